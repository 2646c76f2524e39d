# The README's two commands: `make serve` and `make test`. Both work on a fresh Debian machine
# with Python 3.11: they create .venv, install what is missing, and run.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ninfer-installed
# System parts the tests need (Prometheus, a kube-apiserver, helm, Chromium...) are installed by
# the scripts in scripts/setup/, in name order; slow builds are cached outside the repository.
export NINFER_TOOLS ?= $(HOME)/.cache/ninfer-tools

.PHONY: serve test test-gpu test-interp venv system lint format clean

venv: $(STAMP)

$(STAMP): pyproject.toml requirements/cpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements/cpu.txt
	$(BIN)/pip install -q -e '.[test]'
	touch $@

serve: venv
	$(BIN)/ninfer-serve $(ARGS)

system:
	@set -e; for s in scripts/setup/*.sh; do [ -e "$$s" ] || continue; echo "== $$s"; bash "$$s"; done

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

# GPU tests (marker `gpu`) run on the device machine with `make test-gpu`; the CPU suite deselects them.
test: venv system lint
	PATH="$(abspath $(BIN)):$(NINFER_TOOLS)/bin:$$PATH" $(BIN)/python -m pytest -m "not gpu" -n 2 --dist loadfile --durations=30 $(PYTEST_ARGS)

test-gpu:
	python3 -m pytest -m gpu tests $(PYTEST_ARGS)

# The `gpu` kernel tests on a CPU under Triton's interpreter (slow: name files with PYTEST_ARGS), in a venv of their
# own (scripts/dev/interp-venv.sh); a few bf16 tolerances miss there that the GPU meets (the interpreter truncates).
test-interp: venv
	bash scripts/dev/interp-venv.sh $(VENV)
	TRITON_INTERPRET=1 $(NINFER_TOOLS)/interp-venv/bin/python -m pytest -m gpu -p no:cacheprovider $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info

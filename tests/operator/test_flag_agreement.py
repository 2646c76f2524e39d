"""The operator and the server agree by construction: every command line the operator renders is one
`ninfer-serve --check-args` accepts, and every mode the operator refuses is one the server refuses.

For each row of flags.FLAG_TABLE (and every routing / secret setting that adds flags) the test renders the
real Deployment for a spec holding that row's example value, takes the server container's command, and runs
the server's own validation on it (`api.serve.main` with `--check-args`: the same parser and rules as a
start, no weights loaded). The two filesystem paths of the pod layout (the artifact mount and the request-log
directory) are mapped onto a temporary folder, since the validation checks that they exist; every other
argument is passed exactly as rendered. One case also runs the installed `ninfer-serve` console script, so
the entry point and the in-process call are the same program.
"""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ninfer_operator import crd, flags, resources
from operator_samples import SAMPLE

from api import serve

IMAGE = "ninfer/server:test"


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("pod")
    (root / "artifacts").mkdir()
    (root / "artifacts" / "qwen3.6-27b.ninfer").write_bytes(b"not loaded by --check-args")
    (root / "log").mkdir()
    return {resources.ARTIFACT_DIR: str(root / "artifacts"), resources.LOG_DIR: str(root / "log")}


def rendered_argv(spec: dict[str, Any]) -> list[str]:
    dep = resources.render_deployment("m", spec, IMAGE)
    (server,) = [c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    return list(server["command"])


def on_this_machine(argv: list[str], layout: dict[str, str]) -> list[str]:
    out = []
    for arg in argv[1:]:  # argv[0] is the program
        for pod_dir, here in layout.items():
            if arg.startswith(pod_dir + "/"):
                arg = here + arg[len(pod_dir) :]
        out.append(arg)
    return out


def check_args(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.MonkeyPatch.context() as mp, pytest.raises(SystemExit) as done:
        mp.setenv("NINFER_API_KEY", "from-the-secret")  # what the pod's Secret-backed env var holds
        serve.main([*argv, "--check-args"])
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out + captured.err


def spec_with(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE)
    node = spec
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    if path == "engine.spec.draftTokens":
        spec["engine"]["spec"]["mode"] = "mtp"  # the only valid pairing (validate_spec)
    if path == "engine.prefixReuse":
        del spec["engine"]["hostKvCacheMiB"]  # parking needs prefix reuse (validate_spec)
    return spec


@pytest.mark.parametrize("row", flags.FLAG_TABLE, ids=lambda r: r.field)
def test_each_table_row_renders_an_argv_the_server_accepts_or_is_refused_by_both(
    row: flags.FlagRow, layout: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = spec_with(row.field, row.example)
    argv = rendered_argv(spec)
    assert flags.row_args(row, row.example), f"{row.field}'s example renders no flag"
    assert row.flag in argv
    code, output = check_args(on_this_machine(argv, layout), capsys)
    assert resources.validate_spec("m", spec) == []
    if row.unsupported:
        assert row.unsupported in flags.unsupported_reasons(spec), "the operator must refuse it first"
        assert code == 2, (
            f"ninfer-serve now accepts {row.field} ({row.flag}): remove `unsupported` from its FLAG_TABLE row"
        )
    else:
        assert flags.unsupported_reasons(spec) == []
        assert code == 0, f"ninfer-serve refuses the argv the operator renders for {row.field}:\n{output}"


@pytest.mark.parametrize(
    "setting",
    [
        {"routing": {"gateway": {"name": "gw"}}},  # --metrics-vllm-aliases
        {"routing": {"ingress": {"sessionHeader": "X-Session-Id"}}},
        {"routing": None},
        {"apiKeySecret": {"name": "key"}},  # $NINFER_API_KEY from the Secret; nothing on the command line
        {"drainSeconds": 5},
        {"engine": {**SAMPLE["engine"], "extraArgs": ["--prefill-chunk", "2048", "--no-thinking"]}},
        {"engine": {}},  # nothing set: the server's defaults
    ],
    ids=["gateway", "ingress", "no-routing", "api-key", "drain", "extra-args", "defaults"],
)
def test_settings_outside_the_engine_render_accepted_argv(
    setting: dict[str, Any], layout: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    spec = {**copy.deepcopy(SAMPLE), **setting}
    code, output = check_args(on_this_machine(rendered_argv(spec), layout), capsys)
    assert code == 0, output


@pytest.mark.parametrize(
    "engine",
    [
        {"maxContext": 8192, "kvCapacity": 4096},
        {"prefixReuse": False, "hostKvCacheMiB": 1024},
    ],
    ids=["kv-below-context", "parking-without-reuse"],
)
def test_cross_field_rules_of_the_operator_are_the_servers(
    engine: dict[str, Any], layout: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """What validate_spec refuses up front, the server would refuse at start (so no pod is rendered)."""
    spec = {**copy.deepcopy(SAMPLE), "engine": engine}
    assert resources.validate_spec("m", spec)
    code, _ = check_args(on_this_machine(rendered_argv(spec), layout), capsys)
    assert code == 2


def test_every_engine_field_of_the_crd_has_a_table_row_or_is_extra_args() -> None:
    engine = crd.spec_schema()["properties"]["engine"]["properties"]
    leaves = {f"engine.{k}" for k, v in engine.items() if v.get("type") != "object"}
    leaves |= {f"engine.spec.{k}" for k in engine["spec"]["properties"]}
    covered = {row.field for row in flags.FLAG_TABLE} | {"engine.extraArgs"}
    assert leaves <= covered, f"CRD engine fields without a FLAG_TABLE row: {sorted(leaves - covered)}"
    model_id = crd.spec_schema()["properties"]["model"]["properties"]
    assert "modelId" in model_id and "model.modelId" in covered


def test_the_installed_console_script_validates_the_rendered_argv(layout: dict[str, str]) -> None:
    script = Path(sys.executable).with_name("ninfer-serve")
    argv = on_this_machine(rendered_argv(copy.deepcopy(SAMPLE)), layout)
    ok = subprocess.run([str(script), *argv, "--check-args"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0 and "arguments OK" in ok.stdout, ok.stderr  # (refusals: the in-process cases)

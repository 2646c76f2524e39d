"""Issue #21 item 6: every `spec.engine.spec.mode` maps to `ninfer-serve` flags the server accepts.

For every speculative mode (the CRD's enum, plus the modes the server knows, `engine.config.SPEC_METHODS`)
and every draft count the mode allows, the test renders the operator's real Deployment, takes the server
container's exact command (`flags.server_args` via `resources.render_deployment`), and runs the server's own
argument validation on it (`ninfer-serve --check-args`: the parser and `EngineConfig`'s rules, no model
loaded). `MODES` states what each mode must do today. DFlash is being built: while the server refuses it,
its row says so and the test checks the refusal names the reason; when the server accepts `--spec dflash`
the test fails here until the row is flipped (`accepted=True`, the reason removed), the CRD enum gains
'dflash', and the operator's `draftTokens` rule allows it (DFlash refuses host parking: its spec carries none).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import pytest
from ninfer_operator import crd, resources
from operator_samples import SAMPLE
from test_flag_agreement import check_args, layout, on_this_machine, rendered_argv  # noqa: F401 (fixture)

from engine.config import MAX_DRAFT_TOKENS, SPEC_METHODS


@dataclass(frozen=True)
class Mode:
    accepted: bool
    draft_tokens: tuple[int | None, ...] = (None,)  # None: the flag left out (the server's default)
    in_crd: bool = True  # offered by the CRD's enum today
    refusal: str = ""  # while refused: words the server's error must contain


MODES: dict[str, Mode] = {
    "off": Mode(accepted=True),
    "mtp": Mode(accepted=True, draft_tokens=(None, *range(1, MAX_DRAFT_TOKENS["mtp"] + 1))),
    # flip when `--spec dflash` lands: accepted=True, in_crd=True, refusal="" (draft tokens 1..15)
    "dflash": Mode(accepted=False, in_crd=False, refusal="DFlash is not available in this build"),
}
CASES = [(mode, k) for mode, m in MODES.items() for k in m.draft_tokens]


def _spec(mode: str, k: int | None) -> dict[str, Any]:
    spec = copy.deepcopy(SAMPLE)
    spec["engine"]["spec"] = {"mode": mode} if k is None else {"mode": mode, "draftTokens": k}
    if mode == "dflash":  # DFlash refuses host parking (its draft caches are not parked)
        del spec["engine"]["hostKvCacheMiB"]
    return spec


def test_every_mode_is_in_the_table():
    """The CRD's modes and the server's methods all have a row (a new mode must state what it does)."""
    enum = crd.spec_schema()["properties"]["engine"]["properties"]["spec"]["properties"]["mode"]["enum"]
    assert set(enum) | {"off", *SPEC_METHODS} == set(MODES)
    assert {m for m, row in MODES.items() if row.in_crd} == set(enum)


@pytest.mark.parametrize(("mode", "k"), CASES, ids=[f"{m}-k{k}" for m, k in CASES])
def test_the_operators_argv_for_each_spec_mode_passes_the_servers_validation(
    mode: str,
    k: int | None,
    layout: dict[str, str],
    capsys: pytest.CaptureFixture[str],  # noqa: F811
) -> None:
    row = MODES[mode]
    spec = _spec(mode, k)
    argv = rendered_argv(spec)
    if mode == "off":
        assert "--spec" not in argv and "--draft-tokens" not in argv
    else:
        assert argv[argv.index("--spec") + 1] == mode
        assert ("--draft-tokens" in argv) == (k is not None)
        if k is not None:
            assert argv[argv.index("--draft-tokens") + 1] == str(k)
    code, output = check_args(on_this_machine(argv, layout), capsys)
    if row.accepted:
        assert resources.validate_spec("m", spec) == []
        assert code == 0 and "arguments OK" in output, f"ninfer-serve refuses {mode} k={k}:\n{output}"
    else:
        assert code == 2, f"ninfer-serve now accepts --spec {mode}: flip its MODES row (module docstring)"
        assert row.refusal in output, f"--spec {mode} refused without its reason:\n{output}"

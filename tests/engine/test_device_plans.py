"""The newest date's device plans (scripts/device/plans/DATE-sN-*.txt) are valid before they cost device time.

Every stage line (`NAME SECONDS COMMAND`, as scripts/device/stages.sh reads it) is checked without a GPU: its
`NINFER_*=value` prefixes are switches the code parses, with values it accepts; `python3 -m engine.testing.bench`
argv goes through the bench's parser and its device-free rules (and `--server-args` through ninfer-serve's);
`python3 -m pytest` node ids and `-k` expressions collect at least one `gpu` test from every path they name
(collection only); `python3 bench/kernels/X.py` argv through the script's argparse (where Triton imports); the
.json / .log files a stage writes are under `$WORK` (what stages.sh returns).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLANS = ROOT / "scripts" / "device" / "plans"
_SESSION = re.compile(r"^(\d{4}-\d{2}-\d{2})-s(\d+)-.+\.txt$")
_ENV = re.compile(r"^([A-Z_][A-Z0-9_]*)=(.*)$")
_SHELL = {"|", "||", "&&", ";", "<"}
_PYTEST_VALUE_OPTIONS = {"-k", "-m", "-p", "--timeout", "--durations", "-n", "--dist", "--maxfail", "-o"}


def newest_plans() -> list[Path]:
    """The plan files of the newest date (DATE-sN-*: every session that planned for that date; sessions without
    a GPU leave their plans to the next one that has it, so several sessions can share a date)."""
    dates: dict[str, list[Path]] = {}
    for path in PLANS.glob("*.txt"):
        m = _SESSION.match(path.name)
        if m:
            dates.setdefault(m.group(1), []).append(path)
    return sorted(dates[max(dates)]) if dates else []


def stages(path: Path) -> list[tuple[str, int, str]]:
    out = []
    for line in path.read_text().splitlines():
        parts = line.split(None, 2)
        if not parts or parts[0].startswith("#"):
            continue
        assert len(parts) == 3, f"{path.name}: not `NAME SECONDS COMMAND`: {line!r}"
        assert parts[1].isdigit(), f"{path.name}: {parts[0]}'s SECONDS is not an integer: {parts[1]!r}"
        out.append((parts[0], int(parts[1]), parts[2]))
    return out


STAGES = [(path, *stage) for path in newest_plans() for stage in stages(path)]
IDS = [f"{path.stem}:{name}" for path, name, _, _ in STAGES]


def split_command(cmd: str, work: Path) -> tuple[dict[str, str], list[str]]:
    """The command's env prefixes and argv, `$WORK` replaced as stages.sh's shell would."""
    argv = shlex.split(cmd.replace("$WORK", str(work)).replace("${WORK}", str(work)))
    env: dict[str, str] = {}
    while argv and (m := _ENV.match(argv[0])):
        env[m.group(1)] = m.group(2)
        argv.pop(0)
    # a wrapper (`ncu ... python3 X`) runs the python3 command after it; shell redirections end the argv
    if "python3" in argv:
        argv = argv[argv.index("python3") :]
    ends = [i for i, arg in enumerate(argv) if arg in _SHELL or arg.startswith((">", "2>"))]
    return env, argv[: ends[0]] if ends else argv


def _switch_parsers() -> dict[str, str]:
    """NINFER_X -> the kernels._dispatch function that parses it (`X = parse_x(os.environ.get("NINFER_X", ...`)."""
    text = (ROOT / "kernels" / "_dispatch.py").read_text()
    return dict(
        (name, fn) for fn, name in re.findall(r"(parse_\w+)\(os\.environ\.get\(\"(NINFER_\w+)\"", text)
    )


def check_env(env: dict[str, str]) -> None:
    from engine import env as engine_env
    from kernels import _dispatch

    known = (ROOT / "engine" / "env.py").read_text() + (ROOT / "kernels" / "_dispatch.py").read_text()
    parsers = _switch_parsers()
    for name, value in env.items():
        assert name.startswith("NINFER_") and name in known, f"{name}: not a switch engine/env.py lists"
        if name in parsers:
            getattr(_dispatch, parsers[name])(value)  # ValueError: a value the switch refuses
        elif name == "NINFER_MOE_EXPERTS":
            os.environ[name] = value
            try:
                engine_env.moe_experts_mode()
            finally:
                del os.environ[name]


def check_bench(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from api import serve
    from engine.testing.bench import cli
    from engine.testing.bench.server import server_command

    try:
        args = cli.parse_args(argv)
    except SystemExit as exc:
        raise AssertionError(f"ninfer-bench refuses {argv}") from exc
    reason = cli.check_args(args)
    assert reason is None, reason
    if args.server:
        cmd = server_command(args, 8000)
        flags = cmd[cmd.index("api.serve") + 1 :]
        monkeypatch.setattr(serve, "_cuda_available", lambda: True)  # the device has one
        try:
            serve.parse_args(flags)
        except SystemExit as exc:
            raise AssertionError(f"ninfer-serve refuses {flags}") from exc


def pytest_selection(argv: list[str]) -> tuple[list[str], str | None]:
    """A plan's pytest argv: the paths / node ids it names and its -k expression (it must select -m gpu)."""
    paths, keyword, marker, i = [], None, None, 0
    while i < len(argv):
        arg = argv[i]
        if arg in _PYTEST_VALUE_OPTIONS:
            keyword = argv[i + 1] if arg == "-k" else keyword
            marker = argv[i + 1] if arg == "-m" else marker
            i += 2
            continue
        if not arg.startswith("-"):
            paths.append(arg)
        i += 1
    assert marker == "gpu", "a device stage runs the gpu tests (-m gpu)"
    return paths or ["tests"], keyword


@functools.cache
def collected_selections() -> dict[str, dict[str, int]]:
    """Every pytest stage's selection, per stage id and path: the gpu tests it picks (one collection for all)."""
    queries: dict[str, tuple[list[str], str | None]] = {}
    for stage_id, (_, _, _, line) in zip(IDS, STAGES, strict=True):
        argv = split_command(line, ROOT)[1]
        if argv[1:3] == ["-m", "pytest"]:
            queries[stage_id] = pytest_selection(argv[3:])
    if not queries:
        return {}
    files = sorted({path.split("::")[0] for paths, _ in queries.values() for path in paths})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "answers.json"
        cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "plan_collect"]
        env = {
            "PYTHONPATH": str(ROOT),
            "NINFER_PLAN_OUT": str(out),
            "NINFER_PLAN_QUERIES": json.dumps([{"paths": p, "k": k} for p, k in queries.values()]),
        }
        proc = subprocess.run(
            [*cmd, "-p", "no:cacheprovider", *files],
            cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        tail = f"{proc.stdout[-3000:]}{proc.stderr[-2000:]}"
        assert proc.returncode == 0, f"pytest --collect-only {files}:\n{tail}"
        answers = json.loads(out.read_text())
    return dict(zip(queries, answers, strict=True))


def check_pytest(stage_id: str) -> None:
    for path, count in collected_selections()[stage_id].items():
        assert count > 0, f"{path}: -m gpu (and -k) select no test there"


class _Parsed(Exception):
    pass


def check_script(path: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    script = ROOT / path
    assert script.is_file(), f"{path}: no such script"
    if importlib.util.find_spec("triton") is None:
        # NOTE: the CPU venv has no Triton (it must not: see requirements/cpu.txt); the scripts import it at the
        # top and use it only when they run, so a bare stand-in lets their argument parsing run. The kernels
        # package is imported first, so it keeps its own (Triton-less) view.
        import kernels.attention  # noqa: F401
        import kernels.quant  # noqa: F401

        stand_in = types.ModuleType("triton")
        stand_in.testing = types.ModuleType("triton.testing")  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "triton", stand_in)
        monkeypatch.setitem(sys.modules, "triton.testing", stand_in.testing)  # type: ignore[attr-defined]
    real = argparse.ArgumentParser.parse_args

    def parse_only(self: argparse.ArgumentParser, args: object = None, namespace: object = None) -> None:
        real(self, args, namespace)  # type: ignore[arg-type]
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    monkeypatch.setattr(sys, "argv", [str(script), *argv])
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(script.parent))  # as `python3 bench/kernels/X.py` puts it first
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        raise AssertionError(f"{path} refuses {argv}") from exc
    except _Parsed:
        return
    raise AssertionError(f"{path}: never parsed its arguments")


def test_the_newest_session_has_plans() -> None:
    assert STAGES, "no plan of a DATE-sN prefix in scripts/device/plans"


@pytest.mark.parametrize("path", newest_plans(), ids=lambda p: p.stem)
def test_plan_fits_its_budget(path: Path) -> None:
    """stages.sh runs a plan within 570 s; a plan is asked to keep under ~240 s (names unique: one log each)."""
    rows = stages(path)
    names = [name for name, _, _ in rows]
    assert len(names) == len(set(names)), f"{path.name}: stage names repeat"
    assert sum(seconds for _, seconds, _ in rows) <= 570


def newest_order() -> Path | None:
    """The newest date's ORDER file (DATE-sN-ORDER.md, the highest N): the calls the next device session makes."""
    dates = {m.group(1) for p in newest_plans() if (m := _SESSION.match(p.name))}
    orders = sorted(
        PLANS.glob(f"{max(dates)}-s*-ORDER.md"), key=lambda p: int(p.name.split("-s")[1].split("-")[0])
    )
    return orders[-1] if dates and orders else None


def order_calls(path: Path) -> list[tuple[int, list[tuple[Path, list[str]]]]]:
    """Each `scripts/device/stages.sh PLAN[:STAGE,...] ... [--budget S]` line of an ORDER file: (budget, [(plan,
    stage names or [] for all)])."""
    calls = []
    for line in path.read_text().splitlines():
        words = line.strip().strip("`").split()
        if words[:1] != ["scripts/device/stages.sh"]:
            continue
        budget, specs, rest = 570, [], words[1:]
        while rest:
            word = rest.pop(0)
            if word == "--budget":
                budget = int(rest.pop(0))
                continue
            plan, _, names = word.partition(":")
            specs.append((ROOT / plan, [n for n in names.split(",") if n]))
        calls.append((budget, specs))
    return calls


def test_order_calls_run_real_stages_within_a_call() -> None:
    """The newest ORDER file's calls name plans and stages that exist (stages.sh refuses others before running
    anything), their stages' seconds fit the call's budget (570 s, under the device's 600 s a command), a call's
    stage names are unique (one log each), and together the calls schedule every stage of the date's plans."""
    order = newest_order()
    assert order is not None, (
        "no DATE-sN-ORDER.md beside the newest plans: the next session would not know the calls"
    )
    calls = order_calls(order)
    assert calls, f"{order.name}: no `scripts/device/stages.sh ...` call lines"
    scheduled = set()
    for budget, specs in calls:
        seconds, names = 0, []
        for plan, wanted in specs:
            assert plan.is_file(), f"{order.name}: no plan {plan}"
            rows = {name: secs for name, secs, _ in stages(plan)}
            for name in wanted or list(rows):
                assert name in rows, f"{order.name}: {plan.name} has no stage {name}"
                seconds += rows[name]
                names.append(name)
                scheduled.add((plan.name, name))
        assert seconds <= min(budget, 570), f"{order.name}: a call of {seconds} s ({names})"
        assert len(names) == len(set(names)), f"{order.name}: a call repeats a stage name ({names})"
    every = {(path.name, name) for path, name, _, _ in STAGES}
    assert every <= scheduled, f"{order.name} schedules none of {sorted(every - scheduled)}"


@pytest.mark.parametrize(("path", "name", "seconds", "cmd"), STAGES, ids=IDS)
def test_stage_command_is_valid(
    path: Path, name: str, seconds: int, cmd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, argv = split_command(cmd, tmp_path)
    check_env(env)
    for arg in argv:  # stages.sh returns $WORK (results.tgz): a result written elsewhere is lost
        out = arg.split("=", 1)[-1]
        assert not out.endswith((".json", ".log")) or out.startswith(f"{tmp_path}/"), (
            f"{name}: {out} not in $WORK"
        )
    assert argv and argv[0] == "python3", (
        f"{name}: not a python3 command, which this test cannot check: {cmd}"
    )
    if argv[1:3] == ["-m", "engine.testing.bench"]:
        check_bench(argv[3:], monkeypatch)
    elif argv[1:3] == ["-m", "pytest"]:
        check_pytest(f"{path.stem}:{name}")
    elif argv[1].startswith("bench/") and argv[1].endswith(".py"):
        check_script(argv[1], argv[2:], monkeypatch)
    else:
        pytest.fail(f"{name}: a command this test does not know how to check: {cmd}")

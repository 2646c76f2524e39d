"""`ninfer ARTIFACT --prompt ...`: the answer on stdout, loading and throughput on stderr; seeded runs
repeat; bad input exits 2 with a message."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from engine_harness import one_thread, tiny_artifact

from engine.cli import main


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with one_thread():
        code = main([str(tiny_artifact("dense")), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ninfer_prints_the_answer_on_stdout_and_timing_on_stderr(capsys):
    code, out, err = _run(capsys, "--prompt", "Say hi", "--max-new", "8", "--no-thinking", "--greedy")
    assert code == 0 and out.strip()
    assert "loading" in err and "loaded ninfer-tiny-dense" in err and "tok/s" in err and "8 generated" in err
    code, out_again, _ = _run(capsys, "--prompt", "Say hi", "--max-new", "8", "--no-thinking", "--greedy")
    assert out_again == out


def test_seeded_sampled_cli_runs_repeat_exactly(capsys):
    args = ("--prompt", "Say hi", "--max-new", "8", "--no-thinking", "--temperature", "1.0", "--seed", "7")
    first, second = _run(capsys, *args), _run(capsys, *args)
    assert first[0] == 0 and first[1].strip() and first[1] == second[1]
    other = _run(capsys, *args[:-1], "8")
    assert other[1] != first[1]


def test_thinking_mode_sends_the_reasoning_to_stderr(capsys):
    code, out, err = _run(capsys, "--prompt", "Say hi", "--max-new", "6", "--greedy")
    assert code == 0 and out.strip() == ""  # the random model never closes </think>: all reasoning
    assert len(err.splitlines()) >= 3


def test_a_stop_string_inside_the_reasoning_neither_ends_nor_cuts_it(capsys):
    args = ("--prompt", "Say hi", "--max-new", "6", "--greedy")
    _, _, err = _run(capsys, *args)
    reasoning = err[err.index("\n", err.index("loaded")) + 1 : err.index("\n[")]  # between load and summary
    stop = reasoning.strip()[2:6]
    assert stop.strip()
    code, _, err_stopped = _run(capsys, *args, "--stop", stop)
    assert code == 0 and reasoning in err_stopped and "[length]" in err_stopped


def test_bad_input_exits_2_with_a_message(capsys, tmp_path):
    bad = tmp_path / "messages.json"
    bad.write_text('{"nope": 1}')
    code, _, err = _run(capsys, "--messages", str(bad))
    assert code == 2 and "expected a JSON list of messages" in err
    code, _, err = _run(capsys, "--prompt", "x" * 10, "--max-context", "4")
    assert code == 2 and "max_context is 4" in err


def test_ninfer_console_script_answers():
    ninfer = Path(sys.executable).parent / "ninfer"  # the console script the package installs
    assert ninfer.is_file(), f"{ninfer}: not installed (pip install -e .)"
    args = [str(tiny_artifact("dense")), "--prompt", "Hi", "--max-new", "4", "--no-thinking", "--greedy"]
    result = subprocess.run([str(ninfer), *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() and "tok/s" in result.stderr


def test_spec_mtp_gives_the_same_answer_and_reports_its_rounds_on_stderr(capsys):
    args = ("--prompt", "Say hi", "--max-new", "8", "--no-thinking", "--greedy")
    _, plain, _ = _run(capsys, *args)
    code, out, err = _run(capsys, *args, "--spec", "mtp", "--draft-tokens", "2")
    assert code == 0 and out == plain
    assert "[spec mtp K=2]" in err and "drafts accepted" in err and "tokens per round" in err

"""One set of engine rules for the three ways in: `ninfer-serve` and `ninfer` (the installed console scripts,
run as real processes) exit 2 with the reason before loading anything, and `LLM(**keywords)` raises
ValueError with the very same words (engine/config.py holds every rule; engine/flags.py maps flags 1:1)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from engine import LLM
from engine.config import EngineConfig

BIN = Path(sys.executable).parent

# (flags, the same settings as LLM keywords, words the refusal must contain)
SHARED = [
    (["--prefill-chunk", "100"], {"prefill_chunk": 100}, "prefill_chunk=100: must be a multiple of 128"),
    (
        ["--prefill-chunk", "256", "--prefill-chunk-decoding", "512"],
        {"prefill_chunk": 256, "prefill_chunk_decoding": 512},
        "prefill_chunk_decoding=512: must be <= prefill_chunk (256)",
    ),
    (["--prefill-chunk-decoding", "192"], {"prefill_chunk_decoding": 192}, "must be a multiple of 128"),
    (
        ["--max-context", "4096", "--kv-capacity", "1024"],
        {"max_context": 4096, "kv_capacity": 1024},
        "kv_capacity=1024: must be >= max_context (4096)",
    ),
    (["--kv-capacity", "lots"], {"kv_capacity": "lots"}, "kv_capacity='lots': must be 'auto'"),
    (["--kv-dtype", "fp4"], {"kv_dtype": "fp4"}, "kv_dtype='fp4': must be one of"),
    (
        ["--spec", "dflash", "--draft-tokens", "16"],
        {"spec": "dflash", "draft_tokens": 16},
        "draft_tokens=16: must be in 1..15 with --spec dflash",
    ),
    (["--draft-tokens", "3"], {"draft_tokens": 3}, "draft_tokens=3: needs speculative decoding (--spec mtp)"),
    (
        ["--spec", "mtp", "--draft-tokens", "6"],
        {"spec": "mtp", "draft_tokens": 6},
        "draft_tokens=6: must be in 1..5 with --spec mtp",
    ),
    (
        ["--gpu-memory-limit", "lots"],
        {"gpu_memory_limit": "lots"},
        "gpu_memory_limit='lots': must be a positive",
    ),
]
# Flags only the server offers (lanes, queueing, host parking): the server and LLM() agree.
SERVER_ONLY = [
    (
        ["--host-kv-cache-mib", "64", "--no-prefix-reuse"],
        {"host_kv_cache_mib": 64, "prefix_reuse": False},
        "host_kv_cache_mib=64: needs prefix reuse",
    ),
    (
        ["--spec", "dflash", "--host-kv-cache-mib", "64"],
        {"spec": "dflash", "host_kv_cache_mib": 64},
        "host parking does not capture DFlash draft caches",
    ),
    (["--max-concurrency", "9"], {"max_concurrency": 9}, "max_concurrency=9: must be in 1..8"),
    (["--burst-wait-ms", "-1"], {"burst_wait_ms": -1}, "burst_wait_ms=-1: must be in 0..1000"),
]


def _refusal(program: str, stderr: str) -> str:
    """The reason of `PROGRAM: error: REASON`, the last line argparse writes."""
    last = stderr.strip().splitlines()[-1]
    prefix = f"{program}: error: "
    assert last.startswith(prefix), stderr
    return last.removeprefix(prefix)


def _llm_refusal(tmp_path: Path, keywords: dict[str, object]) -> str:
    # A missing file: were the settings accepted, loading would fail with other words.
    with pytest.raises(ValueError) as info:
        LLM(tmp_path / "absent.ninfer", device="cpu", **keywords)
    return str(info.value)


def _run_all(commands: dict[str, list[str]]) -> dict[str, str]:
    """Run the programs side by side; each must exit 2; their refusals by program name."""
    procs = {
        name: subprocess.Popen(
            [str(BIN / name), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for name, argv in commands.items()
    }
    out = {}
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, f"{name}: exit {proc.returncode}\n{err}"
        out[name] = _refusal(name, err)
    return out


@pytest.mark.parametrize(("argv", "keywords", "reason"), SHARED, ids=[" ".join(c[0]) for c in SHARED])
def test_ninfer_serve_ninfer_and_llm_refuse_alike(
    argv: list[str], keywords: dict[str, object], reason: str, tmp_path: Path
) -> None:
    missing = str(tmp_path / "absent.ninfer")
    got = _run_all({"ninfer-serve": [missing, *argv], "ninfer": [missing, "--prompt", "hi", *argv]})
    llm = _llm_refusal(tmp_path, keywords)
    assert reason in llm
    assert got == {"ninfer-serve": llm, "ninfer": llm}


@pytest.mark.parametrize(
    ("argv", "keywords", "reason"), SERVER_ONLY, ids=[" ".join(c[0]) for c in SERVER_ONLY]
)
def test_server_only_flags_refuse_as_llm_does(
    argv: list[str], keywords: dict[str, object], reason: str, tmp_path: Path
) -> None:
    got = _run_all({"ninfer-serve": [str(tmp_path / "absent.ninfer"), *argv]})
    llm = _llm_refusal(tmp_path, keywords)
    assert reason in llm and got["ninfer-serve"] == llm


def test_every_engine_flag_sets_the_keyword_of_its_name() -> None:
    """The table stays 1:1: `--x-y` and `--no-x-y` set `x_y`, and every keyword is a config field."""
    from engine.flags import ENGINE_FLAGS, config_defaults

    defaults = config_defaults()
    for row in ENGINE_FLAGS:
        name = row.flag.removeprefix("--")
        assert row.keyword == name.removeprefix("no-").replace("-", "_"), row
        switch = name.startswith("no-") or row.given is True or row.negatable  # --no-x, a switch
        assert (row.parse is None) == switch, row
        EngineConfig.from_flags(**{row.keyword: defaults[row.keyword]})  # a known keyword
    keywords = [row.keyword for row in ENGINE_FLAGS]
    assert len(set(keywords)) == len(keywords)
    with pytest.raises(ValueError, match="^no_such_flag=1: unknown engine option"):
        EngineConfig.from_flags(no_such_flag=1)

"""`ninfer-serve` flags: parsed and validated at start, refused with the reason (exit status 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.serve import parse_args, redacted_argv


@pytest.mark.parametrize(
    ("argv", "reason"),
    [
        (["--prefill-chunk", "100"], "prefill_chunk=100: must be a multiple of 128"),
        (["--prefill-chunk-decoding", "100"], "prefill_chunk_decoding=100: must be a multiple of 128"),
        (
            ["--prefill-chunk-decoding", "2048"],
            "prefill_chunk_decoding=2048: must be <= prefill_chunk (1024)",
        ),
        (["--prefill-chunk-decoding", "0"], "prefill_chunk_decoding=0: must be an integer >= 1"),
        (["--prefill-chunk-decoding", "1.5"], "prefill_chunk_decoding='1.5': must be an integer >= 1"),
        (
            ["--max-context", "4096", "--kv-capacity", "1024"],
            "kv_capacity=1024: must be >= max_context (4096)",
        ),
        (["--max-concurrency", "9"], "max_concurrency=9"),
        (["--max-context", "300000"], "must be <= 262,144, the models' native context"),
        (["--reasoning-effort", "extreme"], "invalid choice"),
        (["--thinking-budget", "-1"], "-1 must be >= 0"),
        (["--kv-dtype", "fp4"], "kv_dtype='fp4': must be one of"),
        (["--temperature", "3"], "temperature=3.0"),
        (["--top-k", "50"], "top_k=50: must be in 0..20"),
        (["--request-log-max-mib", "5"], "need --request-log-jsonl"),
        (["--api-key", ""], "--api-key: the API key must not be empty"),
        (["--api-key", "clé"], "--api-key: the API key must be printable ASCII"),
        (["--api-key", "a", "--api-key-file", "/k"], "--api-key and --api-key-file: give one, not both"),
        (["--api-key-file", "/no/such/key"], "--api-key-file /no/such/key: cannot read"),
        (["--header-timeout-s", "0"], "must be > 0"),
        (["--kv-capacity", "lots"], "kv_capacity='lots'"),
        (["/no/such/model.ninfer"], "no such file"),
    ],
)
def test_bad_flags_exit_2_with_the_reason(
    argv: list[str], reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert reason in capsys.readouterr().err


def test_request_log_that_is_the_artifact_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    artifact = tmp_path / "m.ninfer"
    artifact.write_bytes(b"x")
    with pytest.raises(SystemExit):
        parse_args([str(artifact), "--request-log-jsonl", str(artifact)])
    assert "is the artifact itself" in capsys.readouterr().err


def test_good_flags_map_to_engine_config_and_options(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    args, config, options = parse_args(
        [
            "--max-context", "4096", "--kv-capacity", "auto", "--max-concurrency", "4", "--no-prefix-reuse",
            "--prefill-chunk", "256", "--kv-dtype", "int8", "--greedy", "--top-p", "0.5", "--model-id", "alias",
            "--request-log-jsonl", str(log), "--request-log-max-mib", "2", "--request-log-keep", "3", "--cors",
            "--no-cuda-graph", "--prefill-chunk-decoding", "128",
        ]
    )  # fmt: skip
    assert config.scheduler.max_context == 4096 and config.scheduler.max_concurrency == 4
    assert config.cache.kv_capacity == "auto" and config.cache.prefix_reuse is False
    assert config.cache.kv_dtype == "int8" and config.greedy is True
    assert options.sampling.top_p == 0.5 and options.model_id == "alias" and options.cors
    assert options.request_log_keep == 3 and options.request_log_max_mib == 2.0
    assert (args.host, args.port) == ("127.0.0.1", 8080)
    assert config.cuda_graph is False
    assert config.scheduler.prefill_chunk == 256 and config.scheduler.prefill_chunk_decoding == 128
    default = parse_args(["--prefill-chunk", "8192"])[1].scheduler
    assert default.prefill_chunk_decoding is None and default.effective_prefill_chunk_decoding == 2048
    assert parse_args([])[1].cuda_graph is True


def test_reasoning_effort_and_thinking_budget_set_the_thinking_defaults() -> None:
    _, _, options = parse_args(["--reasoning-effort", "low"])
    assert options.thinking is True and options.sampling.thinking_budget == 2048
    _, _, options = parse_args(["--reasoning-effort", "max"])
    assert options.sampling.thinking_budget == -1
    _, _, options = parse_args(["--reasoning-effort", "none"])
    assert options.thinking is False
    _, _, options = parse_args(["--reasoning-effort", "high", "--thinking-budget", "100"])
    assert options.sampling.thinking_budget == 100
    assert parse_args([])[2].sampling.thinking_budget is None


def test_api_key_is_redacted_from_logged_argv() -> None:
    assert redacted_argv(["--api-key", "s3cret", "--api-key=abc", "--port", "1"]) == [
        "--api-key", "<redacted>", "--api-key=<redacted>", "--port", "1",
    ]  # fmt: skip


def test_api_key_comes_from_the_flag_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("from-file\n")
    monkeypatch.setenv("NINFER_API_KEY", "from-env")
    assert parse_args(["--api-key", "from-flag"])[2].api_key == "from-flag"
    assert parse_args(["--api-key-file", str(key_file)])[2].api_key == "from-file"
    assert parse_args([])[2].api_key == "from-env"
    monkeypatch.setenv("NINFER_API_KEY", "naïve")
    with pytest.raises(SystemExit):
        parse_args([])
    assert "$NINFER_API_KEY: the API key must be printable ASCII" in capsys.readouterr().err
    monkeypatch.delenv("NINFER_API_KEY")
    assert parse_args([])[2].api_key is None
    key_file.write_text("first\nsecond\n")  # surrounding whitespace is stripped, a second line is refused
    with pytest.raises(SystemExit):
        parse_args(["--api-key-file", str(key_file)])
    assert "the API key must be a single line" in capsys.readouterr().err


def test_request_size_limit_defaults_from_the_context() -> None:
    assert parse_args(["--max-context", "512"])[2].max_request_mib == 4  # the floor
    assert parse_args(["--max-context", "262144"])[2].max_request_mib == 16  # 64 bytes per token
    assert parse_args(["--max-context", "512", "--max-request-mib", "9"])[2].max_request_mib == 9

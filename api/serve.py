"""`ninfer-serve [ARTIFACT | --synthetic GEOMETRY] [flags]`: parse and validate every flag, load the engine,
run uvicorn.

The engine's flags are engine/flags.py's table and their rules engine/config.py's (the same as `ninfer` and
`LLM()`); the server's own flags (network, identity, logging, --synthetic) and their rules are here.

No artifact = the embedded demo model (built once into the user cache). `--synthetic GEOMETRY` serves random
weights of a real geometry built on the device (engine/testing/synthetic.py; model id `<GEOMETRY>-synthetic`, and
/v1/models, /stats and the request log's server_start say `synthetic`): for load tests and benchmarks at the
real sizes without the checkpoints. A bad flag or flag combination exits with status 2 and the reason before
anything is loaded; `--check-args` stops right after that validation (exit 0), which is how the operator's
tests prove that every command line it renders is one the server accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import uvicorn

from api.options import MIN_REQUEST_MIB, ServerOptions, default_max_request_mib
from api.server import DrainingServer, guarded_protocol
from engine.artifact.digest import is_sha256_hex, sha256_file
from engine.config import EngineConfig
from engine.flags import (
    add_engine_flags,
    add_sampling_flags,
    engine_config,
    nonneg_int,
    positive_int,
    sampling_params,
    thinking_default,
)
from engine.request import SamplingParams
from engine.testing.geometry import SYNTHETIC_NAMES, TINY_GEOMETRY, needs_cuda, synthetic_model_id

logger = logging.getLogger("ninfer.serve")

LOG_FORMAT = "%(asctime)s.%(msecs)03d  %(levelname)s  %(message)s"
API_KEY_ENV = "NINFER_API_KEY"


def _nonneg_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text} must be >= 0")
    return value


def _positive_float(text: str) -> float:
    value = _nonneg_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} must be > 0")
    return value


def _api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or $NINFER_API_KEY (one of them); ValueError if unusable."""
    if args.api_key is not None and args.api_key_file is not None:
        raise ValueError("--api-key and --api-key-file: give one, not both")
    key, source = args.api_key, "--api-key"
    if args.api_key_file is not None:
        source = f"--api-key-file {args.api_key_file}"
        try:
            key = args.api_key_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"{source}: cannot read ({exc})") from None
    elif key is None and os.environ.get(API_KEY_ENV):
        key, source = os.environ[API_KEY_ENV], f"${API_KEY_ENV}"
    if key is None:
        return None
    if not key.strip():
        raise ValueError(f"{source}: the API key must not be empty")
    if "\n" in key or "\r" in key:
        raise ValueError(f"{source}: the API key must be a single line")
    if not (key.isascii() and key.isprintable()):
        raise ValueError(f"{source}: the API key must be printable ASCII (HTTP headers carry no other bytes)")
    return str(key)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ninfer-serve",
        description="Serve a .ninfer model over OpenAI Chat Completions / Responses and Anthropic Messages.",
        epilog="OpenTelemetry traces are off unless the standard OTEL_* variables configure an exporter "
        "(e.g. OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4317); see api/tracing.py.",
    )
    p.add_argument("artifact", nargs="?", help="the .ninfer file (default: the embedded tiny demo model)")
    p.add_argument(
        "--synthetic",
        choices=SYNTHETIC_NAMES,
        help="serve RANDOM weights of this geometry, built on the device, instead of an artifact (load tests "
        f"and benchmarks; model id GEOMETRY-synthetic; {TINY_GEOMETRY} runs on the CPU, the others need a GPU)",
    )
    p.add_argument(
        "--weights-id",
        metavar="PROFILE",
        help="with --synthetic: random weights in this weight profile's formats (e.g. qwen3.6-27b/groupwise-int, "
        "or a kind: groupwise-int, nvfp4, nvfp4-mixed), costing what the real quantized weights cost",
    )
    net = p.add_argument_group("network and identity")
    net.add_argument("--host", default="127.0.0.1")
    net.add_argument("--port", type=nonneg_int, default=8080, help="0 = pick a free port")
    net.add_argument(
        "--api-key",
        help=f"require this key (Authorization: Bearer or x-api-key); also from ${API_KEY_ENV} or --api-key-file",
    )
    net.add_argument("--api-key-file", type=Path, help="read the API key from this file (kept out of `ps`)")
    net.add_argument("--model-id", help="the model name clients use (default: the artifact's model id)")
    net.add_argument("--cors", action="store_true", help="add permissive CORS headers")
    net.add_argument(
        "--max-request-mib",
        type=positive_int,
        help="largest request body (default: from the context, 64 bytes per token, at least "
        f"{MIN_REQUEST_MIB} MiB)",
    )
    net.add_argument(
        "--header-timeout-s",
        type=_positive_float,
        default=30.0,
        help="close a connection whose request "
        "headers are not all in this many seconds after its first byte (408)",
    )
    net.add_argument(
        "--body-timeout-s",
        type=_positive_float,
        default=60.0,
        help="refuse a request whose body stalls this many seconds between reads (408)",
    )
    net.add_argument(
        "--max-connections",
        type=positive_int,
        default=512,
        help="open connections at most; more are answered 503 (too_many_connections) and closed",
    )
    net.add_argument(
        "--shutdown-timeout-s", type=_positive_float, default=30.0,
        help="on SIGTERM, let admitted requests finish this long, then cancel what is left",
    )  # fmt: skip
    net.add_argument(
        "--expected-sha256",
        help="refuse to start unless the artifact file's SHA-256 is this (streams the file once at start)",
    )
    net.add_argument(
        "--metrics-vllm-aliases", action="store_true", help="also export vllm: metric names on /metrics"
    )
    net.add_argument(
        "--check-args",
        action="store_true",
        help="validate the command line as a start would, load nothing, exit 0 (or 2 with the reason)",
    )
    cap = p.add_argument_group("capacity and queueing")
    add_engine_flags(cap, "engine", "server")
    log = p.add_argument_group("logging and response store")
    log.add_argument("--request-log-jsonl", type=Path, help="append request events (never text) here")
    log.add_argument(
        "--request-log-max-mib", type=_nonneg_float, default=0.0, help="rotate at N MiB; 0 = never"
    )
    log.add_argument("--request-log-keep", type=positive_int, default=4, help="rotated files kept")
    log.add_argument("--log-stats-interval-ms", type=nonneg_int, default=5000, help="0 = no throughput")
    log.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info")
    log.add_argument("--response-store-max-records", type=nonneg_int, default=1024)
    log.add_argument("--response-store-max-mib", type=nonneg_int, default=256)
    prompt = p.add_argument_group("prompt and template")
    prompt.add_argument("--no-thinking", action="store_true", help="thinking off unless a request asks")
    prompt.add_argument("--preserve-thinking", action="store_true", help="keep all past reasoning in prompts")
    prompt.add_argument(
        "--tolerant-tool-calls",
        action="store_true",
        help="recover drifted tool-call markup (wrappers, <<, dropped <, leaked markers); a call ends <think>",
    )
    samp = p.add_argument_group("sampling defaults (request fields win; --greedy forces temperature 0)")
    add_sampling_flags(samp)
    return p


def _check_server_flags(args: argparse.Namespace) -> None:
    """The server's own flags (the engine's are the config's: engine/config.py); raise ValueError."""
    if args.synthetic is not None:
        if args.artifact is not None:
            raise ValueError(f"--synthetic {args.synthetic} and artifact {args.artifact}: give one, not both")
        if args.expected_sha256 is not None:
            raise ValueError(f"--synthetic {args.synthetic} has no file to check: drop --expected-sha256")
        if needs_cuda(args.synthetic) and not _cuda_available():
            raise ValueError(
                f"--synthetic {args.synthetic} needs a CUDA device; use --synthetic {TINY_GEOMETRY} on the CPU"
            )
    if args.weights_id is not None and args.synthetic is None:
        raise ValueError(
            f"--weights-id {args.weights_id} needs --synthetic (an artifact names its own profile)"
        )
    if args.model_id is not None and not args.model_id.strip():
        raise ValueError("--model-id must not be empty")
    if args.request_log_jsonl is None and (args.request_log_max_mib or args.request_log_keep != 4):
        raise ValueError("--request-log-max-mib / --request-log-keep need --request-log-jsonl")
    if args.request_log_jsonl is not None:
        log = args.request_log_jsonl.resolve()
        if args.artifact is not None and log == Path(args.artifact).resolve():
            raise ValueError(f"--request-log-jsonl {log} is the artifact itself")
        if log.is_dir():
            raise ValueError(f"--request-log-jsonl {log} is a directory")
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            with open(log, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            raise ValueError(f"--request-log-jsonl {log}: cannot open for append ({exc.strerror})") from None
    if args.artifact is not None and not Path(args.artifact).is_file():
        raise ValueError(f"artifact {args.artifact}: no such file")
    if args.expected_sha256 is not None and not is_sha256_hex(args.expected_sha256):
        raise ValueError(f"--expected-sha256 {args.expected_sha256!r}: must be 64 hex digits")


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, EngineConfig, ServerOptions]:
    """Parse and validate; exits with status 2 and the reason on any bad flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        config = engine_config(args, args.artifact)  # the engine's flags: every rule is the config's
        sampling = sampling_params(args)
        _check_server_flags(args)
        api_key = _api_key(args)
    except ValueError as exc:
        parser.error(str(exc))
    max_context = config.scheduler.max_context
    options = ServerOptions(
        api_key=api_key,
        model_id=args.model_id,
        cors=args.cors,
        # --vision: room for base64 media (api/media.py's per-medium limit) beyond the text
        max_request_mib=args.max_request_mib
        or default_max_request_mib(max_context) + (64 if config.vision else 0),
        body_timeout_seconds=args.body_timeout_s,
        request_log_jsonl=args.request_log_jsonl,
        request_log_max_mib=args.request_log_max_mib,
        request_log_keep=args.request_log_keep,
        log_stats_interval_ms=args.log_stats_interval_ms,
        response_store_max_records=args.response_store_max_records,
        response_store_max_mib=args.response_store_max_mib,
        sampling=sampling,
        greedy=config.greedy,
        default_max_tokens=config.scheduler.default_max_tokens,
        thinking=not args.no_thinking and thinking_default(args) is not False,
        preserve_thinking=args.preserve_thinking,
        tolerant_tool_calls=args.tolerant_tool_calls,
        metrics_vllm_aliases=args.metrics_vllm_aliases,
    )
    return args, config, options


def _verify_digest(artifact: str, expected: str) -> str:
    """Stream the artifact once; exit 1 with both digests when it is not the expected one."""
    actual = sha256_file(artifact)
    if actual != expected.lower():
        print(
            f"ninfer-serve: error: artifact {artifact} has SHA-256 {actual}, expected {expected.lower()};"
            " refusing to start",
            file=sys.stderr,
        )
        raise SystemExit(1)
    return actual


def redacted_argv(argv: Sequence[str]) -> list[str]:
    out, hide = [], False
    for item in argv:
        if hide:
            out.append("<redacted>")
            hide = False
        elif item == "--api-key":
            out.append(item)
            hide = True
        elif item.startswith("--api-key="):
            out.append("--api-key=<redacted>")
        else:
            out.append(item)
    return out


EngineFactory = Callable[[str, EngineConfig, SamplingParams], Any]


def main(argv: Sequence[str] | None = None, *, engine_factory: EngineFactory | None = None) -> None:
    """Run the server. `engine_factory(artifact, config)` replaces the engine (tests serve scripted ones)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, config, options = parse_args(argv)
    if args.check_args:  # every rule above ran; the digest check and the load are the start itself
        print("ninfer-serve: arguments OK")
        raise SystemExit(0)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT, datefmt="%Y-%m-%d %H:%M:%S")
    from api.app import create_app

    artifact: str | None = args.artifact
    if args.synthetic is not None:
        logger.warning(
            "serving RANDOM weights of the %s geometry (--synthetic): output is noise; model id %s",
            args.synthetic,
            synthetic_model_id(args.synthetic),
        )
    elif artifact is None:
        from engine.testing.demo import demo_artifact_path

        artifact = str(demo_artifact_path())
    if args.expected_sha256 is not None and artifact is not None:
        options = dataclasses.replace(options, artifact_sha256=_verify_digest(artifact, args.expected_sha256))
    try:
        if args.synthetic is not None:
            # engine_factory (tests) receives the geometry name in place of the artifact path.
            factory = engine_factory or functools.partial(_load_synthetic, weights_id=args.weights_id)
            engine = factory(args.synthetic, config, options.sampling)
        else:
            assert artifact is not None
            factory = engine_factory or _load
            engine = factory(artifact, dataclasses.replace(config, artifact=artifact), options.sampling)
    except ValueError as exc:  # ArtifactError and config errors are ValueErrors
        print(f"ninfer-serve: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    app = create_app(engine, options, argv=redacted_argv(argv), artifact=artifact)
    protocol = guarded_protocol(header_timeout=args.header_timeout_s, max_connections=args.max_connections)
    uv_config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        http=protocol,
        timeout_graceful_shutdown=int(args.shutdown_timeout_s),
        h11_max_incomplete_event_size=None,
    )
    server = DrainingServer(uv_config, app, shutdown_timeout=args.shutdown_timeout_s)
    server.run()


def _load(artifact: str, config: EngineConfig, sampling: SamplingParams) -> Any:
    from api.engine_client import load_engine

    return load_engine(artifact, config, sampling)


def _load_synthetic(
    name: str, config: EngineConfig, sampling: SamplingParams, weights_id: str | None = None
) -> Any:
    from api.engine_client import load_synthetic_engine

    return load_synthetic_engine(name, config, sampling, weights_id)


if __name__ == "__main__":
    main()

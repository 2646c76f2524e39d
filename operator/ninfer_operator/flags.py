"""The one table from `NInferDeployment` spec fields to `ninfer-serve` flags, and what the server runs today.

`FLAG_TABLE` is the only place a spec field becomes a command-line flag. `server_args` renders from it, the
operator refuses a spec that asks for an `unsupported` row (condition `Ready=False`, reason `Unsupported`,
phase `Unsupported`) instead of rendering a pod that would crash-loop, and
`tests/operator/test_flag_agreement.py` runs `ninfer-serve --check-args` on the argv of every row with its
`example` value: a supported row must be accepted, an unsupported row refused. When the server gains a
mode, that test fails until the row's `unsupported` text is removed here, and nothing else changes.

Kinds of rows:
  value   `[flag, str(v)]` whenever the field is set (`skip` lists values that mean "leave the default")
  false   `[flag]` when the field is explicitly false (prefixReuse: false -> --no-prefix-reuse)
  true    `[flag]` when the field is true
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SERVER_PORT = 8080
API_KEY_ENV = "NINFER_API_KEY"
# The request log lives on an emptyDir whose sizeLimit is REQUEST_LOG_VOLUME_MIB; rotation keeps it below:
# (keep + 1 live file) * max MiB = 5 * 256 MiB = 1.25 GiB < 2 GiB.
REQUEST_LOG_VOLUME_MIB = 2048
REQUEST_LOG_MAX_MIB = 256
REQUEST_LOG_KEEP = 4


@dataclass(frozen=True)
class FlagRow:
    field: str  # dotted path under spec, e.g. "engine.maxContext"
    flag: str
    kind: str  # "value" | "true" | "false"
    example: Any  # a value the agreement test renders
    skip: tuple[Any, ...] = ()  # values of a "value" row that render nothing (the server default)
    unsupported: str = ""  # non-empty: ninfer-serve refuses this field today; the reason users see


FLAG_TABLE: tuple[FlagRow, ...] = (
    FlagRow("model.modelId", "--model-id", "value", "qwen3.6-27b"),
    FlagRow("engine.maxContext", "--max-context", "value", 131072),
    FlagRow("engine.kvCapacity", "--kv-capacity", "value", "auto"),
    FlagRow("engine.maxConcurrency", "--max-concurrency", "value", 4),
    FlagRow("engine.hostKvCacheMiB", "--host-kv-cache-mib", "value", 16384),
    FlagRow("engine.kvDtype", "--kv-dtype", "value", "int8"),
    FlagRow("engine.prefixReuse", "--no-prefix-reuse", "false", False),
    FlagRow(
        "engine.spec.mode",
        "--spec",
        "value",
        "mtp",
        skip=("off",),
    ),
    FlagRow(
        "engine.spec.draftTokens",
        "--draft-tokens",
        "value",
        3,
    ),
    FlagRow("engine.vision", "--vision", "true", True),
)


def get_path(spec: Mapping[str, Any], path: str) -> Any:
    node: Any = spec
    for part in path.split("."):
        if not isinstance(node, Mapping):
            return None
        node = node.get(part)
    return node


def row_args(row: FlagRow, value: Any) -> list[str]:
    """The argv fragment one row renders for `value` (empty when the value asks for nothing)."""
    if value is None:
        return []
    if row.kind == "value":
        return [] if value in row.skip else [row.flag, str(value)]
    if row.kind == "true":
        return [row.flag] if value is True else []
    if row.kind == "false":
        return [row.flag] if value is False else []
    raise AssertionError(f"unknown row kind {row.kind!r}")


def unsupported_reasons(spec: Mapping[str, Any]) -> list[str]:
    """Why the server cannot run this spec today (empty = it can)."""
    return [
        row.unsupported for row in FLAG_TABLE if row.unsupported and row_args(row, get_path(spec, row.field))
    ]


def table_flags() -> set[str]:
    return {row.flag for row in FLAG_TABLE} | set(FIXED_FLAGS)


# Flags the operator always sets from the pod layout; spec.engine.extraArgs may not repeat them.
FIXED_FLAGS = (
    "--host",
    "--port",
    "--expected-sha256",
    "--request-log-jsonl",
    "--request-log-max-mib",
    "--request-log-keep",
    "--metrics-vllm-aliases",
    "--shutdown-timeout-s",
    "--api-key",
    "--api-key-file",
)
DEFAULT_DRAIN_S = 600  # spec.drainSeconds: how long a stopping replica may finish the streams it admitted


def server_args(
    spec: Mapping[str, Any], artifact_path: str, request_log: str, *, inference_pool: bool
) -> list[str]:
    """`ninfer-serve` command line: the table's rows, the pod layout, then `engine.extraArgs` verbatim."""
    sha = str(get_path(spec, "model.artifact.sha256"))
    args = ["ninfer-serve", artifact_path, "--host", "0.0.0.0", "--port", str(SERVER_PORT)]
    for row in FLAG_TABLE:
        args += row_args(row, get_path(spec, row.field))
    # NOTE: the server re-checks the digest itself: hostPath/PVC contents can change after the Job ran.
    args += ["--expected-sha256", sha, "--request-log-jsonl", request_log]
    args += ["--request-log-max-mib", str(REQUEST_LOG_MAX_MIB), "--request-log-keep", str(REQUEST_LOG_KEEP)]
    # on SIGTERM the server stops admitting (/ready 503) and lets admitted streams finish this long
    args += ["--shutdown-timeout-s", str(drain_seconds(spec))]
    if inference_pool:  # the endpoint picker reads the vLLM names of the queue and KV gauges
        args.append("--metrics-vllm-aliases")
    # NOTE: the API key reaches the server as $NINFER_API_KEY from the Secret (resources.server_env), never
    # on the command line, where `ps` and the pod spec would show it.
    args += [str(a) for a in get_path(spec, "engine.extraArgs") or []]
    return args


def drain_seconds(spec: Mapping[str, Any]) -> int:
    return int(get_path(spec, "drainSeconds") or DEFAULT_DRAIN_S)


def extra_args_errors(spec: Mapping[str, Any]) -> list[str]:
    owned = table_flags()
    errors = []
    for arg in get_path(spec, "engine.extraArgs") or []:
        flag = str(arg).split("=", 1)[0]
        if flag in owned:
            errors.append(f"engine.extraArgs repeats {flag}, which the operator sets from the spec")
    return errors

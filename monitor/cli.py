"""`ninfer-monitor`: the monitoring sidecar (see monitor/sidecar/). Every flag has a `MONITOR_*` variable
(`--stats-url` -> `MONITOR_STATS_URL`); a flag given on the command line wins over the variable."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

from monitor.sidecar.server import Monitor, MonitorConfig

DEFAULTS = MonitorConfig()


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    def default(flag: str, value: object) -> object:
        return env.get("MONITOR_" + flag.upper().replace("-", "_"), value)

    p = argparse.ArgumentParser(prog="ninfer-monitor", description=__doc__.split("\n")[0])
    p.add_argument("--port", type=int, default=default("port", DEFAULTS.port), help="0 = pick a free port")
    p.add_argument("--bind", default=default("bind", DEFAULTS.bind), help="address to listen on")
    p.add_argument(
        "--server-url", default=default("server-url", DEFAULTS.server_url), help="ninfer-serve base URL"
    )
    p.add_argument(
        "--stats-url", default=default("stats-url", None), help="base URL of /stats (default: server-url)"
    )
    p.add_argument(
        "--jsonl", type=Path, default=default("jsonl", None), help="the server's --request-log-jsonl"
    )
    p.add_argument(
        "--interval", type=float, default=default("interval", DEFAULTS.interval), help="seconds per poll"
    )
    p.add_argument("--samples", type=int, default=default("samples", DEFAULTS.samples), help="samples kept")
    p.add_argument(
        "--window", type=float, default=default("window", DEFAULTS.window), help="aggregate window, s"
    )
    p.add_argument("--stats-timeout", type=float, default=default("stats-timeout", DEFAULTS.stats_timeout))
    p.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], default=default("log-level", "info")
    )
    return p


def parse_config(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> MonitorConfig:
    """Flags over `MONITOR_*` variables over defaults; exits with status 2 and the reason on bad input."""
    parser = build_parser(os.environ if env is None else env)
    args = parser.parse_args(argv)
    try:
        return MonitorConfig(
            port=int(args.port),
            bind=str(args.bind),
            server_url=str(args.server_url),
            stats_url=args.stats_url,
            jsonl=Path(args.jsonl) if args.jsonl else None,
            interval=float(args.interval),
            samples=int(args.samples),
            window=float(args.window),
            stats_timeout=float(args.stats_timeout),
        )
    except ValueError as exc:  # also a MONITOR_* value that is not a number
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_config(argv)
    level = (os.environ.get("MONITOR_LOG_LEVEL") or "info").upper()
    if argv is not None and "--log-level" in argv:
        level = argv[list(argv).index("--log-level") + 1].upper()
    logging.basicConfig(level=level, format="%(asctime)s.%(msecs)03d  %(levelname)s  %(message)s",
                        datefmt="%Y-%m-%d %H:%M:%S")  # fmt: skip
    try:
        monitor = Monitor(config)
    except OSError as exc:
        print(
            f"ninfer-monitor: cannot listen on {config.bind}:{config.port}: {exc.strerror}", file=sys.stderr
        )
        return 1
    done = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    monitor.start()
    logging.getLogger("ninfer.monitor").info(
        "ninfer-monitor on http://%s:%d/ (stats %s, log %s, every %.1fs)",
        config.bind,
        monitor.port,
        config.stats_endpoint,
        config.jsonl,
        config.interval,
    )
    done.wait()
    monitor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

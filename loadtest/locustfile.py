"""Locust entry for every NInfer load profile. Run it through `loadtest/run.py` (which sets the variables
below and runs the `locust` CLI headless), or directly:

    NINFER_LOAD_PROFILE=chat_mix locust -f loadtest/locustfile.py --headless -u 4 -r 4 -t 30s \
        --host http://127.0.0.1:8080

Environment:
    NINFER_LOAD_PROFILE   agent_sessions_long | park_resume | shared_prefix_fanout | prefill_ladder |
                          chat_mix | rate_sweep (default chat_mix)
    NINFER_LOAD_SCALE     a key of the scenario's "scales" (default demo)
    NINFER_LOAD_SCENARIO  scenario JSON (default loadtest/scenarios/<profile>.json)
    NINFER_LOAD_PARAMS    JSON object overriding scenario params (e.g. {"context_tokens": 2000})
    NINFER_LOAD_RESULTS   results folder (default loadtest/results/<profile>-<scale>)
    NINFER_LOAD_SEED      integer seed for the synthetic prompts (default 0)
    NINFER_LOAD_MODEL     model name to send (default: the first of GET /v1/models)

Results (written when the test stops): records.jsonl, summary.json, summary.csv (loadtest/report.py).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import gevent
import profiles
from locust import events
from locust.env import Environment
from report import summarize, write_results

HERE = Path(__file__).resolve().parent
PROFILE = os.environ.get("NINFER_LOAD_PROFILE", "chat_mix")
SCALE = os.environ.get("NINFER_LOAD_SCALE", "demo")
SCENARIO_PATH = Path(os.environ.get("NINFER_LOAD_SCENARIO") or HERE / "scenarios" / f"{PROFILE}.json")
RESULTS = Path(os.environ.get("NINFER_LOAD_RESULTS") or HERE / "results" / f"{PROFILE}-{SCALE}")

if PROFILE not in profiles.PROFILES:
    raise SystemExit(f"NINFER_LOAD_PROFILE={PROFILE!r}: not one of {sorted(profiles.PROFILES)}")
_scenario = json.loads(SCENARIO_PATH.read_text())
_scale = _scenario["scales"][SCALE]
SETTINGS = profiles.Settings(
    profile=PROFILE,
    params={**_scale.get("params", {}), **json.loads(os.environ.get("NINFER_LOAD_PARAMS") or "{}")},
    seed=int(os.environ.get("NINFER_LOAD_SEED", "0")),
    model=os.environ.get("NINFER_LOAD_MODEL") or None,
    timeout_s=float(_scale.get("request_timeout_s", 120)),
)
profiles.configure(SETTINGS)

# Locust runs the User (and LoadTestShape) classes it finds in this module: expose only this profile's.
globals().update({cls.__name__: cls for cls in profiles.PROFILES[PROFILE]})

_started: list[float] = []
_stopped: list[float] = []


@events.test_start.add_listener
def _on_start(environment: Environment, **_: Any) -> None:
    _started.append(time.time())
    profiles.mark_start()


@events.test_stop.add_listener
def _on_stop(environment: Environment, **_: Any) -> None:
    _stopped.append(time.time())


@events.quitting.add_listener
def _on_quit(environment: Environment, **_: Any) -> None:
    """Write the results once every user has stopped (after --stop-timeout)."""
    started = _started[0] if _started else time.time()
    stopped = _stopped[0] if _stopped else time.time()
    records = list(profiles.RECORDS)
    meta = {
        "profile": PROFILE,
        "scale": SCALE,
        "scenario": str(SCENARIO_PATH),
        "params": SETTINGS.params,
        "seed": SETTINGS.seed,
        "host": environment.host,
        "started_unix": started,
        "duration_s": stopped - started,
    }
    summary = summarize(records, _scale.get("slo", {}), meta)
    extras = profiles.EXTRAS.get(PROFILE)
    if extras is not None:
        extras(summary)
    write_results(RESULTS, records, summary)


# NOTE: importing the SDKs takes seconds before the gevent loop first runs; libev caches "now" per loop
# iteration, so without this refresh Locust's --run-time timer would fire that many seconds early.
gevent.get_hub().loop.update_now()

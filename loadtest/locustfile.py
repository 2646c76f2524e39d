"""Locust entry for every NInfer load profile: one User class per profile, selected the Locust way.

    locust -f loadtest/locustfile.py --list                      # the profiles, as User classes
    locust -f loadtest/locustfile.py ParkResume --headless -u 4 -r 4 -t 60s --host http://127.0.0.1:8080
    NINFER_LOAD_PROFILE=park_resume locust -f loadtest/locustfile.py --headless ...   # the same run

User class   profile (scenario loadtest/scenarios/<profile>.json)
  AgentSessionsLong    agent_sessions_long
  ParkResume           park_resume
  SharedPrefixFanout   shared_prefix_fanout
  PrefillLadder        prefill_ladder
  ChatMix              chat_mix (the default when neither a class nor NINFER_LOAD_PROFILE names one)
  RateSweep            rate_sweep (its RateSweepShape drives the users; it is off for every other profile)
Name one class (or set NINFER_LOAD_PROFILE); naming classes of two profiles is refused, since each profile
reads its own scenario. `loadtest/run.py` runs this file through the `locust` CLI for one or all profiles.

Environment:
    NINFER_LOAD_PROFILE   the profile when no User class is named (default chat_mix)
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gevent
import profiles
from locust import events
from locust.env import Environment
from report import summarize, write_results

HERE = Path(__file__).resolve().parent


class AgentSessionsLong(profiles.AgentSession):
    """agent_sessions_long: long agent sessions on a shared system prompt and a repository context."""


class ParkResume(profiles.ParkResumeSession):
    """park_resume: more sessions than lanes; later turns resume from host parking (or recompute)."""


class SharedPrefixFanout(profiles.SharedPrefixFanout):
    """shared_prefix_fanout: fresh questions on a few shared system prompts."""


class PrefillLadder(profiles.PrefillLadder):
    """prefill_ladder: uncached single turns climbing prompt sizes (TTFT against prompt length)."""


class ChatMix(profiles.ChatMix):
    """chat_mix: stateless chat turns from a weighted mix of sizes and APIs."""


class RateSweep(profiles.RateSweepUser):
    """rate_sweep: Poisson arrivals at stepped rates (goodput against load)."""


class RateSweepShape(profiles.RateSweepShape):
    """rate_sweep's stages; removed by `_select` for every other profile."""

    use_common_options = True  # -u/-r/-t are simply unused by it; no warning for the other profiles


PROFILE_CLASSES: dict[str, type] = {
    "agent_sessions_long": AgentSessionsLong,
    "park_resume": ParkResume,
    "shared_prefix_fanout": SharedPrefixFanout,
    "prefill_ladder": PrefillLadder,
    "chat_mix": ChatMix,
    "rate_sweep": RateSweep,
}
assert set(PROFILE_CLASSES) == set(profiles.PROFILES), "a profile without its User class"


@dataclass
class Run:
    profile: str = "chat_mix"
    scale: str = "demo"
    scenario_path: Path = HERE
    results: Path = HERE
    slo: dict[str, Any] = field(default_factory=dict)


RUN = Run()


def choose_profile(named: list[str], from_env: str | None) -> str:
    """The profile of the named User classes, else NINFER_LOAD_PROFILE, else chat_mix."""
    by_class = {cls.__name__: profile for profile, cls in PROFILE_CLASSES.items()}
    chosen = {by_class[n] for n in named if n in by_class}
    if len(chosen) > 1:
        raise SystemExit(f"User classes of several profiles named ({', '.join(sorted(named))}): name one")
    if from_env is not None and from_env not in PROFILE_CLASSES:
        raise SystemExit(f"NINFER_LOAD_PROFILE={from_env!r}: not one of {sorted(PROFILE_CLASSES)}")
    if chosen and from_env is not None and chosen != {from_env}:
        raise SystemExit(f"NINFER_LOAD_PROFILE={from_env} but the User class named is of {chosen.pop()}")
    return chosen.pop() if chosen else from_env or "chat_mix"


@events.init.add_listener
def _select(environment: Environment, **_: Any) -> None:
    """Run only the chosen profile's User class (and its shape), with its scenario's settings."""
    options = environment.parsed_options
    named = list(getattr(options, "user_classes", None) or [])
    profile = choose_profile(named, os.environ.get("NINFER_LOAD_PROFILE"))
    environment.user_classes = [PROFILE_CLASSES[profile]]
    if profile != "rate_sweep":
        environment.shape_class = None
    RUN.profile = profile
    RUN.scale = os.environ.get("NINFER_LOAD_SCALE", "demo")
    RUN.scenario_path = Path(os.environ.get("NINFER_LOAD_SCENARIO") or HERE / "scenarios" / f"{profile}.json")
    RUN.results = Path(os.environ.get("NINFER_LOAD_RESULTS") or HERE / "results" / f"{profile}-{RUN.scale}")
    scenario = json.loads(RUN.scenario_path.read_text())
    if RUN.scale not in scenario["scales"]:
        raise SystemExit(f"{profile}: no scale {RUN.scale!r} (have {sorted(scenario['scales'])})")
    scale = scenario["scales"][RUN.scale]
    RUN.slo = scale.get("slo", {})
    profiles.configure(
        profiles.Settings(
            profile=profile,
            params={**scale.get("params", {}), **json.loads(os.environ.get("NINFER_LOAD_PARAMS") or "{}")},
            seed=int(os.environ.get("NINFER_LOAD_SEED", "0")),
            model=os.environ.get("NINFER_LOAD_MODEL") or None,
            timeout_s=float(scale.get("request_timeout_s", 120)),
        )
    )


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
    settings = profiles.SETTINGS
    meta = {
        "profile": RUN.profile,
        "scale": RUN.scale,
        "scenario": str(RUN.scenario_path),
        "params": settings.params,
        "seed": settings.seed,
        "host": environment.host,
        "started_unix": started,
        "duration_s": stopped - started,
    }
    summary = summarize(records, RUN.slo, meta)
    extras = profiles.EXTRAS.get(RUN.profile)
    if extras is not None:
        extras(summary)
    write_results(RUN.results, records, summary)


# NOTE: importing the SDKs takes seconds before the gevent loop first runs; libev caches "now" per loop
# iteration, so without this refresh Locust's --run-time timer would fire that many seconds early.
gevent.get_hub().loop.update_now()

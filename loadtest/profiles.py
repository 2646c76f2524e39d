"""The Locust users of every profile, on one base (`NInferUser`) that streams through the official SDKs
and reports each request as Locust events plus a record for loadtest/report.py.

Locust events per request (`request_type`, `name` = "<profile>:<group>"):
    STREAM  response_time = E2E ms, response_length = output tokens (the failure row on errors)
    TTFT    response_time = time to first token, ms
    TPOT    response_time = (E2E - TTFT) / (output tokens - 1), ms (when >= 2 output tokens)
    ITL     one event per gap between token-carrying chunks, ms
    TOKENS  name "<...>:output" and "<...>:cached": response_time and response_length = the token count
"""

from __future__ import annotations

import itertools
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
from clients import StreamResult, stream_anthropic, stream_openai
from locust import LoadTestShape, User, between, task
from report import meets_slo
from text import code, prose, salt


@dataclass
class Settings:
    profile: str
    params: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    model: str | None = None
    timeout_s: float = 120.0


SETTINGS = Settings(profile="chat_mix")
RECORDS: list[dict[str, Any]] = []
_user_ids = itertools.count()
_t0: list[float] = []


def configure(settings: Settings) -> None:
    global SETTINGS
    SETTINGS = settings


def mark_start() -> None:
    _t0.append(time.time())


def param(name: str) -> Any:
    try:
        return SETTINGS.params[name]
    except KeyError:
        raise SystemExit(f"profile {SETTINGS.profile}: scenario param {name!r} is missing") from None


class NInferUser(User):
    abstract = True

    def on_start(self) -> None:
        self.user_id = next(_user_ids)
        self.rng = random.Random(SETTINGS.seed * 1_000_003 + self.user_id)
        key = os.environ.get("NINFER_API_KEY", "unused")
        host = (self.host or "").rstrip("/")
        self.openai = openai.OpenAI(
            base_url=f"{host}/v1", api_key=key, max_retries=0, timeout=SETTINGS.timeout_s
        )
        self.anthropic = anthropic.Anthropic(
            base_url=host, api_key=key, max_retries=0, timeout=SETTINGS.timeout_s
        )
        if SETTINGS.model is None:
            SETTINGS.model = self.openai.models.list().data[0].id

    def pick_api(self) -> str:
        api = str(SETTINGS.params.get("api", "openai"))
        if api == "mix":
            return "openai" if self.user_id % 2 == 0 else "anthropic"
        return api

    def send(
        self,
        api: str,
        messages: list[dict[str, Any]],
        max_tokens: int,
        *,
        system: str | None,
        group: str,
        **labels: Any,
    ) -> StreamResult | None:
        """Stream one request; fire the Locust events and keep a record. None on failure."""
        name = f"{SETTINGS.profile}:{group}"
        model = SETTINGS.model or "default"
        start = time.time()
        try:
            if api == "anthropic":
                result = stream_anthropic(self.anthropic, model, messages, max_tokens, system=system)
            else:
                full = ([{"role": "system", "content": system}] if system else []) + messages
                result = stream_openai(self.openai, model, full, max_tokens)
        except Exception as exc:  # reported as a failed request, the user carries on
            elapsed = time.time() - start
            self._fire("STREAM", name, elapsed * 1000, 0, exc)
            RECORDS.append(
                {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300], "api": api, "group": group,
                 "start": start, "end": time.time(), "e2e_s": elapsed, **labels}
            )  # fmt: skip
            return None
        self._fire("STREAM", name, result.e2e_s * 1000, result.output_tokens)
        if result.ttft_s is not None:
            self._fire("TTFT", name, result.ttft_s * 1000, result.prompt_tokens)
        if result.tpot_s is not None:
            self._fire("TPOT", name, result.tpot_s * 1000, result.output_tokens)
        for gap in result.itl_s:
            self._fire("ITL", name, gap * 1000, 0)
        self._fire("TOKENS", f"{name}:output", result.output_tokens, result.output_tokens)
        self._fire("TOKENS", f"{name}:cached", result.cached_tokens, result.cached_tokens)
        RECORDS.append(
            {
                "ok": True,
                "api": api,
                "group": group,
                "start": result.start,
                "end": result.start + result.e2e_s,
                "ttft_s": result.ttft_s,
                "tpot_s": result.tpot_s,
                "itl_s": result.itl_s,
                "e2e_s": result.e2e_s,
                "output_tokens": result.output_tokens,
                "prompt_tokens": result.prompt_tokens,
                "cached_tokens": result.cached_tokens,
                "finish_reason": result.finish_reason,
                **labels,
            }
        )
        return result

    def _fire(
        self, kind: str, name: str, value: float, length: int, exc: BaseException | None = None
    ) -> None:
        self.environment.events.request.fire(
            request_type=kind,
            name=name,
            response_time=value,
            response_length=length,
            exception=exc,
            context={"profile": SETTINGS.profile},
        )


def _tenant_prompt(tenant: int, num_tokens: int) -> str:
    """The shared system prompt of a tenant: identical for every session of that tenant."""
    rng = random.Random(SETTINGS.seed * 7919 + tenant)
    return f"You are coding agent #{tenant}. Follow the house rules.\n" + prose(num_tokens, rng)


class AgentSession(NInferUser):
    """One user = one agent session: shared system prompt (per tenant), a large repository context, then
    turns of tool output in and an answer out, with think time between turns. After `turns` turns (or a
    failed turn) the user starts a fresh session with a new repository context."""

    def wait_time(self) -> float:
        lo, hi = param("think_time_s")
        return self.rng.uniform(float(lo), float(hi))

    def on_start(self) -> None:
        super().on_start()
        self.num_sessions = 0
        self.new_session()

    def new_session(self) -> None:
        self.num_sessions += 1
        self.session = f"u{self.user_id}s{self.num_sessions}"
        self.api = self.pick_api()
        tenant = self.user_id % int(param("num_tenants"))
        self.system = _tenant_prompt(tenant, int(param("system_tokens")))
        repo = code(int(param("context_tokens")), self.rng)
        task_text = prose(int(SETTINGS.params.get("task_tokens", 32)), self.rng)
        self.messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"{salt(self.rng)} Repository:\n{repo}\n\nTask: {task_text}"}
        ]
        self.turn = 0

    def kind(self) -> str | None:
        return None

    @task
    def next_turn(self) -> None:
        result = self.send(
            self.api,
            self.messages,
            int(param("answer_tokens")),
            system=self.system,
            group=f"turn {self.turn}",
            turn=self.turn,
            session=self.session,
            kind=self.kind(),
        )
        if result is None:
            self.new_session()
            return
        tool = code(int(param("tool_tokens")), self.rng)
        self.messages += [
            {"role": "assistant", "content": result.text or "Running the tool."},
            {"role": "user", "content": f"Tool output:\n{tool}"},
        ]
        self.turn += 1
        if self.turn >= int(param("turns")):
            self.new_session()


class ParkResumeSession(AgentSession):
    """More sessions than lanes and KV capacity: while one session thinks, the others' prefills evict its
    lane and cache, so its next turn resumes (from host parking when enabled, else recomputed). Records
    are labelled `kind` = cold (turn 0) or resumed (later turns)."""

    def kind(self) -> str | None:
        return "cold" if self.turn == 0 else "resumed"


class SharedPrefixFanout(NInferUser):
    """`num_groups` system prompts, each shared by the users assigned to it; every request is a fresh
    short question on that prefix (inference-perf `shared_prefix`)."""

    wait_time = between(0.0, 0.2)

    @task
    def ask(self) -> None:
        group = self.user_id % int(param("num_groups"))
        question = f"{salt(self.rng)} {prose(int(param('question_tokens')), self.rng)}"
        self.send(
            self.pick_api(),
            [{"role": "user", "content": question}],
            int(param("output_tokens")),
            system=_tenant_prompt(1000 + group, int(param("system_tokens"))),
            group=f"prefix {group}",
        )


class PrefillLadder(NInferUser):
    """Single turns climbing `rungs` prompt sizes (then starting over), with a unique salt first so nothing
    is served from the prefix cache: TTFT against prompt length."""

    wait_time = between(0.0, 0.0)

    def on_start(self) -> None:
        super().on_start()
        self.rung = 0

    @task
    def climb(self) -> None:
        rungs = [int(r) for r in param("rungs")]
        size = rungs[self.rung % len(rungs)]
        self.rung += 1
        prompt = f"{salt(self.rng)}\n{code(size, self.rng)}\nSummarize the code above."
        self.send(
            self.pick_api(),
            [{"role": "user", "content": prompt}],
            int(param("output_tokens")),
            system=None,
            group=f"{size:>7} tokens",
            rung=size,
        )


class ChatMix(NInferUser):
    """Stateless chat turns drawn from a weighted mix of (prompt, output) sizes and APIs."""

    wait_time = between(0.0, 0.5)

    @task
    def chat(self) -> None:
        mix: list[Mapping[str, Any]] = param("mix")
        entry = self.rng.choices(mix, weights=[float(m.get("weight", 1)) for m in mix])[0]
        prompt = f"{salt(self.rng)} {prose(int(entry['prompt_tokens']), self.rng)}"
        self.send(
            str(entry.get("api") or self.pick_api()),
            [{"role": "user", "content": prompt}],
            int(entry["output_tokens"]),
            system="You are a helpful assistant.",
            group=str(entry["name"]),
        )


def _stage_at(elapsed: float) -> tuple[int, Mapping[str, Any]] | None:
    stages: list[Mapping[str, Any]] = param("stages")
    end = 0.0
    for index, stage in enumerate(stages):
        end += float(stage["duration_s"])
        if elapsed < end:
            return index, stage
    return None


class RateSweepUser(NInferUser):
    """Poisson arrivals at each stage's aggregate `rate` (req/s), split over the users; a user still busy
    with a request delays its next arrival, so saturation shows as falling goodput."""

    def wait_time(self) -> float:
        elapsed = time.time() - (_t0[-1] if _t0 else time.time())
        current = _stage_at(elapsed)
        if current is None:
            return 0.1
        runner = self.environment.runner
        rate = float(current[1]["rate"]) / max(1, runner.user_count if runner is not None else 1)
        remaining = sum(float(s["duration_s"]) for s in param("stages")) - elapsed
        return min(self.rng.expovariate(rate), remaining + 0.05)  # never sleep past the last stage

    @task
    def request(self) -> None:
        current = _stage_at(time.time() - (_t0[-1] if _t0 else time.time()))
        if current is None:
            return
        index, stage = current
        prompt = f"{salt(self.rng)} {prose(int(param('prompt_tokens')), self.rng)}"
        self.send(
            self.pick_api(),
            [{"role": "user", "content": prompt}],
            int(param("output_tokens")),
            system=None,
            group=f"stage {index} @ {float(stage['rate']):g} rps",
            stage=index,
            rate=float(stage["rate"]),
        )


class RateSweepShape(LoadTestShape):
    """`users` users for the sum of the stage durations, then stop."""

    def tick(self) -> tuple[int, float] | None:
        total = sum(float(s["duration_s"]) for s in param("stages"))
        if self.get_run_time() >= total:
            return None
        users = int(param("users"))
        return users, float(users)


def _park_resume_extras(summary: dict[str, Any]) -> None:
    kinds = summary.get("by_kind", {})
    cold = (kinds.get("cold") or {}).get("ttft_s", {}).get("p50")
    resumed = (kinds.get("resumed") or {}).get("ttft_s", {}).get("p50")
    summary["resumed_vs_cold_ttft_p50"] = resumed / cold if cold and resumed is not None else None


def _rate_sweep_extras(summary: dict[str, Any]) -> None:
    """The highest stage rate whose share of requests meeting every SLO reaches `goodput_target`."""
    target = float(SETTINGS.params.get("goodput_target", 0.9))
    best = None
    for rate in sorted({float(r["rate"]) for r in RECORDS if r.get("rate") is not None}):
        stage = [r for r in RECORDS if r.get("rate") == rate]
        if sum(1 for r in stage if meets_slo(r, summary.get("slo", {}))) >= target * len(stage):
            best = rate
    summary["goodput_target"] = target
    summary["max_rate_meeting_slo"] = best


PROFILES: dict[str, tuple[type, ...]] = {
    "agent_sessions_long": (AgentSession,),
    "park_resume": (ParkResumeSession,),
    "shared_prefix_fanout": (SharedPrefixFanout,),
    "prefill_ladder": (PrefillLadder,),
    "chat_mix": (ChatMix,),
    "rate_sweep": (RateSweepUser, RateSweepShape),
}
EXTRAS: dict[str, Callable[[dict[str, Any]], None]] = {
    "park_resume": _park_resume_extras,
    "rate_sweep": _rate_sweep_extras,
}

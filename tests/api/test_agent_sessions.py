"""Concurrent agent sessions on a KV pool that holds one context, with host parking (real server, official SDKs).

Three sessions (Chat Completions with tool messages and Responses with function_call / function_call_output
items, both without an output limit, and Anthropic Messages with tool_use / tool_result blocks) each resend
their whole conversation plus a tool result and a new message every turn, streamed. The pool (`--kv-capacity` =
`--max-context`, four pages) holds one session at a time, so sessions are parked to host RAM between turns, and
the two sessions without a limit, both growing to the context, preempt each other while decoding. Per turn:

- `cached_tokens` / `cache_read_input_tokens` is the whole previous conversation: the previous prompt up to its
  last message, only its generation prompt (`<|im_start|>assistant\\n` and thinking tags, under 8 tokens) is
  computed again, also for a session preempted mid-turn and resumed from the host;
- greedy outputs equal the same conversation on a server with a large pool (no eviction, no parking);
- /metrics prefix hits and prompt tokens by source add up to the reported cached tokens, and /stats parking,
  restore and preemption counters match /metrics; preempted sessions recompute nothing.

Then a stream cut mid-way leaves no page behind: with nothing running, the pages in use are the checkpoints'.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest
from api_helpers import VENV_BIN, Server, free_port, start_server, stop_server

MODEL = "agent"
CONTEXT = 256
TURNS = 3
SHORT = 24  # max tokens of the sessions that set one
Turn = dict[str, Any]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Server]]:
    """(pressured, roomy): a pool of one context with host parking, and a large pool without (started together)."""
    root = tmp_path_factory.mktemp("agent_sessions")
    flags = {
        "pressured": ["--kv-capacity", str(CONTEXT), "--host-kv-cache-mib", "64"],  # four 64-token pages
        "roomy": ["--kv-capacity", str(64 * CONTEXT)],
    }

    def start(name: str) -> Server:
        port = free_port()
        cmd = [str(VENV_BIN / "ninfer-serve"), "--port", str(port), "--model-id", MODEL, "--max-context",
               str(CONTEXT), "--max-concurrency", "3", "--greedy", "--log-stats-interval-ms", "0", *flags[name]]  # fmt: skip
        url, process = start_server(cmd, root / f"{name}.log", port)
        return Server(url, process, root / f"{name}.log")

    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(start, flags))
    yield started[0], started[1]
    for server in started:
        stop_server(server.process)


def _system(s: int) -> str:
    return f"Agent {s} here: a careful coding assistant that reads files with its tool before answering."


def _result(s: int, t: int) -> str:
    return f"def f{s}{t}(x):\n    return x + {s * 10 + t}\n"


def _args(s: int, t: int) -> str:
    return json.dumps({"path": f"m{s}{t}.py"})


def chat(url: str, s: int) -> list[Turn]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    messages: list[Any] = [
        {"role": "system", "content": _system(s)},
        {"role": "user", "content": "Fix the bug."},
    ]
    turns = []
    for t in range(TURNS):
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, stream=True, temperature=0,
                                                     stream_options={"include_usage": True}))  # fmt: skip
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
        text = "".join(d.content or "" for d in deltas) + "|" + reasoning
        usage = chunks[-1].usage
        assert usage is not None and usage.prompt_tokens_details is not None
        turns.append(
            {"prompt": usage.prompt_tokens, "cached": usage.prompt_tokens_details.cached_tokens, "text": text}
        )
        call = {
            "id": f"call_{t}",
            "type": "function",
            "function": {"name": "read_file", "arguments": _args(s, t)},
        }
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{t}", "content": _result(s, t)},
            {"role": "user", "content": f"Turn {t + 1}: the next file."},
        ]  # fmt: skip
    return turns


def responses(url: str, s: int) -> list[Turn]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    items: list[Any] = [{"type": "message", "role": "user", "content": "Fix the bug."}]
    turns = []
    for t in range(TURNS):
        events = list(client.responses.create(model=MODEL, instructions=_system(s), input=items, stream=True,
                                              temperature=0, store=False))  # fmt: skip
        final = next(e.response for e in events if e.type in ("response.completed", "response.incomplete"))
        assert final.usage is not None
        text = json.dumps([item.model_dump(exclude_none=True, exclude={"id"}) for item in final.output])
        turns.append({"prompt": final.usage.input_tokens, "cached": final.usage.input_tokens_details.cached_tokens,
                      "text": text})  # fmt: skip
        items += [item.model_dump(exclude_none=True, exclude={"status"}) for item in final.output]
        items += [
            {"type": "function_call", "call_id": f"call_{t}", "name": "read_file", "arguments": _args(s, t)},
            {"type": "function_call_output", "call_id": f"call_{t}", "output": _result(s, t)},
            {"type": "message", "role": "user", "content": f"Turn {t + 1}: the next file."},
        ]  # fmt: skip
    return turns


def messages(url: str, s: int) -> list[Turn]:
    client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0, timeout=120)
    history: list[Any] = [{"role": "user", "content": "Fix the bug."}]
    turns = []
    for t in range(TURNS):
        with client.messages.stream(
            model=MODEL, system=_system(s), messages=history, max_tokens=SHORT
        ) as stream:
            final = stream.get_final_message()
        cached = final.usage.cache_read_input_tokens or 0
        text = "".join(b.text for b in final.content if b.type == "text")
        turns.append({"prompt": final.usage.input_tokens + cached, "cached": cached, "text": text})
        tool_use = {
            "type": "tool_use",
            "id": f"toolu_{t}",
            "name": "read_file",
            "input": json.loads(_args(s, t)),
        }
        history += [
            {"role": "assistant", "content": [{"type": "text", "text": text}, tool_use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{t}", "content": _result(s, t)},
                                         {"type": "text", "text": f"Turn {t + 1}: the next file."}]},
        ]  # fmt: skip
    return turns


SESSIONS: tuple[Callable[[str, int], list[Turn]], ...] = (chat, responses, messages)


def _run_sessions(url: str) -> list[list[Turn]]:
    results: list[Any] = [None] * len(SESSIONS)

    def run(s: int) -> None:
        try:
            results[s] = SESSIONS[s](url, s)
        except Exception as exc:  # reported by the assertion below, with the session
            results[s] = exc

    threads = [threading.Thread(target=run, args=(s,)) for s in range(len(SESSIONS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for s, result in enumerate(results):
        assert isinstance(result, list), f"session {SESSIONS[s].__name__}: {result!r}"
    return results


def _usage(turns: list[Turn]) -> list[tuple[int, int]]:
    return [(t["prompt"], t["cached"]) for t in turns]


def _metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics").text
    return {name: float(value) for name, value in re.findall(r"^(ninfer_\S+) (\S+)$", text, re.MULTILINE)}


def _idle(url: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        stats = httpx.get(f"{url}/stats").json()["engine"]
        if not (stats["num_running"] or stats["num_waiting"]) or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


@pytest.mark.slow
def test_agent_sessions_stay_warm_on_a_pool_of_one_context(servers: tuple[Server, Server]) -> None:
    pressured, roomy = servers
    with ThreadPoolExecutor(2) as pool:  # the two servers side by side (each mostly waits on one core)
        got, want = pool.map(_run_sessions, (pressured.url, roomy.url))
    stats, metrics = _idle(pressured.url), _metrics(pressured.url)
    for s, (turns, reference) in enumerate(zip(got, want, strict=True)):
        name = SESSIONS[s].__name__
        assert [t["text"] for t in turns] == [t["text"] for t in reference], f"{name}: greedy output differs"
        assert turns[0]["cached"] == 0, name
        for previous, turn in zip(turns, turns[1:], strict=False):
            # the whole previous conversation, short of its generation prompt
            assert previous["prompt"] - 8 <= turn["cached"] < previous["prompt"], (name, _usage(turns), stats)
    assert stats["num_preemptions"] >= 1 and stats["num_recomputed_tokens"] == 0
    assert stats["host_kv_parks"] >= 1 and stats["host_kv_restores"] >= 1
    cached = sum(t["cached"] for turns in got for t in turns)
    by_source = 'ninfer_prompt_tokens_by_source_total{source="%s"}'
    assert metrics["ninfer_prefix_cache_hits_total"] == cached
    assert metrics[by_source % "device_cache"] + metrics[by_source % "host_cache"] == cached
    assert metrics[by_source % "host_cache"] > 0  # sessions came back from host RAM
    assert metrics['ninfer_prefix_reuse_path_total{path="host_restore"}'] <= stats["host_kv_restores"]
    assert metrics["ninfer_host_kv_restores_total"] == stats["host_kv_restores"]
    assert metrics["ninfer_host_kv_parks_total"] == stats["host_kv_parks"]
    assert metrics["ninfer_scheduler_preemptions_total"] == stats["num_preemptions"]

    client = openai.OpenAI(base_url=pressured.v1, api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Talk."}], stream=True
    )
    for n, _chunk in enumerate(stream):
        if n == 3:
            break
    stream.close()  # the client goes away mid-stream
    stats = _idle(pressured.url)
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["num_requests_finished"].get("aborted") == 1
    assert stats["num_pages_used"] == stats["num_pages_cached"] > 0  # every page in use is a checkpoint's
    # ... and only theirs: an idle pool is free to admission (eviction reclaims them), its load metric 0
    assert stats["num_pages_reclaimable"] == stats["num_pages_used"]
    assert _metrics(pressured.url)["ninfer_kv_cache_usage_ratio"] == 0.0

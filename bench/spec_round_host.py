"""Host time of one speculative round (`--spec mtp`), split by phase, on the tiny model (CPU or CUDA).

The model is the tiny test model's geometry with random weights and a small vocabulary (``--vocab``). A round
is what ``ninfer-bench --spec-rounds K`` times: ``ModelRunner.execute`` of one verify row per lane (its
last token and K drafts), then the bench's own loop building the next plan. Each phase below is timed
exclusively (a phase's time leaves out the phases nested in it):

    forward        the static path's forwards (verify, catch-up, chained drafts): one graph replay each on CUDA
    fill           SpecInputs.fill: the Python that builds a forward's inputs, and their upload
    logits         the target head over the verified positions (compute_logits), the draft head outside the
                   draft graph (the first draft) and the argmax / processed distribution over the vocabulary
    verdict        engine.spec.verify.verify: acceptance (greedy: the argmax and its host copy); 0 on the one-wait
                   round (engine/runner/spec_round.py, ``--one-wait on``, the default), whose host work is in spec_run
    rollback       SpecExecutor._roll_back (the snapshot copies)
    drafter        MtpDrafter.advance minus the above (pair lists, hidden gathers, the drafts' host copy)
    spec_run       SpecExecutor.run minus the above (grouping, positions, DraftRows, the outcome)
    runner         ModelRunner.execute minus the above (the StepResult)
    bench_loop     the rest of the round (the next RowPlans)

Everything but ``forward`` and ``logits`` is host work; ``device_idle_host_us_per_round`` is the part of it a
CUDA round's device sits idle through (CriticalPath: between the verdict's host copy and the catch-up's launch,
``mid``, and between the drafts' host copy and the next verify's launch, ``end``; the one-wait round has no
``mid``). ``--sync-counts`` adds the host reads per round (``.tolist()``,
``.item()``, ``.cpu()``) and the blocking host -> device copies (``torch.tensor(..., device=...)`` other than
through ``engine.transfer.upload``, and indexing a tensor with a host list), by caller.

    PYTHONPATH=. python3 bench/spec_round_host.py [--arch dense|moe] [--k 3] [--concurrency 1,8]
                                                  [--rounds 200] [--device cpu] [--json OUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import engine.runner.speculative as speculative
import engine.spec.mtp as mtp
import engine.spec.verify as verify_module
from engine.model.config import ModelConfig
from engine.spec.graphs import SpecGraphs, SpecInputs
from engine.spec.mtp import MtpDrafter
from engine.testing.bench.spec import make_spec_runner, run_spec_rounds
from engine.testing.synthetic import build_synthetic
from engine.testing.tiny import tiny_hf_config

PHASES = ("forward", "fill", "logits", "verdict", "rollback", "drafter", "spec_run", "runner")


class PhaseClock:
    """Exclusive CPU time of this thread per phase (steadier than wall time on a shared machine): entering a
    phase pauses the one it is nested in."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = collections.defaultdict(float)
        self._stack: list[list[Any]] = []  # [phase, start]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        now = time.thread_time()
        if self._stack:
            outer = self._stack[-1]
            self.totals[outer[0]] += now - outer[1]
        self._stack.append([name, now])
        try:
            yield
        finally:
            end = time.thread_time()
            inner = self._stack.pop()
            self.totals[inner[0]] += end - inner[1]
            if self._stack:
                self._stack[-1][1] = end

    def wrap(self, owner: Any, attr: str, name: str) -> None:
        real = getattr(owner, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.phase(name):
                return real(*args, **kwargs)

        setattr(owner, attr, timed)


class CriticalPath:
    """The host's work a CUDA round waits on: from the verdict's host copy to the catch-up's launch (``mid``) and
    from the drafts' host copy to the next verify's launch (``end``); the device idles through both (thread CPU
    microseconds, summed over the rounds)."""

    def __init__(self) -> None:
        self.gaps: dict[str, float] = collections.defaultdict(float)
        self._open: dict[str, float] = {}

    def mark_done(self, what: str) -> None:
        self._open[what] = time.thread_time()

    def launched(self, kind: str) -> None:
        gap, after = ("mid", "verdict") if kind == "catch_up" else ("end", "drafts")
        if kind in ("catch_up", "target") and after in self._open:
            self.gaps[gap] += time.thread_time() - self._open.pop(after)


CLOCK, PATH = PhaseClock(), CriticalPath()


def _instrument_classes() -> None:
    """Wrap the round's phases (once per process: class attributes)."""
    CLOCK.wrap(SpecInputs, "fill", "fill")
    real_fn, real_run = SpecGraphs._fn, SpecGraphs._run

    def fn(self: SpecGraphs, key: Any) -> Callable[[], Any]:
        inner = real_fn(self, key)
        return lambda: _timed_call(inner)

    def run(self: SpecGraphs, key: Any, *args: Any, **kwargs: Any) -> Any:
        PATH.launched(key[0])
        return real_run(self, key, *args, **kwargs)

    setattr(SpecGraphs, "_fn", fn)  # noqa: B010
    setattr(SpecGraphs, "_run", run)  # noqa: B010
    CLOCK.wrap(mtp, "proposal_logits", "logits")
    CLOCK.wrap(verify_module, "processed_distribution", "logits")
    CLOCK.wrap(speculative, "verify", "verdict")
    CLOCK.wrap(speculative.SpecExecutor, "_roll_back", "rollback")
    CLOCK.wrap(MtpDrafter, "advance", "drafter")
    CLOCK.wrap(speculative.SpecExecutor, "run", "spec_run")
    real_verify, real_propose = speculative.verify, MtpDrafter._propose_on_device

    def verify(*args: Any, **kwargs: Any) -> Any:
        out = real_verify(*args, **kwargs)
        PATH.mark_done("verdict")
        return out

    def propose(*args: Any, **kwargs: Any) -> Any:
        out = real_propose(*args, **kwargs)
        PATH.mark_done("drafts")
        return out

    real_one_wait = speculative.run_one_wait

    def one_wait(*args: Any, **kwargs: Any) -> Any:  # its one copy is the last thing it waits for
        out = real_one_wait(*args, **kwargs)
        PATH.mark_done("drafts")
        return out

    setattr(speculative, "verify", verify)  # noqa: B010
    setattr(MtpDrafter, "_propose_on_device", propose)  # noqa: B010
    setattr(speculative, "run_one_wait", one_wait)  # noqa: B010


_instrument_classes()


def _instrument(runner: Any) -> None:
    CLOCK.wrap(runner.model, "compute_logits", "logits")
    CLOCK.wrap(runner, "execute", "runner")


def _timed_call(fn: Callable[[], Any]) -> Any:
    with CLOCK.phase("forward"):
        return fn()


class SyncCounter:
    """Host reads and blocking uploads per caller (file:line of the engine frame that made them)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        self.active = False

    def _where(self) -> str:
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "/engine/" in frame.filename and "/engine/testing/" not in frame.filename:
                return f"{frame.filename.split('/engine/')[-1]}:{frame.lineno}"
        return "?"

    def install(self) -> None:
        self._saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "item", "cpu")}
        self._saved_tensor = torch.tensor
        for name in ("tolist", "item", "cpu"):
            real = getattr(torch.Tensor, name)

            def read(self_: torch.Tensor, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                if self.active:
                    self.counts[f"{_name} {self._where()}"] += 1
                return _real(self_, *args, **kw)

            setattr(torch.Tensor, name, read)
        real_tensor = torch.tensor

        def tensor(*args: Any, **kw: Any) -> torch.Tensor:
            if self.active and kw.get("device") is not None:
                self.counts[f"torch.tensor(device=) {self._where()}"] += 1
            return real_tensor(*args, **kw)

        setattr(torch, "tensor", tensor)  # noqa: B010 (mypy: torch.tensor is not assignable)
        real_getitem = torch.Tensor.__getitem__

        def getitem(self_: torch.Tensor, index: Any) -> Any:
            if self.active and isinstance(index, list):  # a host list index is uploaded with a stream sync
                self.counts[f"tensor[list] {self._where()}"] += 1
            return real_getitem(self_, index)

        self._saved["__getitem__"] = real_getitem
        setattr(torch.Tensor, "__getitem__", getitem)  # noqa: B010

    def uninstall(self) -> None:
        for name, real in self._saved.items():
            setattr(torch.Tensor, name, real)
        setattr(torch, "tensor", self._saved_tensor)  # noqa: B010


def tiny_model(arch: str, vocab: int, device: str) -> Any:
    """The tiny test model's geometry (engine/testing/tiny.py) with `vocab` rows, random weights, its MTP head."""
    hf = tiny_hf_config(arch)
    hf.update(vocab_size=vocab, eos_token_id=vocab - 2, pad_token_id=vocab - 1)
    return build_synthetic(ModelConfig.from_hf(hf), device=device, dtype=torch.float32, with_mtp=True)


def measure(
    arch: str,
    k: int,
    concurrency: int,
    rounds: int,
    device: str,
    syncs: bool,
    vocab: int,
    one_wait: bool = True,
) -> dict[str, Any]:
    model = tiny_model(arch, vocab, device)
    context = 64
    max_context = context + (rounds + 8) * (k + 1)
    runner = make_spec_runner(model, concurrency * -(-max_context // 64) + 1, concurrency, "bf16", k, max_context,
                              cuda_graph=device == "cuda")  # fmt: skip
    assert runner.spec is not None
    runner.spec.one_wait = one_wait
    clock = CLOCK
    _instrument(runner)
    run_spec_rounds(runner, model.config.vocab_size, concurrency, context, 0, 5, k)  # warm-up
    counter = SyncCounter()
    if syncs:
        counter.install()
    clock.totals.clear()
    PATH.gaps.clear()
    counter.active = True
    start = time.thread_time()
    wall_start = time.perf_counter()
    got = run_spec_rounds(runner, model.config.vocab_size, concurrency, context, 0, rounds, k)
    cpu, wall = time.thread_time() - start, time.perf_counter() - wall_start
    counter.active = False
    if syncs:
        counter.uninstall()
    per_round = {p: round(clock.totals[p] / rounds * 1e6, 1) for p in PHASES}
    per_round["bench_loop"] = round((cpu - sum(clock.totals.values())) / rounds * 1e6, 1)
    host = sum(v for p, v in per_round.items() if p not in ("forward", "logits"))
    return {
        "arch": arch, "vocab": vocab, "one_wait": one_wait, "k": k, "concurrency": concurrency, "rounds": rounds, "device": device,
        "round_us": round(cpu / rounds * 1e6, 1), "round_wall_us": round(wall / rounds * 1e6, 1), "host_us_excluding_forward_and_logits": round(host, 1),
        "phase_us_per_round": per_round,
        "device_idle_host_us_per_round": {g: round(PATH.gaps[g] / rounds * 1e6, 1) for g in ("mid", "end")},
        "tokens_per_round": got["tokens_per_round"],
        "syncs_per_round": {where: n / rounds for where, n in sorted(counter.counts.items())},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="dense", choices=("dense", "moe"))
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument(
        "--repeats", type=int, default=3, help="measurements per concurrency; the median row is kept"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--vocab",
        type=int,
        default=1024,
        help="vocabulary rows (the real 248,320 make the CPU's argmax over them most of a round)",
    )
    p.add_argument("--sync-counts", action="store_true")
    p.add_argument("--one-wait", default="on", choices=("on", "off"),
                   help="off: every round takes the general two-wait path (engine/runner/spec_round.py)")  # fmt: skip
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for c in (int(x) for x in args.concurrency.split(",")):
        runs = [
            measure(args.arch, args.k, c, args.rounds, args.device, False, args.vocab, args.one_wait == "on")
            for _ in range(args.repeats)
        ]
        row = sorted(runs, key=lambda r: r["round_us"])[len(runs) // 2]
        row["round_us_all"] = [r["round_us"] for r in runs]
        if args.sync_counts:  # a run of its own: the counting costs host time
            row["syncs_per_round"] = measure(
                args.arch, args.k, c, 20, args.device, True, args.vocab, args.one_wait == "on"
            )["syncs_per_round"]
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
    summary = {"rows": rows, "round_us_median": statistics.median(r["round_us"] for r in rows)}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

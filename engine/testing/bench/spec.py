"""`ninfer-bench --spec-rounds K [--spec dflash]`: the cost of one speculative round at a real geometry.

Random weights make acceptance meaningless, so this measures what acceptance does not change: the time of
one round (verify K + 1 positions per row in one pass, roll back, catch the MTP layer up, draft K tokens)
relative to one plain decode step, with the speculative CUDA graphs (engine/spec/graphs.py: the verify widths,
the MTP catch-up and the draft steps) unless `--no-cuda-graph`, and projects the time per output token at an
acceptance length of `ACCEPTANCE_LENGTH` tokens per round (upstream's published MTP3 figure): TPOT = round
time / 3.2; with `--spec dflash` (the DFlash companion, random too; the target widths 1 and K + 1 and the
drafter's round per batch size and context bucket on CUDA graphs, engine/spec/dflash_graphs.py) at
`DFLASH_ACCEPTANCE_LENGTH`.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from engine.config import KVDtype
from engine.model.linear import Linear
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.spec.draft_head import DRAFT_ROWS, DraftHead, attach
from engine.step import RowPlan, StepPlan
from engine.testing.bench.steps import GREEDY, PAGE_SIZE

ACCEPTANCE_LENGTH = 3.2  # tokens per MTP3 round, upstream's published average (UPSTREAM.md section 9.3)
# `--spec dflash`: tokens per round of upstream's 35B-A3B DFlash K=7 on its aime profile (UPSTREAM.md 9.4: 5.56 /
# 4.58 / 4.95 for its three runs; the median). Their code profile accepts 43% (1 + 0.43 * 7 = 4.0 per round).
DFLASH_ACCEPTANCE_LENGTH = 4.95


def attach_random_draft_head(model: Qwen3_5ForCausalLM, rows: int = DRAFT_ROWS) -> None:
    """`--spec-lm-head-draft`: a random dense reduced head (`rows` random vocabulary ids) on the synthetic
    model, so a round's proposals cost what `--lm-head-draft` costs (dense rows in the model dtype; the
    published files store them Q4G64)."""
    param = next(model.parameters())
    config = model.config
    rows = min(rows, config.vocab_size)
    with torch.device("meta"):
        head = Linear(config.hidden_size, rows, [("out", rows)])
    weight = torch.randn(rows, config.hidden_size, device=param.device, dtype=param.dtype) * 0.02
    head.weight = nn.Parameter(weight, requires_grad=False)
    ids = torch.randperm(config.vocab_size, device=param.device)[:rows]
    attach(model, DraftHead(head, ids, config.vocab_size))


def make_spec_runner(model: Qwen3_5ForCausalLM, num_pages: int, lanes: int, kv_dtype: KVDtype, k: int,
                     max_context: int, cuda_graph: bool = True, spec: str = "mtp") -> ModelRunner:  # fmt: skip
    """spec "dflash" needs the DFlash companion attached to `model` (engine/spec/dflash_draft.attach_dflash)."""
    return ModelRunner(
        model, num_pages=num_pages, page_size=PAGE_SIZE, num_state_slots=lanes, kv_dtype=kv_dtype,
        max_context=max_context, spec=spec, num_draft_tokens=k, num_lanes=lanes, cuda_graph=cuda_graph,
    )  # fmt: skip


def _synchronize(runner: ModelRunner) -> None:
    # the CPU runs every op at once (bench/spec_round_host.py times rounds there)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)


def run_spec_rounds(
    runner: ModelRunner,
    vocab: int,
    concurrency: int,
    context: int,
    warmup: int,
    rounds: int,
    k: int,
    params: SamplingParams = GREEDY,
) -> dict[str, float]:
    """Seconds per round of `concurrency` verify rows of k drafts each (`params`, greedy by default; each row
    advances by what it accepted + 1, its next drafts the runner's), the tokens committed per round, and the graph
    replays per round (0: eager). Sampled `params`: the first step feeds each row's last token alone (a verify of
    width 1), so every later round's drafts come from the MTP head with their q; count it in `warmup`."""
    spec = runner.spec
    replays = 0
    pages_per_seq = -(-(context + (warmup + rounds + 1) * (k + 1)) // PAGE_SIZE)
    pages = [tuple(range(i * pages_per_seq, (i + 1) * pages_per_seq)) for i in range(concurrency)]
    last = torch.randint(0, vocab, (concurrency,)).tolist()
    drafts = [tuple(torch.randint(0, vocab, (k,)).tolist()) for _ in range(concurrency)]
    pos = [context] * concurrency
    committed = 0
    start = time.perf_counter()
    for step in range(warmup + rounds):
        if step == warmup:
            _synchronize(runner)
            start, committed = time.perf_counter(), 0
            replays = spec.num_graph_replays if spec is not None else 0
        feed = [
            () if step == 0 and params.temperature != 0.0 else d for d in drafts
        ]  # sampled: drafts with q
        rows = tuple(
            RowPlan(
                request_id=f"s{i}",
                lane=i,
                token_ids=(last[i], *feed[i]),
                start_pos=pos[i],
                page_ids=pages[i],
                state_slot=i,
                reset_state=False,
                copy_state_from=None,
                save_state_to=None,
                num_sample=1 + len(feed[i]),
                sampling_params=params,
                num_output_tokens=1,
            )  # fmt: skip
            for i in range(concurrency)
        )
        result = runner.execute(StepPlan(step, rows, (), ()))
        for i, tokens in enumerate(result.sampled_token_ids):
            pos[i] += len(tokens)
            last[i] = tokens[-1]
            drafts[i] = result.draft_token_ids[i] if result.draft_token_ids else ()
            committed += len(tokens)
    _synchronize(runner)
    seconds = (time.perf_counter() - start) / rounds
    replays = (spec.num_graph_replays if spec is not None else 0) - replays
    return {"round_s": seconds, "tokens_per_round": committed / rounds / concurrency,
            "graph_replays_per_round": replays / rounds}  # fmt: skip

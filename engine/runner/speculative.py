"""The speculative step (`--spec mtp`): verify every row's drafts in one batched pass, roll the GDN state
back to the last accepted position, then catch the MTP layer up and propose the next drafts.

Owns: the runner's side of a speculative step: grouping rows into forwards, the snapshot slots, the
rollback copies, the drafts' q distributions kept per request until they are verified. Must not touch
the scheduler or requests: rows come down as `RowPlan`s (a verify row feeds its last token and k drafts
and samples all k + 1 positions; its drafts are its last k fed tokens) and go back up as token lists,
accepted / rolled-back counts and new drafts (`StepResult.draft_token_ids`).

Forwards of one step: rows that sample every fed position ("decode-like": a verify row of width k + 1,
or a plain decode row of width 1 near the context limit) run grouped by width, each group one uniform
batch; prefill chunks run as one varlen batch. A verify group flags `ForwardBatch.verify_width`, so the
GDN layers run its positions one at a time with the decode ops, each writing its state into the snapshot
slot of that position (the last position into the working slot). Uniform groups of up to 8 rows, the MTP
catch-up and the chained draft steps run through static buffers, replayed as CUDA graphs on CUDA
(engine/spec/graphs.py, `use_static_inputs`); what does not fit them runs eagerly. With DFlash the uniform groups
also return the target features, and the drafter's greedy round has its own buffers and graphs
(engine/spec/dflash_graphs.py).

Rollback (per-position snapshots, not replay): lane l owns snapshot slots `base + l*K .. base + l*K + K-1`
(slot `base + j` of a lane holds its conv + recurrent state after verify position j, written there by the
decode ops out of place: no copy); a row that accepted a < k drafts copies snapshot a into its working
slot (`ModelCache.copy_states`: one gather + one scatter per state kind for every GDN layer and row). Chosen
over replay because it needs no second pass through the layers and reuses the decode ops, so the
rolled-back state is exactly the state of decoding the accepted tokens one per step.

Host waits of a round (tests/engine/test_spec_syncs.py): a greedy round whose rows fit the static buffers takes
engine/runner/spec_round.py and waits once, for (accepted count, bonus, next drafts) per row; a sampled or
penalized one engine/runner/spec_sampled.py (rejection sampling on the device, NINFER_SPEC_ONE_WAIT_SAMPLED), also
once; any other round waits twice, for the verdict (engine/spec/verify.py: its catch-up's rows depend on how many
drafts each row kept) and for the drafts (engine/spec/mtp.py). DFlash's greedy and sampled rounds take
engine/runner/dflash_round.py the same way (one wait; the sampled one shares spec_sampled.py's verdict and copy);
its general round waits for the verdict and for the drafts (engine/spec/dflash_draft.py; its block on the drafter's
static buffers when the rows are verify rows of one width, `static_proposals`). Every index and position goes up
through `upload` (pinned, non-blocking).
TODO(#21): enqueue the next round before the host reads this one's verdict (the next verify fed from device
buffers, the verdict read one round late, as plain overlap reads its tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from engine.env import spec_one_wait_sampled
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.qwen3_5 import Qwen3_5ForCausalLM
from engine.request import SamplingParams
from engine.runner.dflash_round import (
    dflash_one_wait_rows,
    dflash_sampled_rows,
    run_dflash_one_wait,
    run_dflash_sampled,
    static_proposals,
)
from engine.runner.inputs import eager_batch
from engine.runner.spec_round import one_wait_rows, run_one_wait
from engine.runner.spec_sampled import run_sampled, sampled_rows
from engine.spec.dflash_draft import DFlashDrafter
from engine.spec.dflash_graphs import DFlashGraphs
from engine.spec.graphs import SpecGraphs, StaticRow
from engine.spec.mtp import DraftRow, MtpDrafter
from engine.spec.verify import GeneratorFor, Verdict, verify
from engine.step import RowPlan
from engine.transfer import upload


@dataclass(frozen=True, slots=True)
class SpecOutcome:
    """Per plan row: tokens to commit, drafts accepted, fed positions rolled back, next drafts."""

    tokens: tuple[tuple[int, ...], ...]
    num_accepted: tuple[int, ...]
    num_rolled_back: tuple[int, ...]
    drafts: tuple[tuple[int, ...], ...]


def drafts_allowed(params: SamplingParams) -> bool:
    """Rows of structured outputs (their grammar's mask follows every sampled token) and of logprobs requests
    never draft: they sample one token per step through the runner's sampler."""
    return params.structured is None and params.logprobs is None


def num_spec_slots(num_lanes: int, num_draft_tokens: int) -> int:
    """Extra state slots speculative decoding needs: K snapshots per lane."""
    return num_lanes * num_draft_tokens


class SpecExecutor:
    """Use: `run(rows, history)` in place of the plain forward + sample of a step."""

    def __init__(
        self,
        model: Qwen3_5ForCausalLM,
        cache: ModelCache,
        *,
        num_draft_tokens: int,
        num_lanes: int,
        snapshot_base: int,
        generator: GeneratorFor,
        method: str = "mtp",
    ) -> None:
        """method: the drafter, "mtp" (engine/spec/mtp.py) or "dflash" (engine/spec/dflash_draft.py: it reads
        the target features of its layers, which the verify forward then captures)."""
        self.model, self.cache = model, cache
        self.k = num_draft_tokens
        self.snapshot_base = snapshot_base
        assert snapshot_base + num_lanes * num_draft_tokens <= cache.num_state_slots, (
            "allocate num_spec_slots() extra state slots"
        )
        self.device = next(model.parameters()).device
        self.generator = generator
        self.drafter: MtpDrafter | DFlashDrafter
        self.feature_layers: tuple[int, ...] = ()
        if method == "dflash":
            self.drafter = DFlashDrafter(model, cache, generator)
            self.feature_layers = self.drafter.feature_layers
        else:
            self.drafter = MtpDrafter(model, cache, cache.num_state_slots, generator)
        self.graphs: SpecGraphs | None = None
        self.draft_graphs: DFlashGraphs | None = None  # DFlash's drafter round (engine/spec/dflash_graphs.py)
        self._draft_probs: dict[str, torch.Tensor | None] = {}  # q of each request's pending drafts
        # the sampled one-wait round's penalty counts per request: (output tokens counted, the last of them, counts
        # [V] on the device), so a round uploads only the tokens since (engine/runner/spec_sampled.py)
        self.penalty_counts: dict[str, tuple[int, int, torch.Tensor]] = {}
        self.num_verify_forwards = 0
        # greedy rounds that fit the static buffers queue everything before one host wait (spec_round.py)
        self.one_wait = True
        # sampled and penalized rounds too (engine/runner/spec_sampled.py; NINFER_SPEC_ONE_WAIT_SAMPLED)
        self.one_wait_sampled = spec_one_wait_sampled()
        self.num_one_wait_rounds = 0
        self.num_sampled_one_wait_rounds = 0

    def release(self, request_ids: Sequence[str]) -> None:
        """Drop the state of requests that ended."""
        self.forget_draft_probs(request_ids)
        for request_id in request_ids:
            self.penalty_counts.pop(request_id, None)

    def forget_draft_probs(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._draft_probs.pop(request_id, None)

    def draft_probs(self, request_id: str) -> torch.Tensor | None:
        """q [>= k, V] of the request's pending drafts (None: greedy drafts, or none)."""
        return self._draft_probs.get(request_id)

    def keep_draft_probs(self, request_id: str, probs: torch.Tensor) -> None:
        self._draft_probs[request_id] = probs

    def copy_slot(self, src: int, dst: int) -> None:
        self.drafter.copy_slot(src, dst)

    def copy_page(self, src: int, dst: int) -> None:
        """A page copy (copy-on-write of a reused page) reaches the drafter's own paged state too."""
        if isinstance(self.drafter, DFlashDrafter):
            self.drafter.copy_page(src, dst)

    def _snapshots(self, rows: Sequence[RowPlan], width: int) -> torch.Tensor:
        base = [self.snapshot_base + row.lane * self.k for row in rows]
        table = [[b + j for j in range(width - 1)] for b in base]
        return upload(table, self.device).reshape(len(rows), width - 1)

    def use_static_inputs(self, max_pages: int, capture: bool) -> bool:
        """Run the fixed-shape forwards through static buffers (engine.spec.graphs.py), replaying
        CUDA graphs when `capture` (on CUDA). Returns whether graphs were captured. DFlash: the target widths 1
        and K + 1 with features, and the drafter's round per batch size and context bucket."""
        if isinstance(self.drafter, DFlashDrafter):
            self.graphs = SpecGraphs(
                self.model, self.cache, num_draft_tokens=self.k, max_pages=max_pages,
                feature_layers=self.feature_layers, widths=(1, self.k + 1), with_mtp=False,
            )  # fmt: skip
            self.draft_graphs = DFlashGraphs(self.drafter, num_draft_tokens=self.k, max_pages=max_pages)
            if not capture:
                return False
            return self.graphs.capture() & self.draft_graphs.capture()
        self.graphs = SpecGraphs(self.model, self.cache, num_draft_tokens=self.k, max_pages=max_pages)
        self.drafter.graphs = self.graphs
        return self.graphs.capture() if capture else False

    @property
    def num_graph_replays(self) -> int:
        """CUDA graph replays so far, target and drafter."""
        target = self.graphs.num_replays if self.graphs is not None else 0
        return target + (self.draft_graphs.num_replays if self.draft_graphs is not None else 0)

    def capture_reports(self) -> dict[str, dict[str, object]]:
        """What each graph set captured (empty when none): "target" (the verify widths; MTP's kinds too),
        "drafter" (DFlash)."""
        out = {}
        if self.graphs is not None and self.graphs.report:
            out["target"] = self.graphs.report
        if self.draft_graphs is not None and self.draft_graphs.report:
            out["drafter"] = self.draft_graphs.report
        return out

    def static_rows(self, rows: Sequence[RowPlan], width: int) -> list[StaticRow]:
        return [
            StaticRow(
                row.token_ids,
                row.start_pos,
                row.page_ids,
                row.state_slot,
                not row.reset_state,
                range(
                    self.snapshot_base + row.lane * self.k, self.snapshot_base + row.lane * self.k + width - 1
                ),
            )  # fmt: skip
            for row in rows
        ]

    def _forward(self, rows: Sequence[RowPlan], width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(final hidden, the drafter's target features or None)."""
        if width > 0 and self.graphs is not None:
            static = self.static_rows(rows, width)
            if self.graphs.fits(static, width):
                self.num_verify_forwards += width > 1
                if self.feature_layers:
                    return self.graphs.target_features(static, width)
                return self.graphs.target(static, width), None
        batch: ForwardBatch = eager_batch(rows, self.cache.page_size, self.device)
        if width > 1:
            batch = replace(batch, verify_width=width, snapshot_slots=self._snapshots(rows, width))
            self.num_verify_forwards += 1
        if self.feature_layers:
            return self.model.forward_features(batch, self.cache, self.feature_layers)
        return self.model(batch, self.cache), None

    def run(
        self,
        rows: Sequence[RowPlan],
        history: dict[str, list[int]],
        plain_sample: Callable[[torch.Tensor, Sequence[RowPlan]], list[list[int]]],
    ) -> SpecOutcome:
        """One step over `rows` (plan order). `history`: each request's output tokens so far (for penalties);
        extended here with the committed tokens. `plain_sample(logits, rows)`: the runner's own sampler for
        rows that never draft (structured outputs: a grammar's mask depends on every earlier token;
        logprobs), one position each; it extends `history` itself."""
        if self.one_wait and isinstance(self.drafter, DFlashDrafter):
            verify_rows = dflash_one_wait_rows(self, rows)
            if verify_rows is not None:
                self.num_one_wait_rounds += 1
                return SpecOutcome(*run_dflash_one_wait(self, rows, verify_rows, history))
            verify_rows = dflash_sampled_rows(self, rows) if self.one_wait_sampled else None
            if verify_rows is not None:
                self.num_one_wait_rounds += 1
                self.num_sampled_one_wait_rounds += 1
                return SpecOutcome(*run_dflash_sampled(self, rows, verify_rows, history))
        static = one_wait_rows(self, rows) if self.one_wait else None
        if static is not None:
            self.num_one_wait_rounds += 1
            return SpecOutcome(*run_one_wait(self, rows, static, history))
        static = sampled_rows(self, rows) if self.one_wait and self.one_wait_sampled else None
        if static is not None:
            self.num_one_wait_rounds += 1
            self.num_sampled_one_wait_rounds += 1
            return SpecOutcome(*run_sampled(self, rows, static, history))
        hidden_parts: list[torch.Tensor] = []
        feature_parts: list[torch.Tensor] = []
        where: dict[int, int] = {}  # plan row -> offset of its first fed token in the concatenated hidden
        total = 0
        groups: dict[int, list[int]] = {}
        prefill: list[int] = []
        for i, row in enumerate(rows):
            if row.num_sample == row.num_tokens:
                groups.setdefault(row.num_tokens, []).append(i)
            else:
                prefill.append(i)
        for width, members in [*sorted(groups.items()), (0, prefill)]:
            if not members:
                continue
            hidden, features = self._forward([rows[i] for i in members], width)
            if features is not None:
                feature_parts.append(features)
            for i in members:
                where[i] = total
                total += rows[i].num_tokens
            hidden_parts.append(hidden)
        target_hidden = torch.cat(hidden_parts) if len(hidden_parts) > 1 else hidden_parts[0]
        sampling = [i for i, row in enumerate(rows) if row.sample]
        plain = [i for i in sampling if not drafts_allowed(rows[i].sampling_params)]
        sampling = [i for i in sampling if drafts_allowed(rows[i].sampling_params)]
        verdicts: dict[int, Verdict] = {}
        if plain:
            assert all(rows[i].num_sample == 1 for i in plain), "a row that never drafts samples one position"
            last = upload([where[i] + rows[i].num_tokens - 1 for i in plain], self.device)
            tokens = plain_sample(self.model.compute_logits(target_hidden, last), [rows[i] for i in plain])
            verdicts.update({i: Verdict(tuple(t), 0) for i, t in zip(plain, tokens, strict=True)})
        if sampling:
            positions = [where[i] + rows[i].num_tokens - rows[i].num_sample + j for i in sampling
                         for j in range(rows[i].num_sample)]  # fmt: skip
            logits = self.model.compute_logits(target_hidden, upload(positions, self.device))
            drafts = [rows[i].token_ids[rows[i].num_tokens - rows[i].num_sample + 1 :] for i in sampling]
            probs = [self._draft_probs.get(rows[i].request_id) for i in sampling]
            verdicts.update(zip(sampling, verify(
                logits, drafts, probs, [rows[i].sampling_params for i in sampling],
                [rows[i].request_id for i in sampling], self.generator,
                [history.get(rows[i].request_id, []) for i in sampling],
            ), strict=True))  # fmt: skip
            for i in sampling:
                history.setdefault(rows[i].request_id, []).extend(verdicts[i].tokens)
        self._roll_back(rows, verdicts)
        draft_rows = []
        for i, row in enumerate(rows):
            verdict = verdicts.get(i)
            rolled = (row.num_sample - 1 - verdict.num_accepted) if verdict is not None else 0
            valid = row.num_tokens - rolled
            draft_rows.append(DraftRow(
                request_id=row.request_id, page_ids=row.page_ids, state_slot=row.state_slot,
                start_pos=row.start_pos, tokens=row.token_ids[:valid],
                hidden_rows=range(where[i], where[i] + valid),
                bonus=verdict.tokens[-1] if verdict is not None else None,
                num_drafts=self.k if verdict is not None and drafts_allowed(row.sampling_params) else 0,
                params=row.sampling_params,
                history=history.get(row.request_id, []),
            ))  # fmt: skip
        if isinstance(self.drafter, DFlashDrafter):
            features = torch.cat(feature_parts)
            made = static_proposals(self, rows, draft_rows, features)
            proposals = made if made is not None else self.drafter.advance(draft_rows, features)
        else:
            proposals = self.drafter.advance(draft_rows, target_hidden)
        for i in sampling:
            self._draft_probs[rows[i].request_id] = proposals[i].probs
        for i in plain:
            self._draft_probs.pop(rows[i].request_id, None)
        return SpecOutcome(
            tokens=tuple(verdicts[i].tokens if i in verdicts else () for i in range(len(rows))),
            num_accepted=tuple(verdicts[i].num_accepted if i in verdicts else 0 for i in range(len(rows))),
            num_rolled_back=tuple(
                r.num_tokens - len(d.tokens) for r, d in zip(rows, draft_rows, strict=True)
            ),
            drafts=tuple(p.tokens for p in proposals),
        )

    def _roll_back(self, rows: Sequence[RowPlan], verdicts: dict[int, Verdict]) -> None:
        """Copy the snapshot of each row's last accepted position into its working slot."""
        src, dst = [], []
        for i, verdict in verdicts.items():
            row = rows[i]
            if row.num_sample > 1 and verdict.num_accepted < row.num_sample - 1:
                src.append(self.snapshot_base + row.lane * self.k + verdict.num_accepted)
                dst.append(row.state_slot)
        if not src:
            return
        slots = upload([src, dst], self.device)  # [2, N]: one copy, no wait
        self.cache.copy_states(slots[0], slots[1])

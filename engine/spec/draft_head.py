"""`--lm-head-draft`: MTP proposals from a reduced output head; verification keeps the full head.

The artifact carries the reduced head as two objects (upstream's names and shapes):

    text/draft_head            [R, hidden]  the output-head rows of R shortlisted tokens (R = 131,072, or the
                                            vocabulary when smaller); Q4G64 in the published files, BF16/FP32
                                            in a plain artifact built by `ninfer-artifact convert`
    text/draft_head_token_ids  [R] I32      row r's vocabulary id (distinct ids, most frequent first)

With the flag, the drafter's logits are ``draft_head(h)`` scattered into a full-vocabulary row, every token
outside the shortlist at -inf: a greedy draft is the shortlist's argmax, a sampled draft's q is zero outside
it. Verification reads the full head (engine/runner/speculative.py), so the greedy output is the plain output
and sampled output keeps the target distribution (rejection sampling only needs q to be a distribution).
What the head saves is the proposal GEMM: R rows instead of the vocabulary's 248,320.

`build_draft_head` makes the two objects from an output head and a frequency list (`read_frequency_list`:
token ids, most frequent first); ids the list does not name fill the remaining rows in id order.
Owns: the objects' names, loading them (`load_draft_head`, refusing with the reason when absent), attaching
the head to a loaded model (`attach` / `draft_head_of`) and the proposal logits (`proposal_logits`).
Must not touch: verification (always the full head), requests, the scheduler.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from engine.artifact.container import ArtifactError
from engine.model.linear import Linear
from engine.model.quant import quantized_linear
from engine.model.qwen3_5 import Qwen3_5ForCausalLM

DRAFT_HEAD = "text/draft_head"
DRAFT_HEAD_TOKEN_IDS = "text/draft_head_token_ids"
DRAFT_ROWS = 131_072
_ATTR = "lm_head_draft"  # where `attach` keeps the head on a loaded model


class _Source(Protocol):  # engine.artifact.container.Artifact
    @property
    def model_id(self) -> str: ...

    @property
    def weights_id(self) -> str | None: ...

    def tensor_names(self) -> list[str]: ...

    def tensor_entry(self, name: str) -> Any: ...

    def tensor(self, name: str) -> torch.Tensor: ...

    def raw_bytes(self, name: str) -> memoryview: ...


class DraftHead(nn.Module):
    """The reduced head: ``logits(hidden) -> [N, vocab]`` fp32, -inf outside the shortlist."""

    def __init__(self, head: Linear, token_ids: torch.Tensor, vocab_size: int) -> None:
        super().__init__()
        self.head = head
        self.token_ids: torch.Tensor = token_ids.long()  # [R] on the head's device
        self.vocab_size = vocab_size

    @property
    def num_rows(self) -> int:
        return int(self.token_ids.shape[0])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.head(hidden).float()
        out = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        return out.index_copy_(1, self.token_ids, small)


def attach(model: Qwen3_5ForCausalLM, head: DraftHead) -> None:
    setattr(model, _ATTR, head)


def draft_head_of(model: Qwen3_5ForCausalLM) -> DraftHead | None:
    head = getattr(model, _ATTR, None)
    return head if isinstance(head, DraftHead) else None


def proposal_logits(model: Qwen3_5ForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
    """The drafter's fp32 logits [N, vocab] for MTP hidden states: the reduced head when attached, else the
    model's full head."""
    head = draft_head_of(model)
    return head.logits(hidden) if head is not None else model.compute_logits(hidden)


def require_draft_head(artifact: _Source) -> None:
    """ArtifactError, saying what to do, when the artifact carries no reduced head (checked before loading)."""
    names = set(artifact.tensor_names())
    missing = [n for n in (DRAFT_HEAD, DRAFT_HEAD_TOKEN_IDS) if n not in names]
    if missing:
        raise ArtifactError(
            f"--lm-head-draft: the artifact {artifact.model_id}/{artifact.weights_id} carries no reduced output "
            f"head ({', '.join(map(repr, missing))} missing); build one with `ninfer-artifact convert HF_DIR OUT "
            "--draft-head-frequencies FILE`, or run without --lm-head-draft"
        )


def load_draft_head(artifact: _Source, model: Qwen3_5ForCausalLM) -> DraftHead:
    """The artifact's reduced head on the model's device and dtype; ArtifactError (with what to do) when the
    artifact has none or it does not fit the model."""
    require_draft_head(artifact)
    who = f"{artifact.model_id}/{artifact.weights_id}"
    param = next(model.parameters())
    config = model.config
    entry = artifact.tensor_entry(DRAFT_HEAD)
    ids = artifact.tensor(DRAFT_HEAD_TOKEN_IDS)
    rows, hidden = tuple(entry.shape)
    if hidden != config.hidden_size or tuple(ids.shape) != (rows,):
        raise ArtifactError(
            f"--lm-head-draft: {who}: {DRAFT_HEAD} is {list(entry.shape)} and {DRAFT_HEAD_TOKEN_IDS} "
            f"{list(ids.shape)}; the model needs [R, {config.hidden_size}] and [R]"
        )
    check_token_ids(ids, config.vocab_size, who)
    if entry.layout == "contiguous-le-v1":
        with torch.device("meta"):
            head = Linear(hidden, rows, [("out", rows)])
        head.weight = nn.Parameter(
            artifact.tensor(DRAFT_HEAD).to(param.device, param.dtype), requires_grad=False
        )
    else:
        raw = torch.frombuffer(artifact.raw_bytes(DRAFT_HEAD), dtype=torch.uint8)
        head = quantized_linear(hidden, rows, [("out", rows)], entry.format, raw.to(param.device))
    return DraftHead(head, ids.to(param.device), config.vocab_size).eval()


def check_token_ids(ids: torch.Tensor, vocab_size: int, who: str) -> None:
    """ArtifactError unless `ids` are distinct vocabulary ids."""
    flat = ids.long()
    if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= vocab_size):
        raise ArtifactError(
            f"--lm-head-draft: {who}: {DRAFT_HEAD_TOKEN_IDS} holds ids outside 0..{vocab_size - 1}"
        )
    if flat.unique().numel() != flat.numel():
        raise ArtifactError(f"--lm-head-draft: {who}: {DRAFT_HEAD_TOKEN_IDS} repeats token ids")


def read_frequency_list(path: str | os.PathLike[str]) -> list[int]:
    """Token ids, most frequent first: a JSON list of ids (or {"token_ids": [...]}) or text with ids separated
    by whitespace (lines starting with '#' are comments). ArtifactError on anything else."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        words = [w for line in text.splitlines() if not line.lstrip().startswith("#") for w in line.split()]
        if not all(w.lstrip("-").isdigit() for w in words):
            raise ArtifactError(
                f"{path}: a frequency list is token ids (JSON or whitespace-separated)"
            ) from None
        data = [int(w) for w in words]
    if isinstance(data, dict):
        data = data.get("token_ids")
    if not isinstance(data, list) or not data or not all(isinstance(t, int) for t in data):
        raise ArtifactError(f"{path}: a frequency list is a non-empty list of token ids")
    return data


def build_draft_head(
    output_head: torch.Tensor, ranking: Sequence[int], rows: int = DRAFT_ROWS
) -> tuple[torch.Tensor, torch.Tensor]:
    """(`text/draft_head` [R, hidden], `text/draft_head_token_ids` [R] int32) from the full output head
    [vocab, hidden] and a frequency ranking (repeats kept once, first place); R = min(rows, vocab)."""
    vocab = output_head.shape[0]
    bad = [t for t in ranking if not 0 <= t < vocab]
    if bad:
        raise ArtifactError(f"frequency list: token ids {bad[:5]} are outside the vocabulary 0..{vocab - 1}")
    chosen = list(dict.fromkeys(ranking))[: min(rows, vocab)]
    if len(chosen) < min(rows, vocab):
        named = set(chosen)
        chosen += [t for t in range(vocab) if t not in named][: min(rows, vocab) - len(chosen)]
    ids = torch.tensor(chosen, dtype=torch.int64)
    return output_head[ids].contiguous(), ids.to(torch.int32)

"""Incremental forwards through the paged cache equal one full forward (state handoff between the
chunked and recurrent GDN forms, conv state, paged KV), and batching never changes a sequence's result."""

from __future__ import annotations

import pytest
import torch

from engine.model import allocate_model_cache


def _tokens(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _setup(tiny, paged, name: str, page_size: int = 16, slots: int = 4):
    Driver, Lane = paged
    ckpt = tiny(name)
    model = ckpt.build()
    cache = allocate_model_cache(ckpt.config, num_pages=48, page_size=page_size, num_state_slots=slots,
                                 dtype=torch.float32)  # fmt: skip
    return ckpt, model, Driver(cache, seed=len(name)), Lane, cache


def _full_logits(ckpt, model, paged, tokens: list[int]) -> torch.Tensor:
    Driver, Lane = paged
    cache = allocate_model_cache(
        ckpt.config, num_pages=8, page_size=64, num_state_slots=1, dtype=torch.float32
    )
    batch = Driver(cache).batch([Lane(slot=0)], [tokens])
    return model.compute_logits(model(batch, cache))


def _close(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: float = 1e-4) -> None:
    rel = ((actual - expected).abs().max() / expected.abs().max()).item()
    assert rel < tol, f"{name}: max relative error {rel:.2e}"


@pytest.mark.parametrize("name", ["dense_a", "moe_b"])
def test_prefill_then_decode_equals_full_forward(tiny, paged, name):
    ckpt, model, driver, Lane, cache = _setup(tiny, paged, name)
    tokens = _tokens(63, ckpt.config.vocab_size, 1)
    expected = _full_logits(ckpt, model, paged, tokens)
    lane = Lane(slot=2)
    rows = [model.compute_logits(model(driver.batch([lane], [tokens[:50]]), cache))]
    for t in tokens[50:]:
        rows.append(model.compute_logits(model(driver.batch([lane], [[t]]), cache)))
    _close(name, torch.cat(rows), expected)


@pytest.mark.parametrize("name", ["dense_b", "moe_a"])
def test_uneven_prefill_chunks_equal_full_forward(tiny, paged, name):
    ckpt, model, driver, Lane, cache = _setup(tiny, paged, name, page_size=16)
    tokens = _tokens(70, ckpt.config.vocab_size, 2)
    expected = _full_logits(ckpt, model, paged, tokens)
    lane, rows, start = Lane(slot=1), [], 0
    for size in [1, 17, 30, 2, 1, 19]:  # chunks crossing page boundaries, single tokens in between
        rows.append(model.compute_logits(model(driver.batch([lane], [tokens[start : start + size]]), cache)))
        start += size
    _close(name, torch.cat(rows), expected)


@pytest.mark.parametrize("name", ["dense_a", "moe_a"])
def test_batched_sequences_equal_each_alone(tiny, paged, name):
    """Two sequences of different lengths: batched prefill, a mixed step (one prefilling a chunk while
    the other decodes) and batched decode steps give each the logits it gets alone."""
    ckpt, model, driver, Lane, cache = _setup(tiny, paged, name)
    a, b = _tokens(45, ckpt.config.vocab_size, 3), _tokens(70, ckpt.config.vocab_size, 4)
    alone_a, alone_b = _full_logits(ckpt, model, paged, a), _full_logits(ckpt, model, paged, b)
    lane_a, lane_b = Lane(slot=3), Lane(slot=0)
    got_a, got_b = [], []

    def step(chunk_a: list[int], chunk_b: list[int]) -> None:
        batch = driver.batch([lane_a, lane_b], [chunk_a, chunk_b])
        logits = model.compute_logits(model(batch, cache))
        got_a.append(logits[: len(chunk_a)])
        got_b.append(logits[len(chunk_a) :])

    step(a[:40], b[:25])  # both prefilling
    step(a[40:41], b[25:60])  # a decodes while b prefills its next chunk
    for i in range(4):  # both decode
        step(a[41 + i : 42 + i], b[60 + i : 61 + i])
    _close("a", torch.cat(got_a), alone_a)
    _close("b", torch.cat(got_b), alone_b[:64])


def test_fresh_request_ignores_stale_slot_state(tiny, paged):
    """has_initial_state=False must start a reused slot from zeros, not from its previous owner."""
    ckpt, model, driver, Lane, cache = _setup(tiny, paged, "dense_a")
    tokens = _tokens(30, ckpt.config.vocab_size, 5)
    model(driver.batch([Lane(slot=0)], [_tokens(20, ckpt.config.vocab_size, 6)]), cache)  # dirties slot 0
    got = model.compute_logits(model(driver.batch([Lane(slot=0)], [tokens]), cache))
    _close("reused slot", got, _full_logits(ckpt, model, paged, tokens))

"""Host parking on CPU (`HostIndex` + `HostCopier`, joined as in host_harness.py): bit-exact round trips,
slabs and blocks, LRU, lookup, integrity, copy runs."""

from __future__ import annotations

import random

import pytest
import torch
from host_harness import Parking as HostParking

from engine.cache.prefix import extend_page_hashes
from engine.model import ModelCache, ModelConfig, allocate_model_cache
from engine.runner.host_copier import HostEntryMismatch, ParkHandle
from engine.runner.host_layout import cache_geometry, page_runs, paged_tensors, state_tensors

PAGE_SIZE = 4

# 2 GDN + 2 attention layers (+ 1 MTP KV entry): 64 bytes per page per K/V tensor (bf16 4x1x8),
# GDN conv 20x3 bf16 (120 B) + recurrent 2x4x6 fp32 (192 B) per layer per slot.
TINY = ModelConfig(
    model_type="qwen3_5_text", vocab_size=100, hidden_size=16, num_hidden_layers=4,
    layer_types=("linear_attention", "full_attention", "linear_attention", "full_attention"),
    num_attention_heads=2, num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4,
    partial_rotary_factor=0.5, mrope_section=None, linear_conv_kernel_dim=4, linear_key_head_dim=4,
    linear_value_head_dim=6, linear_num_key_heads=1, linear_num_value_heads=2, intermediate_size=32,
)  # fmt: skip


def make_cache(
    num_pages: int = 16, num_slots: int = 4, kv_dtype: str = "bf16", device: str = "cpu", seed: int = 0
) -> ModelCache:
    """A tiny cache (with MTP KV) whose every byte is random, so any misplaced byte shows."""
    cache = allocate_model_cache(
        TINY, num_pages=num_pages, page_size=PAGE_SIZE, num_state_slots=num_slots, with_mtp=True,
        kv_dtype=kv_dtype, device=device,
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    for t in paged_tensors(cache) + state_tensors(cache):
        flat = t.view(-1).view(torch.uint8)
        flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=gen))
    return cache


def page_bytes(cache: ModelCache, page_ids: list[int]) -> list[torch.Tensor]:
    """Raw bytes of these pages in every paged tensor (CPU copies), for bit-exact comparison."""
    return [
        t[page_ids].reshape(len(page_ids), -1).view(torch.uint8).cpu().clone() for t in paged_tensors(cache)
    ]


def slot_bytes(cache: ModelCache, slot: int) -> list[torch.Tensor]:
    return [t[slot].reshape(-1).view(torch.uint8).cpu().clone() for t in state_tensors(cache)]


def assert_same(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(x, y), f"tensor {i}: {int((x != y).sum())} of {x.numel()} bytes differ"


def parking(
    cache: ModelCache,
    capacity_blocks: int,
    block_bytes: int = 256,
    blocks_per_slab: int = 4,
    device: str = "cpu",
    gather_run_bytes: int = 0,
) -> HostParking:
    """A small budget; by default page runs are copied directly (`gather_run_bytes=0`), staging holds 3 pages."""
    return HostParking(
        cache_geometry(cache), capacity_blocks * block_bytes, slab_bytes=blocks_per_slab * block_bytes,
        block_bytes=block_bytes, device=device, gather_run_bytes=gather_run_bytes, staging_bytes=3 * 64,
    )  # fmt: skip


def park(
    host: HostParking, cache: ModelCache, key: str, page_ids: list[int], tokens: list[int],
    checkpoints: list[tuple[int, int]] | None = None, extra: dict[str, torch.Tensor] | None = None,
) -> ParkHandle | None:  # fmt: skip
    """park() then the integrity check every test runs after every operation."""
    handle = host.park(
        key,
        cache,
        page_ids=page_ids,
        token_ids=tokens,
        checkpoints=checkpoints or [(len(tokens), 0)],
        extra=extra,
    )
    host.check_integrity()
    return handle


def tokens_of(key: str, num_tokens: int) -> list[int]:
    base = 1000 * (ord(key[0]) - ord("a") + 1)
    return [base + i for i in range(num_tokens)]


def blocks_of(host: HostParking, num_pages: int, num_checkpoints: int = 1) -> int:
    return host.blocks.blocks_for(host.geometry.entry_bytes(num_pages, num_checkpoints))


# ---- bit-exact round trips -------------------------------------------------------------------------


@pytest.mark.parametrize("gather_run_bytes", [0, 1 << 20], ids=["runs", "staged"])
@pytest.mark.parametrize("kv_dtype", ["bf16", "int8"])
def test_round_trip_is_bit_exact_into_other_pages_and_another_slot(
    kv_dtype: str, gather_run_bytes: int
) -> None:
    src, dst = make_cache(kv_dtype=kv_dtype, seed=1), make_cache(kv_dtype=kv_dtype, seed=2)
    host = parking(src, capacity_blocks=64, gather_run_bytes=gather_run_bytes)
    pages, new_pages = [1, 2, 5, 6, 7], [7, 3, 0, 4, 2]
    hidden = torch.randn(3, 16).to(torch.bfloat16)
    want_pages, want_state = page_bytes(src, pages), slot_bytes(src, 3)
    handle = park(host, src, "a", pages, tokens_of("a", 18), [(18, 3)], extra={"mtp_hidden": hidden})
    assert handle is not None and handle.kind == "park" and handle.done()
    assert handle.num_bytes == host.geometry.entry_bytes(5, 1, hidden.numel() * 2)
    for t in paged_tensors(src) + state_tensors(src):
        t.zero_()  # the entry holds its own bytes: the source may be reused at once
    untouched = [p for p in range(16) if p not in new_pages]
    others_before = page_bytes(dst, untouched), slot_bytes(dst, 0), slot_bytes(dst, 2), slot_bytes(dst, 3)
    out = torch.zeros_like(hidden)
    back = host.unpark("a", dst, page_ids=new_pages, state_slot=1, extra={"mtp_hidden": out})
    host.check_integrity()
    assert_same(page_bytes(dst, new_pages), want_pages)
    assert_same(slot_bytes(dst, 1), want_state)
    assert torch.equal(out.view(torch.int16), hidden.view(torch.int16))
    assert_same(page_bytes(dst, untouched), others_before[0])
    for slot, before in zip((0, 2, 3), others_before[1:], strict=True):
        assert_same(slot_bytes(dst, slot), before)
    assert back.kind == "unpark" and back.num_bytes == handle.num_bytes
    stats = host.stats()
    assert "a" not in host and stats.num_entries == 0 and stats.used_bytes == 0  # restored: bytes freed
    assert (stats.num_parks, stats.num_restores) == (1, 1)
    assert stats.park_bytes == stats.restore_bytes == handle.num_bytes
    assert stats.park_seconds > 0 and stats.restore_seconds > 0 and stats.evictions == {}


def test_an_entry_spans_slabs_and_slabs_are_allocated_on_first_use() -> None:
    cache = make_cache()
    host = parking(cache, capacity_blocks=16, blocks_per_slab=4)  # 4 slabs of 4 blocks
    assert host.blocks.num_slabs == 4 and host.stats().allocated_bytes == 0
    want = page_bytes(cache, [0, 1, 2, 3, 4])
    handle = park(host, cache, "a", [0, 1, 2, 3, 4], tokens_of("a", 20))
    entry = host.entry("a")
    assert len(entry.block_ids) == blocks_of(host, 5) == 10
    assert sorted({b // 4 for b in entry.block_ids}) == [0, 1, 2]
    assert host.stats().allocated_bytes == 3 * 4 * 256  # slab 3 never touched
    assert handle is not None and handle.num_runs == 1 and handle.num_copies > 6 + 4  # split at slab edges
    host.unpark("a", cache, page_ids=[10, 11, 12, 13, 14], state_slot=2)
    host.check_integrity()
    assert_same(page_bytes(cache, [10, 11, 12, 13, 14]), want)


def test_scattered_free_blocks_hold_an_entry_larger_than_any_hole() -> None:
    cache = make_cache()
    host = parking(cache, capacity_blocks=20, blocks_per_slab=8)
    for key in "abcde":  # 4 blocks each: the budget is full
        assert park(host, cache, key, [0], tokens_of(key, 4)) is not None
    assert host.blocks.num_free == 0
    for key in "ace":
        host.drop(key)
        host.check_integrity()
    assert host.blocks.num_free == 12 and blocks_of(host, 4) == 9  # holes of 4 blocks each
    want = page_bytes(cache, [3, 9, 10, 15])
    assert host.can_park(4)
    assert park(host, cache, "f", [3, 9, 10, 15], tokens_of("f", 16)) is not None
    assert host.entry_keys == ["b", "d", "f"] and host.stats().evictions == {"dropped": 3}
    assert len(host.blocks.extents(host.entry("f").block_ids)) == 3
    host.unpark("f", cache, page_ids=[12, 13, 14, 1], state_slot=3)
    host.check_integrity()
    assert_same(page_bytes(cache, [12, 13, 14, 1]), want)


# ---- LRU, pins, budget -----------------------------------------------------------------------------


def test_lru_eviction_order_and_reasons() -> None:
    cache, other = make_cache(), make_cache(kv_dtype="int8")
    host = parking(cache, capacity_blocks=12)
    assert blocks_of(host, 1) == 4 and blocks_of(host, 2) == 6
    for key in "abc":
        park(host, cache, key, [0], tokens_of(key, 4))
    assert host.lookup(tokens_of("a", 4)) is not None and host.entry_keys == ["a", "b", "c"]  # probe: no move
    host.touch("a")
    assert host.entry_keys == ["b", "c", "a"]
    park(host, cache, "d", [1], tokens_of("d", 4))
    assert host.entry_keys == ["c", "a", "d"] and host.stats().evictions == {"lru": 1}  # b: least recent
    park(host, cache, "a", [2], tokens_of("a", 4))
    assert host.entry_keys == ["c", "d", "a"] and host.stats().evictions == {"lru": 1, "replaced": 1}
    host.pin("c")
    assert host.can_park(2)
    park(host, cache, "e", [3, 4], tokens_of("e", 8))  # 6 blocks: c is pinned, so d then a go
    assert host.entry_keys == ["c", "e"] and host.stats().evictions == {"lru": 3, "replaced": 1}
    assert not host.can_park(6) and park(host, cache, "f", list(range(6)), tokens_of("f", 24)) is None
    assert not host.can_park(7) and park(host, cache, "g", list(range(7)), tokens_of("g", 28)) is None
    assert host.stats().refusals == {"pinned": 1, "oversize": 1} and host.entry_keys == ["c", "e"]
    host.unpin("c")
    host.drop("c")
    with pytest.raises(HostEntryMismatch, match="geometry"):
        host.unpark("e", other, page_ids=[0, 1], state_slot=0)
    host.check_integrity()
    assert len(host) == 0
    assert host.stats().evictions == {"lru": 3, "replaced": 1, "dropped": 1, "mismatch": 1}


def test_budget_zero_is_off() -> None:
    cache = make_cache()
    host = HostParking.from_mib(cache_geometry(cache), 0)
    assert not host.enabled and not host.can_park(1)
    assert park(host, cache, "a", [0], tokens_of("a", 4)) is None
    assert host.lookup(tokens_of("a", 4)) is None and len(host) == 0
    stats = host.stats()
    assert (stats.capacity_bytes, stats.allocated_bytes, stats.refusals) == (0, 0, {"off": 1})
    on = HostParking.from_mib(cache_geometry(cache), 1, block_bytes=4096)
    assert on.enabled and on.stats().capacity_bytes == 1 << 20 and on.stats().allocated_bytes == 0
    with pytest.raises(ValueError, match="host_kv_cache_mib"):
        HostParking.from_mib(cache_geometry(cache), -1)


def test_a_kept_restore_is_evicted_before_entries_never_restored() -> None:
    """Restoring an earlier checkpoint keeps the entry for its later ones, but at the front of the LRU: the
    restored tokens are on the device again, and a full budget evicts that remainder before another session's
    only copy (an agent's next turn restores P from [P, G]; the run on the H200 evicted other sessions first)."""
    cache = make_cache()
    probe = parking(cache, capacity_blocks=64)
    capacity = blocks_of(probe, 1, 2) + 2 * blocks_of(probe, 1)  # "a" (two checkpoints), "b" and "c"; no more
    host = parking(cache, capacity_blocks=capacity)
    park(host, cache, "a", [0], tokens_of("a", 4), [(2, 0), (4, 1)])
    park(host, cache, "b", [1], tokens_of("b", 4))
    park(host, cache, "c", [2], tokens_of("c", 4))
    host.pin("a")
    host.unpark("a", cache, page_ids=[5], state_slot=2, num_tokens=2, keep=True)
    host.check_integrity()
    assert host.entry_keys == ["a", "b", "c"]  # kept, first to go (it was the oldest anyway: move it last)
    host.touch("a")
    host.pin("a")
    host.unpark("a", cache, page_ids=[5], state_slot=2, num_tokens=2, keep=True)
    assert host.entry_keys == ["a", "b", "c"]
    park(host, cache, "d", [3], tokens_of("d", 4))
    host.check_integrity()
    assert host.entry_keys == ["b", "c", "d"] and host.stats().evictions == {"lru": 1}


def test_pins_hold_an_entry_across_restores_and_keep_retains_it() -> None:
    cache = make_cache()
    host = parking(cache, capacity_blocks=32)
    park(host, cache, "a", [0, 1], tokens_of("a", 8))
    host.pin("a")
    host.pin("a")
    host.unpark("a", cache, page_ids=[4, 5], state_slot=1)
    assert "a" in host and host.entry("a").num_pins == 1  # another scheduled restore still needs it
    host.unpark("a", cache, page_ids=[6, 7], state_slot=2)
    host.check_integrity()
    assert "a" not in host
    park(host, cache, "b", [0, 1], tokens_of("b", 8))
    host.unpark("b", cache, page_ids=[4, 5], state_slot=1, keep=True)
    host.check_integrity()
    assert "b" in host and host.stats().num_restores == 3


# ---- lookup ------------------------------------------------------------------------------------------


def test_lookup_is_non_destructive_and_finds_branch_points() -> None:
    cache = make_cache()
    host = parking(cache, capacity_blocks=64)
    tokens = tokens_of("a", 14)
    want_early = slot_bytes(cache, 0), page_bytes(cache, [2, 3])
    park(host, cache, "a", [2, 3, 4, 5], tokens, [(6, 0), (14, 1)])
    park(host, cache, "x", [8], tokens_of("x", 3))
    before = host.stats(), host.entry_keys, host.blocks.num_free

    full = host.lookup([*tokens, 7, 7])
    assert full is not None and (full.entry_key, full.num_tokens, full.num_pages) == ("a", 14, 4)
    branch = host.lookup([*tokens[:6], 50, 51, 52, 53, 54])  # diverges inside page 1, after checkpoint 6
    assert branch is not None and (branch.num_tokens, branch.num_pages) == (6, 2)
    assert branch.num_bytes == host.geometry.entry_bytes(2, 1)
    assert host.lookup([*tokens[:5], 77, 77, 77, 77]) is None  # diverges before the first checkpoint
    capped = host.lookup(tokens, max_tokens=13)
    assert capped is not None and capped.num_tokens == 6
    hashes: list[bytes] = []
    extend_page_hashes(hashes, [*tokens, 7], 15, PAGE_SIZE)
    assert host.lookup([*tokens, 7], page_hashes=hashes) == host.lookup([*tokens, 7])
    assert (host.stats(), host.entry_keys, host.blocks.num_free) == before  # probes moved nothing

    park(host, cache, "b", [9, 10], [*tokens[:6], 60, 61], [(6, 2)])  # the same turn-6 prefix, newer
    match = host.lookup([*tokens[:6], 50])
    assert match is not None and match.entry_key == "b"  # ties go to the most recently used
    host.touch("a")
    match = host.lookup([*tokens[:6], 50])
    assert match is not None and match.entry_key == "a"

    handle = host.unpark("a", cache, page_ids=[12, 13], state_slot=3, num_tokens=6)
    host.check_integrity()
    assert handle.num_bytes == host.geometry.entry_bytes(2, 1)  # only what checkpoint 6 needs
    assert_same(slot_bytes(cache, 3), want_early[0])
    assert_same(page_bytes(cache, [12, 13]), want_early[1])


# ---- integrity and copy runs -------------------------------------------------------------------------


def test_check_integrity_reports_the_numbers_that_disagree() -> None:
    cache = make_cache()
    host = parking(cache, capacity_blocks=32)
    park(host, cache, "a", [0, 1], tokens_of("a", 8))
    host._used_bytes += 1
    with pytest.raises(RuntimeError, match=r"host entries hold \d+ bytes, the counter says \d+"):
        host.check_integrity()
    host._used_bytes -= 1
    lost = host.entry("a").block_ids.pop()
    with pytest.raises(RuntimeError, match=r"in \d+ blocks \(want \d+\)"):
        host.check_integrity()
    host.entry("a").block_ids.append(lost)
    host.blocks.free([lost])
    with pytest.raises(RuntimeError, match="both free and held"):
        host.check_integrity()
    with pytest.raises(RuntimeError, match="already free"):
        host.blocks.free([lost])


def test_page_runs_coalesce_consecutive_ascending_ids() -> None:
    assert page_runs([4, 5, 6, 9, 2, 3]) == [(0, 4, 3), (3, 9, 1), (4, 2, 2)]
    assert page_runs([5, 4, 3]) == [(0, 5, 1), (1, 4, 1), (2, 3, 1)]
    assert page_runs([]) == []


def test_contiguous_pages_copy_in_one_run_per_tensor_and_scattered_pages_in_one_per_page() -> None:
    cache = make_cache()
    host = parking(cache, capacity_blocks=64, blocks_per_slab=64)  # one slab: entries are one extent
    num_paged, num_state = len(paged_tensors(cache)), len(state_tensors(cache))
    contiguous = park(host, cache, "a", [2, 3, 4, 5], tokens_of("a", 16))
    assert contiguous is not None and contiguous.num_runs == 1
    assert contiguous.num_copies == num_paged + num_state
    scattered = park(host, cache, "b", [9, 2, 7, 4], tokens_of("b", 16))
    assert scattered is not None and scattered.num_runs == 4
    assert scattered.num_copies == 4 * num_paged + num_state
    back = host.unpark("a", cache, page_ids=[12, 13, 0, 1], state_slot=1)
    assert back.num_runs == 2 and back.num_copies == 2 * num_paged + num_state


def test_short_runs_go_through_staging_chunks_and_long_runs_do_not() -> None:
    cache = make_cache(num_pages=32)
    host = parking(cache, capacity_blocks=64, blocks_per_slab=64, gather_run_bytes=128)  # 64-byte pages
    num_paged, num_state = len(paged_tensors(cache)), len(state_tensors(cache))
    scattered = [9, 2, 7, 4, 20, 30, 11]
    want = page_bytes(cache, scattered)
    handle = park(host, cache, "a", scattered, tokens_of("a", 28))  # runs of 64 bytes < 128: staged
    assert handle is not None and handle.num_runs == 7
    assert handle.num_copies == 3 * num_paged + num_state  # staging holds 3 pages: chunks of 3, 3, 1
    back = host.unpark("a", cache, page_ids=[0, 5, 10, 15, 21, 25, 31], state_slot=1)
    assert back.num_copies == 3 * num_paged + num_state
    assert_same(page_bytes(cache, [0, 5, 10, 15, 21, 25, 31]), want)
    contiguous = park(host, cache, "b", [3, 4, 5, 6], tokens_of("b", 16))  # one run of 256 bytes: direct
    assert contiguous is not None and contiguous.num_copies == num_paged + num_state
    host.check_integrity()


# ---- validation and a randomized run ----------------------------------------------------------------


def test_bad_calls_raise_value_errors() -> None:
    cache = make_cache()
    host = parking(cache, capacity_blocks=64)
    tokens = tokens_of("a", 8)
    for cps in ([], [(4, 0), (4, 1)], [(9, 0)], [(0, 0)]):
        with pytest.raises(ValueError, match="checkpoints"):
            host.park("a", cache, page_ids=[0, 1], token_ids=tokens, checkpoints=cps)
    with pytest.raises(ValueError, match="cannot hold"):
        host.park("a", cache, page_ids=[0], token_ids=tokens, checkpoints=[(8, 0)])
    park(host, cache, "a", [0, 1], tokens, [(8, 0)], extra={"h": torch.zeros(4)})
    with pytest.raises(ValueError, match="no parked entry"):
        host.unpark("zz", cache, page_ids=[0, 1], state_slot=0)
    with pytest.raises(ValueError, match="not a checkpoint"):
        host.unpark("a", cache, page_ids=[0, 1], state_slot=0, num_tokens=5)
    with pytest.raises(ValueError, match="extras"):
        host.unpark("a", cache, page_ids=[0, 1], state_slot=0, extra={"g": torch.zeros(4)})
    with pytest.raises(ValueError, match="parked as"):
        host.unpark("a", cache, page_ids=[0, 1], state_slot=0, extra={"h": torch.zeros(5)})
    host.check_integrity()


@pytest.mark.parametrize("gather_run_bytes", [0, 128], ids=["runs", "staged"])
def test_random_operations_keep_integrity_and_every_restore_exact(gather_run_bytes: int) -> None:
    rng = random.Random(7)
    cache = make_cache(num_pages=32, num_slots=6)
    host = parking(cache, capacity_blocks=40, blocks_per_slab=8, gather_run_bytes=gather_run_bytes)
    parked: dict[str, tuple[list[torch.Tensor], dict[int, list[torch.Tensor]]]] = {}
    for _ in range(300):
        op = rng.random()
        if op < 0.5:
            key = f"k{rng.randrange(12)}"
            num_tokens = rng.randrange(1, 29)
            pages = rng.sample(range(32), host.geometry.pages_for(num_tokens))
            cps = [
                (n, rng.randrange(6))
                for n in sorted(rng.sample(range(1, num_tokens + 1), min(2, num_tokens)))
            ]
            snapshot = page_bytes(cache, pages), {n: slot_bytes(cache, s) for n, s in cps}
            if park(host, cache, key, pages, tokens_of("k", num_tokens), cps) is not None:
                parked[key] = snapshot
        elif op < 0.8 and len(host):
            key = str(rng.choice(host.entry_keys))
            entry = host.entry(key)
            num_tokens = rng.choice(entry.checkpoints)
            dest = rng.sample(range(32), host.geometry.pages_for(num_tokens))
            slot = rng.randrange(6)
            host.unpark(
                key, cache, page_ids=dest, state_slot=slot, num_tokens=num_tokens, keep=rng.random() < 0.5
            )
            pages_want, states_want = parked[key]
            assert_same(page_bytes(cache, dest), [p[: len(dest)] for p in pages_want])
            assert_same(slot_bytes(cache, slot), states_want[num_tokens])
            for t in paged_tensors(cache) + state_tensors(cache):  # fresh bytes for later parks
                t.view(-1).view(torch.uint8).random_(0, 256)
        elif len(host):
            host.drop(str(rng.choice(host.entry_keys)))
        host.check_integrity()
        parked = {k: v for k, v in parked.items() if k in host}
    stats = host.stats()
    assert stats.num_parks > 50 and stats.num_restores > 30 and stats.evictions.get("lru", 0) > 0

"""Host parking on CUDA (`HostIndex` + `HostCopier`): pinned slabs, the dedicated copy stream, events, bit-exact round trip.

Run on the device machine (`-m gpu`); the CPU suite deselects it.
"""

from __future__ import annotations

import pytest
import torch
from test_host import assert_same, make_cache, page_bytes, parking, slot_bytes, tokens_of

from engine.runner.host_layout import paged_tensors, state_tensors

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("gather_run_bytes", [0, 1 << 20], ids=["runs", "staged"])
def test_gpu_round_trip_is_bit_exact_through_pinned_slabs_on_a_copy_stream(gather_run_bytes: int) -> None:
    assert torch.cuda.is_available(), "the gpu marker needs a CUDA device"
    src, dst = make_cache(device="cuda", seed=1), make_cache(device="cuda", seed=2)
    host = parking(
        src, capacity_blocks=64, blocks_per_slab=4, device="cuda", gather_run_bytes=gather_run_bytes
    )
    pages, new_pages = [1, 2, 5, 6, 7, 11], [7, 3, 0, 4, 2, 15]
    hidden = torch.randn(3, 16, device="cuda").to(torch.bfloat16)
    want_pages, want_late = page_bytes(src, pages), slot_bytes(src, 3)
    torch.cuda.synchronize()

    handle = host.park(
        "a", src, page_ids=pages, token_ids=tokens_of("a", 22), checkpoints=[(9, 0), (22, 3)],
        extra={"mtp_hidden": hidden},
    )  # fmt: skip
    host.check_integrity()
    assert handle is not None and handle.num_bytes == host.geometry.entry_bytes(6, 2, hidden.numel() * 2)
    slabs = [s for s in host.copier.slabs._slabs if s is not None]
    assert len(slabs) > 1 and all(s.is_pinned() for s in slabs)  # the entry spans pinned slabs
    assert host.copier._stream is not None and host.copier._stream != torch.cuda.current_stream()
    host.copier.wait_copies()  # the compute stream may now overwrite the parked pages
    for t in paged_tensors(src) + state_tensors(src):
        t.zero_()

    out = torch.zeros_like(hidden)
    back = host.unpark("a", dst, page_ids=new_pages, state_slot=1, extra={"mtp_hidden": out})
    back.wait()  # the current stream reads the restored pages only after the copies
    restored_pages, restored_state = page_bytes(dst, new_pages), slot_bytes(dst, 1)
    restored_hidden = out.view(torch.int16).cpu()
    torch.cuda.synchronize()
    assert handle.done() and back.done()
    assert_same(restored_pages, want_pages)
    assert_same(restored_state, want_late)
    assert torch.equal(restored_hidden, hidden.view(torch.int16).cpu())

    park2 = host.park("b", dst, page_ids=new_pages, token_ids=tokens_of("a", 22), checkpoints=[(9, 1)])
    assert park2 is not None
    early = host.unpark("b", src, page_ids=[12, 13, 14], state_slot=2)
    early.synchronize()
    assert_same(slot_bytes(src, 2), slot_bytes(dst, 1))
    assert_same(page_bytes(src, [12, 13, 14]), [p[:3] for p in want_pages])
    host.copier.synchronize()
    host.check_integrity()
    stats = host.stats()
    assert stats.num_parks == 2 and stats.num_restores == 2
    assert stats.park_seconds > 0 and stats.restore_seconds > 0

"""The Triton token-bitmask kernel vs its reference (GPU; or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.bitmask import apply_token_bitmask_, apply_token_bitmask_ref_

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("rows", "vocab"), [(1, 70), (8, 248320), (3, 5000), (5, 4097)])
def test_apply_token_bitmask_matches_reference_exactly(rows, vocab, device):
    gen = torch.Generator().manual_seed(rows * vocab)
    logits = torch.randn(rows, vocab, generator=gen).to(device)
    words = -(-vocab // 32)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32, generator=gen).to(device)
    bitmask[0] = -1  # an unconstrained row: all ones leaves it untouched
    expect = apply_token_bitmask_ref_(logits.clone(), bitmask)
    got = apply_token_bitmask_(logits.clone(), bitmask)
    assert torch.equal(got, expect)
    assert torch.equal(got[0], logits[0])
    assert bool(torch.isinf(got[1:]).any()) or rows == 1


def test_apply_token_bitmask_on_a_strided_logits_view(device):
    gen = torch.Generator().manual_seed(0)
    wide = torch.randn(4, 300, generator=gen).to(device)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (4, 8), dtype=torch.int32, generator=gen).to(device)
    expect = apply_token_bitmask_ref_(wide[:, :250].clone(), bitmask)
    got = apply_token_bitmask_(wide[:, :250], bitmask)
    assert torch.equal(got, expect) and torch.equal(wide[:, :250], expect)

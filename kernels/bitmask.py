"""Token bitmask application: set the logits a packed allowed-token bitmask forbids to -inf, in place.

``apply_token_bitmask_ref_`` is the torch reference (a byte-table gather then ``masked_fill_``, several
launches); ``apply_token_bitmask_`` launches one Triton kernel for the whole batch on CUDA (one read of each
bitmask word, a write of each forbidden logit only) and falls back to the reference elsewhere.

Layout (llguidance's and xgrammar's): ``bitmask`` [B, ceil(V / 32)] int32; bit b of word w of row r allows
token 32 * w + b of row r. Bits past V are ignored. A row of all ones (-1 words) leaves its logits untouched.
"""

from __future__ import annotations

import torch

from kernels._dispatch import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def _byte_bits(device: torch.device) -> torch.Tensor:
    """[256, 8] bool: bit j of byte value v (the lookup that unpacks a bitmask in one gather)."""
    table = _BYTE_BITS.get(device)
    if table is None:
        values = torch.arange(256, dtype=torch.int32, device=device)
        table = ((values[:, None] >> torch.arange(8, dtype=torch.int32, device=device)) & 1).bool()
        _BYTE_BITS[device] = table
    return table


def _check(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    vocab_size = logits.shape[-1]
    assert bitmask.dtype == torch.int32 and bitmask.shape == (logits.shape[0], -(-vocab_size // 32)), (
        f"bitmask {tuple(bitmask.shape)} {bitmask.dtype} does not fit logits {tuple(logits.shape)}"
    )


def apply_token_bitmask_ref_(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [B, V] float (modified in place and returned), bitmask [B, ceil(V / 32)] int32.

    The int32 words are read as little-endian bytes (x86 and CUDA devices), so byte k of a row holds
    tokens 8k..8k+7 and one table gather unpacks every bit.
    """
    _check(logits, bitmask)
    table = _byte_bits(logits.device)
    allowed = table[bitmask.view(torch.uint8).long()].flatten(1)[:, : logits.shape[-1]]
    return logits.masked_fill_(~allowed, float("-inf"))


if HAS_TRITON:

    @triton.jit
    def _apply_token_bitmask_kernel(
        logits_ptr, bitmask_ptr, vocab_size, logits_stride, bitmask_stride, BLOCK: tl.constexpr
    ):
        # grid (B, cdiv(V, BLOCK)): one program masks BLOCK logits of one row.
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < vocab_size
        words = tl.load(bitmask_ptr + row * bitmask_stride + cols // 32, mask=inside, other=-1)
        forbidden = ((words >> (cols % 32)) & 1) == 0
        minus_inf = tl.full([BLOCK], float("-inf"), logits_ptr.dtype.element_ty)
        tl.store(logits_ptr + row * logits_stride + cols, minus_inf, mask=inside & forbidden)  # no logit read


def apply_token_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """One launch for the whole batch on CUDA (see module doc); the reference elsewhere."""
    if not use_triton(logits, bitmask) or logits.stride(-1) != 1:
        return apply_token_bitmask_ref_(logits, bitmask)
    _check(logits, bitmask)
    bitmask = bitmask if bitmask.stride(-1) == 1 else bitmask.contiguous()
    block = 4096
    grid = (logits.shape[0], triton.cdiv(logits.shape[-1], block))
    _apply_token_bitmask_kernel[grid](
        logits, bitmask, logits.shape[-1], logits.stride(0), bitmask.stride(0), BLOCK=block
    )
    return logits

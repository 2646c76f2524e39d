"""The model's CUDA paths against the torch references (`-m gpu`, run on the device machine): the grouped
MoE experts, and a whole chunked prefill + decode (paged prefill attention, fla chunked GDN, the varlen conv,
RoPE, the fused MoE and the Triton decode kernels) against the same model on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import kernels._dispatch
import kernels.gdn
from engine.core import load_artifact
from engine.model import allocate_model_cache, make_forward_batch
from engine.model.mlp import _experts_grouped
from engine.testing.tiny import build_tiny
from kernels.moe import moe_experts_ref, moe_route_ref

pytestmark = pytest.mark.gpu


def _rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()).item()


@pytest.mark.parametrize(
    ("tokens", "experts", "top_k", "hidden", "inter"),
    [(300, 8, 2, 64, 48), (777, 256, 8, 256, 64), (7680, 256, 8, 2048, 512)],  # the last: 35B-A3B prefill
)
def test_grouped_experts_match_the_reference(
    tokens: int, experts: int, top_k: int, hidden: int, inter: int
) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    gate_up = (
        torch.randn(experts, 2 * inter, hidden, device="cuda", generator=gen) * hidden**-0.5
    ).bfloat16()
    down = (torch.randn(experts, hidden, inter, device="cuda", generator=gen) * inter**-0.5).bfloat16()
    weights, ids = moe_route_ref(torch.randn(tokens, experts, device="cuda", generator=gen), top_k)
    shared = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    expected = moe_experts_ref(x.float(), gate_up.float(), down.float(), weights, ids)
    assert _rel_rms(_experts_grouped(x, gate_up, down, weights, ids), expected) < 1e-2
    out = _experts_grouped(x, gate_up, down, weights, ids, shared)
    assert _rel_rms(out, expected + shared.float()) < 1e-2
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # the prefill path reads nothing back to the host
    try:
        again = _experts_grouped(x, gate_up, down, weights, ids, shared)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(again, out), "two runs of the same batch differ"


@pytest.mark.parametrize(
    ("arch", "gdn", "limit"),
    [
        ("dense", "reference", 2e-3),
        ("moe", "reference", 2e-3),
        # NINFER_MOE_ROUTER=fused: the decode rows route in one launch (kernels/moe_router.py)
        ("moe-fused-router", "reference", 2e-3),
        # NINFER_ATTN_FUSE=on: q/k norms, RoPE and the KV store in one launch, the output gate in the decode reduce
        ("dense-attn-fuse", "reference", 2e-3),
        # fla-core's chunked kernels multiply fp32 inputs in TF32 (10-bit mantissa): ~1e-3 per GDN layer. Not
        # run for the MoE model: TF32 noise flips near-tie top-k routing choices, whose outputs then differ by
        # whole experts. fla's kernel itself is checked against the reference in tests/kernels/test_gdn_triton.py.
        ("dense", "fla", 2e-2),
    ],
)
def test_cuda_chunked_prefill_and_decode_match_the_cpu_model(
    arch: str, gdn: str, limit: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every other CUDA path (paged prefill attention, the conv and RoPE kernels, the decode kernels, the MoE)
    in fp32 against the CPU model; the chunked GDN runs either the torch reference on the GPU or fla-core."""
    if arch == "moe-fused-router":
        arch = "moe"
        monkeypatch.setattr(kernels._dispatch, "MOE_ROUTER_MODE", "fused")
    if arch == "dense-attn-fuse":
        arch = "dense"
        monkeypatch.setattr(kernels._dispatch, "ATTN_FUSE", "on")
    if gdn == "reference":
        monkeypatch.setattr(kernels.gdn, "_fla_chunk", lambda: None)
    else:
        assert kernels.gdn._fla_chunk() is not None, "fla-core is not installed on this GPU machine"
    path = build_tiny(tmp_path / f"tiny-{arch}.ninfer", arch=arch, seed=0)
    logits = {}
    for device in ("cpu", "cuda"):
        model = load_artifact(path, device=device, dtype=torch.float32).model
        config = model.config
        tokens = torch.randint(
            0, config.vocab_size, (90,), generator=torch.Generator().manual_seed(1)
        ).tolist()
        cache = allocate_model_cache(config, 8, 16, 2, dtype=torch.float32, device=device)
        pages, out = list(range(8)), []
        with torch.inference_mode():
            for start, end in ((0, 50), (50, 88), (88, 89), (89, 90)):
                batch = make_forward_batch([tokens[start:end]], [start], [pages], [1], 16, device=device)
                out.append(model.compute_logits(model(batch, cache)).cpu())
        logits[device] = torch.cat(out)
    assert _rel_rms(logits["cuda"], logits["cpu"]) < limit


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_a_mixed_prefill_step_reads_nothing_back_to_the_host(arch: str, tmp_path: Path) -> None:
    """A varlen step (a fresh prompt, a chunk continuing a cached prefix and a decode row) runs the whole
    model (bf16, fla-core's chunked GDN, the fused MoE) without one device-to-host sync: the GDN prefill takes
    the sequence bounds from the batch's host mirrors, so the host keeps queueing kernels ahead of the GPU."""
    path = build_tiny(tmp_path / f"tiny-{arch}.ninfer", arch=arch, seed=0)
    model = load_artifact(path, device="cuda", dtype=torch.bfloat16).model
    config = model.config
    tokens = torch.randint(0, config.vocab_size, (300,), generator=torch.Generator().manual_seed(2)).tolist()
    cache = allocate_model_cache(config, 24, 16, 4, dtype=torch.bfloat16, device="cuda")
    with torch.inference_mode():
        first = make_forward_batch([tokens[:40], tokens[100:101]], [0, 0], [range(8), range(8, 16)], [1, 2],
                                   16, device="cuda")  # fmt: skip
        model(first, cache)
        step = make_forward_batch(
            [tokens[200:297], tokens[40:90], tokens[101:102]], [0, 40, 1],
            [range(16, 24), range(8), range(8, 16)], [3, 1, 2], 16, device="cuda",
        )  # fmt: skip
        expected = model.compute_logits(model(step, cache), step.last_token_indices()).float()  # warm-up
        # Run the same step again from the same state: restore what the warm-up wrote.
        cache = allocate_model_cache(config, 24, 16, 4, dtype=torch.bfloat16, device="cuda")
        model(first, cache)
        last = step.last_token_indices()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            logits = model.compute_logits(model(step, cache), last)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert _rel_rms(logits.float(), expected) < 1e-2

"""The vision tower on CUDA against itself on the CPU (`-m gpu`, run on the device machine), at the real
head size (16 heads x 72, width 1152) with two blocks: float32 within 1e-4 relative, bf16 within 2e-2."""

from __future__ import annotations

import pytest
import torch

from engine.model.vision import VisionConfig, VisionTower

pytestmark = pytest.mark.gpu

GRIDS = [[1, 32, 24], [1, 8, 8], [3, 12, 16]]  # two images and a 6-frame video in one call


@pytest.fixture(scope="module")
def tower_and_input():
    config = VisionConfig.from_hf({"vision_config": {"depth": 2, "out_hidden_size": 512}})
    torch.manual_seed(0)
    tower = VisionTower(config).eval()
    for name, p in tower.named_parameters():
        p.data.normal_(1.0 if name.endswith("norm1.weight") or name.endswith("norm2.weight") else 0.0, 0.03)
    grid = torch.tensor(GRIDS)
    pixels = torch.randn(int(grid.prod(-1).sum()), config.patch_dim)
    with torch.no_grad():
        expected = tower(pixels, grid)
    return tower, pixels, grid, expected


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_tower_on_cuda_matches_the_cpu(tower_and_input, dtype, tolerance):
    tower, pixels, grid, expected = tower_and_input
    gpu = VisionTower(tower.config)
    gpu.load_state_dict(tower.state_dict())
    gpu = gpu.to("cuda", dtype).eval()
    with torch.no_grad():
        out = gpu(pixels.to("cuda", dtype), grid).float().cpu()
    rel = ((out - expected).abs().max() / expected.abs().max()).item()
    assert rel < tolerance, f"{dtype}: max relative error {rel:.2e}"


def test_engine_with_an_image_on_cuda_graphs_equal_eager(tmp_path):
    """The splice and the rope delta on the GPU: a tiny model with a tiny tower, greedy tokens of an image prompt
    with CUDA-graph decode (the delta written into the graph's position buffer) equal eager decode."""
    import io

    from PIL import Image

    from engine.llm import LLM
    from engine.request import SamplingParams
    from engine.testing.tiny import build_tiny

    artifact = build_tiny(tmp_path / "tiny-vl.ninfer", vision=True)
    buf = io.BytesIO()
    Image.effect_noise((128, 96), 64).convert("RGB").save(buf, "PNG")
    prompt = {
        "prompt": "Look: <|vision_start|><|image_pad|><|vision_end|> and say",
        "multi_modal_data": {"image": buf.getvalue()},
    }
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, presence_penalty=0.0)
    outs = []
    for graphs in (True, False):
        llm = LLM(artifact, vision=True, max_context=256, device="cuda", cuda_graph=graphs)
        outs.append(llm.generate(prompt, params)[0].outputs[0].token_ids)
        if graphs:
            assert llm.core.runner.num_graph_steps > 0
    assert outs[0] == outs[1]

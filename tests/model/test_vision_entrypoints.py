"""Images through the Python and command-line entry points on a tiny model with a tiny tower (CPU): `LLM.generate`
with vLLM's `multi_modal_data`, `LLM.chat` with an `image_url` part (a file path), and `ninfer --messages` with an
image part, which is refused without `--vision` (exit 2, before loading) instead of being dropped."""

from __future__ import annotations

import io
import json

import pytest
import torch
from PIL import Image

from engine.cli import main as ninfer_main
from engine.llm import LLM
from engine.media import MediaError
from engine.request import SamplingParams
from engine.testing.tiny import MEDIA_TOKEN_IDS, build_tiny

GREEDY = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, presence_penalty=0.0)
PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
IMAGE_PAD = MEDIA_TOKEN_IDS["image_token_id"]


def png(seed: int, size: int = 64) -> bytes:
    image = Image.new("RGB", (size, size), ((seed * 50) % 256, 80, (seed * 90) % 256))
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    return build_tiny(tmp_path_factory.mktemp("tiny_vl") / "tiny-vl.ninfer", vision=True)


@pytest.fixture(scope="module")
def llm(artifact):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LLM(artifact, vision=True, max_context=256, dtype=torch.float32, device="cpu")
    torch.set_num_threads(before)


def test_generate_with_multi_modal_data(llm):
    prompt = f"Describe {PLACEHOLDER} and {PLACEHOLDER}."
    one, again, other = llm.generate(
        [{"prompt": prompt, "multi_modal_data": {"image": [png(1), png(2)]}},
         {"prompt": prompt, "multi_modal_data": {"image": [png(1), png(2)]}},
         {"prompt": prompt, "multi_modal_data": {"image": [Image.open(io.BytesIO(png(3))), png(2, 128)]}}],
        GREEDY,
    )  # fmt: skip
    assert one.prompt_token_ids.count(IMAGE_PAD) == 4 + 4  # 64x64 at the tiny budget: 4 tokens each
    assert other.prompt_token_ids.count(IMAGE_PAD) == 4 + 16
    assert one.outputs[0].token_ids == again.outputs[0].token_ids and len(one.outputs[0].token_ids) == 3
    with pytest.raises(MediaError, match="one <|vision_start|>"):
        llm.generate({"prompt": prompt, "multi_modal_data": {"image": png(1)}}, GREEDY)


def test_chat_with_an_image_file(llm, tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(png(4))
    out = llm.chat([{"role": "user", "content": [{"type": "text", "text": "What is it?"},
                                                  {"type": "image_url", "image_url": {"url": str(path)}}]}],
                   GREEDY)  # fmt: skip
    assert out.prompt_token_ids.count(IMAGE_PAD) == 4 and len(out.outputs[0].token_ids) == 3


def test_cli_refuses_media_without_vision_and_answers_with_it(artifact, tmp_path, capsys):
    path = tmp_path / "b.png"
    path.write_bytes(png(5))
    messages = tmp_path / "m.json"
    content = [{"type": "image_url", "image_url": {"url": str(path)}}, {"type": "text", "text": "Describe."}]
    messages.write_text(json.dumps([{"role": "user", "content": content}]))
    args = [str(artifact), "--messages", str(messages), "--max-new", "2", "--greedy", "--device", "cpu"]
    assert ninfer_main(args) == 2
    assert "--vision" in capsys.readouterr().err
    assert ninfer_main([*args, "--vision"]) == 0
    err = capsys.readouterr().err
    assert "2 generated" in err

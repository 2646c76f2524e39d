"""IncrementalDetokenizer: deltas never split a character, add up to the full decode, and never leak
the start of a stop string."""

from __future__ import annotations

import pytest

from engine.tokenizer import IncrementalDetokenizer, Tokenizer, qwen35_tokenizer

TEXT = "Bonjour 😀🫠🦩👍🏽! 𠀋你好世界，测试一下。👨‍👩‍👧 emoji family, then plain ASCII.\n한국어 🇯🇵 end"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return qwen35_tokenizer()


def _deltas(detok: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [detok.add(i) for i in ids] + [detok.finish()]


def test_deltas_concatenate_to_full_decode(tok: Tokenizer) -> None:
    ids = tok.encode(TEXT)
    # Some tokens are partial UTF-8 sequences: the test is only meaningful if the text has them.
    assert any(not _is_utf8(tok.token_bytes[i]) for i in ids)
    deltas = _deltas(IncrementalDetokenizer(tok), ids)
    assert "".join(deltas) == tok.decode(ids) == TEXT
    assert all("\ufffd" not in d for d in deltas)


def test_partial_character_is_held_until_complete(tok: Tokenizer) -> None:
    ids = tok.encode("🫠")
    assert len(ids) == 3, "the emoji must span several byte-level tokens for this test"
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(i) for i in ids[:-1]] == ["", ""]
    assert detok.add(ids[-1]) == "🫠"


def test_incomplete_character_at_the_end_flushes_as_replacement(tok: Tokenizer) -> None:
    ids = tok.encode("a🫠")[:-1]
    detok = IncrementalDetokenizer(tok)
    assert "".join(_deltas(detok, ids)) == tok.decode(ids) == "a\ufffd"


def test_special_tokens_skipped_or_kept(tok: Tokenizer) -> None:
    ids = tok.encode("<think>\nr\n</think>\n\nhi<|im_end|>")
    assert "".join(_deltas(IncrementalDetokenizer(tok), ids)) == "<think>\nr\n</think>\n\nhi"
    kept = IncrementalDetokenizer(tok, skip_special_tokens=False)
    assert "".join(_deltas(kept, ids)) == "<think>\nr\n</think>\n\nhi<|im_end|>"


def test_stop_string_is_cut_and_never_leaks(tok: Tokenizer) -> None:
    text = "The answer is 42. END of story, more text"
    ids = tok.encode(text)
    detok = IncrementalDetokenizer(tok, stop=["END"])
    shown = ""
    for i in ids:
        shown += detok.add(i)
        assert "E" not in shown  # not even "E" or "EN", which might still grow into "END"
    shown += detok.finish()
    assert shown == "The answer is 42. "
    assert detok.stop_matched == "END"
    assert detok.add(ids[0]) == "" and detok.finish() == ""


def test_stop_prefix_tail_is_held_then_released(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["<STOP>"])
    out = detok.add_many(tok.encode("value <ST"))
    assert out == "value "  # "<ST" could still become "<STOP>"
    out += detok.add_many(tok.encode("ART here"))
    assert out == "value <START here"
    assert detok.finish() == "" and detok.stop_matched is None


def test_held_tail_is_released_at_finish(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["\n\nUser:"])
    out = detok.add_many(tok.encode("done\n\nUs"))
    assert out == "done"
    assert detok.finish() == "\n\nUs"


def test_stop_across_a_multibyte_character(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["😀"], include_stop=True)
    shown = "".join(_deltas(detok, tok.encode("smile 😀 after")))
    assert shown == "smile 😀"
    assert detok.stop_matched == "😀"


def test_earliest_of_several_stops_wins(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["world", "lo w"])
    shown = "".join(_deltas(detok, tok.encode("hello world")))
    assert shown == "hel" and detok.stop_matched == "lo w"


def test_padding_ids_past_the_vocabulary_have_no_text(tok: Tokenizer) -> None:
    detok = IncrementalDetokenizer(tok)
    assert detok.add(248_300) == ""
    with pytest.raises(ValueError):
        detok.add(-1)
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tok, stop=[""])


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True

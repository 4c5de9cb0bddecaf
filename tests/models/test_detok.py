"""The one incremental detokenizer (dart_core.models.detok), used by the API's streaming text and the page's
answer spans: a character split over byte tokens is released whole, never as U+FFFD, and the pieces join to
the full decode."""
from __future__ import annotations

import pytest

from dart_core.models.detok import IncrementalDetokenizer, incremental_texts


def byte_decode(ids):
    """A byte-level tokenizer: token id = one UTF-8 byte."""
    return bytes(ids).decode("utf-8", errors="replace")


def ids_of(text: str) -> list[int]:
    return list(text.encode("utf-8"))


@pytest.mark.parametrize("text", ["caf\u00e9 ok", "hi \U0001F600!", "\u4f60\u597d\u4e16\u754c", "a\u00e9\U0001F44D\u4e2dz",
                                  "\U0001F468\u200d\U0001F469\u200d\U0001F467 family"])
def test_split_characters_are_released_whole(text):
    ids = ids_of(text)
    pieces = incremental_texts(ids, byte_decode)
    assert len(pieces) == len(ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    # each character goes to the byte token that completes it: the pieces are whole characters
    assert [p for p in pieces if p] == [c for c in text]


def test_push_holds_back_until_the_character_is_complete():
    d = IncrementalDetokenizer(byte_decode)
    emoji = ids_of("\U0001F600")          # 4 bytes
    assert d.push(ids_of("ab")) == "ab"
    assert d.push(emoji[:2]) == "" and d.pending
    assert d.push(emoji[2:3]) == ""
    assert d.push(emoji[3:] + ids_of("c")) == "\U0001F600c" and not d.pending
    cjk = ids_of("\u4e2d")                 # 3 bytes, pushed across two steps
    assert d.push(cjk[:1]) == ""
    assert d.push(cjk[1:]) == "\u4e2d"
    assert d.flush() == ""


def test_a_lone_invalid_byte():
    # in the middle: held while it is the last thing decoded, then released (as U+FFFD) with what follows
    ids = ids_of("a") + [0xFF] + ids_of("b")
    pieces = incremental_texts(ids, byte_decode)
    assert "".join(pieces) == byte_decode(ids) == "a\ufffdb"
    assert pieces == ["a", "", "\ufffdb"]
    # at the end: it never completes, so push keeps it back and flush releases it
    d = IncrementalDetokenizer(byte_decode)
    assert d.push(ids_of("x") + [0xC3]) == ""
    assert d.pending and d.flush() == "x\ufffd" and not d.pending
    assert incremental_texts(ids_of("x") + [0xC3], byte_decode) == ["x", "\ufffd"]


def test_empty_and_plain_ascii():
    assert incremental_texts([], byte_decode) == []
    assert incremental_texts(ids_of("plain"), byte_decode) == list("plain")
    assert IncrementalDetokenizer(byte_decode).push([]) == ""


def test_window_decode_keeps_context_sensitive_spaces():
    """A tokenizer that drops the leading space of a decoded sequence's first token (SentencePiece-style):
    the window keeps one released token as context, so the pieces still join to the full decode."""
    vocab = {1: "\u2581Hello", 2: "\u2581world", 3: "!"}

    def sp_decode(ids):
        return "".join(vocab[i] for i in ids).replace("\u2581", " ").lstrip(" ")

    pieces = incremental_texts([1, 2, 3], sp_decode)
    assert "".join(pieces) == sp_decode([1, 2, 3]) == "Hello world!"


def test_a_real_byte_level_tokenizer_streams_whole_characters():
    """With a byte-level BPE tokenizer (tiny_models), characters outside its merges split over byte tokens: the
    per-token texts hold no U+FFFD and join to the full decode, in one pass or pushed step by step."""
    from tiny_models import make_tiny_tokenizer
    tok = make_tiny_tokenizer()
    text = "caf\u00e9 \U0001F600 \u4f60\u597d, \U0001F44D\U0001F3FD ok"
    ids = tok.encode(text, add_special_tokens=False)
    decode = lambda ids: tok.decode(ids, skip_special_tokens=True)  # noqa: E731
    assert decode(ids) == text and len(ids) > len(text.split())
    pieces = incremental_texts(ids, decode)
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    d = IncrementalDetokenizer(decode)
    streamed = [d.push(ids[i:i + 3]) for i in range(0, len(ids), 3)]
    assert "".join(streamed) + d.flush() == text and not any("\ufffd" in s for s in streamed)

"""Incremental detokenization: the text a growing token sequence adds, never half a character.

A byte-level tokenizer can split one character (an emoji, a CJK character, an accented letter) over
several tokens; decoding them one at a time shows U+FFFD (the replacement character) until the last
byte arrives. :class:`IncrementalDetokenizer` holds such text back and releases it whole with the
token that completes it. It decodes a short window (the tokens since the last released text plus
the ones before it, as vLLM and TGI do), so the released pieces join to exactly ``decode(tokens)``
for byte-level tokenizers, including those that treat a sequence's first token specially.

    detok = IncrementalDetokenizer(lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    for ids in steps:
        print(detok.push(ids), end="")   # '' while a character is still incomplete
    print(detok.flush())                 # what is still held back (an unfinished or invalid byte), if anything

Used by the Python API's streaming text (dart_core.api.dart_generate_stream) and the page's per-token
answer spans (dart_core.ui.record.token_spans).
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Text of a growing token sequence, released only once it is stable.

    ``decode``: ids -> text. ``push(ids)`` adds tokens and returns the text they complete ('' while the
    text so far ends in U+FFFD, i.e. a character is still split); ``flush()`` returns what is held back.
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.tokens: list[int] = []
        self._prefix = 0   # the window decoded for context starts here
        self._read = 0     # tokens before this have had their text released

    def push(self, ids: Iterable[int]) -> str:
        self.tokens.extend(int(i) for i in ids)
        before = self.decode(self.tokens[self._prefix:self._read])
        now = self.decode(self.tokens[self._prefix:])
        if len(now) > len(before) and not now.endswith(REPLACEMENT):
            self._prefix, self._read = self._read, len(self.tokens)
            return now[len(before):]
        return ""

    @property
    def pending(self) -> bool:
        """Whether tokens are held back (their text not yet released)."""
        return self._read < len(self.tokens)

    def flush(self) -> str:
        """Release the held-back text as it decodes now (U+FFFD for a byte that never completed)."""
        if not self.pending:
            return ""
        text = self.decode(self.tokens[self._prefix:])[len(self.decode(self.tokens[self._prefix:self._read])):]
        self._prefix = self._read = len(self.tokens)
        return text


def incremental_texts(tokens: Sequence[int], decode: Callable[[list[int]], str]) -> list[str]:
    """Per token, the text it adds; joined they equal ``decode(tokens)`` for byte-level tokenizers.

    A character split over several byte tokens is credited whole to the token that completes it; text
    still held back at the end (an unfinished character) goes to the last token.
    """
    detok = IncrementalDetokenizer(decode)
    out = [detok.push([t]) for t in tokens]
    if out:
        out[-1] += detok.flush()
    return out

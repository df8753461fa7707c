"""Token ids of a text that arrives in pieces: the whole text's ids, each given out once later text cannot change it.

`TokenStream(tokenizer).feed(delta)` gives the ids of the text so far that no continuation can change, and holds the
rest back; after `finish` the ids given are exactly `Tokenizer.encode(text, added_tokens=False)` of the whole text
(what a prompt reads a user's text as). Each of `bpe.Tokenizer.encode`'s steps can look ahead, so each holds back:

| step          | what later text can change                       | held back                                     |
|---------------|--------------------------------------------------|-----------------------------------------------|
| NFC           | a character a later mark or jamo composes with,  | from the last character that may be composed  |
|               | or that later marks are reordered around         | with the one before it (`_fresh_start`) on    |
| pre-tokenizer | a word whose regex read up to the text's end:    | from the first word one of whose runs (letters |
|               | "hel" + "lo", "中文和E" + "nglish" (the run of    | and marks, punctuation and its newlines and    |
|               | non-lower letters backtracks), a whitespace run  | slashes, whitespace) from its start reaches    |
|               | (its last space may start the next word)         | the end (`_word_settled`)                      |
| BPE           | nothing: it merges inside one word               | -                                             |

Added tokens are not cut out (the text is read as text), so nothing waits for an added token's spelling. Introduced
in 19.
"""
from __future__ import annotations

import functools
import unicodedata

from .bpe import HEAD, PREFIX, PUNCT, TAIL, WHITESPACE, Tokenizer, char_kind, nfc, pretokenize

_HANGUL_SECONDS = (range(0x1161, 0x1176), range(0x11A8, 0x11C3))   # a vowel after L, a final after LV: composed


@functools.cache
def _composition_seconds() -> frozenset[str]:
    """Every character that canonical composition may join to the character before it: the second of a two-character
    canonical decomposition, and Hangul's vowel and final jamo."""
    seconds = {chr(c) for r in _HANGUL_SECONDS for c in r}
    for cp in range(0xC0, 0x30000):
        d = unicodedata.decomposition(chr(cp))
        if d and not d.startswith("<"):
            parts = d.split()
            if len(parts) == 2:
                seconds.add(chr(int(parts[1], 16)))
    return frozenset(seconds)


def _fresh_start(ch: str) -> bool:
    """Whether NFC never acts across the boundary before `ch`: a starter (combining class 0, so nothing is reordered
    around it or composed past it) that no composition joins to what precedes it, and that NFC leaves as it is."""
    if ch.isascii():
        return True
    return (unicodedata.combining(ch) == 0 and ch not in _composition_seconds()
            and unicodedata.normalize("NFC", ch) == ch)


def stable_split(text: str) -> int:
    """The last position p > 0 before which NFC can be applied apart: nfc(text[:p] + x) == nfc(text[:p]) + nfc(x)
    for any x that starts with text[p:] (0 when there is none)."""
    for p in range(len(text) - 1, 0, -1):
        if _fresh_start(text[p]):
            return p
    return 0


_LETTERS = HEAD | TAIL


def _run_end(kinds: list[int], i: int, allowed: frozenset) -> int:
    while i < len(kinds) and kinds[i] in allowed:
        i += 1
    return i


def _word_settled(text: str, kinds: list[int], i: int) -> bool:
    """Whether the pre-tokenizer's word at i is the same whatever follows `text`: every run its regex's branches
    read from i (a letter-and-mark run from i or after a prefix character, a punctuation run and the newlines and
    slashes after it, a whitespace run; `bpe`'s branches read no further) stops at a character of `text`."""
    n = len(text)
    starts = [i, i + 1] if kinds[i] in PREFIX else [i]
    if any(_run_end(kinds, j, _LETTERS) >= n for j in starts if j < n):
        return False
    k = _run_end(kinds, i + 1 if text[i] == " " else i, PUNCT)
    while k < n and text[k] in "\r\n/":
        k += 1
    return k < n and _run_end(kinds, i, WHITESPACE) < n


def settled_words(text: str) -> tuple[list[str], int]:
    """The pre-tokenizer's words of (normalized) `text` that no continuation changes, and how many characters they
    hold."""
    kinds = [char_kind(c) for c in text]
    words, at = [], 0
    for word in pretokenize(text):
        if not _word_settled(text, kinds, at):
            break
        words.append(word)
        at += len(word)
    return words, at


class TokenStream:
    """`Tokenizer.encode(text, added_tokens=False)` of a text fed in deltas (module docstring):

        tokens = TokenStream(tokenizer)
        ids = [i for delta in deltas for i in tokens.feed(delta)] + tokens.finish()

    `pending` is the text held back (NFC applied to a part of it, which changes nothing: NFC of NFC is NFC)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.pending = ""
        self.given = 0
        self.finished = False

    def feed(self, delta: str, then: str = "") -> list[int]:
        """Add `delta`; the ids of the text that later text cannot change (maybe none). `then`: what is known to
        come next, if anything comes (a space after a word settles it; it is not part of the text)."""
        if self.finished:
            raise ValueError("the text is finished")
        self.pending += delta
        p = min(stable_split(self.pending + then), len(self.pending))
        head = nfc(self.pending[:p])
        words, settled = settled_words(head + then if p == len(self.pending) else head)
        while words and settled > len(head):
            settled -= len(words.pop())
        if not words:
            return []
        self.pending = head[settled:] + self.pending[p:]
        return self._ids(words)

    def finish(self) -> list[int]:
        """The text is complete: the ids held back."""
        if self.finished:
            return []
        self.finished = True
        words, self.pending = pretokenize(nfc(self.pending)), ""
        return self._ids(words)

    def _ids(self, words: list[str]) -> list[int]:
        ids = [i for w in words for i in self.tokenizer.word_ids(w)]
        self.given += len(ids)
        return ids

"""Segments of a text that arrives in pieces: each one given out as soon as the text so far decides it.

`SegmentStream` takes text deltas (`feed`) and gives back segments; after `finish` it has given exactly
`segment.segments` of the whole text, whatever the deltas. Every rule of `segment` decides from the text around a
position, so a segment is given out once the text that decides it, and the segment after it starts with, is in:

| rule                                              | waits for                                                  |
|---------------------------------------------------|------------------------------------------------------------|
| a run of end marks (`.`, `?!`, `...`, `。`)       | the character after the run (the run may go on)            |
| closing quotes and brackets after the marks       | the first character that is not one                        |
| French ` »` after the marks                       | the first character after the spaces                       |
| "no letter right after a closing quote" (「はい。」と) | that character                                         |
| the next word's case, abbreviations, ordinals     | the whole next word (up to the whitespace after it)        |
| URL, email and host masks (`.` in example.com)    | the whitespace after the word, when it holds `/ @ www.`    |
| a paragraph (blank line)                          | the character after a line break and its spaces            |
| a sentence's clauses, spaces, characters (2-3)    | the sentence's end (then the sentence alone decides)       |
| packing up to the bound (4)                       | the next piece (a segment is closed when it does not fit)  |
| the last segment of a paragraph                   | the paragraph break, or `finish`                           |
| the CJK spacing of `normalize`                    | nothing more: a segment is normalized once it is decided   |

A segment's pause (after it, when more follows) is the long-text layer's: `pipeline.textstream` waits for the next
segment or the end before it gives the pause out.

Only the text from the first segment not yet given out is kept: from a sentence start with whitespace before it, where
no rule looks back across, or else (Chinese and Japanese, no spaces) from the character before the sentence, which
keeps what the rules that look back see (`_word_before` finds no abbreviation in a word holding "。" or "」", and no URL
or email spans it when its word has no `/ @ www.` before it); and measures are kept by the text measured, so a long
text costs about one pass over each delta's neighbourhood, not over the text so far.
Introduced in 19.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable

from .segment import (
    _CJK,
    _CJK_RE,
    _CLOSERS,
    _ENDS,
    _OPENERS,
    _PARAGRAPH,
    _PROTECTED_MARKS,
    MAX_SEGMENT_CHARS,
    _protected_mask,
    _sentence_ends,
    _spans,
    fit,
    normalize,
    pack,
)

_FRENCH_SPACES = " \u00a0\u202f"
_OPEN_LINE = re.compile(r"\n[ \t]*\Z")                    # a line break that a blank line may still follow


def _end_decided(text: str, m: re.Match) -> bool:
    """Whether `segment._sentence_ends`' verdict on the run of end marks `m` is final: every character it reads is
    in `text` (see the module docstring's table)."""
    n, s, e = len(text), m.start(), m.end()
    if e >= n:
        return False
    closed = e
    while closed < n and text[closed] in _CLOSERS:
        closed += 1
    k = closed
    while k < n and text[k] in _FRENCH_SPACES:
        k += 1
    if k >= n:
        return False
    if k > closed and text[k] == "»":
        closed = k + 1
        if closed >= n:
            return False
    after, run = text[closed], m.group()
    wide = any(c in "。！？．" for c in run)
    strong = any(c in "!?！？" for c in run)
    if not wide and not strong and run != ".":
        return True                                         # an ellipsis: never an end
    if closed > e and not after.isspace() and after not in _OPENERS:
        return True                                         # 「はい。」と: never an end
    if not wide and not after.isspace() and not (strong and _CJK_RE.match(after)):
        return True                                         # 3.14: never an end
    if not after.isspace() and not _mask_decided(text, s, closed):
        return False                                        # an end, unless a URL in its word covers it
    if wide:
        return True
    i = closed  # the next word decides: all of it
    while i < n and (text[i].isspace() or text[i] in _OPENERS):
        i += 1
    while i < n and not text[i].isspace():
        i += 1
    return i < n


def _mask_decided(text: str, s: int, closed: int) -> bool:
    """Whether `segment._protected_mask` is final at s, in a word that goes on past `closed`: it is when the word
    has no `/`, `@` or `www.` before s (a protected match needs one of them before a mark it covers), or when the
    word has ended."""
    start = s
    while start > 0 and not text[start - 1].isspace():
        start -= 1
    return not _PROTECTED_MARKS.search(text, start, s) or any(c.isspace() for c in text[closed:])


def decided_until(text: str) -> int:
    """The first position of `text` where a sentence end may still be decided otherwise by text that follows: the
    start of the first run of end marks whose verdict is not final, or of a line break that may open a paragraph
    (len(text) when there is none)."""
    horizon = len(text)
    line = _OPEN_LINE.search(text)
    if line and not any(m.start() <= line.start() < m.end() for m in _PARAGRAPH.finditer(text)):
        horizon = line.start()
    for m in _ENDS.finditer(text, 0, horizon):
        if not _end_decided(text, m):
            return m.start()
    return horizon


_JOINS = re.compile(f"[{_CJK}。，、！？；：]")   # `normalize` drops a space after one of these before CJK
_WORD = re.compile(r"[^\W\d_]+")   # letters only (no digits: "1 000" is never cut between its groups)


def _cut(text: str, start: int) -> tuple[int, int] | None:
    """Where the kept text can begin so that the sentence at `start` and all after it are decided as in the whole
    text, and how many characters before `start` it keeps (module docstring); None when it cannot."""
    if text[start - 1].isspace():
        return start, 0
    run = start
    while run > 0 and not text[run - 1].isspace():
        run -= 1
    return None if _PROTECTED_MARKS.search(text, run, start) else (start - 1, 1)


class SegmentStream:
    """`segment.segments(text, max_len, length)` of a text fed in pieces (module docstring):

        stream = SegmentStream(60, count_tokens)
        for delta in deltas:
            for seg in stream.feed(delta): speak(seg)
        for seg in stream.finish(): speak(seg)

    `given` counts the segments given out; `pending` is the text not in one yet; `open_text` the start of the next
    segment, as far as it is decided (normalized; "" when none is): the next segment given out starts with it (its
    complete sentences, or before the first is complete, its first words: `_lead`); `open_spaced`: in that
    segment a space follows it, if anything does."""

    def __init__(self, max_len: int = MAX_SEGMENT_CHARS, length: Callable[[str], int] = len):
        if max_len < 1:
            raise ValueError(f"max_len must be at least 1, not {max_len}")
        # the decided sentences are measured again at every delta until their segment is given out: a token count
        # costs a BPE pass, so counts are kept (by the normalized text measured)
        self.max_len, self.length = max_len, functools.lru_cache(maxsize=4096)(length)
        self.text = ""       # from a safe cut on (module docstring)
        self.floor = 0       # characters of `self.text` that belong to segments given out (0 or 1, module docstring)
        self.out = 0         # segments of `self.text` given out
        self.given = 0
        self.finished = False
        self.open_text = ""
        self.open_spaced = False  # a space follows `open_text` in the segment, if anything does

    @property
    def pending(self) -> str:
        """The text fed that no segment given out holds yet (raw)."""
        return self.text

    def feed(self, delta: str) -> list[str]:
        """Add `delta` to the text; the segments it decides (maybe none)."""
        if self.finished:
            raise ValueError("the text is finished")
        if not isinstance(delta, str):
            raise TypeError(f"a text delta is a str, not {type(delta).__name__}")
        self.text += delta
        return self._give(False)

    def finish(self) -> list[str]:
        """The text is complete: the segments left."""
        if self.finished:
            return []
        self.finished = True
        return self._give(True)

    def _give(self, done: bool) -> list[str]:
        spans, cut, (self.open_text, self.open_spaced) = self._decided(done)
        new = spans[self.out:]
        self.out = len(spans)
        if cut is not None:
            self.text, self.floor, self.out = self.text[cut[0]:], cut[1], 0
        self.given += len(new)
        return new

    def _lead(self, text: str, start: int, horizon: int) -> int:
        """Where the words that surely open the segment starting at `start` (before any of its sentences is
        complete) end: whole words of letters (not CJK: no spaces there), separated by whitespace with no blank line,
        before any other character, taken while they fit the bound as `pack` takes a sentence's words (a sentence
        cut into clauses keeps these in its first clause, one cut at spaces in its first piece). `start` if none."""
        while start < horizon and text[start].isspace():
            start += 1
        end = at = start
        while at < horizon:
            word = _WORD.match(text, at)
            if not word or _CJK_RE.search(word.group()):
                break
            stop = gap = word.end()
            if stop >= horizon or not text[stop].isspace():
                break                                   # the word may go on, or punctuation follows
            if self.length(normalize(text[start:stop])) > self.max_len:
                break
            end = stop
            while gap < horizon and text[gap].isspace():
                gap += 1
            if text.count("\n", stop, gap) > 1:
                break                                   # a blank line: the next word is another paragraph's
            at = gap
        return end

    def _decided(self, done: bool) -> tuple[list[str], tuple[int, int] | None, tuple[str, bool]]:
        """The decided segments of `self.text` (normalized), a safe cut (where the text can start from now on, and
        its floor; None: nowhere new) and the decided start of the next segment (its complete pieces, normalized)."""
        text, floor = self.text, self.floor
        horizon = len(text) if done else decided_until(text)
        mask = _protected_mask(text)
        ends = sorted({c for c in _sentence_ends(text, mask) if c <= horizon} | ({floor} if floor else set()))
        bound = len(text) if done else max(ends, default=0)   # text up to here is in sentences known to be complete
        paragraphs = _spans(text, [m.start() for m in _PARAGRAPH.finditer(text) if m.start() < horizon], 0,
                            len(text))
        out: list[tuple[int, int]] = []
        for n, (a, b) in enumerate(paragraphs):
            last = n == len(paragraphs) - 1 and not done
            sentences = [(x, y) for x, y in (_spans(text, ends, a, min(b, bound)) if not last or bound > a else [])
                         if x >= floor]
            packed = pack(text, [p for x, y in sentences for p in fit(text, mask, x, y, self.max_len, self.length)],
                          self.max_len, self.length)
            if last:  # its last segment may still grow: it stays, and the text from its start is all that is kept
                start, end = packed.pop() if packed else (a, self._lead(text, max(a, floor), horizon))
                out += packed
                cut = _cut(text, start) if start > floor and start in {a} | {x for x, _ in sentences} else None
                spaced = start < end < len(text) and text[end].isspace() and not _JOINS.match(text[end - 1])
                return [normalize(text[x:y]) for x, y in out], cut, (normalize(text[start:end]), spaced)
            out += packed
        return [normalize(text[x:y]) for x, y in out], None, ("", False)

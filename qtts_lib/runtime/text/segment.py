"""Long text -> sentences -> clauses -> segments of bounded length. Introduced in 16.

The model speaks one segment per generation (chapter 16 says why: long generations drift), so a
long text is cut where a reader would pause, then the pieces are packed back together up to a
bound (characters by default; the runtime passes BPE tokens, what the model sees):

1. **Sentences** end at `. ! ?` (followed by a space, a closing quote or bracket, or the end) and
   at the full-width `。！？．` (no space needed), and at blank lines (paragraphs). A period is *not*
   an end when it is part of a number (3.14, no space follows), of a URL or an email, of an
   ellipsis (`...`, `…`: a clause break only), after a known abbreviation ("Dr.", "e.g.", "U.S.",
   "z.B.", "т.е."), after a single cased letter (an initial: "J. K."), after a number of at most
   three digits followed by a month or a counted noun (German ordinals: "am 3. Oktober"), or when
   the next word starts with a lowercase letter. After a closing quote, an end only counts if no letter follows at once
   (Japanese 「はい。」と言った is one sentence).
2. A sentence longer than the bound is cut into **clauses** after `, ; :` followed by a space (so
   1,000 and 3,14 stay whole), after the full-width `，；：、`, after an ellipsis, and at dashes.
3. A clause still too long is cut at **spaces** (never between two digit groups, "1 000"); a run
   without spaces (Chinese, Japanese, a giant URL) is cut between **characters** as a last resort.
4. The pieces are **packed** greedily, in order, into segments no longer than the bound, never
   across a paragraph (a heading without a period is not read into the next sentence).

When in doubt the rules do not split: a missed split costs only a longer segment (still bounded by
step 2-4), a wrong split puts a pause in the middle of a phrase. Every piece is a span of the
original text, so segments keep its own separators (none between Chinese sentences, a space
between English ones); whitespace runs become one space, and none is kept between two CJK
characters (hard-wrapped Chinese or Japanese). Stdlib only.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

MAX_SEGMENT_CHARS = 200   # the bound in characters when no tokenizer is at hand

_CLOSERS = "\"'”’»)]}」』）】〉》"
_OPENERS = "\"'“‘«([{「『（【〈《¿¡"
_FULL_WIDTH_ENDS = "。！？．"
_PROTECTED = re.compile(
    r"(?:https?://|ftp://|www\.)[^\s<>\"“”]*[^\s<>\"“”.,;:!?)\]}'’。，！？]"   # URL, trailing punctuation excluded
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"                                             # email
    r"|\b[\w-]+(?:\.[a-z]{2,6})+/\S*[^\s.,;:!?)]",                               # bare host/path: example.com/a
    re.IGNORECASE)
_ENDS = re.compile(r"[.!?。！？．…]+")
_CLAUSE_ASCII = re.compile(r"[,;:]|\.{2,}|…+| [—–-] ")
_CLAUSE_WIDE = re.compile(r"[，；：、]|…+|——")
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uff66-\uff9f"
_CJK_RE = re.compile(f"[{_CJK}]")
_SPACES = re.compile(r"\s+")
_PARAGRAPH = re.compile(r"\n[ \t]*\n")

# Words before a period that never end a sentence (lowercase, final period dropped). Dotted
# single-letter runs (e.g, i.e, u.s, z.b, т.е) and single cased letters are caught by rule, not listed.
ABBREVIATIONS = frozenset("""
mr mrs ms dr prof sr jr st mt vs approx dept eq ca cf al inc ltd co corp jan feb apr jun jul aug sep sept oct
nov dec ph.d
hr hrn fr frau bzw bspw evtl ggf inkl vgl sog str abs allg
mme mlle mm ste env p.ex
sra sres srta dra dña ud uds av avda aprox
sig sigg dott dott.ssa ing avv geom
exmo exma
гг ул им проф стр рис
""".split())
# ... but these often do end a sentence: the next word's case decides (rule 1's last test), as for any word.
FINAL_ABBREVIATIONS = frozenset("etc usw ecc a.m p.m т.д т.п".split())
# ... and these abbreviate only before a number ("No. 5", "S. 12", "Nr. 7").
_NUMBER_ABBREVIATIONS = frozenset("no nos nr vol fig pág núm pag art s p pp".split())
# German ordinals are written "3." : before these words a small number's period is not an end.
ORDINAL_NOUNS = frozenset("""Januar Jänner Februar März April Mai Juni Juli August September Oktober November
Dezember Kapitel Jahrhundert Jahrtausend Klasse Stock Mal Platz Liga Weltkrieg Auflage Satz Akt""".split())

_PROTECTED_MARKS = re.compile(r"[/@]|www\.", re.IGNORECASE)   # every protected match holds one of them


def _protected_mask(text: str) -> list[bool]:
    mask = [False] * len(text)
    if not _PROTECTED_MARKS.search(text):  # the bare-host pattern backtracks over every long word: skip it
        return mask
    for m in _PROTECTED.finditer(text):
        mask[m.start():m.end()] = [True] * (m.end() - m.start())
    return mask


def _word_before(text: str, i: int) -> str:
    """The whitespace-delimited word that ends at index i (exclusive), without leading openers."""
    j = i
    while j > 0 and not text[j - 1].isspace():
        j -= 1
    return text[j:i].lstrip(_OPENERS)


def _next_word(text: str, i: int) -> str:
    """The word from i on, after whitespace and opening marks ('' at the end)."""
    while i < len(text) and (text[i].isspace() or text[i] in _OPENERS):
        i += 1
    return re.match(r"\S*", text[i:]).group().rstrip(".,;:!?")


def _is_abbreviation(word: str, next_word: str) -> bool:
    w, next_char = word.lower(), next_word[:1]
    if w in FINAL_ABBREVIATIONS:
        return False
    if w in _NUMBER_ABBREVIATIONS:
        return next_char.isdigit()
    if w in ABBREVIATIONS:
        return True
    if re.fullmatch(r"(?:[^\W\d_]\.)+[^\W\d_]", w):        # e.g, u.s, z.b, т.е
        return True
    if len(word) == 1 and word.isalpha() and word.lower() != word.upper():  # an initial, not 네 or 是
        return True
    return bool(re.fullmatch(r"\d{1,3}", word)) and next_word in ORDINAL_NOUNS  # 3. Oktober, 1. Kapitel


def _sentence_ends(text: str, mask: list[bool]) -> list[int]:
    """Indices just after each sentence end (rule 1)."""
    ends = [m.start() for m in _PARAGRAPH.finditer(text)]
    for m in _ENDS.finditer(text):
        s, e = m.start(), m.end()
        if mask[s]:
            continue
        run = m.group()
        closed = e
        while closed < len(text) and text[closed] in _CLOSERS:
            closed += 1
        french = re.match(r"[ \u00a0\u202f]+»", text[closed:])     # « C'est fini. »
        closed += french.end() if french else 0
        after = text[closed] if closed < len(text) else ""
        wide = any(c in _FULL_WIDTH_ENDS for c in run)
        strong = any(c in "!?！？" for c in run)
        if not wide and not strong and run != ".":
            continue                                        # an ellipsis: a clause break only
        if closed > e and after and not after.isspace() and after not in _OPENERS:
            continue                                        # 「はい。」と言った: the quote goes on
        if not wide:
            if after and not after.isspace() and not (strong and _CJK_RE.match(after)):
                continue                                    # 3.14, example.com, "a.b"
            nxt = _next_word(text, closed)
            if nxt[:1].islower():
                continue                                    # "e.g. this", "¿Qué? dijo él"
            if run == "." and _is_abbreviation(_word_before(text, s), nxt):
                continue
        ends.append(closed)
    return sorted(set(ends))


def _spans(text: str, cuts: list[int], start: int, end: int) -> list[tuple[int, int]]:
    """text[start:end] cut at `cuts`, each piece stripped of surrounding whitespace; empty pieces dropped."""
    out, s = [], start
    for c in sorted({c for c in cuts if start < c < end} | {end}):
        a, b = s, c
        while a < b and text[a].isspace():
            a += 1
        while b > a and text[b - 1].isspace():
            b -= 1
        if a < b:
            out.append((a, b))
        s = c
    return out


def _clause_cuts(text: str, mask: list[bool], start: int, end: int) -> list[int]:
    cuts = []
    for regex, needs_space in ((_CLAUSE_ASCII, True), (_CLAUSE_WIDE, False)):
        for m in regex.finditer(text, start, end):
            if mask[m.start()]:
                continue
            e = m.end()
            while e < end and text[e] in _CLOSERS:
                e += 1
            if needs_space and m.group()[0] != " " and e < end and not text[e].isspace():
                if not (m.group()[0] in ".…" and _CJK_RE.match(text[e])):
                    continue                                # 1,000  3,14  10:30  a...b
            cuts.append(e)
    return cuts


def _space_cuts(text: str, start: int, end: int) -> list[int]:
    """Spaces to cut at, except between two digit groups (1 000, 3 500 000)."""
    return [m.start() for m in _SPACES.finditer(text, start, end) if m.start() > start
            and not (text[m.start() - 1].isdigit() and m.end() < end and text[m.end()].isdigit())]


def normalize(piece: str) -> str:
    """Whitespace runs -> one space; none between two CJK characters."""
    piece = re.sub(r"\s+", " ", piece.strip())
    return re.sub(f"(?<=[{_CJK}。，、！？；：]) (?=[{_CJK}])", "", piece)


def sentences(text: str) -> list[str]:
    """The sentences of `text` (rule 1), normalized."""
    return [normalize(text[a:b]) for a, b in _spans(text, _sentence_ends(text, _protected_mask(text)), 0, len(text))]


def clauses(text: str) -> list[str]:
    """The clauses of `text` (rule 2), normalized."""
    return [normalize(text[a:b]) for a, b in _spans(text, _clause_cuts(text, _protected_mask(text), 0, len(text)),
                                                        0, len(text))]


def segments(text: str, max_len: int = MAX_SEGMENT_CHARS, length: Callable[[str], int] = len) -> list[str]:
    """`text` as segments of at most `max_len` by `length` (default: characters), rules 1-4.

    `length` is applied to normalized segments; pass a token counter to bound tokens."""
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1, not {max_len}")
    mask = _protected_mask(text)
    ends = _sentence_ends(text, mask)
    out = []
    for a, b in _spans(text, [m.start() for m in _PARAGRAPH.finditer(text)], 0, len(text)):
        out += pack(text, [p for x, y in _spans(text, ends, a, b) for p in fit(text, mask, x, y, max_len, length)],
                    max_len, length)
    return [normalize(text[a:b]) for a, b in out]


def fit(text: str, mask: list[bool], a: int, b: int, max_len: int, length: Callable[[str], int] = len,
        level: int = 0) -> list[tuple[int, int]]:
    """One sentence `text[a:b]` as pieces of at most `max_len` (rules 2-3, packed): itself when it fits; else cut at
    clauses, then spaces, then characters, each level only where the one before left a piece too long."""
    if length(normalize(text[a:b])) <= max_len or b - a == 1:
        return [(a, b)]
    while level < 3:
        level += 1
        cuts = (_clause_cuts(text, mask, a, b) if level == 1 else _space_cuts(text, a, b) if level == 2
                else list(range(a + 1, b)))
        parts = _spans(text, cuts, a, b)
        if len(parts) > 1:
            return pack(text, [p for x, y in parts for p in fit(text, mask, x, y, max_len, length, level)],
                        max_len, length)
    return [(a, b)]


def pack(text: str, parts: list[tuple[int, int]], max_len: int, length: Callable[[str], int] = len
         ) -> list[tuple[int, int]]:
    """Rule 4: consecutive spans joined greedily, in order, while the joined span measures at most `max_len`. A
    segment is closed by the first span that does not fit it, and never changes after."""
    out: list[tuple[int, int]] = []
    for a, b in parts:
        if out and length(normalize(text[out[-1][0]:b])) <= max_len:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def read_cases(path: str | Path) -> list[dict]:
    """The segmenter's test corpus (data/inputs/segment_corpus.txt): see the header of that file."""
    cases, case, part = [], None, None
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("#") and case is None:
            continue
        if line.startswith("=== "):
            head, _, note = line[4:].partition(":")
            language, kind = head.split()
            case = {"language": language, "kind": kind, "note": note.strip(), "text": [], "expected": []}
            cases.append(case)
            part = "text"
        elif line.strip() == "---" and case is not None:
            part = "expected"
        elif case is not None:
            case[part].append(line)
    for c in cases:
        c["text"] = "\n".join(c["text"]).strip("\n")
        c["expected"] = [e for e in c["expected"] if e.strip()]
    return cases

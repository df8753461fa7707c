r"""Qwen2 byte-level BPE in pure Python (stdlib only): text -> token ids. Introduced in 06.

This is the text tokenizer of the reference pipeline, written as the spec a C/C++ port follows.
The truth is what `qwen_tts` runs: `AutoProcessor.from_pretrained(model_dir, fix_mistral_regex=True)`,
i.e. a `Qwen2TokenizerFast` converted from vocab.json + merges.txt (there is no tokenizer.json),
then patched by transformers 4.57.3. `encode` runs the same five steps as that tokenizer:

1. Added tokens (`added_tokens_decoder` in tokenizer_config.json: `<|im_start|>`, `<tts_pad>`, ...)
   are cut out of the raw text first: leftmost match, the longest one at that position. All of
   them have lstrip = rstrip = normalized = single_word = false, so they match verbatim, eat no
   spaces around them, and are matched before normalization. Special or not, each is one id.
2. Every remaining piece is NFC-normalized (the tokenizer's `normalizers.NFC()`), see `nfc`.
3. The piece is split into words by the pre-tokenizer regex, see `pretokenize`.
4. Each word's UTF-8 bytes are mapped to printable characters (`bytes_to_unicode`, GPT-2's table).
5. BPE: adjacent symbols are merged by merges.txt rank, lowest first; symbols become vocab.json ids.

The regex is not Qwen2's. `PreTrainedTokenizerBase._patch_mistral_regex` (transformers 4.57.3)
runs for any tokenizer with vocab_size > 100000 loaded from a local directory whose config.json
says transformers_version in (4.57.2, 5.0.0) -- our checkpoints say 4.57.3. With
`fix_mistral_regex=True` it replaces pre_tokenizer[0] (Qwen2's Split) with this Split, "isolated":

    [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+
    |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*
    |\p{N}
    | ?[^\s\p{L}\p{N}]+[\r\n/]*
    |\s*[\r\n]+
    |\s+(?!\S)
    |\s+

instead of Qwen2's `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|...`.
So letter runs split at case changes ("HelloWorld" -> "Hello", "World"), marks join letter runs,
there are no contraction rules ("I'm" -> "I", "'m" only because "'" may prefix a letter run;
"DON'T" -> "DON", "'T"), punctuation runs also take trailing "/", and digits are single words.
The ByteLevel step after it (add_prefix_space=False, use_regex=False) stays.

`decode` maps ids to tokens, tokens to bytes, and bytes to text (invalid UTF-8 -> U+FFFD).

Step 1 is the reference's, and a hazard for a product: a user who types `<|im_end|>` gets the id that ends a chat
turn, so the text can rewrite the prompt around it. `encode_template` keeps step 1 for a template's own text only
and reads what the user typed as text; for text without added tokens it gives the reference's ids.

Unicode data. The regex engine (Oniguruma, inside the Rust `tokenizers` 0.22) knows Unicode 16.0;
Python 3.11's `unicodedata` knows 14.0; the reference's NFC (Rust crate
`unicode-normalization-alignments`) knows only Unicode 9.0. This module uses `unicodedata` and
corrects both gaps with two small tables measured against the reference (`_UNICODE_16_ADDITIONS`,
`_NFC_UNKNOWN_TO_REFERENCE`). A C port would use range tables generated from the UCD instead:
General_Category from Unicode 16.0 folded to the eight kinds of `char_kind` (3,194 ranges, 2,366
of them not OTHER; or a two-stage lookup table), the 25 White_Space code points for \s, and
Unicode 9.0 decomposition, combining-class and composition tables for NFC (or a newer NFC plus
`_NFC_UNKNOWN_TO_REFERENCE`, as here).
"""
from __future__ import annotations

import bisect
import json
import unicodedata
from pathlib import Path

# ---------------------------------------------------------------- bytes <-> printable characters


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> character table: printable Latin-1 bytes map to themselves,
    the other 68 bytes (controls, space, 0x7F-0xA0, 0xAD) to U+0100.. in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    table = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR: dict[int, str] = bytes_to_unicode()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_CHAR.items()}


# ---------------------------------------------------------------- character classes

# What the regex needs to know about one code point. Every code point has exactly one kind.
CR_LF = 0     # "\r" or "\n"
SPACE = 1     # any other White_Space (\s)
UPPER = 2     # Lu, Lt
LOWER = 3     # Ll
CASELESS = 4  # Lm, Lo (e.g. CJK, kana, hangul, Arabic, Devanagari letters)
MARK = 5      # Mn, Mc, Me (combining marks; NOT letters for \p{L})
NUMBER = 6    # Nd, Nl, No
OTHER = 7     # everything else: punctuation, symbols, emoji, controls, format, unassigned

# The regex's character classes, as sets of kinds.
PREFIX = frozenset({SPACE, MARK, OTHER})          # [^\r\n\p{L}\p{N}]
HEAD = frozenset({UPPER, CASELESS, MARK})         # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
TAIL = frozenset({LOWER, CASELESS, MARK})         # [\p{Ll}\p{Lm}\p{Lo}\p{M}]
PUNCT = frozenset({MARK, OTHER})                  # [^\s\p{L}\p{N}]
WHITESPACE = frozenset({CR_LF, SPACE})            # \s

# Oniguruma's \s is the Unicode White_Space property (not Python's str.isspace, which also
# accepts U+001C..U+001F). U+200B and U+180E are not White_Space.
WHITE_SPACE = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                         0x2028, 0x2029, 0x202F, 0x205F, 0x3000])

_KIND_OF_CATEGORY = {
    "Lu": UPPER, "Lt": UPPER, "Ll": LOWER, "Lm": CASELESS, "Lo": CASELESS,
    "Mn": MARK, "Mc": MARK, "Me": MARK, "Nd": NUMBER, "Nl": NUMBER, "No": NUMBER,
}

# Letters, marks and numbers the regex engine knows (Unicode 16.0) but Python 3.11's unicodedata
# (Unicode 14.0) calls unassigned ("Cn"): Unicode 15.0/15.1/16.0 additions, measured by matching
# every code point against \p{Lu}..\p{No} in the reference. Labels: "Lu" = Lu/Lt, "Ll", "Lo" = Lm/Lo,
# "M" = any mark, "N" = any number. Consulted only when unicodedata answers "Cn".
_UNICODE_16_ADDITIONS: tuple[tuple[int, int, str], ...] = (
    (0x00897, 0x00897, "M"), (0x00CF3, 0x00CF3, "M"), (0x00ECE, 0x00ECE, "M"),
    (0x01C89, 0x01C89, "Lu"), (0x01C8A, 0x01C8A, "Ll"), (0x0A7CB, 0x0A7CC, "Lu"),
    (0x0A7CD, 0x0A7CD, "Ll"), (0x0A7DA, 0x0A7DA, "Lu"), (0x0A7DB, 0x0A7DB, "Ll"),
    (0x0A7DC, 0x0A7DC, "Lu"), (0x105C0, 0x105F3, "Lo"), (0x10D40, 0x10D49, "N"),
    (0x10D4A, 0x10D4F, "Lo"), (0x10D50, 0x10D65, "Lu"), (0x10D69, 0x10D6D, "M"),
    (0x10D6F, 0x10D6F, "Lo"), (0x10D70, 0x10D85, "Ll"), (0x10EC2, 0x10EC4, "Lo"),
    (0x10EFC, 0x10EFF, "M"), (0x1123F, 0x11240, "Lo"), (0x11241, 0x11241, "M"),
    (0x11380, 0x11389, "Lo"), (0x1138B, 0x1138B, "Lo"), (0x1138E, 0x1138E, "Lo"),
    (0x11390, 0x113B5, "Lo"), (0x113B7, 0x113B7, "Lo"), (0x113B8, 0x113C0, "M"),
    (0x113C2, 0x113C2, "M"), (0x113C5, 0x113C5, "M"), (0x113C7, 0x113CA, "M"),
    (0x113CC, 0x113D0, "M"), (0x113D1, 0x113D1, "Lo"), (0x113D2, 0x113D2, "M"),
    (0x113D3, 0x113D3, "Lo"), (0x113E1, 0x113E2, "M"), (0x116D0, 0x116E3, "N"),
    (0x11BC0, 0x11BE0, "Lo"), (0x11BF0, 0x11BF9, "N"), (0x11F00, 0x11F01, "M"),
    (0x11F02, 0x11F02, "Lo"), (0x11F03, 0x11F03, "M"), (0x11F04, 0x11F10, "Lo"),
    (0x11F12, 0x11F33, "Lo"), (0x11F34, 0x11F3A, "M"), (0x11F3E, 0x11F42, "M"),
    (0x11F50, 0x11F59, "N"), (0x11F5A, 0x11F5A, "M"), (0x1342F, 0x1342F, "Lo"),
    (0x13440, 0x13440, "M"), (0x13441, 0x13446, "Lo"), (0x13447, 0x13455, "M"),
    (0x13460, 0x143FA, "Lo"), (0x16100, 0x1611D, "Lo"), (0x1611E, 0x1612F, "M"),
    (0x16130, 0x16139, "N"), (0x16D40, 0x16D6C, "Lo"), (0x16D70, 0x16D79, "N"),
    (0x18CFF, 0x18CFF, "Lo"), (0x1B132, 0x1B132, "Lo"), (0x1B155, 0x1B155, "Lo"),
    (0x1CCF0, 0x1CCF9, "N"), (0x1D2C0, 0x1D2D3, "N"), (0x1DF25, 0x1DF2A, "Ll"),
    (0x1E030, 0x1E06D, "Lo"), (0x1E08F, 0x1E08F, "M"), (0x1E4D0, 0x1E4EB, "Lo"),
    (0x1E4EC, 0x1E4EF, "M"), (0x1E4F0, 0x1E4F9, "N"), (0x1E5D0, 0x1E5ED, "Lo"),
    (0x1E5EE, 0x1E5EF, "M"), (0x1E5F0, 0x1E5F0, "Lo"), (0x1E5F1, 0x1E5FA, "N"),
    (0x2B739, 0x2B739, "Lo"), (0x2EBF0, 0x2EE5D, "Lo"), (0x31350, 0x323AF, "Lo"),
)
_ADDITION_STARTS = [lo for lo, _, _ in _UNICODE_16_ADDITIONS]
_KIND_OF_LABEL = {"Lu": UPPER, "Ll": LOWER, "Lo": CASELESS, "M": MARK, "N": NUMBER}


def _find_range(starts: list[int], ranges, cp: int):
    """The (lo, hi, ...) entry of sorted, disjoint `ranges` that holds cp, else None."""
    i = bisect.bisect_right(starts, cp) - 1
    if i >= 0 and ranges[i][0] <= cp <= ranges[i][1]:
        return ranges[i]
    return None


def _kind_uncached(ch: str) -> int:
    cp = ord(ch)
    if cp in (0x0A, 0x0D):
        return CR_LF
    if cp in WHITE_SPACE:
        return SPACE
    cat = unicodedata.category(ch)
    if cat == "Cn":
        hit = _find_range(_ADDITION_STARTS, _UNICODE_16_ADDITIONS, cp)
        return _KIND_OF_LABEL[hit[2]] if hit else OTHER
    return _KIND_OF_CATEGORY.get(cat, OTHER)


_KIND_CACHE: dict[str, int] = {chr(c): _kind_uncached(chr(c)) for c in range(128)}


def char_kind(ch: str) -> int:
    """The kind (CR_LF, SPACE, UPPER, ..., OTHER) of one code point."""
    kind = _KIND_CACHE.get(ch)
    if kind is None:
        kind = _KIND_CACHE[ch] = _kind_uncached(ch)
    return kind


# ---------------------------------------------------------------- NFC, as the reference does it

# Code points assigned after Unicode 9.0 that the reference's NFC (Unicode 9.0 data) treats as
# plain starters but Python 3.11's NFC does not: marks with a nonzero combining class (Python would
# reorder them and let them be skipped over by compositions), plus U+11935/U+11930, which Python
# composes to U+11938 (Unicode 13.0). Measured against `normalizers.NFC()` over all code points.
_NFC_UNKNOWN_TO_REFERENCE: tuple[tuple[int, int], ...] = (
    (0x007FD, 0x007FD), (0x00898, 0x0089F), (0x008CA, 0x008D3), (0x009FE, 0x009FE), (0x00C3C, 0x00C3C),
    (0x00D3B, 0x00D3C), (0x00EBA, 0x00EBA), (0x01715, 0x01715), (0x01ABF, 0x01ACE), (0x01DF6, 0x01DFA),
    (0x0A82C, 0x0A82C), (0x10D24, 0x10D27), (0x10EAB, 0x10EAC), (0x10F46, 0x10F50), (0x10F82, 0x10F85),
    (0x11070, 0x11070), (0x1133B, 0x1133B), (0x1145E, 0x1145E), (0x11839, 0x1183A), (0x11930, 0x11930),
    (0x11935, 0x11935), (0x1193D, 0x1193E), (0x11943, 0x11943), (0x119E0, 0x119E0), (0x11A34, 0x11A34),
    (0x11A47, 0x11A47), (0x11A99, 0x11A99), (0x11D42, 0x11D42), (0x11D44, 0x11D45), (0x11D97, 0x11D97),
    (0x16FF0, 0x16FF1), (0x1E130, 0x1E136), (0x1E2AE, 0x1E2AE), (0x1E2EC, 0x1E2EF),
)
_NFC_STARTS = [lo for lo, _ in _NFC_UNKNOWN_TO_REFERENCE]
_NFC_FIRST_UNKNOWN = min(_NFC_STARTS[0], _ADDITION_STARTS[0])  # below it, no table lookup is needed


def _unknown_to_reference_nfc(cp: int) -> bool:
    """True for a code point the reference's NFC does not know and Python's would act on.
    Unicode 15/16 additions are included so a newer Python keeps the same answer."""
    return (_find_range(_NFC_STARTS, _NFC_UNKNOWN_TO_REFERENCE, cp) is not None
            or _find_range(_ADDITION_STARTS, _UNICODE_16_ADDITIONS, cp) is not None)


def nfc(text: str) -> str:
    """NFC as the reference's normalizer computes it.

    A code point the reference does not know is a starter that never composes and has no
    decomposition, so NFC cannot act across it: normalize the stretches between such code points
    with Python's NFC and keep those code points as they are."""
    if text.isascii():
        return text
    out: list[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ord(ch) >= _NFC_FIRST_UNKNOWN and _unknown_to_reference_nfc(ord(ch)):
            out.append(unicodedata.normalize("NFC", text[start:i]))
            out.append(ch)
            start = i + 1
    out.append(unicodedata.normalize("NFC", text[start:]))
    return "".join(out)


# ---------------------------------------------------------------- pre-tokenizer scanner
#
# The regex is tried at a position branch by branch; the first branch that matches wins (not the
# longest), and each branch matches the way a backtracking engine would. Matches never overlap and
# every code point is covered (every kind starts some branch), so the words concatenate back to the
# input. Each branch below returns the end of its match at i, or -1.


def _run_end(kinds: list[int], i: int, allowed: frozenset) -> int:
    """First index >= i whose kind is not in `allowed` (or len)."""
    while i < len(kinds) and kinds[i] in allowed:
        i += 1
    return i


def _body_starts(kinds: list[int], i: int) -> list[int]:
    r"""Where the letter run starts: after the optional [^\r\n\p{L}\p{N}] prefix (tried first), or at i."""
    return [i + 1, i] if kinds[i] in PREFIX else [i]


def _branch_lower_tail(text: str, kinds: list[int], i: int) -> int:
    """Branch 1: prefix? HEAD* TAIL+ -- a word that contains a lower-case (or caseless) letter.

    HEAD* takes the longest run. If a TAIL char follows it, TAIL+ takes its whole run. Otherwise
    HEAD* gives characters back until TAIL+ can start on one of them: the match ends right after
    the last TAIL char (caseless letter or mark) inside the HEAD run."""
    for j in _body_starts(kinds, i):
        k = _run_end(kinds, j, HEAD)
        if k < len(kinds) and kinds[k] in TAIL:
            return _run_end(kinds, k, TAIL)
        for m in range(k - 1, j - 1, -1):
            if kinds[m] in TAIL:
                return m + 1
    return -1


def _branch_upper(text: str, kinds: list[int], i: int) -> int:
    """Branch 2: prefix? HEAD+ TAIL* -- an upper-case run ("DON", the "T" of "'T")."""
    for j in _body_starts(kinds, i):
        k = _run_end(kinds, j, HEAD)
        if k > j:
            return _run_end(kinds, k, TAIL)
    return -1


def _branch_digit(text: str, kinds: list[int], i: int) -> int:
    r"""Branch 3: \p{N} -- exactly one digit / number character."""
    return i + 1 if kinds[i] == NUMBER else -1


def _branch_punct(text: str, kinds: list[int], i: int) -> int:
    r"""Branch 4: ' '? PUNCT+ [\r\n/]* -- punctuation/symbols, an optional leading space (U+0020
    only), and any newlines or slashes right after them."""
    j = i + 1 if text[i] == " " else i
    k = _run_end(kinds, j, PUNCT)
    if k == j:
        return -1
    while k < len(text) and text[k] in "\r\n/":
        k += 1
    return k


def _branch_newlines(text: str, kinds: list[int], i: int) -> int:
    r"""Branch 5: \s* [\r\n]+ -- whitespace up to and including the last newline of the run."""
    k = _run_end(kinds, i, WHITESPACE)
    for m in range(k - 1, i - 1, -1):
        if kinds[m] == CR_LF:
            return m + 1
    return -1


def _branch_spaces_before_space(text: str, kinds: list[int], i: int) -> int:
    r"""Branch 6: \s+ (?!\S) -- a whitespace run, minus its last char when a non-space follows
    (that char is left to prefix the next word). Fails for a single space before a non-space."""
    k = _run_end(kinds, i, WHITESPACE)
    if k == len(kinds) and k > i:
        return k
    return k - 1 if k - 1 > i else -1


def _branch_spaces(text: str, kinds: list[int], i: int) -> int:
    r"""Branch 7: \s+ -- any whitespace run."""
    k = _run_end(kinds, i, WHITESPACE)
    return k if k > i else -1


# The regex's alternatives in order; each takes (text, kinds, i) and returns the match end or -1.
BRANCHES = (
    _branch_lower_tail,
    _branch_upper,
    _branch_digit,
    _branch_punct,
    _branch_newlines,
    _branch_spaces_before_space,
    _branch_spaces,
)


def _match_at(text: str, kinds: list[int], i: int) -> int:
    """End of the regex match starting at i: the first branch that matches, else -1."""
    for branch in BRANCHES:
        end = branch(text, kinds, i)
        if end > i:
            return end
    return -1


def pretokenize(text: str) -> list[str]:
    """Split (normalized) text into words exactly like the reference's Split(regex, "isolated")."""
    kinds = [char_kind(ch) for ch in text]
    words: list[str] = []
    i = 0
    while i < len(text):
        end = _match_at(text, kinds, i)
        if end < 0:  # unreachable (every kind starts a branch); an unmatched gap is its own word
            end = i + 1
        words.append(text[i:end])
        i = end
    return words


# ---------------------------------------------------------------- added tokens


def split_added_tokens(text: str, added: dict[str, int]) -> list[tuple[str, int | None]]:
    """Cut added tokens out of raw text: [(piece, None) for plain text, (token, id) for a token].

    Scans left to right; at the first position where some token matches, the longest one wins
    (Aho-Corasick leftmost-longest, as the reference). No stripping of neighbouring spaces."""
    by_first: dict[str, list[str]] = {}
    for tok in sorted(added, key=len, reverse=True):
        by_first.setdefault(tok[0], []).append(tok)
    pieces: list[tuple[str, int | None]] = []
    start = i = 0
    while i < len(text):
        hit = next((t for t in by_first.get(text[i], ()) if text.startswith(t, i)), None)
        if hit is None:
            i += 1
            continue
        if i > start:
            pieces.append((text[start:i], None))
        pieces.append((hit, added[hit]))
        i = start = i + len(hit)
    if start < len(text):
        pieces.append((text[start:], None))
    return pieces


# ---------------------------------------------------------------- BPE

_NO_RANK = 1 << 62


def _merge_pair(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    """Replace every occurrence of `pair` in symbols, left to right, by its concatenation."""
    merged: list[str] = []
    n = 0
    while n < len(symbols):
        if n + 1 < len(symbols) and (symbols[n], symbols[n + 1]) == pair:
            merged.append(symbols[n] + symbols[n + 1])
            n += 2
        else:
            merged.append(symbols[n])
            n += 1
    return merged


def bpe(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Merge the characters of a byte-level word: repeatedly merge the adjacent pair with the
    lowest rank (all its occurrences, left to right) until no adjacent pair has a rank.
    Same result as the reference's priority-queue BPE: one rank is one pair, and a merge
    can never create another occurrence of the pair just merged."""
    symbols = list(word)
    while len(symbols) > 1:
        best = min(zip(symbols, symbols[1:]), key=lambda pair: ranks.get(pair, _NO_RANK))
        if best not in ranks:
            break
        symbols = _merge_pair(symbols, best)
    return symbols


def read_merges(path: Path) -> dict[tuple[str, str], int]:
    """merges.txt -> {(left, right): rank}; rank = line order, skipping '#version' and blank lines."""
    ranks: dict[tuple[str, str], int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            line = line.strip()
            if not line or (n == 0 and line.startswith("#version")):
                continue
            left, right = line.split()
            ranks[(left, right)] = len(ranks)
    return ranks


class Tokenizer:
    """Qwen2 byte-level BPE tokenizer, as the reference pipeline configures it. Introduced in 06."""

    CACHE_SIZE = 10000

    def __init__(self, vocab: dict[str, int], ranks: dict[tuple[str, str], int], added: dict[str, int]):
        self.vocab = vocab
        self.ranks = ranks
        self.added = added
        self.id_to_token_map: dict[int, str] = {i: t for t, i in vocab.items()}
        self.id_to_token_map.update({i: t for t, i in added.items()})
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Read vocab.json, merges.txt and tokenizer_config.json (added_tokens_decoder) from a checkpoint dir."""
        path = Path(path)
        vocab = json.loads((path / "vocab.json").read_text(encoding="utf-8"))
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
        added = {}
        for token_id, spec in config.get("added_tokens_decoder", {}).items():
            if spec.get("lstrip") or spec.get("rstrip") or spec.get("normalized") or spec.get("single_word"):
                raise NotImplementedError(f"added token {spec['content']!r}: only verbatim added tokens are supported")
            added[spec["content"]] = int(token_id)
        return cls(vocab, read_merges(path / "merges.txt"), added)

    def token_to_id(self, token: str) -> int | None:
        """Id of a vocabulary or added token (byte-level spelling, e.g. 'Ġhello'), else None."""
        return self.added.get(token, self.vocab.get(token))

    def id_to_token(self, token_id: int) -> str | None:
        return self.id_to_token_map.get(token_id)

    def word_ids(self, word: str) -> list[int]:
        """Ids of one pre-tokenized word (cached; the cache is cleared when full)."""
        ids = self._cache.get(word)
        if ids is None:
            chars = "".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8"))
            ids = [self.vocab[sym] for sym in bpe(chars, self.ranks)]
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    def encode(self, text: str, added_tokens: bool = True) -> list[int]:
        """Token ids of text, as `processor(text=text)["input_ids"]` of the reference (no BOS/EOS added).

        `added_tokens=False` reads the text as text: an added token's spelling in it (`<|im_end|>`) becomes the
        ids of its characters, never the token's own id. What people type goes through `encode_template`."""
        return self._encode_pieces(split_added_tokens(text, self.added) if added_tokens else [(text, None)])

    def encode_template(self, template: str, *values: str) -> list[int]:
        """Ids of `template` with its `{}` filled by `values`, where added tokens count only in the template's own
        text: a value is text, whatever it contains. A chat template's structure (`<|im_start|>`, `<|im_end|>`)
        is the template's; a `<|im_end|>` typed into a value is spoken as the characters it is made of.

        A value without added tokens gives exactly `encode(template.format(*values))`: the template's text and the
        values between two added tokens are still normalized and split into words as one piece."""
        literals = template.split("{}")
        if len(literals) != len(values) + 1:
            raise ValueError(f"the template has {len(literals) - 1} places for values, not {len(values)}")
        pieces: list[tuple[str, int | None]] = []
        for i, literal in enumerate(literals):
            pieces += split_added_tokens(literal, self.added)
            if i < len(values):
                pieces.append((values[i], None))
        joined: list[tuple[str, int | None]] = []  # plain neighbours join: one piece, as in the formatted string
        for piece, added_id in pieces:
            if added_id is None and joined and joined[-1][1] is None:
                joined[-1] = (joined[-1][0] + piece, None)
            elif piece or added_id is not None:
                joined.append((piece, added_id))
        return self._encode_pieces(joined)

    def _encode_pieces(self, pieces: list[tuple[str, int | None]]) -> list[int]:
        """Ids of `split_added_tokens`'s pieces: an added token's id, or the BPE of a plain piece's words."""
        ids: list[int] = []
        for piece, added_id in pieces:
            if added_id is not None:
                ids.append(added_id)
                continue
            for word in pretokenize(nfc(piece)):
                ids.extend(self.word_ids(word))
        return ids

    def decode(self, ids) -> str:
        """Text of token ids (special tokens kept, unknown ids skipped, bad UTF-8 -> U+FFFD)."""
        data = bytearray()
        for token_id in ids:
            token = self.id_to_token_map.get(int(token_id))
            if token is None:
                continue
            if all(c in CHAR_TO_BYTE for c in token):
                data.extend(CHAR_TO_BYTE[c] for c in token)
            else:  # a token outside the byte alphabet (an added token with such characters) is kept as is
                data.extend(token.encode("utf-8"))
        return data.decode("utf-8", errors="replace")

"""BPE of a text fed in pieces (qtts_lib.runtime.text.bpe_stream): the whole text's ids, whatever the cuts."""
import random
import unicodedata

import pytest

from qtts_lib import paths
from qtts_lib.runtime.text.bpe import Tokenizer
from qtts_lib.runtime.text.bpe_stream import TokenStream, stable_split

LINES = (paths.INPUTS / "tokenizer_corpus.txt").read_text(encoding="utf-8").split("\n")[:-1]
# the pieces later text can change: marks and jamo that compose with what precedes them, marks reordered, whitespace
# runs and newlines, case changes, digits, punctuation with trailing newlines and slashes, CJK, emoji
ATOMS = ["e", "E", "\u0301", "\u0323", "\u0308", "A", "\u030a", "\u212b", "\u1100", "\u1161", "\u11a8", "\uac00",
         "\u0b47", "\u0b3e", "\u0915", "\u093f", " ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "Hello", "world",
         "HTTP", "Request", "iPhone", "123", "4", "!", "?!", "...", "/", "'s", "'T", "你好", "。", "日本語", "😀",
         "\u200b", "ñ", "n\u0303", "\u1e9b\u0323", "Ω", "\u2126", "x", "-", "_", "\u0345", "\U0001d15e", "\U00011935"]


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_dir(paths.model_dir("tiny-base"))


def _split(text: str, rng: random.Random) -> list[str]:
    if len(text) < 2:
        return [text]
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 30))))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def _streamed(tok, parts: list[str]) -> list[int]:
    stream = TokenStream(tok)
    return [i for p in parts for i in stream.feed(p)] + stream.finish()


def test_the_tokenizer_corpus_at_random_cuts(tok):
    rng = random.Random(1)
    for line in LINES + ["\n".join(LINES[:40]), "  \n \n\n".join(LINES[40:80])]:
        want = tok.encode(line, added_tokens=False)
        for _ in range(8):
            parts = _split(line, rng)
            assert _streamed(tok, parts) == want, (line, parts)


def test_one_character_at_a_time(tok):
    for line in LINES[::5]:
        assert _streamed(tok, list(line)) == tok.encode(line, added_tokens=False), line


def test_random_texts_of_marks_jamo_whitespace_and_case(tok):
    rng = random.Random(2)
    for _ in range(400):
        text = "".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 30)))
        want = tok.encode(text, added_tokens=False)
        for _ in range(4):
            parts = _split(text, rng)
            assert _streamed(tok, parts) == want, (text, parts)


def test_ids_come_before_the_text_ends(tok):
    stream = TokenStream(tok)
    assert stream.feed("Hello") == []                        # "Hello" may go on ("Hellos", "HelloWorld")
    assert stream.feed(" wor") == tok.encode("Hello")       # the space may start the next word: " wor" waits
    assert stream.feed("ld  \n") == tok.encode(" world")    # a whitespace run waits for what ends it
    assert stream.finish() == tok.encode("  \n")
    stream = TokenStream(tok)
    assert stream.feed("caf") == [] and stream.feed("e") == [] and stream.feed("\u0301 ok") == tok.encode("café")


def test_nfc_is_split_only_where_later_text_cannot_reach_back():
    assert stable_split("abc") == 2 and stable_split("a") == 0
    assert stable_split("ae\u0301") == 1                     # the mark composes with e: split before e
    assert stable_split("\u1100\u1161") == 0                 # a vowel jamo joins the leading one
    for text in ["e\u0301\u0323x", "\uac00\u11a8y", "\u0b47\u0b3ez"]:
        p = stable_split(text)
        for tail in ["", "\u0301", "\u11a8", "\u0b3e", "q"]:
            whole = unicodedata.normalize("NFC", text + tail)
            assert whole == unicodedata.normalize("NFC", text[:p]) + unicodedata.normalize("NFC", text[p:] + tail)


class _Words:
    """A tokenizer whose ids are the pre-tokenizer's words (one id a word): equal ids are equal words, a stricter
    check than BPE's ids, which may agree where the words do not (" \\n" + " \\n" and " \\n \\n" merge alike)."""

    def __init__(self):
        self.ids: dict[str, int] = {}

    def word_ids(self, word: str) -> list[int]:
        return [self.ids.setdefault(word, len(self.ids))]

    def encode(self, text: str) -> list[int]:
        from qtts_lib.runtime.text.bpe import nfc, pretokenize

        return [i for w in pretokenize(nfc(text)) for i in self.word_ids(w)]


def test_the_words_themselves_are_the_whole_texts():
    words = _Words()
    rng = random.Random(3)
    texts = LINES[::3] + ["a\n \n\nb", "x\n  \n\t\n y", "Hi!\n \n/z", "  \n\n  end", "A\u0301\u0323 \n\n"]
    for _ in range(300):
        texts.append("".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 30))))
    for text in texts:
        want = words.encode(text)
        for _ in range(6):
            parts = _split(text, rng)
            assert _streamed(words, parts) == want, (text, parts)


def test_a_segments_ids_in_the_chat_template_are_its_own(tok):
    """The prompt reads a segment's ids out of the chat template (`prompt.TEXT`); streamed, its ids come from the
    segment alone: the two agree for every segment of the corpora (a segment never starts with whitespace, so the
    template's "\\n" before it is a word of its own)."""
    from qtts_lib.runtime.pipeline.prompt import END_TOKENS, ROLE_TOKENS, TEXT
    from qtts_lib.runtime.text import segment

    cases = segment.read_cases(paths.INPUTS / "segment_corpus.txt")
    texts = LINES + [c["text"] for c in cases]
    for text in texts:
        for seg in segment.segments(text, 40) if text.strip() else []:
            assert tok.encode_template(TEXT, seg)[ROLE_TOKENS:-END_TOKENS] == tok.encode(seg, added_tokens=False)


def test_a_known_space_ahead_settles_the_last_word():
    """`then=" "` when the text's next character is a space: the last word settles now, and the ids stay the whole
    text's."""
    words = _Words()
    rng = random.Random(4)
    texts = LINES[::4] + ["".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 30))) for _ in range(200)]
    for text in texts:
        want = words.encode(text)
        for _ in range(4):
            stream, got, at = TokenStream(words), [], 0
            for part in _split(text, rng):
                at += len(part)
                got += stream.feed(part, " " if text[at:at + 1] == " " else "")
            assert got + stream.finish() == want, (text,)
    stream = TokenStream(words)
    assert stream.feed("Hello", " ") == words.encode("Hello") and stream.feed(" world") == []

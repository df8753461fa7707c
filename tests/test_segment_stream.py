"""The segmenter fed in pieces (qtts_lib.runtime.text.segment_stream): the whole text's segments, given early."""
import random

import pytest

from qtts_lib import paths
from qtts_lib.runtime.text import segment
from qtts_lib.runtime.text.segment_stream import SegmentStream, decided_until

CASES = segment.read_cases(paths.INPUTS / "segment_corpus.txt")
TEXTS = [c["text"] for c in CASES] + [
    "Pi is 3.14 and e is 2.718.", "We sold 1,000,000 copies.", "See www.example.com or https://a.b/c.d?e=f.",
    "Mail ann.lee@example.co.uk today.", "Wait... what?", "Dr. Who met Mr. Smith, e.g. on Monday.",
    "The U.S. and the U.K. agreed.", "Er kam am 3. Oktober.", "Я живу в г. Москве, т.е. в столице.",
    "one two three four five, six seven eight nine ten, eleven twelve thirteen fourteen fifteen.",
    "alpha beta gamma delta epsilon zeta", "这是一个没有标点符号的很长的句子", "It cost 1 000 000 euros",
    "A b. C d. E f. G h.", "你好。今天天气很好！我们去公园吧？", "今天天气\n很好。",
    "Chapter One\n\nIt was a bright cold day. The clocks were striking thirteen.\n \nPart two.",
    "« C'est fini. » Il part. « Vraiment ? » Oui.", "「はい。」と言った。次へ。", "Go to http://x.cn/你好。我们走。好！",
    "Stop!Then go.\n\n\n\nNew para.  \n\t\n  Last one...  ", "No. 5 is taken, but no. Apple Inc. The end.",
    "He said \"Stop.\" She left. (Really.) Yes!", "¿Qué? dijo él. ¡Hola! Bien.", "a.b.c. D e. f@g.h. I.",
    "你好。Dr. Smith kam. 「はい。」Dr. Who. 好！J. K. 是。3. Oktober. 你。e.g. this. x。www.a.cn/b。c. D.",
    "去www.a.cn/你好。Dr. 我们。No. 5. 「はい。」e.g. 好的。",
]


def _split(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 40)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def _streamed(parts: list[str], max_len: int, length=len) -> list[str]:
    """The segments of `parts` fed in order; each `open_text` is checked to start the next segment given."""
    stream = SegmentStream(max_len, length)
    out, opened = [], ""
    for p in parts + [None]:
        new = stream.feed(p) if p is not None else stream.finish()
        if new:
            assert new[0].startswith(opened), (new[0], opened)
        opened = stream.open_text if stream.open_text else (opened if not new else "")
        out += new
    return out


@pytest.mark.parametrize("max_len", [8, 25, 60, 200])
def test_any_split_gives_the_whole_texts_segments(max_len):
    rng = random.Random(max_len)
    for text in TEXTS + ["\n\n".join(TEXTS), " ".join(TEXTS)]:
        want = segment.segments(text, max_len)
        for _ in range(25):
            parts = _split(text, rng)
            assert _streamed(parts, max_len) == want, (text, parts)


def test_every_single_split_point_and_one_character_at_a_time():
    for text in TEXTS:
        want = segment.segments(text, 30)
        assert _streamed(list(text), 30) == want, text
        for i in range(1, len(text)):
            assert _streamed([text[:i], text[i:]], 30) == want, (text, i)


def test_random_texts_from_the_rules_ingredients():
    words = ["Dr.", "dr.", "e.g.", "U.S.", "3.", "Oktober", "oktober", "etc.", "No.", "5", "J.", "www.a.com",
             "a@b.cd", "x.com/a.", "...", "…", "Hello.", "hello", "World!", "?", "\"Hi.\"", "(Yes.)", "«", "»",
             "你好。", "世界！", "a.cn/你好。", "はい。」と", "。", "1,000", "3.14", "—", "-", ",", ";", "Ünïcödé.",
             "\n", "\n\n", "\n \n", "  "]
    rng = random.Random(7)
    for _ in range(300):
        text = "".join(rng.choice(words) + rng.choice(["", " ", " ", " ", "\n"]) for _ in range(rng.randint(1, 25)))
        max_len = rng.choice([5, 12, 40, 200])
        want = segment.segments(text, max_len)
        for _k in range(5):
            parts = _split(text, rng)
            assert _streamed(parts, max_len) == want, (text, parts, max_len)


def test_a_token_bound_fed_word_by_word():
    from qtts_lib.runtime.text.bpe import Tokenizer

    tok = Tokenizer.from_dir(paths.model_dir("tiny-base"))
    count = lambda s: len(tok.encode(s))  # noqa: E731
    text = " ".join(c["text"] for c in CASES)
    words = [w + " " for w in text.split(" ")]
    assert _streamed(words, 30, count) == segment.segments(text, 30, count)


def test_segments_come_as_soon_as_the_next_word_is_in():
    stream = SegmentStream(12)
    assert stream.feed("Hello there.") == []            # the run of marks may go on
    assert stream.feed(" How") == []                    # the next word may go on ("However" or "how")
    assert stream.feed(" are you? Fine") == []          # "are you?" ends a sentence only if "Fine..." is not lower
    assert stream.feed(" thanks. ") == ["Hello there."]  # "How are you?" is complete and does not fit beside it
    assert stream.finish() == ["How are you?", "Fine thanks."]
    stream = SegmentStream(200)
    assert stream.feed("Er kam am 3. ") == [] and stream.feed("Okto") == [] and stream.feed("ber an. Dann") == []
    assert stream.feed("\n\nNeu") == ["Er kam am 3. Oktober an. Dann"]   # a paragraph closes its last segment


@pytest.mark.parametrize("text, until", [
    ("Hello.", 5), ("Hello. ", 5), ("Hello. World", 5), ("Hello. World ", 13), ("e.g. this", 3),
    ("你好。我", 4), ("Hi\n", 2), ("Hi\n \n", 5), ("Hi\n \n\t", 6), ("Hi\n \n\n", 5), ("ok 3.14", 7),
    ("see www.a.cn/你好。我", 15), ("www.a.cn/你好。我 ", 14), ("see a.cn 你好。我", 13),
])
def test_decided_until(text, until):
    assert decided_until(text) == until


def test_the_text_kept_stays_short():
    stream = SegmentStream(40)
    sentence = "This sentence is short enough. "
    for _ in range(200):
        stream.feed(sentence)
    assert len(stream.pending) < 3 * len(sentence)
    assert stream.given >= 190
    stream = SegmentStream(40)
    for _ in range(200):                            # no spaces: kept from the character before the open segment
        stream.feed("今天天气很好，我们去公园吧。")
    assert len(stream.pending) < 4 * 14 and stream.given >= 95


def test_a_cut_without_a_space_keeps_what_the_abbreviation_rule_looks_back_at():
    """Chinese before an abbreviation with no space between: the whole text reads "好。St" as the word before the
    period (no abbreviation: a sentence ends), so the kept text must keep the "。" when it starts at "St"."""
    for length in range(1, 20):
        for max_len in range(8, 30):
            text = "好" * length + "。St. Bernard is big and fat. Yes."
            assert _streamed(list(text), max_len) == segment.segments(text, max_len), (length, max_len)


def test_the_first_words_open_a_segment_before_its_first_sentence_is_complete():
    """`open_text` before any sentence is complete: whole words of letters that fit, what a cut into clauses or at
    spaces keeps in the first piece; never digits ("1 000 000" is one piece: its "1" alone may not fit)."""
    stream = SegmentStream(30)
    seen = [(stream.feed(d), stream.open_text) for d in ["Hello", " there", " my good", " friend, how"]]
    assert seen == [([], ""), ([], "Hello"), ([], "Hello there my"), ([], "Hello there my good")]
    for text in ["It cost 1 000 000 euros and more.", "ab 12 345 678 cd ef gh.", "x 1 2 3 4 5 6 7 8 9 y z.",
                 "one two three four five six seven eight nine ten eleven twelve"]:
        for max_len in range(3, 30):
            assert _streamed(list(text), max_len) == segment.segments(text, max_len), (text, max_len)

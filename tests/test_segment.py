"""The segmenter (qtts_lib.runtime.segment): the committed multilingual corpus, and the bounds of segments."""
import pytest

from qtts_lib import paths
from qtts_lib.runtime.text import segment

CASES = segment.read_cases(paths.INPUTS / "segment_corpus.txt")
LANGUAGES = {"english", "chinese", "japanese", "korean", "german", "french", "spanish", "italian", "portuguese",
             "russian"}


def test_the_corpus_covers_the_checkpoints_languages():
    import json

    config = json.loads((paths.model_dir("tiny-base") / "config.json").read_text())
    assert set(config["talker_config"]["codec_language_id"]) == LANGUAGES
    assert {c["language"] for c in CASES} == LANGUAGES
    assert {c["language"] for c in CASES if c["kind"] == "clauses"} >= {"english", "chinese", "japanese"}


@pytest.mark.parametrize("case", CASES, ids=[f"{c['language']}-{c['kind']}-{i}" for i, c in enumerate(CASES)])
def test_corpus_case(case):
    assert getattr(segment, case["kind"])(case["text"]) == case["expected"], case["note"]


@pytest.mark.parametrize("text", [
    "Pi is 3.14 and e is 2.718.", "We sold 1,000,000 copies.", "See www.example.com or https://a.b/c.d?e=f.",
    "Mail ann.lee@example.co.uk today.", "Wait... what?", "Dr. Who met Mr. Smith, e.g. on Monday.",
    "The U.S. and the U.K. agreed.", "Er kam am 3. Oktober.", "Я живу в г. Москве, т.е. в столице.",
])
def test_no_split_inside_numbers_abbreviations_urls_emails_ellipses(text):
    assert segment.sentences(text) == [text]


def test_segments_are_bounded_and_lose_nothing():
    text = "\n\n".join(c["text"] for c in CASES)
    for bound in (10, 25, 60, 200):
        segs = segment.segments(text, bound)
        assert all(len(s) <= bound for s in segs), bound
        squeeze = lambda t: "".join(t.split())  # noqa: E731
        assert squeeze("".join(segs)) == squeeze(text)


def test_a_long_sentence_is_cut_at_clauses_then_spaces_then_characters():
    long_sentence = "one two three four five, six seven eight nine ten, eleven twelve thirteen fourteen fifteen."
    assert segment.segments(long_sentence, 40) == ["one two three four five,", "six seven eight nine ten,",
                                                   "eleven twelve thirteen fourteen fifteen."]
    assert segment.segments("alpha beta gamma delta epsilon zeta", 12) == ["alpha beta", "gamma delta",
                                                                          "epsilon zeta"]
    assert segment.segments("这是一个没有标点符号的很长的句子", 6) == ["这是一个没有", "标点符号的很", "长的句子"]
    assert segment.segments("It cost 1 000 000 euros", 9) == ["It cost", "1 000 000", "euros"]  # digit groups stay


def test_short_sentences_are_packed_and_cjk_joins_without_spaces():
    assert segment.segments("A b. C d. E f. G h.", 10) == ["A b. C d.", "E f. G h."]
    assert segment.segments("你好。今天天气很好！我们去公园吧？", 12) == ["你好。今天天气很好！", "我们去公园吧？"]
    assert segment.segments("今天天气\n很好。", 100) == ["今天天气很好。"]  # hard-wrapped Chinese


def test_a_token_bound():
    from qtts_lib.runtime.text.bpe import Tokenizer

    tok = Tokenizer.from_dir(paths.model_dir("tiny-base"))
    count = lambda s: len(tok.encode(s))  # noqa: E731
    text = " ".join(c["text"] for c in CASES)
    segs = segment.segments(text, 30, count)
    assert all(count(s) <= 30 for s in segs) and len(segs) > 10


def test_bad_bound():
    with pytest.raises(ValueError, match="at least 1"):
        segment.segments("Hello.", 0)


def test_segments_never_cross_a_paragraph():
    text = "Chapter One\n\nIt was a bright cold day. The clocks were striking thirteen.\n \nPart two."
    assert segment.segments(text, 200) == ["Chapter One", "It was a bright cold day. The clocks were striking "
                                           "thirteen.", "Part two."]

"""qtts_lib.runtime.bpe against the reference pipeline's tokenizer (chapter 06).

The reference is what qwen_tts uses: `AutoProcessor.from_pretrained(model_dir, fix_mistral_regex=True)`
and `processor(text=text, return_tensors="pt", padding=True)["input_ids"]`.
"""
import ast
import os
import random
import sys
import unicodedata

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from qtts_lib import checkpoint, paths  # noqa: E402
from qtts_lib.runtime.text import bpe  # noqa: E402

CORPUS = paths.INPUTS / "tokenizer_corpus.txt"
SEPARATORS = ["\n", "\n\n", "\r\n"]


def read_corpus() -> list[str]:
    # split on "\n" only: str.splitlines() would also split on U+2028, U+0085, \x1c.. inside lines
    return CORPUS.read_text(encoding="utf-8").split("\n")[:-1]


@pytest.fixture(scope="module")
def model_dir():
    return checkpoint.ensure("tiny-base")


@pytest.fixture(scope="module")
def processor(model_dir):
    """The reference tokenizer, loaded exactly as Qwen3TTSModel.from_pretrained loads it."""
    from qtts_lib import reference

    reference.import_qwen_tts()
    import transformers
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSProcessor
    from transformers import AutoConfig, AutoProcessor

    transformers.logging.set_verbosity_error()
    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoProcessor.register(Qwen3TTSConfig, Qwen3TTSProcessor, exist_ok=True)
    proc = AutoProcessor.from_pretrained(str(model_dir), fix_mistral_regex=True)
    assert proc.tokenizer.fix_mistral_regex is True
    return proc


@pytest.fixture(scope="module")
def tok(model_dir):
    return bpe.Tokenizer.from_dir(model_dir)


def ref_ids(processor, text: str) -> list[int]:
    return processor(text=text, return_tensors="pt", padding=True)["input_ids"][0].tolist()


def mismatches(processor, tok, texts) -> list[tuple[str, list[int], list[int]]]:
    bad = []
    for text in texts:
        want, got = ref_ids(processor, text), tok.encode(text)
        if want != got:
            bad.append((text, want, got))
    return bad


def word_mismatches(processor, texts) -> list[tuple[str, list[str], list[str]]]:
    """Compare the words, not just the ids: different splits often BPE to the same ids."""
    backend = processor.tokenizer.backend_tokenizer
    bad = []
    for text in texts:
        for piece, added_id in bpe.split_added_tokens(text, processor.tokenizer.get_added_vocab()):
            if added_id is not None:
                continue
            want = [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(piece))]
            got = ["".join(bpe.BYTE_TO_CHAR[b] for b in w.encode("utf-8")) for w in bpe.pretokenize(bpe.nfc(piece))]
            if want != got:
                bad.append((piece, want, got))
    return bad


def describe(bad) -> str:
    return "\n".join(f"{t!r}\n  ref {w}\n  got {g}" for t, w, g in bad[:10])


# ---------------------------------------------------------------- the module itself


def test_bpe_module_is_stdlib_only():
    tree = ast.parse(open(bpe.__file__, encoding="utf-8").read())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
    assert not names & {"re", "regex"}, names


def test_unicode_tables_match_python_version():
    # _UNICODE_16_ADDITIONS and _NFC_UNKNOWN_TO_REFERENCE were measured against Python 3.11's unicodedata.
    assert unicodedata.unidata_version == "14.0.0"


def test_reference_uses_the_patched_regex(processor):
    pre = processor.tokenizer.backend_tokenizer.pre_tokenizer
    assert [w for w, _ in pre.pre_tokenize_str("HelloWorld I'm")] == ["Hello", "World", "ĠI", "'m"]


def test_token_to_id(tok, processor):
    t = processor.tokenizer
    for token in ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tts_pad>", "<tts_text_bos>", "<think>",
                  "Hello", "Ġworld", "Ċ", "ĠĠ", "assistant"]:
        assert tok.token_to_id(token) == t.convert_tokens_to_ids(token), token
    assert tok.token_to_id("definitely-not-a-token") is None


# ---------------------------------------------------------------- parity with the reference


def test_corpus_is_big_and_mixed():
    lines = read_corpus()
    assert len(lines) >= 150
    text = "".join(lines)
    for needle in ["DON'T", "HelloWorld", "iPhone", "McDonald", "\u200d", "🇺🇸", "🏽", "<|im_end|>", "<tts_pad>",
                   "<|endoftext|>", "\t", "你好", "こんにちは", "안녕", "Привет", "مرحبا", "नमस्ते", "https://"]:
        assert needle in text, needle


def test_corpus_lines_match_reference(processor, tok):
    bad = mismatches(processor, tok, read_corpus())
    assert not bad, f"{len(bad)} corpus lines differ:\n{describe(bad)}"
    bad = word_mismatches(processor, read_corpus())
    assert not bad, f"{len(bad)} corpus lines split differently:\n{describe(bad)}"


def test_multiline_joins_match_reference(processor, tok):
    lines = read_corpus()
    texts = [SEPARATORS[i % 3].join(lines[i:i + 2 + i % 3]) for i in range(len(lines))]
    texts += [sep.join(lines[i:i + 2]) for sep in SEPARATORS for i in range(0, len(lines), 7)]
    bad = mismatches(processor, tok, texts)
    assert not bad, f"{len(bad)} multi-line strings differ:\n{describe(bad)}"


def test_prompt_formats_match_reference(processor, tok):
    """The exact strings qwen_tts tokenizes: assistant text, ref text and instruct text."""
    texts = []
    for line in read_corpus():
        texts += [f"<|im_start|>assistant\n{line}<|im_end|>\n<|im_start|>assistant\n",
                  f"<|im_start|>assistant\n{line}<|im_end|>\n",
                  f"<|im_start|>user\n{line}<|im_end|>\n"]
    bad = mismatches(processor, tok, texts)
    assert not bad, f"{len(bad)} prompts differ:\n{describe(bad)}"


TEMPLATES = ["<|im_start|>assistant\n{}<|im_end|>\n<|im_start|>assistant\n", "<|im_start|>assistant\n{}<|im_end|>\n",
             "<|im_start|>user\n{}<|im_end|>\n"]


def test_a_template_of_text_without_added_tokens_gives_the_references_ids(processor, tok):
    """`encode_template` (what the prompt uses for what people type) is the reference's tokenizer wherever the text
    holds no added token: corpus lines and random strings in each of the three templates qwen_tts formats."""
    texts = [t for t in read_corpus() + random_strings(1000)
             if all(i is None for _, i in bpe.split_added_tokens(t, tok.added))]
    assert len(texts) > 900
    bad = [(template.format(t), ref_ids(processor, template.format(t)), tok.encode_template(template, t))
           for template in TEMPLATES for t in texts
           if tok.encode_template(template, t) != ref_ids(processor, template.format(t))]
    assert not bad, f"{len(bad)} templated texts differ:\n{describe(bad)}"


def test_added_tokens_typed_into_a_template_are_text(tok):
    """Every added token of the checkpoint (`<|im_end|>`, `<|im_start|>`, `<tts_pad>`, `<|endoftext|>`, ...) typed
    into a value: the template's own ids stay where the template puts them, the value yields no added id and decodes
    to exactly what was typed."""
    added = set(tok.added.values())
    assert {"<|im_start|>", "<|im_end|>", "<tts_pad>", "<|endoftext|>"} <= set(tok.added)
    values = [f"Hi {t} there" for t in tok.added] + ["".join(tok.added), "<|im_end|>\n<|im_start|>user\nSing.",
                                                      "<|im_", "end|>", "<tts_pad><tts_pad>"]
    for template in TEMPLATES:
        before, after = (tok.encode(part) for part in template.split("{}"))
        for value in values:
            ids = tok.encode_template(template, value)
            assert ids[:len(before)] == before and ids[len(ids) - len(after):] == after, (template, value)
            inner = ids[len(before):len(ids) - len(after)]
            assert not added & set(inner), (template, value)
            assert inner == tok.encode(value, added_tokens=False) and tok.decode(inner) == value
    assert tok.encode("<|im_end|>") == [tok.added["<|im_end|>"]]  # the reference's reading is still there
    with pytest.raises(ValueError, match="1 places for values, not 2"):
        tok.encode_template(TEMPLATES[0], "a", "b")


def _random_pools() -> list[tuple[float, callable]]:
    """(weight, draw(rng) -> str) for the property test."""
    def span(lo, hi):
        return lambda r: chr(r.randint(lo, hi))

    def choice(seq):
        return lambda r: r.choice(seq)

    def anywhere(r):
        plane = r.choice([0, 0, 1, 1, 2, 3, 14, 15])
        cp = plane * 0x10000 + r.randint(0, 0xFFFF)
        return "\ufffd" if 0xD800 <= cp <= 0xDFFF else chr(cp)

    ascii_punct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    marks = [chr(c) for c in range(0x300, 0x370)] + [chr(c) for c in (0x1DFA, 0x1AC1, 0x08D3, 0x0C3C, 0x302A,
                                                                          0x3099, 0x094D, 0x0E48, 0x1133B)]
    emoji = (["\u200d", "\ufe0f", "\u20e3"] + [chr(c) for c in range(0x1F3FB, 0x1F400)]
             + [chr(c) for c in range(0x1F1E6, 0x1F200)])
    return [
        (12, span(ord("a"), ord("z"))), (6, span(ord("A"), ord("Z"))), (4, span(ord("0"), ord("9"))),
        (4, choice(ascii_punct)), (3, choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL"])),
        (6, choice([" ", " ", "  ", "    ", "\t", "\n", "\r", "\r\n", "\n\n", " \n", "\u00a0", "\u3000",
                    "\x0b", "\x0c", "\x85", "\u2028", "\x1c"])),
        (3, span(0xA0, 0xFF)), (2, span(0x370, 0x4FF)), (4, span(0x4E00, 0x9FFF)), (3, span(0xAC00, 0xD7A3)),
        (1, span(0x1100, 0x11FF)), (3, span(0x3040, 0x30FF)), (2, span(0x600, 0x6FF)), (2, span(0x900, 0x97F)),
        (3, span(0x1F300, 0x1FAFF)), (2, choice(emoji)), (4, choice(marks)), (4, anywhere),
        (1, choice(["<|im_start|>", "<|im_end|>", "<tts_pad>", "<|endoftext|>", "<think>", "<|im_", "<tts"])),
    ]


def random_strings(n: int, seed: int = 20260606) -> list[str]:
    rng = random.Random(seed)
    pools = _random_pools()
    weights = [w for w, _ in pools]
    out = []
    for _ in range(n):
        draws = rng.choices(pools, weights, k=rng.randint(0, 40))
        out.append("".join(draw(rng) for _, draw in draws)[:40])
    return out


def test_random_unicode_strings_match_reference(processor, tok):
    texts = random_strings(3000)
    bad = mismatches(processor, tok, texts)
    assert not bad, f"{len(bad)} of {len(texts)} random strings differ:\n{describe(bad)}"
    bad = word_mismatches(processor, texts)
    assert not bad, f"{len(bad)} random strings split differently:\n{describe(bad)}"


def test_pretokenizer_over_every_code_point(processor):
    """Every code point (shuffled, so each meets random neighbours) splits like the reference's
    pre-tokenizer: checks the character classes against the regex engine's Unicode tables."""
    pre = processor.tokenizer.backend_tokenizer.pre_tokenizer
    cps = [c for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    random.Random(0).shuffle(cps)
    bad = []
    for k in range(0, len(cps), 5000):
        text = "".join(map(chr, cps[k:k + 5000]))
        want = [w for w, _ in pre.pre_tokenize_str(text)]
        got = ["".join(bpe.BYTE_TO_CHAR[b] for b in w.encode("utf-8")) for w in bpe.pretokenize(text)]
        if want != got:
            bad.append(k)
    assert not bad, f"{len(bad)} chunks differ"


def test_nfc_matches_reference_normalizer(processor):
    """Combining-mark soup, incl. marks the reference's Unicode 9.0 NFC does not know."""
    norm = processor.tokenizer.backend_tokenizer.normalizer
    rng = random.Random(7)
    marks = [chr(c) for c in range(0x300, 0x110000)
             if unicodedata.combining(chr(c)) and not 0xD800 <= c <= 0xDFFF]
    bases = list("aeiouAEIOUnNcCsSzZ") + ["\u1100", "\u1161", "\u11a8", "\uac00", "\U00011935", "\U00011930",
                                          "\u0915", "\u3046", "\u0627", "\u05d0", "\u1e00", " "]
    texts = ["".join(rng.choice(marks if rng.random() < 0.55 else bases) for _ in range(rng.randint(1, 12)))
             for _ in range(20000)]
    bad = [t for t in texts if bpe.nfc(t) != norm.normalize_str(t)]
    assert not bad, [[hex(ord(c)) for c in t] for t in bad[:5]]


# ---------------------------------------------------------------- decode


def test_roundtrip_corpus(tok):
    lines = read_corpus()
    texts = lines + [SEPARATORS[i % 3].join(lines[i:i + 3]) for i in range(len(lines))]
    not_nfc = [t for t in lines if bpe.nfc(t) != t]
    assert len(not_nfc) <= 3, not_nfc  # the deliberately decomposed lines come back composed
    for text in texts:
        assert tok.decode(tok.encode(text)) == bpe.nfc(text), text
        if text not in not_nfc and "\n" not in text:
            assert tok.decode(tok.encode(text)) == text


def test_decode_matches_reference(processor, tok):
    """Arbitrary id sequences, incl. ones that cut UTF-8 sequences (decoded as U+FFFD)."""
    rng = random.Random(11)
    special = list(tok.added.values())
    seqs = [[rng.choice(special) if rng.random() < 0.05 else rng.randrange(151643) for _ in range(rng.randint(0, 20))]
            for _ in range(1000)]
    seqs += [tok.encode(s)[1:] for s in read_corpus()]  # drop the first token: may start mid-character
    for ids in seqs:
        assert tok.decode(ids) == processor.tokenizer.decode(ids), ids

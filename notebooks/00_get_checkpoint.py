# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 00 · Get a checkpoint and run the original once
# > Before porting anything, make the original model run on this machine and keep what it says.
#
# **You will:** pick a checkpoint, load it with `qwen-tts`'s own loader with the network off, clone the
# voice clip once in x-vector mode (the voice enters only as one speaker vector, below), listen to it and keep the
# result as a baseline.
#
# **You will learn:** what a Qwen3-TTS checkpoint directory holds; why this tutorial runs on random-init
# checkpoints of the real architecture; how to import the 12 Hz path of `qwen-tts` (the model whose codec makes
# 12.5 frames a second) without its 25 Hz extras; the words the rest of the tutorial uses for the model's parts.
#
# **You need:** nothing but the installed packages: the checkpoint is synthesized if it is not on disk.
#
# **Leaves behind:** `models/<ckpt>/`, `data/outputs/<ckpt>/00_baseline.wav` (+ manifest),
# `data/reports/<ckpt>/00_get_checkpoint.json`.

# %%
import json
import os
import time

import numpy as np
import torch
from IPython.display import Audio, display

from qtts_lib import artifacts, check, checkpoint, paths, plots, reference, settings
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav, save_wav
from qtts_lib.runtime.errors import AudioError

ckpt = settings.checkpoint()  # QTTS_CHECKPOINT, default tiny-base
torch.set_num_threads(settings.threads())
report = check.begin("00_get_checkpoint", ckpt)
print(f"checkpoint: {ckpt}   threads: {settings.threads()}   torch {torch.__version__}")

# %% [markdown]
# **The words of this tutorial.** Qwen3-TTS makes speech as a sequence of *frames*, 12.5 a second; a frame is 16
# integer *codes*, one from each of 16 *codebooks* of 2048 entries. Chapter 01 draws how the parts connect.
# - **RVQ** (residual vector quantization): how the codec turns a frame's vector into codes: each codebook in a
#   chain takes the entry nearest to what the codebooks before it left over (the residual). This codec splits
#   it: codebook 0 (the *semantic* one) alone, codebooks 1..15 as one residual chain; decoding adds both back.
# - **Talker**: a Qwen3 decoder-only transformer (28 layers in the released model). It reads the *prompt* (the
#   text and the voice, as rows of embeddings) and predicts codebook 0 of each frame with its `codec_head`.
# - **Code predictor**: a small decoder (5 layers) that predicts codebooks 1..15 of the same frame one after
#   another from the talker's hidden state. `qwen-tts` calls it the *sub-talker*, and its input projection
#   `small_to_mtp_projection`: **MTP** is multi-token prediction, several tokens per talker step.
# - **Codec** (`qwen-tts`: the *speech tokenizer*, `qwen3_tts_tokenizer_12hz`): its **decoder** turns a frame's
#   16 codes into 1920 samples of a 24 kHz waveform; its **encoder** is **Mimi**, the neural speech codec of
#   Kyutai's Moshi (`transformers.MimiModel`), which turns a voice clip into codes.
# - **Speaker encoder**: an **ECAPA-TDNN** (Emphasized Channel Attention, Propagation and Aggregation in a
#   Time-Delay Neural Network, a speaker-verification network). It reads a mel spectrogram of the clip (128 bands
#   of a perceptual frequency scale) and returns one vector, the **x-vector**: the speaker's embedding.
# - **x-vector mode** clones a voice from the x-vector alone; **ICL** (in-context learning) mode also puts the
#   clip's Mimi codes and its transcript into the prompt, and the talker continues in that voice.
#
# The default checkpoint kind, **Base**, clones a voice clip in either mode; the other kinds (built-in
# speakers, voices described in words) are chapter 09.

# %% [markdown]
# ## 1. Choose a checkpoint
# The Hugging Face hub is out of reach from these machines, so the real weights cannot be downloaded.
# The tutorial therefore runs on checkpoints **of the real architecture with random weights**:
#
# | name | what | used for |
# |---|---|---|
# | `tiny-base` (default), `tiny-customvoice` | real config keys, ids, strides; small dims | CI, chapters in seconds |
# | `full-base`, `full-customvoice` | the 0.6B dimensions of the real `config.json` | honest memory and speed numbers |
# | a real checkpoint directory under `models/` | e.g. `models/Qwen3-TTS-12Hz-0.6B-Base` | real speech |
#
# Random weights make noise, so every proof in this tutorial is *parity* (token for token, SNR, cosine),
# never "it sounds right". A name outside this list is refused with the list of valid ones:

# %%
os.environ["QTTS_CHECKPOINT"], saved = "qwen3-tts-large", ckpt
try:
    settings.checkpoint()
except settings.UnknownCheckpoint as e:
    refusal = str(e)
    print(refusal)
finally:
    os.environ["QTTS_CHECKPOINT"] = saved
check.equal("unknown checkpoint refused with the valid names", "names tiny-base", "tiny-base" in refusal, True)

# %% [markdown]
# ## 2. Synthesize (or find) the checkpoint
# `checkpoint.ensure` returns a real directory untouched. For our own names it builds the model classes of
# `qwen-tts` from the real config (shrunk for `tiny-*`) under a fixed seed, writes every file the loader
# reads, and records a manifest; a stale directory (made by an older spec) is rebuilt.
# Two fixes make random weights exercise every path: random RVQ codebooks (init leaves them at zero, so the
# codec decoder would ignore codes and the Mimi encoder emit zeros), and a wider init of the tiny codec decoder
# (at the default 0.02 it outputs near-silence).

# %%
t0 = time.perf_counter()
model_dir = checkpoint.ensure(ckpt)
print(f"{model_dir}  ({time.perf_counter() - t0:.1f} s)")
for f in sorted(p for p in model_dir.rglob("*") if p.is_file() and "ncnn" not in p.parts):
    print(f"  {f.relative_to(model_dir)!s:45} {f.stat().st_size / 2**20:9.2f} MiB")

# %% [markdown]
# A synthesized checkpoint is a pure function of its seed: building it again gives the same bytes.

# %%
if checkpoint.is_synthetic(ckpt) and ckpt.startswith("tiny"):
    import tempfile
    from pathlib import Path

    manifest = json.loads((model_dir / checkpoint.MANIFEST).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        again = checkpoint.build_random(ckpt, manifest["seed"], out=Path(tmp) / ckpt)
        same = artifacts.sha256(again / "model.safetensors") == manifest["model.safetensors"]
    check.equal("re-synthesis is byte-identical", "sha256 equal", same, True)
else:
    print(f"skipped the rebuild check because {ckpt} is "
          + ("full size (4 GB)" if checkpoint.is_synthetic(ckpt) else "a real checkpoint"))

# %% [markdown]
# ## 3. Read the numbers that matter from config.json
# Every dimension and id in this tutorial comes from the checkpoint's own `config.json`; chapter 01 shows
# why the Python class defaults cannot be trusted.

# %%
cfg = checkpoint.load_config(ckpt)
talker, pred = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
print(f"model type: {cfg['tts_model_type']}")
print(f"talker:    {talker['num_hidden_layers']} layers, hidden {talker['hidden_size']}, "
      f"heads {talker['num_attention_heads']}/{talker['num_key_value_heads']}, head_dim {talker['head_dim']}, "
      f"codec vocab {talker['vocab_size']}")
print(f"predictor: {pred['num_hidden_layers']} layers, hidden {pred['hidden_size']}, "
      f"{talker['num_code_groups'] - 1} tables and heads of {pred['vocab_size']}")
print(f"text:      vocab {talker['text_vocab_size']} -> {talker['text_hidden_size']} -> {talker['hidden_size']}")
print(f"codec ids: pad {talker['codec_pad_id']}, bos {talker['codec_bos_id']}, eos {talker['codec_eos_token_id']}; "
      f"languages {sorted(talker['codec_language_id'])}")

# %% [markdown]
# ## 4. Load it with the original loader, offline
# `qwen_tts/__init__` imports the 25 Hz speech tokenizer, which pulls `torchaudio`, `sox`, `onnxruntime`
# and `einops`; the 12 Hz model needs none of them. `reference.import_qwen_tts` registers a placeholder
# module under the 25 Hz name first, so the real package imports with only what the 12 Hz path uses.

# %%
os.environ["HF_HUB_OFFLINE"] = "1"
t0 = time.perf_counter()
tts = reference.load(model_dir, threads=settings.threads())
print(f"loaded {type(tts).__name__} in {time.perf_counter() - t0:.1f} s with HF_HUB_OFFLINE=1")
n_params = sum(p.numel() for p in tts.model.parameters())
n_codec = sum(p.numel() for p in tts.model.speech_tokenizer.model.parameters())
print(f"parameters: model {n_params / 1e6:.1f} M, speech tokenizer {n_codec / 1e6:.1f} M")
check.equal("talker layers loaded = config", "layers", len(tts.model.talker.model.layers), talker["num_hidden_layers"])

# %% [markdown]
# ## 5. The voice clip
# `data/inputs/voice.wav` is espeak-ng speech resampled by sox to **24 kHz mono** (`python -m qtts_lib.inputs`
# remakes it). The reference model asserts 24 kHz, and a resampler is one more thing a port would have to
# reproduce bit for bit, so we keep inputs native. A wav at another rate or with two channels is converted
# with a printed note, never silently:

# %%
import tempfile

import soundfile as sf

voice_wav = load_wav(paths.voice_wav())
print(f"voice.wav: {len(voice_wav)} samples = {len(voice_wav) / SAMPLE_RATE:.2f} s at 24 kHz")
with tempfile.TemporaryDirectory() as tmp:
    odd = f"{tmp}/stereo_22k.wav"
    sf.write(odd, np.stack([voice_wav[::2], voice_wav[::2]], axis=1)[:22050], 22050)
    converted = load_wav(odd)
    try:
        load_wav(odd, strict=True)
    except AudioError as e:
        print("strict:", e)
check.equal("22.05 kHz stereo converted to 24 kHz mono", "samples", len(converted), 24000)
display(Audio(voice_wav, rate=SAMPLE_RATE))

# %% [markdown]
# ## 6. Run the original once
# Clone the voice clip in x-vector mode (the speaker encoder's x-vector only), greedy (always the most likely
# code) on CPU fp32. (`reference.default_voice` picks the voice argument of the checkpoint's kind; chapter 09.)
# `max_new_tokens=N` yields N-1 frames: the last sampled codebook-0 token never gets its other 15 codes.

# %%
TEXT = "Hello from ncnn. Every token of this sentence is checked against PyTorch."
MAX_NEW_TOKENS = 45
t0 = time.perf_counter()
voice = reference.default_voice(tts, voice_wav)
run = reference.capture_generation(tts, TEXT, "english", max_new_tokens=MAX_NEW_TOKENS, **voice)
seconds = time.perf_counter() - t0
wav = run["wav"]
print(f"{run['codes'].shape[0]} frames -> {len(wav)} samples ({len(wav) / SAMPLE_RATE:.2f} s of audio) "
      f"in {seconds:.1f} s")
check.equal("frames = max_new_tokens - 1", "frames", int(run["codes"].shape[0]), MAX_NEW_TOKENS - 1)
check.at_least("baseline is not silent", "rms", float(np.sqrt(np.mean(wav**2))), 1e-3)
check.equal("1920 samples per frame", "samples/frame", len(wav) // run["codes"].shape[0], SAMPLES_PER_FRAME)

# %%
display(Audio(wav, rate=SAMPLE_RATE))
plots.waveform({"voice clip": voice_wav, f"original model ({ckpt})": wav});

# %% [markdown]
# ## 7. Keep the baseline
# The baseline wav gets a manifest entry (producer, inputs, sha256, versions, threads, checkpoint
# fingerprint); chapter 03 turns this run into full golden references.

# %%
out = save_wav(paths.outputs_dir(ckpt) / "00_baseline.wav", wav)
entry = artifacts.record(out, "00_get_checkpoint", ckpt, inputs={"text": TEXT, "language": "english",
                         "ref_wav_sha256": artifacts.sha256(paths.voice_wav()), "max_new_tokens": MAX_NEW_TOKENS},
                         threads=settings.threads(), mode=f"{voice.get('speaker', 'x-vector')} greedy")
artifacts.verify(out, ckpt)
print(out, entry["sha256"][:16])

# %% [markdown]
# ## Summary
# - A checkpoint is a directory of configs, safetensors and tokenizer files; the tutorial synthesizes one of the
#   real architecture when the real weights are not available, deterministically from a seed.
# - `qwen-tts` loads it offline with its own `from_pretrained`; its 25 Hz extras are kept out by a placeholder module.
# - One greedy x-vector clone on CPU fp32 gives N-1 frames of 16 codes, 1920 samples each.
#
# **Artifacts left:** `models/<ckpt>/`, `data/outputs/<ckpt>/00_baseline.wav` with its manifest, the chapter report.
#
# **If your numbers differ**
# - *"QTTS_CHECKPOINT is not a known checkpoint"* → the name is not one of ours nor a directory under `models/` with
#   `config.json` and `model.safetensors`.
# - *Loader tries to download* → `HF_HUB_OFFLINE` was unset and the directory is incomplete; compare its files with the
#   listing in section 2.
# - *Silent baseline* → a checkpoint synthesized by hand with the default codec init; let `checkpoint.ensure` build it.

# %%
check.table()

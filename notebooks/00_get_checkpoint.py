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
# **You will:** pick a checkpoint, load it with the loader of `qwen-tts` (the official Python package of
# Qwen3-TTS: the PyTorch model classes and their `from_pretrained`) with the network off, clone the committed voice
# clip once in x-vector mode (the voice enters only as one speaker vector, section 6), listen to it and keep the
# result as a baseline for later chapters.
#
# **You will learn:** what a Qwen3-TTS checkpoint directory holds; why this tutorial runs on random-init
# checkpoints of the real architecture; how to import the 12 Hz path of `qwen-tts` without its 25 Hz extras
# (Qwen3-TTS comes in two families named by their codec's frame rate: 12 Hz, 12.5 frames a second, the one
# ported here, and 25 Hz). Each term is defined where it is first needed; [the glossary](../glossary.md)
# collects them all, with the chapter that teaches each.
#
# **You need:** nothing but the installed packages: the checkpoint is synthesized if it is not on disk.
#
# **Leaves behind:** `models/<ckpt>/`, `data/outputs/<ckpt>/00_baseline.wav` (+ manifest),
# `data/reports/<ckpt>/00_get_checkpoint.json`.

# %% [markdown]
# Every chapter opens the same way. `settings` reads the checkpoint name (`QTTS_CHECKPOINT`) and the CPU thread
# count (`QTTS_THREADS`). `check.begin` opens the chapter's **report**: from then on each `check.*` call compares
# one value with a threshold, prints `OK` or `NOT OK`, records a named row in
# `data/reports/<ckpt>/00_get_checkpoint.json`, and raises if it failed. A chapter that runs to its end has
# therefore passed every check; its last cell shows them as a table.

# %%
import torch

from qtts_lib import check, settings

ckpt = settings.checkpoint()  # QTTS_CHECKPOINT, default tiny-base
torch.set_num_threads(settings.threads())
report = check.begin("00_get_checkpoint", ckpt)
print(f"checkpoint: {ckpt}   threads: {settings.threads()}   torch {torch.__version__}")

# %% [markdown]
# ## 1. Choose a checkpoint
# The Hugging Face hub is out of reach from these machines, so the real weights cannot be downloaded.
# The tutorial therefore runs on checkpoints **of the real architecture with random weights**:
#
# | name | what | used for |
# |---|---|---|
# | `tiny-base` (default), `tiny-customvoice`, `tiny-1.7b-*`, `tiny-voicedesign` | real keys and ids, small | CI |
# | `full-base`, `full-customvoice`, `full-1.7b-*` | the real dimensions | honest memory and speed numbers |
# | a real checkpoint directory under `models/` | e.g. `models/Qwen3-TTS-12Hz-0.6B-Base` | real speech |
#
# (Base, CustomVoice and VoiceDesign are the checkpoint kinds: clone a voice clip, speak as one of nine built-in
# speakers, or speak in a voice described in words. Chapter 09 ports the other kinds; the first chapters run Base.)
# Random weights make noise, so every proof in this tutorial is **parity**: the port's output against the
# original's, as equal tokens, or as a signal-to-noise ratio (SNR, the reference's power over the difference's, in
# dB) or a cosine similarity above a bar; never "it sounds right". A name outside this list is refused with the
# list of valid ones. The cell sets the variable to a made-up name, asks again, and puts the real name back:

# %%
import os

os.environ["QTTS_CHECKPOINT"], saved = "qwen3-tts-large", ckpt
try:
    settings.checkpoint()
except settings.UnknownCheckpoint as e:
    refusal = str(e)
    print(refusal)
finally:
    os.environ["QTTS_CHECKPOINT"] = saved
check.equal("unknown checkpoint refused with the valid names", "names tiny-base",
            "tiny-base" in refusal, True)

# %% [markdown]
# ## 2. Synthesize (or find) the checkpoint
# Qwen3-TTS makes speech in **frames**, 12.5 a second; a frame is 16 **codes**, each an index into one of 16
# **codebooks** (tables of 2048 learned vectors). A checkpoint holds the weights of the parts that make and use
# them, each drawn in chapter 01: the **talker**, a decoder-only transformer that predicts codebook 0 of each frame;
# the **code predictor**, a small decoder that predicts codebooks 1..15; the **codec**, whose decoder turns codes
# into a 24 kHz waveform and whose encoder, **Mimi**, turns a voice clip into codes by **RVQ** (residual vector
# quantization: each codebook in a chain codes what the ones before it left over); and, in the Base kind that
# clones a voice clip, the **speaker encoder**, which turns the clip into one vector for the speaker.
#
# `checkpoint.ensure` returns a real directory untouched. For our own names it builds the model classes of
# `qwen-tts` from the real config (shrunk for `tiny-*`) under a fixed seed, writes every file the loader
# reads, and records a **manifest** (a JSON file of the seed and each file's sha256); a directory made by an
# older version of the library's recipe is rebuilt.
# Two fixes make random weights exercise every path: random RVQ codebooks (init leaves them at zero, so the
# codec decoder would ignore codes and the Mimi encoder emit zeros), and a wider init of the tiny codec decoder
# (at the default 0.02 it outputs near-silence). The listing leaves out `ncnn/`, where chapter 04 and later
# put the converted graphs; `speech_tokenizer/` is what `qwen-tts` calls the codec.

# %%
import time

from qtts_lib import checkpoint

t0 = time.perf_counter()
model_dir = checkpoint.ensure(ckpt)
print(f"{model_dir}  ({time.perf_counter() - t0:.1f} s)")
files = [p for p in model_dir.rglob("*") if p.is_file() and "ncnn" not in p.parts]
for f in sorted(files):
    print(f"  {f.relative_to(model_dir)!s:45} {f.stat().st_size / 2**20:9.2f} MiB")

# %% [markdown]
# A synthesized checkpoint is a pure function of its seed: building it again gives the same bytes. That matters
# because every reference output saved later is tied to the checkpoint's fingerprint; a rebuild that changed a
# byte would make them stale. The check rebuilds the tiny checkpoint into a temporary directory and compares the
# weights file's sha256 with the manifest's:

# %%
import json
import tempfile
from pathlib import Path

from qtts_lib import artifacts

if checkpoint.is_synthetic(ckpt) and ckpt.startswith("tiny"):
    manifest = json.loads((model_dir / checkpoint.MANIFEST).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        again = checkpoint.build_random(ckpt, manifest["seed"], out=Path(tmp) / ckpt)
        sha = artifacts.sha256(again / "model.safetensors")
    same = sha == manifest["model.safetensors"]
    check.equal("re-synthesis is byte-identical", "sha256 equal", same, True)
else:
    why = "full size (4 GB)" if checkpoint.is_synthetic(ckpt) else "a real checkpoint"
    print(f"skipped the rebuild check because {ckpt} is {why}")

# %% [markdown]
# ## 3. Read the numbers that matter from config.json
# Every dimension and id in this tutorial comes from the checkpoint's own `config.json`; chapter 01 shows
# why the Python class defaults cannot be trusted. The cell prints the talker's depth and width and its
# attention heads as query/key-value (fewer key-value heads than query heads: chapter 02 explains), and its
# **codec vocabulary**: the 2048 codes of codebook 0 followed by control ids. Among those are `pad`, `bos`
# (begin of speech), `eos` (end of speech) and one id per language. Then the code predictor's 15 embedding
# tables and output heads, one per codebook 1..15, and the text path: a token id is embedded at the text width
# and projected to the talker's width.

# %%
cfg = checkpoint.load_config(ckpt)
talker, pred = cfg["talker_config"], cfg["talker_config"]["code_predictor_config"]
print(f"model type: {cfg['tts_model_type']}")
heads = f"{talker['num_attention_heads']}/{talker['num_key_value_heads']}"  # query/kv
print(f"talker:    {talker['num_hidden_layers']} layers, "
      f"hidden {talker['hidden_size']}, heads {heads}, head_dim {talker['head_dim']}, "
      f"codec vocab {talker['vocab_size']}")
print(f"predictor: {pred['num_hidden_layers']} layers, hidden {pred['hidden_size']}, "
      f"{talker['num_code_groups'] - 1} tables and heads of {pred['vocab_size']}")
print(f"text:      vocab {talker['text_vocab_size']} -> {talker['text_hidden_size']} "
      f"-> {talker['hidden_size']}")
print(f"codec ids: pad {talker['codec_pad_id']}, bos {talker['codec_bos_id']}, "
      f"eos {talker['codec_eos_token_id']}; "
      f"languages {sorted(talker['codec_language_id'])}")

# %% [markdown]
# ## 4. Load it with the original loader, offline
# `qwen_tts/__init__` imports the 25 Hz speech tokenizer, which pulls `torchaudio`, `sox`, `onnxruntime`
# and `einops`; the 12 Hz model needs none of them. `reference.import_qwen_tts` registers a placeholder
# module under the 25 Hz name first, so the real package imports with only what the 12 Hz path uses.
# `reference.load` does that, then calls the package's own `from_pretrained` on the directory. It returns the
# package's wrapper object; `tts.model` is the `torch.nn.Module` that holds the talker, the code predictor, the
# speaker encoder and the codec (`speech_tokenizer`). The check compares the loaded layers with the config:

# %%
from qtts_lib import reference

os.environ["HF_HUB_OFFLINE"] = "1"
t0 = time.perf_counter()
tts = reference.load(model_dir, threads=settings.threads())
seconds = time.perf_counter() - t0
print(f"loaded {type(tts).__name__} in {seconds:.1f} s with HF_HUB_OFFLINE=1")
n_params = sum(p.numel() for p in tts.model.parameters())
n_codec = sum(p.numel() for p in tts.model.speech_tokenizer.model.parameters())
print(f"parameters: model {n_params / 1e6:.1f} M, "
      f"speech tokenizer {n_codec / 1e6:.1f} M")
check.equal("talker layers loaded = config", "layers",
            len(tts.model.talker.model.layers), talker["num_hidden_layers"])

# %% [markdown]
# ## 5. The voice clip
# `data/inputs/voice.wav` is espeak-ng speech resampled by sox to **24 kHz mono** (`python -m qtts_lib.inputs`
# remakes it). The reference model asserts 24 kHz, and a resampler is one more thing a port would have to
# reproduce bit for bit, so we keep inputs native. A wav at another rate or with two channels is converted
# with a printed note, never silently. The cell writes one second of stereo audio at 22.05 kHz to a temporary
# file: `load_wav` must give back one second of mono at 24 kHz (24000 samples), and `strict=True` must refuse it:

# %%
import numpy as np
import soundfile as sf
from IPython.display import Audio, display

from qtts_lib import paths
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, load_wav
from qtts_lib.runtime.errors import AudioError

voice_wav = load_wav(paths.voice_wav())
seconds = len(voice_wav) / SAMPLE_RATE
print(f"voice.wav: {len(voice_wav)} samples = {seconds:.2f} s at 24 kHz")
with tempfile.TemporaryDirectory() as tmp:
    odd = f"{tmp}/stereo_22k.wav"
    sf.write(odd, np.stack([voice_wav[::2], voice_wav[::2]], axis=1)[:22050], 22050)
    converted = load_wav(odd)
    try:
        load_wav(odd, strict=True)
    except AudioError as e:
        print("strict:", e)
check.equal("22.05 kHz stereo converted to 24 kHz mono", "samples",
            len(converted), 24000)
display(Audio(voice_wav, rate=SAMPLE_RATE))

# %% [markdown]
# ## 6. Run the original once
# Clone the voice clip in **x-vector mode**: the speaker encoder turns the clip into the **x-vector**, the one
# vector through which the voice enters the model (chapter 08 shows the other mode, which also gives the model the
# clip's own codes). Decoding is **greedy** (always the most likely code), on CPU in fp32.
# `reference.default_voice` picks the voice argument of the checkpoint's kind: the clip for Base, the first
# built-in speaker for CustomVoice, a description for VoiceDesign (chapter 09). `reference.capture_generation`
# runs the package's generate call and returns a dict: `codes` (frames × 16), `wav`, and what went in.
# The talker's outputs are called **tokens**; `max_new_tokens=N` caps them at N and yields N-1 frames: the last
# codebook-0 token never gets its other 15 codes. Each frame decodes to 24000 / 12.5 = 1920 samples:

# %%
from qtts_lib.runtime.audio.wav import SAMPLES_PER_FRAME

TEXT = "Hello from ncnn. Every token of this sentence is checked against PyTorch."
MAX_NEW_TOKENS = 45
t0 = time.perf_counter()
voice = reference.default_voice(tts, voice_wav)
run = reference.capture_generation(tts, TEXT, "english",
                                   max_new_tokens=MAX_NEW_TOKENS, **voice)
seconds = time.perf_counter() - t0
wav = run["wav"]
print(f"{run['codes'].shape[0]} frames -> {len(wav)} samples "
      f"({len(wav) / SAMPLE_RATE:.2f} s of audio) in {seconds:.1f} s")
check.equal("frames = max_new_tokens - 1", "frames",
            int(run["codes"].shape[0]), MAX_NEW_TOKENS - 1)
check.at_least("baseline is not silent", "rms", float(np.sqrt(np.mean(wav**2))), 1e-3)
check.equal("1920 samples per frame", "samples/frame",
            len(wav) // run["codes"].shape[0], SAMPLES_PER_FRAME)

# %% [markdown]
# Listen to it, and look at it beside the voice clip (random weights: expect noise, not speech):

# %%
from qtts_lib import plots

display(Audio(wav, rate=SAMPLE_RATE))
plots.waveform({"voice clip": voice_wav, f"original model ({ckpt})": wav});

# %% [markdown]
# ## 7. Keep the baseline
# The baseline wav gets a manifest entry (producer, inputs, sha256, versions, threads, checkpoint
# fingerprint); chapter 03 turns this run into full golden references.

# %%
from qtts_lib.runtime.audio.wav import save_wav

out = save_wav(paths.outputs_dir(ckpt) / "00_baseline.wav", wav)
inputs = {"text": TEXT, "language": "english", "max_new_tokens": MAX_NEW_TOKENS,
          "ref_wav_sha256": artifacts.sha256(paths.voice_wav())}
entry = artifacts.record(out, "00_get_checkpoint", ckpt, inputs=inputs,
                         threads=settings.threads(),
                         mode=f"{voice.get('speaker', 'x-vector')} greedy")
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

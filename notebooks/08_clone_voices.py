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
# # 08 · Clone a voice on ncnn
# > A voice clip enters the prompt twice: as an x-vector (one vector for the speaker), and as its own codes.
#
# An **x-vector** is one fixed-length vector describing a speaker: the speaker encoder (an ECAPA-TDNN, dilated 1-D
# convolutions pooled over time) computes it from the clip's log-mel spectrogram. **ICL** (in-context learning) puts
# the clip itself in the prompt, as its codec codes beside its transcript, so the model continues in that voice.
#
# **You will:** write the speaker encoder's mel frontend in numpy and hold it to the reference's; check a voice clip
# before using it; compute the x-vector with the exported speaker encoder; encode the clip's codes with the Mimi
# encoder (Kyutai's neural audio codec, the speech tokenizer's encoder half) and a numpy split RVQ (residual vector
# quantizer); clone both ways, each compared with PyTorch.
#
# **You will learn:** the exact mel recipe (one wrong constant costs you the cosine); what makes a clip unusable;
# how the split RVQ works; how the ICL prompt lines up transcript and codes; why the clip's share of the decoded
# audio is cut by a ratio. The runtime's pieces: `audio.mel`, `audio.clips`, `audio.rvq`, `synth.voices`.
#
# **You need:** chapter 03's goldens (`xvec_greedy.npz`, `icl_greedy.npz`); graphs are exported here if missing.
# Sections 1-2 run on every checkpoint; cloning (3-5) needs Base, the only kind with a speaker encoder. **Leaves
# behind:** `data/outputs/<ckpt>/08_*.wav`, `data/reports/<ckpt>/08_clone_voices.json`.

# %%
import numpy as np

from qtts_lib import check, paths, settings
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, load_wav

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("08_clone_voices", ckpt)
voice_wav = load_wav(paths.voice_wav())
voice_text = (paths.INPUTS / "voice.txt").read_text().strip()
print(f"{ckpt}; voice clip {len(voice_wav) / SAMPLE_RATE:.2f} s: {voice_text!r}")

# %% [markdown]
# ## 1. Write the mel frontend in numpy
# The speaker encoder reads a log-mel spectrogram: the short-time spectrum of the wav folded onto 128 bands spaced the
# way pitch is heard. The reference's `modeling_qwen3_tts.mel_spectrogram` uses `torch.stft` and librosa's filter bank
# (`extract_speaker_embedding` passes n_fft 1024, hop 256, 128 mels up to 12 kHz); the runtime has neither, so we write
# it in numpy, one step a cell. First the frames: reflect-pad by (n_fft − hop)/2 samples a side (edge not repeated),
# then (`center=False`) a frame every `HOP` samples, `N_FFT` long, times a *periodic* Hann window (over N, not N − 1):

# %%
N_FFT, HOP, N_MELS, FMAX = 1024, 256, 128, 12000.0  # extract_speaker_embedding passes

def frames_of(w: np.ndarray) -> np.ndarray:
    """(frames, N_FFT) windowed frames of a mono wav (n,)."""
    pad = (N_FFT - HOP) // 2  # 384
    padded = np.pad(np.asarray(w, np.float32), pad, mode="reflect")
    view = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP]
    hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    return view * hann.astype(np.float32)

# %% [markdown]
# Then the magnitude of each frame's spectrum. A real signal's FFT is symmetric, so the one-sided `rfft` keeps bins
# 0 to N_FFT/2 (513). The reference adds 1e-9 under the square root (a finite gradient at zero), so we do too:

# %%
def magnitude_of(frames: np.ndarray) -> np.ndarray:
    """(frames, 513) |rfft| of each frame."""
    spec = np.fft.rfft(frames, axis=-1)
    return np.sqrt(spec.real**2 + spec.imag**2 + 1e-9).astype(np.float32)

# %% [markdown]
# The filter bank is where a wrong constant hides. librosa's default (`htk=False`) is the **Slaney** mel scale:
# linear below 1 kHz (200/3 Hz per mel), logarithmic above (a factor 6.4 every 27 mels); HTK's 2595·log10(1 + f/700)
# is close but not equal. 130 edges evenly spaced in mel from 0 to 12 kHz make 128 triangles over the FFT bins,
# each rising from edge i to 1 at edge i+1 and back to 0 at edge i+2, scaled by 2/(width in Hz) (Slaney's
# normalization: every filter has the same area):

# %%
def hz_to_mel(f: float) -> float:
    log_part = 15 + np.log(np.maximum(f, 1e-9) / 1000) / (np.log(6.4) / 27)
    return np.where(f < 1000, f / (200 / 3), log_part)

def mel_to_hz(m: np.ndarray) -> np.ndarray:
    return np.where(m < 15, m * 200 / 3, 1000 * np.exp((m - 15) * np.log(6.4) / 27))

def mel_filterbank(sr: int = SAMPLE_RATE) -> np.ndarray:
    """(N_MELS, N_FFT // 2 + 1) Slaney-scale, Slaney-normalized triangles, 0 to FMAX."""
    bins = np.arange(N_FFT // 2 + 1) * sr / N_FFT  # Hz of each FFT bin
    f = mel_to_hz(np.linspace(hz_to_mel(0.0), hz_to_mel(FMAX), N_MELS + 2))
    lo, mid, hi = f[:-2, None], f[1:-1, None], f[2:, None]
    tri = np.maximum(0, np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)))
    return (tri * 2 / (hi - lo)).astype(np.float32)

# %% [markdown]
# We hold the bank to the reference's (`librosa.filters.mel`, imported in its module as `librosa_mel_fn`) and the
# runtime's. Then the last step: project onto the bands and compress with `log(max(x, 1e-5))`, the floor keeping
# silence finite. The output is (frames, 128), the reference's (1, 128, frames) transposed, as the encoder takes it:

# %%
from qtts_lib import reference
from qtts_lib.runtime.audio import mel

reference.import_qwen_tts()  # first: it shields qwen_tts from imports it does not need
from qwen_tts.core.models import modeling_qwen3_tts as qm

bank = mel_filterbank()  # (128, 513)
ref_bank = qm.librosa_mel_fn(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=N_MELS, fmin=0,
                             fmax=FMAX)
check.close("filter bank (these cells) = reference's librosa_mel_fn", bank, ref_bank,
            rel=1e-6)
check.close("filter bank (these cells) = runtime.audio.mel", bank,
            mel.mel_filterbank(), rel=1e-6)

def log_mel(w: np.ndarray) -> np.ndarray:
    """(frames, N_MELS) log-mel of a 24 kHz mono wav: the speaker encoder's input."""
    bands = magnitude_of(frames_of(w)) @ bank.T  # (frames, 513) @ (513, 128)
    return np.log(np.maximum(bands, 1e-5)).astype(np.float32)

# %% [markdown]
# The whole frontend against the reference's `mel_spectrogram` (torch, with the arguments `extract_speaker_embedding`
# passes: `modules.speaker.MEL_ARGS`) and the runtime's `audio.mel`, on the voice clip, noise and a chirp (lengths not
# a multiple of the hop); then the runtime's against the reference's directly, also by cosine, the x-vector's metric:

# %%
import torch

from qtts_lib.modules.speaker import MEL_ARGS


def reference_mel(w: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return qm.mel_spectrogram(torch.from_numpy(w)[None], **MEL_ARGS)[0].T.numpy()

rng = np.random.default_rng(7)
noise = (0.1 * rng.standard_normal(37_123)).astype(np.float32)
t = np.arange(50_001) / SAMPLE_RATE
chirp = 0.5 * np.sin(2 * np.pi * (100 + 5000 * t) * t)
chirp += 1e-3 * rng.standard_normal(len(t))
wavs = {"voice.wav": voice_wav, "noise, 37123 samples": noise,
        "chirp + faint noise, 50001 samples": chirp.astype(np.float32)}
for name, w in wavs.items():
    ours, ref, runtime = log_mel(w), reference_mel(w), mel.mel_spectrogram(w)
    check.close(f"log_mel (these cells), {name} = reference", ours, ref, rel=1e-5)
    check.close(f"log_mel (these cells), {name} = runtime.audio.mel", ours, runtime,
                rel=1e-5)
    check.cos(f"mel {name}: cosine", runtime, ref, 0.9999999)
    check.close(f"mel {name}: relative error", runtime, ref, rel=1e-5)

# %% [markdown]
# What the speaker encoder sees of the clip, and every eighth filter of the bank:

# %%
import matplotlib.pyplot as plt

fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
m = log_mel(voice_wav)
axes[0].imshow(m.T, origin="lower", aspect="auto", cmap="magma")
axes[0].set_title(f"log-mel of voice.wav, {m.shape[0]} frames x {N_MELS}")
axes[1].plot(bank[::8].T, lw=0.8)
axes[1].set(title="every 8th Slaney filter", xlabel="FFT bin");

# %% [markdown]
# ## 2. Check the voice clip before using it
# A clip a person brings can be broken. `audio.clips.prepare_voice_clip` runs before a voice is built: hard problems
# (NaN or infinite samples, too short, silent) raise `AudioError` (CLI exit status 2); soft ones (clipped) come back
# as warnings; a clip over the maximum is cut at the quietest short window of its last seconds, with a note, but is
# refused with a transcript (ICL: cut, it would say less than it). The thresholds, then seven test clips:

# %%
import pandas as pd
from IPython.display import display

from qtts_lib.runtime import AudioError
from qtts_lib.runtime.audio import clips

print(f"refused: NaN/Inf, shorter than {clips.MIN_VOICE_SECONDS:g} s, RMS below "
      f"{clips.dbfs(clips.SILENCE_RMS):.0f} dBFS\nwarned: more than "
      f"{clips.CLIP_FRACTION:.1%} of samples at |x| >= {clips.CLIP_LEVEL}\ncut: longer "
      f"than {clips.MAX_VOICE_SECONDS:g} s, at the quietest "
      f"{clips.TRIM_WINDOW_SECONDS:g} s of the last {clips.TRIM_SEARCH_SECONDS:g} s")
rng = np.random.default_rng(0)
nan_clip = voice_wav.copy()
nan_clip[1000:1010] = np.nan
long_clip = np.tile(voice_wav, 4)  # 22.7 s: the same sentence four times
silence = 1e-4 * rng.standard_normal(3 * SAMPLE_RATE).astype(np.float32)
brought = {  # name: (clip, transcript, the outcome it should get)
    "voice.wav": (voice_wav, None, "used as is"),
    "NaN samples": (nan_clip, None, "error"),
    "0.3 s": (voice_wav[: int(0.3 * SAMPLE_RATE)], None, "error"),
    "silence": (silence, None, "error"),
    "clipped (x4)": (np.clip(voice_wav * 4, -1, 1), None, "warning"),
    "22.7 s": (long_clip, None, "note"),
    "22.7 s with a transcript": (long_clip, "Good morning.", "error")}

# %% [markdown]
# Each clip's outcome (first word of each message, or "error") against the expected. Last, the long clip's cut: the
# RMS (root mean square, the loudness) of the 1200 samples around it must be a tenth of the whole clip's or less:

# %%
def outcome_of(wav: np.ndarray, transcript: str | None) -> dict:
    try:
        kept, said = clips.prepare_voice_clip(wav, transcript)
    except AudioError as e:
        return {"outcome": "error", "kept (s)": 0.0, "message": str(e)}
    return {"outcome": "; ".join(m.split(":")[0] for m in said) or "used as is",
            "kept (s)": round(len(kept) / SAMPLE_RATE, 2), "message": " ".join(said)}

outcome = pd.DataFrame({name: outcome_of(w, text)
                        for name, (w, text, _) in brought.items()}).T
with pd.option_context("display.max_colwidth", 200):
    display(outcome)
for name, (*_, want) in brought.items():
    check.equal(f"voice clip '{name}'", "outcome", outcome.outcome[name], want)
check.at_most("the long clip is trimmed to at most 15 s", "seconds kept",
              outcome["kept (s)"]["22.7 s"], clips.MAX_VOICE_SECONDS)
cut = int(outcome["kept (s)"]["22.7 s"] * SAMPLE_RATE)
rms = lambda x: float(np.sqrt(np.mean(x**2)))
check.at_most("it is cut where it is quiet (RMS around the cut / RMS of the clip)",
              "ratio", rms(long_clip[cut - 600: cut + 600]) / rms(long_clip), 0.1)

# %% [markdown]
# ## 3. Clone with the x-vector
# Cloning needs the speaker encoder, which only a Base checkpoint has. CustomVoice (built-in speakers) and
# VoiceDesign (voices described in words), chapter 09, have none: on them the report gets one skip row per cloning
# step and the cells below do nothing (`if base`). On Base this loads the reference and the runtime (exporting):

# %%
from qtts_lib import artifacts, checkpoint, export, inputs
from qtts_lib.runtime.pipeline.config import ModelConfig
from qtts_lib.runtime.pipeline.sampling import Sampler, Sampling
from qtts_lib.runtime.pipeline.synthesizer import Result, Synthesizer

model_dir = checkpoint.ensure(ckpt)
config = ModelConfig.load(model_dir)
kind, base = config.kind, config.kind == "base"  # base | custom_voice | voice_design
has_encoder = "speaker_encoder_config" in config.config
print(f"{ckpt}: {kind}, speaker encoder: {has_encoder}")
steps = ["x-vector clone", "voice codes (Mimi encoder)", "qtts say --voice"]
for step in [] if base else steps:
    check.equal(f"{step}: skipped because a {kind} checkpoint has no speaker encoder",
                "speaker_encoder_config", has_encoder, False)
if base:
    torch.set_num_threads(THREADS)
    tts = reference.load(model_dir, threads=THREADS)
    export.ensure(tts, ckpt)
    synth = Synthesizer(model_dir, threads=THREADS)

# %% [markdown]
# The x-vector is one row of the codec track (between the language tag and `codec_pad`). The runtime computes it
# with the numpy mel and the ncnn speaker encoder (`synth.voices.xvector`). `synth.voice(wav=...)` wraps it in a
# `Voice` (who speaks: `speaker_row`, plus `codes` and `text` for ICL). `greedy_run` runs 07's `Loop` greedy for
# `max_new_tokens - 1` frames (07: the last token gets no frame); it must give chapter 03's golden, which the
# cell first makes sure was made from this same wav (its manifest records the wav's sha256):

# %%
FRAMES = inputs.GOLDEN_MAX_NEW_TOKENS - 1  # the goldens' 45 new tokens are 44 frames
golden_dir = paths.golden_dir(ckpt)

def greedy_run(s: Synthesizer, prompt, frames: int) -> Result:
    sampler = Sampler(Sampling(greedy=True), s.config.talker)
    return Result.of(s.loop.run(prompt, sampler, frames), s.config.groups)

if base:
    xvector = synth.voices.xvector(voice_wav)
    with torch.inference_mode():
        xv_torch = tts.model.extract_speaker_embedding(voice_wav, SAMPLE_RATE).numpy()
    check.cos("x-vector: ncnn (numpy mel) vs torch", xvector, xv_torch, 0.99999)
    xvec_golden, entry = artifacts.load_npz(golden_dir / "xvec_greedy.npz", ckpt)
    made_from = f"voice.wav sha256 {artifacts.sha256(paths.voice_wav())[:16]}"
    if entry["inputs"]["voice"] != made_from:
        raise artifacts.StaleArtifact("golden: another voice.wav; re-run chapter 03")
    voice = synth.voice(wav=voice_wav)
    check.equal("voice from the clip: its speaker row = the x-vector above",
                "bitwise equal", bool(np.array_equal(voice.speaker_row, xvector)), True)
    prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice)
    check.tokens_equal("x-vector clone: all codes = golden",
                       greedy_run(synth, prompt, FRAMES).codes, xvec_golden["codes"])

# %% [markdown]
# ## 4. Clone in context (ICL): voice codes from the Mimi encoder
# ICL puts the reference *speech* into the prompt as codes. Mimi's quantizer is **split**: a semantic chain (1 level)
# and an acoustic residual chain from the same latent, each through its own 1×1 input projection; the model keeps 16
# codes per frame (1 + 15). Each level picks the nearest row of its codebook and hands the remainder on. The argmin
# search is a few small matrix products, so it stays on the host
# (`runtime.audio.rvq`, its chain printed first); `synth.voices.codes` runs the Mimi graph, then this. Against the
# reference's speech tokenizer, on the clip cut to whole frames and on its first 40 frames:

# %%
import inspect

from qtts_lib.runtime.audio import rvq
from qtts_lib.runtime.audio.wav import SAMPLES_PER_FRAME

print(inspect.getsource(rvq.residual_chain))

def torch_codes(w: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        codes = tts.model.speech_tokenizer.encode(w, sr=SAMPLE_RATE).audio_codes
    return codes[0].numpy()  # (T, 16)

for frames in (len(voice_wav) // SAMPLES_PER_FRAME, 40) if base else []:
    w = voice_wav[: frames * SAMPLES_PER_FRAME]
    check.tokens_equal(f"voice codes, {frames} frames: ncnn Mimi + numpy RVQ = torch",
                       synth.voices.codes(w), torch_codes(w))

# %% [markdown]
# A fixed graph takes whole frames, so the runtime zero-pads a wav up front; the reference instead pads inside every
# strided convolution. For a wav that is *not* a multiple of 1920 samples the two differ, and only in the last frame:

# %%
if base:
    odd = voice_wav[: 40 * SAMPLES_PER_FRAME - 700]
    ours_c, ref_c = synth.voices.codes(odd), torch_codes(odd)
    per_frame = (ours_c != ref_c).sum(1)
    print(f"{len(odd)} samples -> {len(ref_c)} frames; differing codes per frame: "
          f"last frame {per_frame[-1]}/16, all other frames {per_frame[:-1].sum()}")
    check.equal("unpadded wav: every frame but the last agrees",
                "codes differing before the last frame", int(per_frame[:-1].sum()), 0)

# %% [markdown]
# Chapter 07 drew the ICL prompt: after the x-vector's rows, the voice transcript, the text and `tts_eos` on the
# text track beside `codec_bos` and one row per clip frame on the codec track. The runtime makes the whole voice
# from the clip (`synth.voice(wav=..., text=...)`) and speaks with it. To decode, the reference puts the clip's
# codes in front of the new ones (context for the codec), then drops the first clip/all-frames share of the samples,
# rounded down, so the cut need not fall between frames; `codec.decode_with_voice` does the same:

# %%
from IPython.display import Audio

from qtts_lib.runtime.audio.wav import save_wav

if base:
    gold, _ = artifacts.load_npz(golden_dir / "icl_greedy.npz", ckpt)
    voice_codes = synth.voices.codes(voice_wav)
    check.tokens_equal("ICL voice codes = golden's", voice_codes, gold["voice_codes"])
    icl_voice = synth.voice(wav=voice_wav, text=voice_text)  # x-vector, codes, text
    check.tokens_equal("ICL voice: its codes = the codes above", icl_voice.codes,
                       voice_codes)
    prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, icl_voice)
    print(f"ICL prompt {prompt.embeds.shape}, trailing {prompt.trailing.shape}")
    check.close("ICL prompt embeddings = reference", prompt.embeds,
                gold["inputs_embeds"], rel=1e-5)
    icl = greedy_run(synth, prompt, FRAMES)
    check.tokens_equal("ICL clone: all codes = golden", icl.codes, gold["codes"])
    icl_wav = synth.codec.decode_with_voice(icl.codes, voice_codes)
    check.snr("ICL waveform (voice clip's part cut by frame ratio) vs golden", icl_wav,
              gold["wav"], 60.0)
    save_wav(paths.outputs_dir(ckpt) / "08_icl.wav", icl_wav)
    display(Audio(icl_wav, rate=SAMPLE_RATE))

# %% [markdown]
# ## 5. From the command line
# Both clones with torch blocked (`--greedy`: `qtts say` samples by default; `--voice-text` makes it ICL), then a
# clip too short to use, refused with exit status 2:

# %%
from qtts_lib.isolation import qtts_without_torch

out = paths.outputs_dir(ckpt)
say = ("say", "--checkpoint", str(model_dir), "--language", inputs.LANGUAGE, "--greedy",
       "--max-frames", "12", "--threads", str(THREADS))
runs = {"xvector": ["--voice", str(paths.voice_wav())]}
runs["icl"] = runs["xvector"] + ["--voice-text", voice_text]
for label, args in runs.items() if base else []:
    r = qtts_without_torch(*say, *args, "--text", inputs.TARGET_TEXT,
                           "-o", str(out / f"08_cli_{label}.wav"))
    print(r.stdout.strip() or r.stderr[-400:])
    check.equal(f"qtts say ({label}) with torch blocked", "exit status", r.returncode,
                0)
if base:
    save_wav(out / "08_short_clip.wav", voice_wav[:2400])
    r = qtts_without_torch(*say, "--voice", str(out / "08_short_clip.wav"),
                           "--text", "Hello.", "-o", str(out / "08_refused.wav"))
    print(r.stderr.strip())
    check.equal("a 0.1 s voice clip in the CLI", "exit status", r.returncode, 2)

# %% [markdown]
# ## Summary
# - The numpy mel frontend (frames, periodic Hann window, rFFT magnitude, Slaney filter bank, log) reproduces the
#   reference's `mel_spectrogram` and the runtime's `audio.mel`.
# - A clip with NaN/Inf, too short or silent is refused (exit 2), a clipped one warned about, a long one cut quietly.
# - The x-vector (numpy mel + ncnn speaker encoder) matches torch, and the x-vector clone the golden codes.
# - Mimi graph + numpy split RVQ give the voice codes exactly on whole frames; ICL prompt, codes, waveform match.
#
# **Artifacts left:** `data/outputs/<ckpt>/08_*.wav` (on Base), the chapter report.
#
# **If your numbers differ**
# - *Mel far from the reference* → a mel constant: padding, window periodicity, magnitude epsilon, Slaney vs HTK.
# - *A clip's outcome changed* → a threshold in `audio.clips` moved; section 2 prints them.
# - *Voice codes differ only in the last frame* → the wav is not a multiple of 1920 samples (section 4).
# - *ICL codes diverge at once* → transcript tokenized with its role/`<|im_end|>` tokens, or no codebook 0 row.
# - *ICL waveform off by a few samples* → the clip's part cut at whole frames, not at the reference's ratio.

# %%
check.table()

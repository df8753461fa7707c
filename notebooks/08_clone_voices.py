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
# > A voice clip enters the prompt twice: as an x-vector, and (in context) as its own codes beside its transcript.
#
# **You will:** compute the speaker x-vector from a wav with a numpy mel frontend and the exported ECAPA (speaker
# embedding) encoder; encode the clip's codes with the exported Mimi encoder and a numpy split RVQ (residual vector
# quantizer); clone the voice both ways with chapter 07's loop, each compared with the PyTorch reference.
#
# **You will learn:** the exact mel recipe (where one wrong constant costs you the cosine); how the split RVQ works;
# how the ICL prompt lines up voice transcript and voice codes; why the clip's part of the audio is cut by frame
# ratio. The runtime's pieces: `audio.mel`, `audio.rvq`, the voice encoders `pipeline.voices.VoiceEncoder`
# (`synth.voices`), the prompt `pipeline.prompt` (`synth.prompt`).
#
# **You need:** chapter 03's goldens on `<ckpt>` (`xvec_greedy.npz`, `icl_greedy.npz`); the ncnn graphs are
# exported here if missing. (A checkpoint without a speaker encoder, chapter 09, records why each cloning step is
# skipped.)
# **Leaves behind:** `data/outputs/<ckpt>/07_*.wav`, `data/reports/<ckpt>/08_clone_voices.json`.

# %%
import inspect

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Audio, display

from qtts_lib import artifacts, check, checkpoint, export, inputs, paths, reference, settings
from qtts_lib.isolation import qtts_without_torch
from qtts_lib.modules.speaker import MEL_ARGS
from qtts_lib.runtime.audio import mel, rvq
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav, save_wav
from qtts_lib.runtime.pipeline.sampling import Sampler, Sampling
from qtts_lib.runtime.pipeline.synthesizer import Result, Synthesizer

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("08_clone_voices", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)
synth = Synthesizer(model_dir, threads=THREADS)
kind = synth.kind  # base | custom_voice | voice_design, from the config's tts_model_type
base = kind == "base"
voice_wav = load_wav(paths.voice_wav())
voice_text = (paths.INPUTS / "voice.txt").read_text().strip()
print(f"{ckpt} ({kind}); voice clip {len(voice_wav) / SAMPLE_RATE:.2f} s: {voice_text!r}")


def skipped(step: str) -> None:
    """The report row of a cloning step this checkpoint cannot take, with its reason checked: no speaker encoder."""
    check.equal(f"{step}: skipped because a {kind} checkpoint has no speaker encoder", "speaker_encoder_config",
                "speaker_encoder_config" in synth.config.config, False)


FRAMES = inputs.GOLDEN_MAX_NEW_TOKENS - 1  # the goldens' 45 new tokens are 44 frames (chapter 07)


def greedy_run(s: Synthesizer, prompt, frames: int) -> Result:
    """Chapter 07's loop to its end, greedy like the goldens; `frames` = the reference's max_new_tokens - 1."""
    return Result.of(s.loop.run(prompt, Sampler(Sampling(greedy=True), s.config.talker), frames), s.config.groups)

# %% [markdown]
# ## 1. The mel frontend, in numpy
# The speaker encoder reads a log-mel spectrogram. The reference computes it with `torch.stft` and librosa's filter
# bank; the runtime has neither, so `runtime.audio.mel` writes the recipe out — every constant matters:
#
# | step | value |
# |---|---|
# | reflect padding | (n_fft − hop)/2 = 384 samples each side, then `center=False` |
# | frames | n_fft 1024, hop 256, periodic Hann window of 1024 |
# | magnitude | √(re² + im² + 1e-9) of the one-sided FFT |
# | filter bank | 128 Slaney-scale triangles, 0–12 kHz, Slaney area normalization |
# | compression | log(max(x, 1e-5)) |

# %%
from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram as torch_mel


def reference_mel(w: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        # the arguments extract_speaker_embedding passes (modules.speaker.MEL_ARGS, built from runtime.mel's constants)
        return torch_mel(torch.from_numpy(w)[None], **MEL_ARGS)[0].T.numpy()


rng = np.random.default_rng(7)
chirp_t = np.arange(50_001) / SAMPLE_RATE
wavs = {
    "voice.wav": voice_wav,
    "noise, 37123 samples": (0.1 * rng.standard_normal(37_123)).astype(np.float32),
    "chirp + faint noise, 50001 samples": (0.5 * np.sin(2 * np.pi * (100 + 5000 * chirp_t) * chirp_t)
                                            + 1e-3 * rng.standard_normal(len(chirp_t))).astype(np.float32),
}
for name, w in wavs.items():
    ours, ref = mel.mel_spectrogram(w), reference_mel(w)
    check.cos(f"mel {name}: cosine", ours, ref, 0.9999999)
    check.close(f"mel {name}: relative error", ours, ref, rel=1e-5)

# %%
fig, axes = plt.subplots(1, 2, figsize=(11, 2.8))
m = mel.mel_spectrogram(voice_wav)
axes[0].imshow(m.T, origin="lower", aspect="auto", cmap="magma")
axes[0].set_title(f"log-mel of voice.wav (numpy), {m.shape[0]} frames x 128")
axes[1].plot(mel.mel_filterbank()[::8].T, lw=0.8)  # the runtime's defaults: 24 kHz, n_fft 1024, 128 mels
axes[1].set_title("every 8th Slaney filter")
axes[1].set_xlabel("FFT bin");

# %% [markdown]
# ## 2. Clone with the x-vector
# The x-vector is one row of the codec track (between the language tag and `codec_pad`). The runtime computes it from
# the wav with the numpy mel and the ncnn speaker encoder (`synth.voices.xvector`); the reference with torch. Then the
# whole generation runs from that x-vector, greedy, and must reproduce chapter 03's greedy golden, which was made from
# the same wav.

# %%
if base:
    xvector = synth.voices.xvector(voice_wav)
    with torch.inference_mode():
        xvector_torch = tts.model.extract_speaker_embedding(voice_wav, SAMPLE_RATE).numpy()
    check.cos("x-vector: ncnn (numpy mel) vs torch", xvector, xvector_torch, 0.99999)
    xvec_golden, entry = artifacts.load_npz(paths.golden_dir(ckpt) / "xvec_greedy.npz", ckpt)
    if entry["inputs"]["voice"] != f"voice.wav sha256 {artifacts.sha256(paths.voice_wav())[:16]}":
        raise artifacts.StaleArtifact("the golden was made from another voice.wav; re-run notebooks/03_make_golden.py")
    voice = synth.voice(wav=voice_wav)
    check.equal("voice from the clip: its speaker row = the x-vector above", "bitwise equal",
                bool(np.array_equal(voice.speaker_row, xvector)), True)
    result = greedy_run(synth, synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice), FRAMES)
    check.tokens_equal("x-vector clone: all codes = golden", result.codes, xvec_golden["codes"])
else:
    skipped("x-vector clone")

# %% [markdown]
# ## 3. Clone in context (ICL): voice codes from the Mimi encoder
# ICL puts the reference *speech* into the prompt as codes. Mimi's quantizer is **split**: a semantic chain (1 level)
# and an acoustic residual chain, both starting from the same latent, each through its own 1×1 input projection;
# the model keeps 16 codes per frame (1 + 15). The argmin search is a few small matrix products,
# so it stays on the host (`runtime.audio.rvq`); `synth.voices.codes` runs the Mimi graph and then this:

# %%
print(inspect.getsource(rvq.residual_chain))

# %%
def torch_codes(w: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return tts.model.speech_tokenizer.encode(w, sr=SAMPLE_RATE).audio_codes[0].numpy()


if base:
    for frames in (len(voice_wav) // SAMPLES_PER_FRAME, 40):
        w = voice_wav[: frames * SAMPLES_PER_FRAME]
        check.tokens_equal(f"voice codes, {frames} frames: ncnn Mimi + numpy RVQ = torch", synth.voices.codes(w),
                           torch_codes(w))
else:
    skipped("voice codes (Mimi encoder)")

# %% [markdown]
# A fixed graph takes whole frames, so the runtime zero-pads a wav up front; the reference instead pads inside every
# strided convolution. For a wav that is *not* a multiple of 1920 samples the two differ, and only in the last frame:

# %%
if base:
    odd = voice_wav[: 40 * SAMPLES_PER_FRAME - 700]
    ours_c, ref_c = synth.voices.codes(odd), torch_codes(odd)
    per_frame = (ours_c != ref_c).sum(1)
    print(f"{len(odd)} samples -> {len(ref_c)} frames; differing codes per frame: last frame {per_frame[-1]}/16, "
          f"all other frames {per_frame[:-1].sum()}")
    check.equal("unpadded wav: every frame but the last agrees", "codes differing before the last frame",
                int(per_frame[:-1].sum()), 0)

# %% [markdown]
# Chapter 07 drew the ICL prompt: after the x-vector's rows, the voice transcript, the text and `tts_eos` on the text
# track beside `codec_bos` and one row per frame of the clip on the codec track. Here the runtime makes the whole
# voice from the clip itself (`synth.voice(wav=..., text=...)`: its x-vector, its codes, its transcript) and speaks
# with it. The reference decodes the clip's codes in front of the new ones and cuts the clip's part off by the ratio
# of frames; `codec.decode_with_voice` does the same:

# %%
if base:
    icl_golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "icl_greedy.npz", ckpt)
    voice_codes = synth.voices.codes(voice_wav)
    check.tokens_equal("ICL voice codes = golden's", voice_codes, icl_golden["voice_codes"])
    icl_voice = synth.voice(wav=voice_wav, text=voice_text)  # x-vector + the clip's codes + its transcript
    check.tokens_equal("ICL voice: its codes = the codes above", icl_voice.codes, voice_codes)
    prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, icl_voice)
    print(f"ICL prompt {prompt.embeds.shape}, trailing {prompt.trailing.shape}")
    check.close("ICL prompt embeddings = reference", prompt.embeds, icl_golden["inputs_embeds"], rel=1e-5)
    icl = greedy_run(synth, prompt, FRAMES)
    check.tokens_equal("ICL clone: all codes = golden", icl.codes, icl_golden["codes"])
    icl_wav = synth.codec.decode_with_voice(icl.codes, voice_codes)
    check.snr("ICL waveform (voice clip's part cut by frame ratio) vs golden", icl_wav, icl_golden["wav"], 60.0)
    save_wav(paths.outputs_dir(ckpt) / "08_icl.wav", icl_wav)
    display(Audio(icl_wav, rate=SAMPLE_RATE))

# %% [markdown]
# ## 4. From the command line
# Both clones, in a process where torch cannot be imported (`--greedy`: `qtts say` samples by default; `--voice`
# gives the clip, `--voice-text` its transcript for ICL):

# %%
runs = {"xvector": ["--voice", str(paths.voice_wav())]}
runs["icl"] = runs["xvector"] + ["--voice-text", voice_text]
for label, args in runs.items() if base else []:
    out = paths.outputs_dir(ckpt) / f"08_cli_{label}.wav"
    r = qtts_without_torch("say", "--checkpoint", str(model_dir), *args, "--text", inputs.TARGET_TEXT, "--language",
                           inputs.LANGUAGE, "--greedy", "--max-frames", "12", "--threads", str(THREADS), "-o", str(out))
    print(r.stdout.strip() or r.stderr[-400:])
    check.equal(f"qtts say ({label}) with torch blocked", "exit status", r.returncode, 0)
if not base:
    skipped("qtts say --voice")

# %% [markdown]
# ## Summary
# - The numpy mel frontend reproduces the reference's (cos ≥ 0.9999999); with the ncnn speaker encoder the x-vector
#   matches torch and the x-vector clone reproduces the golden codes.
# - The Mimi graph + numpy split RVQ give the voice codes exactly on whole frames (only the last frame of an
#   unpadded wav can differ); the ICL prompt and generation match the golden, and the voice clip's part of the audio is
#   cut by frame ratio as the reference does.
# - Every comparison runs chapter 07's loop greedy (`Sampling(greedy=True)`) for the reference's `max_new_tokens - 1`
#   frames; `synth.voice(wav=..., text=...)` and `qtts say --voice ... --voice-text ...` are the same voices,
#   sampled by default.
#
# **Artifacts left:** `data/outputs/<ckpt>/07_*.wav`, the chapter report.
#
# **If your numbers differ**
# - *x-vector cosine ~0.99* → a mel constant (padding, window periodicity, magnitude epsilon, Slaney vs HTK).
# - *Voice codes differ only in the last frame* → the wav is not a multiple of 1920 samples (section 3).
# - *ICL codes diverge at once* → voice transcript tokenized without stripping its role/`<|im_end|>` tokens, or codec
#   rows summed without codebook 0.
# - *ICL codes right, the waveform off by a few samples* → the clip's part cut at whole frames of samples instead of
#   the reference's ratio (clip frames / all frames × samples).

# %%
check.table()

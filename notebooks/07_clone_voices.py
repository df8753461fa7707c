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
# # 07 · Clone a voice, use a built-in one, or describe one, all on ncnn
# > The voice enters the prompt in one of five ways; each is ported and checked token for token.
#
# **You will:** compute the speaker x-vector from a wav with a numpy mel frontend and the exported ECAPA encoder;
# encode voice codes with the exported Mimi encoder and a numpy split RVQ; build the ICL prompt (Base); speak with
# every built-in speaker of a CustomVoice checkpoint, with an instruction where the checkpoint follows one; speak a
# voice described in words, and no description at all (VoiceDesign) — each compared with the PyTorch reference.
#
# **You will learn:** the exact mel recipe (where one wrong constant costs you the cosine); how the split RVQ works;
# how the ICL prompt lines up voice transcript and voice codes; how built-in voices, dialects and instructions enter
# the prompt. The runtime's pieces: `audio.mel`, `audio.rvq`, the voice encoders `pipeline.voices.VoiceEncoder`
# (`synth.voices`), the prompt `pipeline.prompt` (`synth.prompt`).
#
# Which sections apply depends on the checkpoint's kind (`tts_model_type`): cloning (2, 3) needs a Base checkpoint,
# built-in voices (4) a CustomVoice one (a Base checkpoint borrows the synthesized CustomVoice checkpoint of its size),
# described voices (5) a VoiceDesign one. A section that does not apply says so and why.
#
# **You need:** chapter 03's goldens on `<ckpt>` (Base: `xvec_greedy.npz`, `icl_greedy.npz`); the ncnn graphs are
# exported here if missing; on a Base checkpoint its CustomVoice sibling is synthesized and exported here.
# **Leaves behind:** `data/outputs/<ckpt>/07_*.wav`, `data/reports/<ckpt>/07_clone_voices.json` (and
# `models/<sibling>/ncnn/` on Base).

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
from qtts_lib.runtime.errors import InputError
from qtts_lib.runtime.pipeline.sampling import Sampler, Sampling
from qtts_lib.runtime.pipeline.synthesizer import Result, Synthesizer

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("07_clone_voices", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)
synth = Synthesizer(model_dir, threads=THREADS)
kind = synth.kind  # base | custom_voice | voice_design, from the config's tts_model_type
base = kind == "base"
voice_wav = load_wav(paths.voice_wav())
voice_text = (paths.INPUTS / "voice.txt").read_text().strip()
print(f"{ckpt} ({kind}, follows instructions: {synth.follows_instructions}); "
      f"voice clip {len(voice_wav) / SAMPLE_RATE:.2f} s: {voice_text!r}")
NO_CLONING = f"skipped because a {kind} checkpoint has no speaker encoder: it does not clone a voice clip"


FRAMES = inputs.GOLDEN_MAX_NEW_TOKENS - 1  # the goldens' 45 new tokens are 44 frames (chapter 06)


def greedy_run(s: Synthesizer, prompt, frames: int) -> Result:
    """Chapter 06's loop to its end, greedy like the goldens; `frames` = the reference's max_new_tokens - 1."""
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
    print(f"§2 x-vector clone: {NO_CLONING}")

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
    print(f"§3 ICL clone: {NO_CLONING}, so no voice codes enter its prompt")

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
# The ICL prompt appends to the shared prefix (role, tags, x-vector, `codec_pad`) two tracks summed position by
# position: text = voice transcript ++ target text ++ `tts_eos`; codec = `codec_bos` ++ one row per frame of the
# clip (the talker table at codebook 0 plus the predictor tables at 1..15). Whatever text does not fit beside the codes
# becomes trailing text; here the codes are longer, so trailing text is just `tts_pad`.

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
    save_wav(paths.outputs_dir(ckpt) / "07_icl.wav", icl_wav)
    display(Audio(icl_wav, rate=SAMPLE_RATE))

# %% [markdown]
# ## 4. Built-in voices (CustomVoice)
# A CustomVoice checkpoint has no speaker encoder: each speaker is a row of the codec embedding (`spk_id` in the
# config), placed where the x-vector goes. Its entry point defaults to **non-streaming** text: the whole text
# (+ `tts_eos`) rides on `codec_pad` rows, a last row `tts_pad + codec_bos` closes the prompt, and trailing text is
# always `tts_pad`. Speakers marked as dialect speakers switch the language tag to their dialect for Chinese and auto.
# A Base checkpoint has no built-in speakers; there this section uses the synthesized CustomVoice checkpoint of the
# same size and model size (`paths.SYNTHETIC`): the codec weights are shared with Base, the talker family is its own.

# %%
def custom_voice_sibling() -> str | None:
    """The synthesized CustomVoice checkpoint with this checkpoint's size (tiny/full) and model size (0.6B/1.7B)."""
    size = paths.SYNTHETIC.get(ckpt, ("full",))[0]  # a real checkpoint: the full-size synthetic one
    model_size = "1.7b" if "1b7" in (tts.model.tts_model_size or "") else "0.6b"
    return next((n for n, spec in paths.SYNTHETIC.items() if spec == (size, "customvoice", model_size)), None)


cv = ckpt if kind == "custom_voice" else custom_voice_sibling() if base else None
if cv is None:
    print(f"§4 built-in voices: skipped because a {kind} checkpoint has no built-in speakers; section 5 speaks its "
          "described voices")
else:
    if cv == ckpt:
        tts_cv, synth_cv = tts, synth
    else:
        print(f"a {kind} checkpoint has no built-in speakers: this section uses {cv}")
        tts_cv = reference.load(checkpoint.ensure(cv), threads=THREADS)
        export.ensure(tts_cv, cv)
        synth_cv = Synthesizer(paths.model_dir(cv), threads=THREADS)
    cv_cfg = checkpoint.load_config(cv)["talker_config"]
    print("speakers:", {s: cv_cfg["spk_id"][s] for s in synth_cv.speakers})
    print("dialect speakers:", {s: d for s, d in cv_cfg["spk_is_dialect"].items() if d})

# %%
N = 16  # the reference's new tokens per voice (N - 1 frames): past the prompt and the EOS mask
rows = []
for speaker in synth_cv.speakers if cv else []:
    language = "auto" if cv_cfg["spk_is_dialect"][speaker] else inputs.LANGUAGE
    ref_run = reference.capture_generation(tts_cv, inputs.TARGET_TEXT, language, speaker=speaker, max_new_tokens=N)
    prompt = synth_cv.prompt(inputs.TARGET_TEXT, language, synth_cv.voice(speaker=speaker))
    check.close(f"{speaker} ({language}): prompt = reference", prompt.embeds, ref_run["inputs_embeds"], rel=1e-5)
    ours = greedy_run(synth_cv, prompt, N - 1)
    row = check.tokens_equal(f"{speaker} ({language}): all codes = reference", ours.codes, ref_run["codes"])
    rows.append((speaker, language, ours.codes.shape[0], row["value"]))
print("\n".join(f"{s:10} {lang:8} {n} frames  mismatched {v}" for s, lang, n, v in rows))

# %% [markdown]
# Names and languages come from the checkpoint's config; an unknown name is refused with the valid ones:

# %%
def refusal(make_voice) -> str:
    """The message a bad voice is refused with ("" if it was not refused)."""
    try:
        make_voice()
    except InputError as e:
        print(e)
        return str(e)
    return ""


if cv:
    message = refusal(lambda: synth_cv.voice(speaker="nobody"))
    check.equal("unknown speaker refused with every valid name", "lists all",
                bool(message) and all(s in message for s in synth_cv.speakers), True)

# %% [markdown]
# ### An instruction for a built-in speaker
# `synth.voice(speaker=..., instruct=...)` adds a style in words. It is a user turn of its own,
# `<|im_start|>user\n{instruct}<|im_end|>\n`, tokenized alone and put in front of the prompt as text rows only. The
# 1.7B CustomVoice checkpoint follows it (`synth.follows_instructions`); the reference drops it on 0.6B
# (`tts_model_size` "0b6"), and so does the runtime, with a warning in `Result.warnings`. Either way the runtime
# must give the reference's codes for the same call:

# %%
def instruction_rows(model_tts, text: str) -> int:
    return len(model_tts.processor.tokenizer(f"<|im_start|>user\n{text}<|im_end|>\n")["input_ids"])


if cv:
    speaker = synth_cv.speakers[0]
    styled = synth_cv.voice(speaker=speaker, instruct=reference.STYLE)
    ref_run = reference.capture_generation(tts_cv, inputs.TARGET_TEXT, inputs.LANGUAGE, speaker=speaker,
                                           instruct=reference.STYLE, max_new_tokens=N)
    plain = synth_cv.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, synth_cv.voice(speaker=speaker))
    prompt = synth_cv.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, styled)
    print(f"{cv}: follows instructions {synth_cv.follows_instructions}; {speaker} + {reference.STYLE!r}: prompt "
          f"{prompt.embeds.shape[0]} rows (without: {plain.embeds.shape[0]})")
    check.close(f"{speaker} + instruction: prompt = reference", prompt.embeds, ref_run["inputs_embeds"], rel=1e-5)
    styled_result = synth_cv.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, styled, sampling=Sampling(greedy=True),
                                        max_frames=N - 1)
    check.tokens_equal(f"{speaker} + instruction: all codes = reference", styled_result.codes, ref_run["codes"])
    dropped = [w for w in styled_result.warnings if "does not follow instructions" in w]
    print("warnings:", styled_result.warnings or "none")
    if synth_cv.follows_instructions:
        check.equal(f"{speaker} + instruction: prompt rows added = the instruction's tokens", "rows",
                    prompt.embeds.shape[0] - plain.embeds.shape[0], instruction_rows(tts_cv, reference.STYLE))
        check.equal(f"{speaker} + instruction: no warning", "warnings", len(dropped), 0)
    else:
        check.equal(f"{speaker} + instruction on {tts_cv.model.tts_model_size}: prompt rows added (dropped)", "rows",
                    prompt.embeds.shape[0] - plain.embeds.shape[0], 0)
        check.equal(f"{speaker} + instruction on {tts_cv.model.tts_model_size}: the drop is warned", "warnings",
                    len(dropped), 1)
    if styled_result.wav.size:
        save_wav(paths.outputs_dir(ckpt) / "07_speaker_instruct.wav", styled_result.wav)

# %% [markdown]
# ## 5. Described voices (VoiceDesign)
# A VoiceDesign checkpoint has neither a speaker encoder nor built-in speakers: the voice is the instruction
# (`synth.voice(instruct=...)`), the same user turn in front of the prompt, and the prompt's codec track has no
# speaker row at all. An empty description is allowed: the model picks a voice of its own. Both, against the
# reference's `generate_voice_design`, for the goldens' whole length:

# %%
designs = {"described": reference.DESIGNED_VOICE, "no description": ""}
design_prompts = {}
if kind == "voice_design":
    for label, description in designs.items():
        ref_run = reference.capture_generation(tts, inputs.TARGET_TEXT, inputs.LANGUAGE, instruct=description,
                                               max_new_tokens=inputs.GOLDEN_MAX_NEW_TOKENS)
        voice = synth.voice(instruct=description)
        check.equal(f"{label}: no speaker row", "speaker_row is None", voice.speaker_row is None, True)
        design_prompts[label] = prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice)
        check.close(f"{label}: prompt = reference", prompt.embeds, ref_run["inputs_embeds"], rel=1e-5)
        designed = greedy_run(synth, prompt, FRAMES)
        check.tokens_equal(f"{label}: all codes = reference", designed.codes, ref_run["codes"])
        wav = synth.codec.decode(designed.codes)
        check.snr(f"{label}: waveform vs reference", wav, ref_run["wav"], 60.0)
        save_wav(paths.outputs_dir(ckpt) / f"07_design_{label.replace(' ', '_')}.wav", wav)
    check.equal("described - no description: prompt rows = the description's tokens", "rows",
                design_prompts["described"].embeds.shape[0] - design_prompts["no description"].embeds.shape[0],
                instruction_rows(tts, reference.DESIGNED_VOICE))
    display(Audio(wav, rate=SAMPLE_RATE))
else:
    print(f"§5 described voices: skipped because a {kind} checkpoint has no voice design "
          "(QTTS_CHECKPOINT=tiny-voicedesign has)")

# %% [markdown]
# A voice clip or a speaker name given to a VoiceDesign checkpoint is refused, with what to give instead:

# %%
if kind == "voice_design":
    check.equal("a voice clip on VoiceDesign is refused, naming an instruction", "says instruction",
                "instruction" in refusal(lambda: synth.voice(wav=voice_wav)), True)

# %% [markdown]
# ## 6. From the command line
# Every voice this checkpoint has, in a process where torch cannot be imported (`--greedy`: `qtts say` samples by
# default; `--instruct` gives the instruction or the description):

# %%
runs = {}
if base:
    runs["icl"] = ["--checkpoint", str(model_dir), "--voice", str(paths.voice_wav()), "--voice-text", voice_text]
if cv:
    runs["speaker"] = ["--checkpoint", str(paths.model_dir(cv)), "--speaker", synth_cv.speakers[0]]
    if synth_cv.follows_instructions:
        runs["speaker_instruct"] = runs["speaker"] + ["--instruct", reference.STYLE]
if kind == "voice_design":
    runs["design"] = ["--checkpoint", str(model_dir), "--instruct", reference.DESIGNED_VOICE]
    runs["design_plain"] = ["--checkpoint", str(model_dir)]
for label, args in runs.items():
    out = paths.outputs_dir(ckpt) / f"07_cli_{label}.wav"
    r = qtts_without_torch("say", *args, "--text", inputs.TARGET_TEXT, "--language", inputs.LANGUAGE,
                           "--greedy", "--max-frames", "12", "--threads", str(THREADS), "-o", str(out))
    print(r.stdout.strip() or r.stderr[-400:])
    check.equal(f"qtts say ({label}) with torch blocked", "exit status", r.returncode, 0)

# %% [markdown]
# ## Summary
# - The numpy mel frontend reproduces the reference's (cos ≥ 0.9999999); with the ncnn speaker encoder the x-vector
#   matches torch and the x-vector clone reproduces the golden codes.
# - The Mimi graph + numpy split RVQ give the voice codes exactly on whole frames (only the last frame of an
#   unpadded wav can differ); the ICL prompt and generation match the golden, and the voice clip's part of the audio is
#   cut by frame ratio as the reference does.
# - Built-in speakers are codec-embedding rows in a non-streaming prompt; every speaker of the config matches torch,
#   and so does a speaker with an instruction (a user turn of text rows in front; dropped with a warning on 0.6B,
#   as the reference drops it).
# - A designed voice is the instruction alone, no speaker row; described and undescribed both match torch.
# - Every comparison runs chapter 06's loop greedy (`Sampling(greedy=True)`) for the reference's `max_new_tokens - 1`
#   frames; `synth.voice(...)` and `qtts say` are the same voices, sampled by default.
#
# **Artifacts left:** `data/outputs/<ckpt>/07_*.wav`, the chapter report; on Base `models/<sibling>/ncnn/`.
#
# **If your numbers differ**
# - *x-vector cosine ~0.99* → a mel constant (padding, window periodicity, magnitude epsilon, Slaney vs HTK).
# - *Voice codes differ only in the last frame* → the wav is not a multiple of 1920 samples (section 3).
# - *ICL codes diverge at once* → voice transcript tokenized without stripping its role/`<|im_end|>` tokens, or codec
#   rows summed without codebook 0.
# - *A dialect speaker diverges* → the language tag was not switched to the dialect id.
# - *Codes with an instruction diverge at once* → the instruction tokenized together with the text, or given codec
#   rows; it is its own user turn, text rows only, in front of everything.

# %%
check.table()

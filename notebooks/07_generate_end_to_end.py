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
# # 07 · Generate end to end with ncnn
# > The prompt, the generation loop over the ncnn graphs and the codec: numpy and ncnn only, every code checked.
#
# **You will:** lay the talker's prompt out; **write the generation loop** for one sequence over the cached ncnn
# graphs and match chapter 03's greedy golden code for code; see that the runtime's `Loop` (many sequences at once)
# is this loop; decode in the reference's chunks; replay a sampled take by its seed; run the `qtts` CLI without torch.
#
# **You will learn:** the loop (prompt; codebook 0 and EOS; which predictor head and table serve which codebook;
# the talker's next input); why it counts frames, not tokens; why the codec decodes in chunks; what a seed replays.
#
# **You need:** `data/golden/<ckpt>/` (chapter 03), `models/<ckpt>/ncnn/` (04–05, exported if missing). The set-up
# loads the reference (its voices, its codec), the goldens and `Synthesizer`, the runtime (no torch inside).
# **Leaves behind:** `data/outputs/<ckpt>/07_ncnn.wav`, `07_cli.wav`, `models/<ckpt>/ncnn/talker_text_table.npy`,
# `data/reports/<ckpt>/07_generate_end_to_end.json`.

# %%
import numpy as np
import torch

from qtts_lib import artifacts, check, checkpoint, export, paths, reference, settings
from qtts_lib.golden import mode_of, voice_of
from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

ckpt = settings.checkpoint()          # QTTS_CHECKPOINT, default tiny-base
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("07_generate_end_to_end", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)
export.ensure(tts, ckpt)  # chapters 04-05's graphs, reused when current
synth = Synthesizer(model_dir, threads=THREADS)  # writes talker_text_table.npy once
kind = tts.model.tts_model_type  # base, custom_voice or voice_design (chapter 09)
mode, voice_args = mode_of(tts), voice_of(tts)  # the golden's stem, and its voice
golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / f"{mode}_greedy.npz", ckpt)
early, _ = artifacts.load_npz(paths.golden_dir(ckpt) / f"{mode}_eos.npz", ckpt)
print(f"{ckpt} ({kind}): goldens {mode}_greedy and {mode}_eos, voice by", *voice_args)

# %% [markdown]
# ## 1. Build the prompt: two tracks summed position by position
# The talker reads one embedding per position: a row of its text embedding table (text ids, chapter 06) plus a row
# of its codec embedding table (codec ids), two **tracks** summed. An x-vector clone's prompt:
#
#     text  <|im_start|> assistant \n tts_pad tts_pad   tts_pad  tts_pad   tts_pad tts_bos   Hello
#     codec ·            ·         ·  think   think_bos language think_eos speaker codec_pad codec_bos
# Text: the chat template's role prefix, `tts_pad`s, `tts_bos` (begin of text), the first text token. Codec, after the
# prefix: four tags naming the language, the speaker row (the **x-vector** the speaker encoder computes from a voice
# clip), `codec_pad`, `codec_bos` (begin of speech). The rest of the text, then `tts_eos`, is **trailing text**, added
# to the talker's input a row per frame, then `tts_pad` for ever; an **ICL** (in-context) clone, chapter 08, adds a
# voice clip's transcript and codes. The rows, as (label, row) pairs, the labels for the figure:

# %%
from qtts_lib.runtime.pipeline import prompt as chat  # the chat template's strings
from qtts_lib.runtime.pipeline.prompt import Prompt, Voice

e, tok = synth.embeddings, synth.tokenizer  # e.text(ids), e.codec(ids): table rows
c, top = synth.config.talker, synth.config.config  # config.json: its talker part, all
text_rows = lambda label, ids: [(label, row) for row in e.text(ids)]  # noqa: E731
codec_rows = lambda label, ids: [(label, row) for row in e.codec(ids)]  # noqa: E731
pad, bos, eos_row = (text_rows(k, [top[f"{k}_token_id"]])[0]
                     for k in ("tts_pad", "tts_bos", "tts_eos"))
codec_bos = codec_rows("codec_bos", [c["codec_bos_id"]])
codec_pad = codec_rows("codec_pad", [c["codec_pad_id"]])
tags = lambda language: codec_rows("codec tag", [  # noqa: E731
    c["codec_think_id"], c["codec_think_bos_id"], c["codec_language_id"][language],
    c["codec_think_eos_id"]])

# %% [markdown]
# `tracks` lays a prompt out; `chat.TEXT` is chapter 06's chat template around the text (`ROLE_TOKENS` ids before it,
# `END_TOKENS` after). An x-vector clone puts the first text token over `codec_bos`; ICL puts transcript, text and
# `tts_eos` beside the clip's codes; a built-in speaker or a described voice (chapter 09): an instruction, all the text:

# %%
def tracks(text: str, language: str, voice: Voice) -> tuple[list, list, list]:
    """(text track, codec track, trailing text): (label, row) pairs; None: empty."""
    ids = tok.encode_template(chat.TEXT, text)  # text stays text, whatever it holds
    speaker = [] if voice.speaker_row is None else [("speaker", voice.speaker_row)]
    head = tags(language) + speaker + codec_pad
    upper = text_rows("role", ids[:chat.ROLE_TOKENS]) + [pad] * (len(head) - 1) + [bos]
    lower = [None] * chat.ROLE_TOKENS + head
    said = text_rows("text", ids[chat.ROLE_TOKENS:-chat.END_TOKENS]) + [eos_row]
    if voice.codes is not None:  # ICL: transcript, text, tts_eos beside the clip
        heard = tok.encode_template(chat.VOICE_TEXT, voice.text)
        heard = heard[chat.ROLE_TOKENS:-chat.VOICE_END_TOKENS]
        said = text_rows("voice transcript", heard) + said
        clip = codec_bos + [("voice codes", row) for row in e.frame(voice.codes)]
        fill = [pad] * (len(clip) - len(said))
        return upper + said[:len(clip)] + fill, lower + clip, said[len(clip):] or [pad]
    if voice.mode == "xvector":
        return upper + said[:1], lower + codec_bos, said[1:]
    ask = tok.encode_template(chat.INSTRUCT, voice.instruct) if voice.instruct else []
    first = text_rows("instruction", ask)
    lower = [None] * len(first) + lower + codec_pad * len(said) + codec_bos
    return first + upper + said + [pad], lower, [pad]

# %% [markdown]
# Each golden's prompt, summed from its pairs, is held to the one the reference built (saved by chapter 03) and
# becomes a `Prompt` (prompt rows, trailing rows, `tts_pad`) for section 2; `Synthesizer.prompt`, the product's,
# builds the same rows. The figure: each prompt's two tracks, a column a position, then its trailing text:

# %%
from qtts_lib import inputs, plots

if kind == "base":  # the golden's x-vector (chapter 08 computes it with ncnn)
    voices = {"x-vector": (Voice(golden["xvector"]), golden)}
    icl, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "icl_greedy.npz", ckpt)
    text = (paths.INPUTS / "voice.txt").read_text().strip()
    voices["ICL"] = (Voice(icl["xvector"], codes=icl["voice_codes"], text=text), icl)
else:  # the other kinds' main golden: a built-in speaker, or a described voice
    voices = {mode: (synth.voice(**voice_args), golden)}
prompts, drawn = {}, {}
for label, (v, gold) in voices.items():
    upper, lower, trailing = tracks(inputs.TARGET_TEXT, inputs.LANGUAGE, v)
    embeds = np.stack([u[1] + (0 if d is None else d[1]) for u, d in zip(upper, lower)])
    rest = np.stack([row for _, row in trailing])  # (P, hidden) and (M, hidden)
    check.close(f"{label} prompt: text track + codec track = reference", embeds,
                gold["inputs_embeds"], rel=1e-5)
    check.close(f"{label} prompt: trailing text = reference", rest,
                gold["trailing_text_hidden"], rel=1e-5)
    prompts[label] = Prompt(embeds, rest, pad[1])
    drawn[label] = [[x and x[0] for x in t] for t in (upper, lower, trailing)]  # labels
voice = voices[next(iter(voices))][0]
prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice)
check.close("prompt embeddings = reference", prompt.embeds, golden["inputs_embeds"],
            rel=1e-5)
check.close("trailing text embeddings = reference", prompt.trailing,
            golden["trailing_text_hidden"], rel=1e-5)
plots.prompt_tracks(drawn, title=f"the talker's prompt, {ckpt}");

# %% [markdown]
# ## 2. Write the loop, one sequence
# A frame is 16 codes, one per codebook, from four of chapter 04's graphs: talker and code predictor with chapter
# 05's KV cache (`prefill`, then `forward` a position a step); the codec head; the 15 predictor heads, one graph
# whose output *s* is head *s* (`Net` called: every output; `.run(inputs, [s])`: output *s*). H, h: their widths:

# %%
from qtts_lib.runtime.binding.net import Net
from qtts_lib.runtime.pipeline import precision

d, tc, pc = synth.config.ncnn_dir, synth.config.talker, synth.config.predictor
GROUPS = synth.config.groups  # 16 codebooks a frame
talker, predictor = (precision.decoder(d, name, x["head_dim"], x["rope_theta"], THREADS)
                     for name, x in [("talker_decoder", tc), ("predictor_decoder", pc)])
codec_head = Net(d, "talker_codec_head", THREADS)  # hidden (1, H) -> logits (1, vocab)
heads = Net(d, "predictor_heads", THREADS)  # head s: hidden (1, h) -> codebook s+1
logits0 = lambda h: codec_head(h[None])[0][0]  # noqa: E731  (H,) -> (vocab,)

# %% [markdown]
# **Prefill the talker** with the whole prompt (every position in one call, filling the cache): its last hidden state
# gives codebook 0's logits through the codec head, the reference's at step 0. Chapter 06's processors pick the code
# (greedy talker settings: control ids suppressed, EOS masked at first); EOS ends the sequence, with no frame.

# %%
from qtts_lib.runtime.pipeline import sampling
from qtts_lib.runtime.pipeline.sampling import SamplerConfig, Sampling

main_prompt = prompts[next(iter(prompts))]
hidden, cache = talker.prefill(main_prompt.embeds[None])  # (1, P, H); P cached
h = hidden[0, -1]
check.close("codebook-0 logits after the prefill = reference (step 0)", logits0(h),
            golden["logits"][0], rel=1e-5)
cfg = checkpoint.load_config(ckpt)
defaults = Sampling.from_generation_config(tts.model.generate_config)  # they sample
talker_sc = SamplerConfig.talker(defaults.replace(greedy=True), cfg)
eos = talker_sc.eos_id
c0 = sampling.sample(logits0(h), [], 0, talker_sc, np.random.default_rng(0))
check.equal("codebook 0 of frame 0 = golden", "token", c0, int(golden["codes"][0, 0]))

# %% [markdown]
# **Codebooks 1..15: the code predictor** prefills two positions, the talker's hidden state and codebook 0's
# embedding; head 0 predicts codebook 1. Each code is embedded (table *s* for codebook *s+1*) and fed as one cached
# step, and head *s+1* predicts the next. The 16 rows, summed, are the frame's embedding, the talker's next input:

# %%
def acoustic_codes(h: np.ndarray, c0: int, rest: SamplerConfig, rng) -> tuple:
    """The frame's 16 codes after codebook 0 = c0, and its embedding (H,)."""
    codes, embed = [c0], e.codec([c0])[0]  # codebook 0's row of the talker's table
    out, p_cache = predictor.prefill(np.stack([h, embed])[None])  # (1, 2, H) -> (1,2,h)
    for s in range(GROUPS - 1):
        logits = heads.run([out[0, -1][None]], [s])[0][0]  # head s: codebook s+1
        codes.append(sampling.sample(logits, codes[1:], s, rest, rng))
        row = e.acoustic(s, codes[-1])  # table s embeds codebook s+1
        embed = embed + row
        if s < GROUPS - 2:  # the last code needs no position of its own
            out = predictor.forward(row[None, None], p_cache)
    return codes, embed


rest = SamplerConfig.subtalker(Sampling(greedy=True), cfg)  # no penalty, EOS, suppress
frame0, embed0 = acoustic_codes(h, c0, rest, np.random.default_rng(0))
check.tokens_equal("frame 0, codebooks 0..15 = golden", np.array(frame0),
                   golden["codes"][0])

# %% [markdown]
# **The next talker step** is one position: frame *t*'s embedding plus row *t* of the trailing text (`tts_pad` once
# the text has run out). After frame 0 it gives step 1's logits:

# %%
def talker_step(embed: np.ndarray, t: int, prompt: Prompt, cache) -> np.ndarray:
    """The talker's hidden state (H,) after frame t, whose embedding is `embed`."""
    text = prompt.trailing[t] if t < len(prompt.trailing) else prompt.tts_pad
    return talker.forward((embed + text)[None, None], cache)[0, -1]


h1 = talker_step(embed0, 0, main_prompt, cache)
check.close("codebook-0 logits after frame 0 = reference (step 1)", logits0(h1),
            golden["logits"][1], rel=1e-5)

# %% [markdown]
# **The loop** is those pieces in turn until EOS or the frame cap, one random stream (a seeded numpy Generator) for
# every code it samples. It counts **frames**. The reference counts codebook-0 tokens (`max_new_tokens`) and makes a
# token's codebooks 1..15 in its next talker call, so its last token gets no frame: `max_frames = max_new_tokens - 1`.

# %%
def generate(prompt: Prompt, choice: Sampling, max_frames: int, eos_id=None) -> tuple:
    """One sequence to EOS or max_frames: codes (T, 16), codebook-0 tokens (EOS too)."""
    first = SamplerConfig.talker(choice, cfg, eos_id)
    rest = SamplerConfig.subtalker(choice, cfg)
    rng = np.random.default_rng(choice.seed)
    hidden, cache = talker.prefill(prompt.embeds[None])
    h, tokens, frames = hidden[0, -1], [], []
    while len(frames) < max_frames:
        tokens.append(sampling.sample(logits0(h), tokens, len(tokens), first, rng))
        if tokens[-1] == first.eos_id:
            break
        codes, embed = acoustic_codes(h, tokens[-1], rest, rng)
        frames.append(codes)
        if len(frames) < max_frames:  # no talker step for a frame that will not come
            h = talker_step(embed, len(frames) - 1, prompt, cache)
    return np.array(frames, np.int64).reshape(-1, GROUPS), tokens

# %% [markdown]
# Greedy, on the main prompt, it gives the golden's codes, its EOS step (-1: none within the cap) and its codebook-0
# tokens; a bar per frame counts the codes that agree (green: all 16):

# %%
import matplotlib.pyplot as plt

eos_step = lambda ts, eos: len(ts) - 1 if ts[-1] == eos else -1  # noqa: E731
greedy = Sampling(greedy=True)
frames = inputs.GOLDEN_MAX_NEW_TOKENS - 1
codes, tokens = generate(main_prompt, greedy, frames)
check.tokens_equal("notebook loop == golden", codes, golden["codes"])
check.equal("notebook loop: EOS step = golden", "eos_step", eos_step(tokens, eos),
            int(golden["eos_step"]))
check.tokens_equal(f"notebook loop: codebook-0 tokens = the golden's first {frames} "
                   "(its last has no frame)", np.array(tokens[:frames]),
                   golden["talker_sequences"][:frames])
gold = golden["codes"]
agree = (codes == gold).sum(1) if codes.shape == gold.shape else np.zeros(len(gold))
fig, ax = plt.subplots(figsize=(9, 2.6))
ax.bar(range(len(agree)), agree, color=np.where(agree == 16, "tab:green", "crimson"))
ax.set(ylim=(0, 16.5), xlabel="frame", ylabel="codes equal (of 16)",
       title=f"the notebook's loop vs the PyTorch golden, per frame ({ckpt})");

# %% [markdown]
# The same loop on the ICL prompt (Base checkpoints), and with an EOS id that the greedy path emits mid-run (chapter
# 03's early-stop golden: a codebook-0 code declared EOS, as `generate(eos_token_id=...)` does), so the stop runs too:

# %%
for label, (_, gold) in list(voices.items())[1:]:
    check.tokens_equal(f"notebook loop, {label} prompt == golden",
                       generate(prompts[label], greedy, frames)[0], gold["codes"])
early_id = int(early["eos_id"])
early_codes, early_tokens = generate(main_prompt, greedy, frames, eos_id=early_id)
stop = eos_step(early_tokens, early_id)
print(f"eos id {early_id}: stopped after {len(early_codes)} frames at step {stop}")
check.equal("early stop: EOS step = golden", "eos_step", stop, int(early["eos_step"]))
check.tokens_equal("early stop: codes = golden", early_codes, early["codes"])

# %% [markdown]
# ## 3. The runtime's `Loop` is this loop, batched
# `pipeline.loop.Loop` runs the same pieces in the same order for a list of sequences, one row each in every graph
# call (chapter 17), each `Sequence` keeping what `generate` keeps in locals, its `Sampler` the two `SamplerConfig`s
# and the random stream. `synth.sampling` is the checkpoint's default `Sampling`. Alone, one gives the loop's codes:

# %%
from qtts_lib.runtime.pipeline.sampling import Sampler

loop_codes = lambda prompt, choice, n, eos_id=None: np.stack(  # noqa: E731
    synth.loop.run(prompt, Sampler(choice, cfg, eos_id), n).codes)
seeded = synth.sampling.replace(seed=0)
check.tokens_equal("runtime Loop = notebook loop (greedy)",
                   loop_codes(main_prompt, greedy, frames), codes)
check.tokens_equal("runtime Loop = notebook loop (early stop)",
                   loop_codes(main_prompt, greedy, frames, early_id), early_codes)
check.tokens_equal(
    "runtime Loop = notebook loop (sampled, the checkpoint's defaults, seed 0)",
    loop_codes(main_prompt, seeded, 20), generate(main_prompt, seeded, 20)[0])

# %% [markdown]
# ## 4. Decode the codes the way the reference does
# The codec turns codes (T, 16) into a waveform: noise (random weights), so the check is the SNR; the figure shows each
# waveform and its spectrogram. The reference decodes in chunks of 300 frames, each with 25 frames of left context
# decoded and dropped; the codec sees further back, so past one chunk a one-shot decode differs, as random codes show:

# %%
from IPython.display import Audio, display

from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, save_wav

wav = synth.codec.decode(codes)
check.snr("waveform vs golden", wav, golden["wav"], 60.0)
save_wav(paths.outputs_dir(ckpt) / "07_ncnn.wav", wav)
display(Audio(wav, rate=SAMPLE_RATE))
plots.waveform({"PyTorch golden": golden["wav"], "ncnn runtime": wav});
T = 340  # past one chunk
long_codes = np.random.default_rng(3).integers(0, 2048, size=(T, 16))
with torch.inference_mode():
    chunks = [{"audio_codes": torch.from_numpy(long_codes)}]
    ref_long = tts.model.speech_tokenizer.decode(chunks)[0][0]
ours_long = synth.codec.decode(long_codes)
one_shot = synth.codec.decode_once(long_codes)
tail = slice(300 * SAMPLES_PER_FRAME, None)
snr_tail = lambda w: check.snr_db(w[tail], ref_long[tail])  # noqa: E731
print(f"frames 300..{T}: chunked vs reference {snr_tail(ours_long):.1f} dB, "
      f"one-shot vs reference {snr_tail(one_shot):.1f} dB")
check.snr(f"chunked decode of {T} frames vs reference", ours_long, ref_long, 60.0)

# %% [markdown]
# ## 5. One call, seeds, and the CLI
# All of this is one call, `Synthesizer.synthesize(text, language, voice, sampling, max_frames)`, the product's only
# pipeline (the CLI runs it). Without `sampling=` it samples as the reference does, with the checkpoint's defaults and
# a fresh seed per call; `result.seed` replays a take (sampled runs are compared by seed, never to a golden):

# %%
product = synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, sampling=greedy,
                           max_frames=frames)
check.tokens_equal("synthesize(): codes = golden", product.codes, golden["codes"])
check.snr("synthesize(): waveform vs golden", product.wav, golden["wav"], 60.0)
check.equal("runtime's default sampling = the reference's generate_config", "equal",
            synth.sampling == defaults, True)
say = lambda **kw: synth.synthesize(  # noqa: E731
    inputs.TARGET_TEXT, inputs.LANGUAGE, voice, max_frames=20, **kw)
first, second = say(), say()  # (20, 16) codes each, or fewer on EOS
replay = say(sampling=synth.sampling.replace(seed=first.seed))  # the first take's seed
same = lambda a, b: a.shape == b.shape and bool((a == b).all())  # noqa: E731
check.equal("sampled twice without a seed: other codes", "equal",
            same(first.codes, second.codes), False)
check.equal("sampled with the first take's seed: its codes again", "equal",
            same(replay.codes, first.codes), True)
check.equal("sampled vs greedy: other codes", "equal",
            same(first.codes, product.codes[: len(first.codes)]), False)

# %% [markdown]
# `qtts_lib.runtime` imports no torch: the CLI runs in a process where importing torch, transformers or qwen_tts raises
# (`tests/test_runtime_imports.py`'s guard). `qtts say` samples unless `--greedy`, and reports the audio made and its
# RTF (compute seconds per audio second); bad input ends in one clear line and exit status 2, no traceback:

# %%
from qtts_lib.isolation import qtts_without_torch

flag = {"base": "voice", "custom_voice": "speaker", "voice_design": "instruct"}[kind]
value = str(paths.voice_wav()) if flag == "voice" else voice_args[flag]
say_args = ["say", "--checkpoint", str(model_dir), f"--{flag}", value, "--threads",
            str(THREADS), "-o", str(paths.outputs_dir(ckpt) / "07_cli.wav")]
run = qtts_without_torch(*say_args, "--text", inputs.TARGET_TEXT, "--language",
                         inputs.LANGUAGE, "--greedy", "--max-frames", "20")
print(run.stdout, run.stderr[-600:])
check.equal("qtts say with torch blocked", "exit status", run.returncode, 0)
for label, extra in [("empty text", ["--text", "   "]),
                     ("unknown language", ["--text", "hi", "--language", "klingon"])]:
    r = qtts_without_torch(*say_args, "--language", "english", *extra)
    print(f"{label}: exit {r.returncode}: {r.stderr.strip()}")
    check.equal(f"CLI refuses {label}", "exit status", r.returncode, 2)

# %% [markdown]
# ## Summary
# - The prompt is two tracks summed position by position; the rest of the text trails, one row per frame.
# - Per frame: codebook 0 from the codec head (EOS ends it); the code predictor's prefill and 14 steps (head *s*
#   predicts codebook *s+1*, table *s* embeds it); the frame's rows plus trailing text feed the next talker step.
#   It matches the golden code for code; the runtime's `Loop` is it, for many sequences at once.
# - Decode in the reference's chunks. Sampling is one `Sampling`, by default the checkpoint's with a fresh seed that
#   `result.seed` replays; parity passes `Sampling(greedy=True)`. `qtts say` runs it all with torch unimportable.
#
# **Artifacts left:** `data/outputs/<ckpt>/07_ncnn.wav`, `07_cli.wav`, `ncnn/talker_text_table.npy`, the report.
#
# **If your numbers differ**
# - *Codes diverge at frame 0, codebook ≥ 1* → the table/head offset (head *s* predicts, table *s* embeds *s+1*).
# - *Codes diverge after the text runs out* → the trailing text index (0 on the first step) or the `tts_pad` fallback.
# - *`synthesize()` differs from the golden while the loops match* → no `sampling=Sampling(greedy=True)`.
# - *`Loop` differs from the notebook's loop only when sampled* → draws in another order (one stream a sequence).
# - *One frame more or fewer than the golden* → `max_new_tokens` passed as `max_frames` (frames = tokens − 1).
# - *Waveform fine for 300 frames, then far off* → one-shot decode instead of the reference's chunks.

# %%
check.table()

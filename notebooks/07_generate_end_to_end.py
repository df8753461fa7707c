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
# > Tokenizer, prompt, sampler, talker loop, code predictor, codec: all numpy + ncnn, every token checked.
#
# **You will:** check a pure-Python BPE tokenizer (`text.bpe`) and a numpy sampler in Hugging Face's order
# (`pipeline.sampling`); lay out the talker's prompt as two tracks; **write the generation loop** for one sequence
# over the cached ncnn graphs and match chapter 03's greedy golden token for token; see that the runtime's batched
# loop (`pipeline.loop`) is this loop; decode in the reference's chunks (`codec`); use the `qtts` CLI.
#
# **You will learn:** the generation loop exactly (the two-track prompt, codebook 0 and the EOS rules, the code
# predictor's fifteen codes and their table/head offset, the frame fed back one step late with its trailing text);
# why the processor order matters; why the runtime counts frames where the reference counts tokens; that the
# runtime samples like the checkpoint unless told to be greedy; why the codec is decoded in the reference's chunks.
#
# **You need:** `data/golden/<ckpt>/` (chapter 03: this chapter stops without it; `xvec_greedy`, `xvec_eos`,
# `icl_greedy`); `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing or stale).
# **Leaves behind:** `data/outputs/<ckpt>/07_ncnn.wav`, the report, `models/<ckpt>/ncnn/talker_text_table.npy`.

# %%

import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import Audio, display

from qtts_lib import artifacts, check, checkpoint, export, inputs, paths, plots, reference, settings
from qtts_lib.golden import mode_of, voice_of
from qtts_lib.isolation import qtts_without_torch
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, save_wav
from qtts_lib.runtime.binding.net import Net
from qtts_lib.runtime.pipeline import precision, sampling
from qtts_lib.runtime.pipeline import prompt as chat  # the chat template's strings and token counts
from qtts_lib.runtime.pipeline.prompt import Prompt, Voice
from qtts_lib.runtime.pipeline.sampling import Sampler, SamplerConfig, Sampling
from qtts_lib.runtime.pipeline.synthesizer import Synthesizer

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("07_generate_end_to_end", ckpt)
model_dir = checkpoint.ensure(ckpt)
tts = reference.load(model_dir, threads=THREADS)  # the reference, for the tokenizer, sampler and codec comparisons
export.ensure(tts, ckpt)                          # chapters 04-05's graphs, reused when current
synth = Synthesizer(model_dir, threads=THREADS)   # the runtime: its tokenizer, embeddings, loop and codec
kind = tts.model.tts_model_type    # base; the other kinds (chapter 09) run this chapter with their own goldens
mode = mode_of(tts)                # the main golden's stem: xvec (speaker, design)
voice_args = voice_of(tts)         # the voice chapter 03 gave the reference for it
golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / f"{mode}_greedy.npz", ckpt)
early, _ = artifacts.load_npz(paths.golden_dir(ckpt) / f"{mode}_eos.npz", ckpt)
print(f"{ckpt} ({kind}): goldens {mode}_greedy and {mode}_eos, voice",
      {k: v if isinstance(v, str) else "data/inputs/voice.wav" for k, v in voice_args.items()})

# %%
cfg = checkpoint.load_config(ckpt)
defaults = Sampling.from_generation_config(tts.model.generate_config)
talker_sc = SamplerConfig.talker(defaults.replace(greedy=True), cfg)  # chapter 06's greedy talker settings

# %% [markdown]
# ## 3. Build the prompt: two tracks summed position by position
# The talker reads one embedding per position, the sum of two tracks. The **text track** carries the role prefix
# `<|im_start|>assistant\n`, `tts_pad`s, `tts_bos` and the first text token; the **codec track**, from the fourth
# position on, the think/language tags, the speaker row (the x-vector), `codec_pad`, and `codec_bos` under the first
# text token. The rest of the text, then `tts_eos`, is **trailing text**, added to the talker's input one row per
# frame, then `tts_pad` for ever. An in-context clone (ICL, chapter 08) puts the clip in: its transcript, the text
# and `tts_eos` beside `codec_bos` and one row per frame of the clip's codes (its 16 codebooks' embeddings summed);
# text that does not fit beside the codes trails. `tracks` lays a prompt out cell by cell over the runtime's
# embedding lookups (`pipeline.embeddings`); it also lays out the other kinds' prompts, which chapter 09 explains.

# %%
def tracks(text: str, language: str, voice: Voice) -> tuple[list, list, list]:
    """The text track and the codec track, one (label, row) cell per position (None: nothing on that track), and
    the trailing text, fed one row per frame after the prompt."""
    e, c, top, tok = synth.embeddings, synth.config.talker, synth.config.config, synth.tokenizer
    text_rows = lambda label, ids: [(label, row) for row in e.text(ids)]  # noqa: E731
    codec_rows = lambda label, ids: [(label, row) for row in e.codec(ids)]  # noqa: E731
    pad, bos, eos = (text_rows(k, [top[f"{k}_token_id"]])[0] for k in ("tts_pad", "tts_bos", "tts_eos"))
    ids = tok.encode_template(chat.TEXT, text)
    words = ids[chat.ROLE_TOKENS:-chat.END_TOKENS]  # the text's own tokens, without the chat template's
    tags = [c["codec_think_id"], c["codec_think_bos_id"], c["codec_language_id"][language], c["codec_think_eos_id"]]
    speaker = [] if voice.speaker_row is None else [("speaker", voice.speaker_row)]
    head = codec_rows("codec tag", tags) + speaker + codec_rows("codec_pad", [c["codec_pad_id"]])
    upper = text_rows("role", ids[:chat.ROLE_TOKENS]) + [pad] * (len(head) - 1) + [bos]
    lower = [None] * chat.ROLE_TOKENS + head
    codec_bos = codec_rows("codec_bos", [c["codec_bos_id"]])
    said = text_rows("text", words) + [eos]
    if voice.codes is not None:  # ICL: transcript + text + tts_eos beside codec_bos + the clip's frames
        heard = tok.encode_template(chat.VOICE_TEXT, voice.text)[chat.ROLE_TOKENS:-chat.VOICE_END_TOKENS]
        said = text_rows("voice transcript", heard) + said
        clip = codec_bos + [("voice codes", row) for row in e.frame(voice.codes)]
        return upper + said[: len(clip)] + [pad] * (len(clip) - len(said)), lower + clip, said[len(clip):] or [pad]
    if voice.mode == "xvector":  # the first text token rides on codec_bos; the rest trails
        return upper + said[:1], lower + codec_bos, said[1:]
    # a built-in speaker or a described voice (chapter 09): the instruction first, the whole text over codec_pad
    first = text_rows("instruction", tok.encode_template(chat.INSTRUCT, voice.instruct)) if voice.instruct else []
    return (first + upper + said + [pad], [None] * len(first) + lower
            + codec_rows("codec_pad", [c["codec_pad_id"]]) * len(said) + codec_bos, [pad])

# %% [markdown]
# The x-vector clone's prompt and the ICL clone's, re-summed from their cells and held to the prompts the reference
# built for chapter 03's goldens, become `Prompt`s (prompt rows, trailing rows, `tts_pad`) for section 4's loop.
# `Synthesizer.prompt` (`pipeline.prompt.PromptBuilder`), what the product runs, builds the same rows:

# %%
if kind == "base":            # the golden's x-vector: chapter 08 computes it from the clip with ncnn
    voices = {"x-vector": (Voice(golden["xvector"]), golden)}
    icl_golden, _ = artifacts.load_npz(paths.golden_dir(ckpt) / "icl_greedy.npz", ckpt)
    voices["ICL"] = (Voice(icl_golden["xvector"], codes=icl_golden["voice_codes"],
                           text=(paths.INPUTS / "voice.txt").read_text().strip()), icl_golden)
else:                         # the other kinds' main golden: a built-in speaker, or a described voice
    voices = {mode: (synth.voice(**voice_args), golden)}
prompts, drawn = {}, {}
for label, (v, gold) in voices.items():
    upper, lower, trailing = tracks(inputs.TARGET_TEXT, inputs.LANGUAGE, v)
    embeds = np.stack([u[1] + (0 if d is None else d[1]) for u, d in zip(upper, lower)])  # (P, hidden)
    rest = np.stack([row for _, row in trailing])  # (M, hidden)
    check.close(f"{label} prompt: text track + codec track = reference", embeds, gold["inputs_embeds"], rel=1e-5)
    check.close(f"{label} prompt: trailing text = reference", rest, gold["trailing_text_hidden"], rel=1e-5)
    prompts[label] = Prompt(embeds, rest, synth.embeddings.text([synth.config.config["tts_pad_token_id"]])[0])
    drawn[label] = [[None if cell is None else cell[0] for cell in t] for t in (upper, lower, trailing)]
voice = voices[next(iter(voices))][0]
prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice)
check.close("prompt embeddings = reference", prompt.embeds, golden["inputs_embeds"], rel=1e-5)
check.close("trailing text embeddings = reference", prompt.trailing, golden["trailing_text_hidden"], rel=1e-5)
plots.prompt_tracks(drawn, title=f"the talker's prompt, {ckpt}");

# %% [markdown]
# ## 4. Write the loop, one sequence
# A frame runs four of chapter 04's graphs, the talker and its codec head (codebook 0), the code predictor and its
# 15 heads (codebooks 1..15), and looks rows up in the embedding tables (`synth.embeddings`). The two decoders run
# with chapter 05's cache (the runtime's `KvCacheNet`, for one sequence the chapter's `OneCache`).

# %%
d, tc, pc = synth.config.ncnn_dir, synth.config.talker, synth.config.predictor
GROUPS = synth.config.groups  # 16 codebooks a frame
talker = precision.decoder(d, "talker_decoder", tc["head_dim"], tc["rope_theta"], threads=THREADS)
predictor = precision.decoder(d, "predictor_decoder", pc["head_dim"], pc["rope_theta"], threads=THREADS)
codec_head = Net(d, "talker_codec_head", THREADS)  # hidden (1, H) -> codebook-0 logits (1, vocab)
heads = Net(d, "predictor_heads", THREADS)  # head s: predictor hidden (1, h) -> codebook s+1 logits (1, 2048)
emb = synth.embeddings
logits0 = lambda h: codec_head(h[None])[0][0]  # noqa: E731  (H,) -> (vocab,)

# %% [markdown]
# **Prefill the talker** with the whole prompt: its last hidden state starts the first frame. The codec head turns
# it into codebook 0's logits, the reference's at step 0 (chapter 03 recorded them):

# %%
main_prompt = prompts[next(iter(prompts))]
hidden, cache = talker.prefill(main_prompt.embeds[None])  # (1, P, H); the cache now holds P positions
h = hidden[0, -1]
check.close("codebook-0 logits after the prefill = reference (step 0)", logits0(h), golden["logits"][0], rel=1e-5)

# %% [markdown]
# **Codebook 0 and the EOS rules.** The talker's vocabulary is codebook 0's 2048 codes, then control ids, all
# suppressed but the codec EOS (section 2's processors); EOS is masked while fewer than `min_new_tokens` tokens exist
# (a mask, not a resample). EOS, picked on codebook 0, ends the sequence: no frame is made for it.

# %%
eos = talker_sc.eos_id  # section 2's greedy talker settings
for step in (0, 1, 2):
    scores = sampling.process(logits0(h), [], step, talker_sc)
    print(f"step {step}: EOS (id {eos}) {scores[eos]:.3g}; {np.isfinite(scores).sum()} of {len(scores)} ids left")
c0 = sampling.sample(logits0(h), [], 0, talker_sc, np.random.default_rng(0))
check.equal("codebook 0 of frame 0 = golden", "token", c0, int(golden["codes"][0, 0]))

# %% [markdown]
# **Codebooks 1..15: the code predictor** prefills two positions, the talker's hidden state and codebook 0's
# embedding, and head 0 reads codebook 1. Each code is then embedded (table *s* for codebook *s+1*) and fed as one
# cached step, and head *s+1* reads the next: 14 steps. The frame's embedding, the sum of its 16 codebooks' rows,
# what the talker is fed next, is gathered on the way:

# %%
def acoustic_codes(h: np.ndarray, c0: int, rest: SamplerConfig, rng) -> tuple[list[int], np.ndarray]:
    """The frame's 16 codes after codebook 0 = c0, and its embedding (H,): the sum of the 16 codebooks' rows."""
    codes, embed = [c0], emb.codec([c0])[0]  # codebook 0's row of the talker's codec table
    out, p_cache = predictor.prefill(np.stack([h, embed])[None])  # (1, 2, H) rows in, (1, 2, h) out
    for s in range(GROUPS - 1):
        logits = heads.run([out[0, -1][None]], [s])[0][0]  # head s predicts codebook s+1
        codes.append(sampling.sample(logits, codes[1:], s, rest, rng))
        row = emb.acoustic(s, codes[-1])  # table s embeds codebook s+1
        embed = embed + row
        if s < GROUPS - 2:  # the last code needs no position of its own
            out = predictor.forward(row[None, None], p_cache)
    return codes, embed


rest = SamplerConfig.subtalker(Sampling(greedy=True), cfg)  # no penalty, no EOS, no suppression
frame0, embed0 = acoustic_codes(h, c0, rest, np.random.default_rng(0))
check.tokens_equal("frame 0, codebooks 0..15 = golden", np.array(frame0), golden["codes"][0])

# %% [markdown]
# **The next talker step** is one position: the frame's embedding plus the next row of trailing text (row 0 after
# frame 0; `tts_pad` once the text has run out), one step behind the codes. It gives step 1's logits:

# %%
def talker_step(embed: np.ndarray, t: int, prompt: Prompt, cache) -> np.ndarray:
    """The talker's hidden state (H,) after frame t, whose embedding is `embed`."""
    text = prompt.trailing[t] if t < len(prompt.trailing) else prompt.tts_pad
    return talker.forward((embed + text)[None, None], cache)[0, -1]


h1 = talker_step(embed0, 0, main_prompt, cache)
check.close("codebook-0 logits after frame 0 = reference (step 1)", logits0(h1), golden["logits"][1], rel=1e-5)

# %% [markdown]
# **The loop** is those pieces in turn until EOS or the frame cap, one random stream for every code it samples.
# It counts **frames**; the reference counts codebook-0 tokens (`max_new_tokens`), the last of which gets no frame:
# its 45 new tokens are at most 44 frames, so `max_frames` is `max_new_tokens - 1`.

# %%
def generate(prompt: Prompt, choice: Sampling, max_frames: int, eos_id: int | None = None):
    """One sequence to EOS or `max_frames` frames: its codes (T, 16) and every codebook-0 token (EOS included)."""
    first, rest = SamplerConfig.talker(choice, cfg, eos_id), SamplerConfig.subtalker(choice, cfg)
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


eos_step = lambda tokens, eos_id: len(tokens) - 1 if tokens[-1] == eos_id else -1  # noqa: E731  (-1: no EOS)
greedy = Sampling(greedy=True)
frames = inputs.GOLDEN_MAX_NEW_TOKENS - 1
codes, tokens = generate(main_prompt, greedy, frames)
check.tokens_equal("notebook loop == golden", codes, golden["codes"])
check.equal("notebook loop: EOS step = golden", "eos_step", eos_step(tokens, eos), int(golden["eos_step"]))
check.tokens_equal(f"notebook loop: codebook-0 tokens = the golden's first {frames} (its last has no frame)",
                   np.array(tokens[:frames]), golden["talker_sequences"][:frames])

# %%
agree = (codes == golden["codes"]).sum(1) if codes.shape == golden["codes"].shape else np.zeros(len(golden["codes"]))
fig, ax = plt.subplots(figsize=(9, 2.6))
ax.bar(range(len(agree)), agree, color=np.where(agree == 16, "tab:green", "crimson"))
ax.set(ylim=(0, 16.5), xlabel="frame", ylabel="codes equal (of 16)",
       title=f"the notebook's loop vs the PyTorch golden, per frame ({ckpt})");

# %% [markdown]
# The same loop on the ICL prompt, and with an EOS id that the greedy path emits mid-run (chapter 03's early-stop
# golden, its id set as `generate(eos_token_id=...)` sets it), so the stop branch runs too:

# %%
for label, (_, gold) in list(voices.items())[1:]:
    check.tokens_equal(f"notebook loop, {label} prompt == golden", generate(prompts[label], greedy, frames)[0],
                       gold["codes"])
early_id = int(early["eos_id"])
early_codes, early_tokens = generate(main_prompt, greedy, frames, eos_id=early_id)
print(f"eos id {early_id}: stopped after {len(early_codes)} frames at step {eos_step(early_tokens, early_id)}")
check.equal("early stop: EOS step = golden", "eos_step", eos_step(early_tokens, early_id), int(early["eos_step"]))
check.tokens_equal("early stop: codes = golden", early_codes, early["codes"])

# %% [markdown]
# ## 5. The runtime's `Loop` is this loop, batched
# `pipeline.loop.Loop` runs the same pieces in the same order for a list of sequences: `advance` makes one frame
# of each, every graph call taking one row per sequence, so the weights are read once for all. What `generate`
# keeps in locals, a sequence keeps in its `Sequence` (prompt, `Sampler` and its random stream, cache, hidden
# state, codes). Chapter 17 teaches the batching. One sequence alone gives the notebook's codes, greedy and sampled:

# %%
def loop_codes(prompt: Prompt, choice: Sampling, max_frames: int, eos_id: int | None = None) -> np.ndarray:
    return np.stack(synth.loop.run(prompt, Sampler(choice, cfg, eos_token_id=eos_id), max_frames).codes)


check.tokens_equal("runtime Loop = notebook loop (greedy)", loop_codes(main_prompt, greedy, frames), codes)
check.tokens_equal("runtime Loop = notebook loop (early stop)",
                   loop_codes(main_prompt, greedy, frames, early_id), early_codes)
check.tokens_equal("runtime Loop = notebook loop (sampled, the checkpoint's defaults, seed 0)", loop_codes(
    main_prompt, synth.sampling.replace(seed=0), 20), generate(main_prompt, synth.sampling.replace(seed=0), 20)[0])

# %% [markdown]
# ## 6. Decode the codes the way the reference does
# The reference decodes through `chunked_decode`: chunks of 300 frames, each with 25 frames of left context that are
# decoded and then dropped. The first chunk equals a one-shot decode, later ones do not (25 frames of context is far
# less than the transformer's reach), so a port that decodes in one shot disagrees with the reference on long outputs.

# %%
wav = synth.codec.decode(codes)
check.snr("waveform vs golden", wav, golden["wav"], 60.0)
out = save_wav(paths.outputs_dir(ckpt) / "07_ncnn.wav", wav)
display(Audio(wav, rate=SAMPLE_RATE))
plots.waveform({"PyTorch golden": golden["wav"], "ncnn runtime": wav});

# %%
T = 340  # past one chunk
long_codes = np.random.default_rng(3).integers(0, 2048, size=(T, 16))
with torch.inference_mode():
    ref_long = tts.model.speech_tokenizer.decode([{"audio_codes": torch.from_numpy(long_codes)}])[0][0]
ours_long = synth.codec.decode(long_codes)
one_shot = synth.codec.decode_once(long_codes)
tail = slice(300 * SAMPLES_PER_FRAME, None)
print(f"frames 300..{T}: chunked vs reference {check.snr_db(ours_long[tail], ref_long[tail]):.1f} dB, "
      f"one-shot vs reference {check.snr_db(one_shot[tail], ref_long[tail]):.1f} dB")
check.snr(f"chunked decode of {T} frames vs reference", ours_long, ref_long, 60.0)

# %% [markdown]
# All of this is one call, `Synthesizer.synthesize(text, language, voice, sampling, max_frames)`: prompt, loop, decode,
# the product's only pipeline (the CLI below runs exactly it).

# %%
product = synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, sampling=greedy, max_frames=frames)
check.tokens_equal("synthesize(): codes = golden", product.codes, golden["codes"])
check.snr("synthesize(): waveform vs golden", product.wav, golden["wav"], 60.0)

# %% [markdown]
# Without `sampling=`, `synthesize` samples with the checkpoint's defaults (`synth.sampling`, the reference's
# `generate_config`), as `qtts say` and `qtts serve` do: a fresh seed per call, as the reference draws. `result.seed`
# replays a take exactly (numpy's random stream is not torch's: sampled runs are compared by seed, never to a golden).

# %%
check.equal("runtime's default sampling = the reference's generate_config", "equal", synth.sampling == defaults, True)
say = lambda **kw: synth.synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, max_frames=20, **kw)
first, second = say(), say()  # (20, 16) codes each, or fewer on EOS
replay = say(sampling=synth.sampling.replace(seed=first.seed))  # the first take's seed, given back
same = lambda a, b: a.shape == b.shape and bool((a == b).all())
check.equal("sampled twice without a seed: other codes", "equal", same(first.codes, second.codes), False)
check.equal("sampled with the first take's seed: its codes again", "equal", same(replay.codes, first.codes), True)
check.equal("sampled vs greedy: other codes", "equal", same(first.codes, product.codes[: len(first.codes)]), False)

# %% [markdown]
# ## 7. The runtime imports no torch, and the CLI
# `qtts_lib.runtime` is the deployable product. The CLI runs it in a fresh process in which importing torch,
# transformers or qwen_tts raises — the same guard `tests/test_runtime_imports.py` uses. Like `synthesize`, `qtts say`
# samples by default; `--greedy` asks for the parity path.

# %%
cli_out = paths.outputs_dir(ckpt) / "07_cli.wav"
cli_voice = {"base": ["--voice", str(paths.voice_wav())], "custom_voice": ["--speaker", voice_args.get("speaker")],
             "voice_design": ["--instruct", voice_args.get("instruct")]}[synth.kind]
run = qtts_without_torch("say", "--checkpoint", str(model_dir), "--text", inputs.TARGET_TEXT,
                         "--language", inputs.LANGUAGE, "--greedy", "--max-frames", "20", "-o", str(cli_out),
                         "--threads", str(THREADS), *cli_voice)
print(run.stdout, run.stderr[-600:])
check.equal("qtts say with torch blocked", "exit status", run.returncode, 0)

# %% [markdown]
# Bad input ends in one clear line and a non-zero exit status, never a traceback from inside ncnn:

# %%
for label, extra in [("empty text", ["--text", "   "]),
                     ("unknown language", ["--text", "hi", "--language", "klingon"])]:
    args = ["say", "--checkpoint", str(model_dir), "-o", str(cli_out), "--language", "english"] + cli_voice + extra
    r = qtts_without_torch(*args)
    print(f"{label}: exit {r.returncode}: {r.stderr.strip()}")
    check.equal(f"CLI refuses {label}", "exit status", r.returncode, 2)

# %% [markdown]
# ## Summary
# - A pure-Python BPE, a numpy sampler in HF's processor order and a one-sequence loop written in this notebook over
#   the cached ncnn graphs reproduce the reference: every code of the golden runs and the EOS step.
# - The prompt is two tracks summed position by position; the rest of the text trails, one row per frame.
# - Per frame: codebook 0 from the codec head (control ids suppressed, EOS masked for the first steps, EOS ends the
#   sequence); the code predictor's prefill and 14 steps (head *s* predicts codebook *s+1*, table *s* embeds it);
#   the frame's 16 rows plus trailing text feed the next talker step. `max_frames` is the reference's
#   `max_new_tokens - 1`. The runtime's `Loop` is the same loop over a list of sequences (chapter 17).
# - Sampling is one `Sampling` object, by default the checkpoint's (a fresh seed per call, `result.seed` replays it);
#   parity with the goldens passes `Sampling(greedy=True)`. Decode in the reference's chunks (300 + 25 left context).
# - `qtts say` runs the whole thing with torch unimportable.
#
# **Artifacts left:** `data/outputs/<ckpt>/07_ncnn.wav`, `07_cli.wav`, `ncnn/talker_text_table.npy`, the chapter report.
#
# **If your numbers differ**
# - *Codes diverge at frame 0, codebook ≥ 1* → the code predictor's table/head offset (head *s* predicts codebook
#   *s+1*, table *s* embeds it).
# - *Codes diverge after the text runs out* → trailing text index (it starts at 0 on the first step)
#   or the `tts_pad` fallback.
# - *Diverge at step 0 or 1 only* → EOS masking by `min_new_tokens` (−inf, not "resample").
# - *`synthesize()` differs from the golden at frame 0 while the loops match* → no `sampling=Sampling(greedy=True)`:
#   the default samples.
# - *`Loop` differs from the notebook's loop only when sampled* → draws in another order (one stream a sequence).
# - *One frame more or fewer than the golden* → `max_new_tokens` passed as `max_frames` (frames = tokens − 1).
# - *Waveform fine for 300 frames, then ~60 dB* → one-shot decode instead of the reference's chunks.

# %%
check.table()

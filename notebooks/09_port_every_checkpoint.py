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
# # 09 · Port every checkpoint: built-in speakers, described voices, instructions, 1.7B
# > The method does not change; the speaker row, the prompt's first rows, a projection and a table width do.
#
# **You will:** speak with built-in speakers (CustomVoice), with an instruction, and in a voice described in words
# (VoiceDesign); find what 1.7B changes; match the reference token for token for every prompt kind; use `qtts export`.
# **You will learn:** how a built-in speaker, a dialect and an instruction enter the prompt; that 0.6B CustomVoice
# drops an instruction, as the reference does; why a talker wider than its code predictor needs no new loop.
#
# **You need:** nothing: `tiny-customvoice`, `tiny-1.7b-customvoice`, `tiny-voicedesign`, `tiny-1.7b-base` (talker
# 192 wide, predictor 128, as 1.7B's 2048 and 1024) and goldens are made if missing, whatever `QTTS_CHECKPOINT` says.
# **Leaves behind:** `data/outputs/<ckpt>/09_*` (a converted checkpoint, wavs), the chapter report.

# %%
import torch

from qtts_lib import check, checkpoint, export, inputs, paths, reference, settings
from qtts_lib.runtime import Sampling, Synthesizer

ckpt, THREADS = settings.checkpoint(), settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("09_port_every_checkpoint", ckpt)
SMALL, WIDE, DESIGN = "tiny-customvoice", "tiny-1.7b-customvoice", "tiny-voicedesign"
refs, synths = {}, {}
for name in (SMALL, WIDE, DESIGN, "tiny-1.7b-base"):
    refs[name] = reference.load(checkpoint.ensure(name), threads=THREADS)
    export.ensure(refs[name], name)  # chapters 04-05's graphs, reused when current
    synths[name] = Synthesizer(paths.model_dir(name), threads=THREADS)
GREEDY, FRAMES = Sampling(greedy=True), inputs.GOLDEN_MAX_NEW_TOKENS - 1
TEXT, LANG = inputs.TARGET_TEXT, inputs.LANGUAGE  # the goldens' text and language
show = reference.show_source  # prints the source lines holding a needle, with file:line

# %% [markdown]
# ## 1. Speak with built-in speakers (CustomVoice)
# A CustomVoice checkpoint has no speaker encoder: a speaker is a row of the talker's codec embedding (`spk_id` maps
# names to rows) where a clone's x-vector goes. Its prompt is **non-streaming**: 07's x-vector prompt fed text a token
# a frame as trailing text; here the whole text and `tts_eos` ride on `codec_pad` rows, `tts_pad + codec_bos` closes
# it, the trailing text is `tts_pad` alone. A dialect speaker's tag replaces the language only for Chinese and `auto`,
# so it runs with `auto`. Every speaker against the reference; then an unknown one, whose error must list the valid:

# %%
from qtts_lib.runtime.errors import InputError


def refusal(make_voice) -> str:
    try:
        make_voice()
    except InputError as e:
        return print(e) or str(e)  # print gives None, so: the message
    return ""

cv, cv_cfg = synths[SMALL], synths[SMALL].config.talker
print("speakers:", cv_cfg["spk_id"], "\nspk_is_dialect:", cv_cfg["spk_is_dialect"])
N = 16  # the reference's new tokens per voice (N - 1 frames)
for speaker in cv.speakers:
    language = "auto" if cv_cfg["spk_is_dialect"][speaker] else LANG
    ref = reference.capture_generation(refs[SMALL], TEXT, language, speaker=speaker,
                                       max_new_tokens=N)
    voice = cv.voice(speaker=speaker)
    prompt = cv.prompt(TEXT, language, voice)
    said = f"{speaker} ({language})"
    check.close(f"{said}: prompt = reference", prompt.embeds, ref["inputs_embeds"],
                rel=1e-5)
    ours = cv.synthesize(TEXT, language, voice, GREEDY, max_frames=N - 1)
    check.tokens_equal(f"{said}: all codes = reference", ours.codes, ref["codes"])
message = refusal(lambda: cv.voice(speaker="nobody"))
check.equal("unknown speaker refused with every valid name", "lists all",
            bool(message) and all(s in message for s in cv.speakers), True)

# %% [markdown]
# ## 2. Add an instruction, or describe the voice (VoiceDesign)
# An instruction is a user turn of its own, `<|im_start|>user\n{instruct}<|im_end|>\n`, tokenized alone and put **in
# front** of the prompt, text rows only: a style for a built-in speaker (`synth.voice(speaker=..., instruct=...)`). On
# VoiceDesign the instruction *is* the voice (`synth.voice(instruct=...)`), with no speaker row; an empty one lets the
# model pick. 07's `tracks` is `plots.prompt_cells` (non-streaming branch below): per track (text, codec), a `(label,
# row)` cell a position, `None` where empty. Four prompts (a speaker with and without `reference.STYLE`, a designed
# voice, none), their cells summed, held to the runtime's and the reference's (from a 2-token run), then drawn:

# %%
import numpy as np

from qtts_lib import plots

show(plots.prompt_cells, "# a built-in speaker", after=4)
speaker = synths[WIDE].speakers[0]
STYLED = dict(speaker=speaker, instruct=reference.STYLE)
PROMPTS = {"speaker": (WIDE, dict(speaker=speaker)),
           "speaker + instruction": (WIDE, STYLED),
           "designed voice": (DESIGN, dict(instruct=reference.DESIGNED_VOICE)),
           "no description": (DESIGN, dict(instruct=""))}
drawn, built = {}, {}
for label, (name, voice_args) in PROMPTS.items():
    synth, voice = synths[name], synths[name].voice(**voice_args)
    built[label] = prompt = synth.prompt(TEXT, LANG, voice)
    cells = plots.prompt_cells(synth, TEXT, LANG, voice)
    summed = np.stack([u[1] + (0 if d is None else d[1]) for u, d in zip(*cells[:2])])
    check.close(f"{label}: the picture, summed, = synth.prompt", summed, prompt.embeds,
                rel=1e-6)
    ref = reference.capture_generation(refs[name], TEXT, LANG, max_new_tokens=2,
                                       **voice_args)
    e, r = prompt.embeds, ref["inputs_embeds"]
    check.equal(f"{label}: prompt rows = reference", "rows", len(e), len(r))
    check.close(f"{label}: prompt embeddings = reference", e, r, rel=1e-5)
    check.close(f"{label}: trailing text = reference", prompt.trailing,
                ref["trailing_text_hidden"], rel=1e-5)
    drawn[label] = [[None if c is None else c[0] for c in track] for track in cells]
plots.prompt_tracks(drawn, title="non-streaming prompts: the whole text in the prompt");

# %% [markdown]
# The instruction adds exactly its own tokens, a designed voice has no speaker row, a clip on VoiceDesign is refused:

# %%
from qtts_lib.runtime import load_wav
from qtts_lib.runtime.pipeline.prompt import INSTRUCT

n = {label: len(p.embeds) for label, p in built.items()}

def instruction_rows(name: str, words: str) -> int:
    return len(refs[name].processor.tokenizer(INSTRUCT.format(words)).input_ids)

check.equal(f"{speaker} + instruction: prompt rows added = the instruction's tokens",
            "rows", n["speaker + instruction"] - n["speaker"],
            instruction_rows(WIDE, reference.STYLE))
check.equal("described - no description: prompt rows = the description's tokens",
            "rows", n["designed voice"] - n["no description"],
            instruction_rows(DESIGN, reference.DESIGNED_VOICE))
for label, words in (("described", reference.DESIGNED_VOICE), ("no description", "")):
    check.equal(f"{label}: no speaker row", "speaker_row is None",
                synths[DESIGN].voice(instruct=words).speaker_row is None, True)
said = refusal(lambda: synths[DESIGN].voice(wav=load_wav(paths.voice_wav())))
check.equal("a voice clip on VoiceDesign is refused, naming an instruction",
            "says instruction", "instruction" in said, True)

# %% [markdown]
# ## 3. Read what 1.7B changes in the config
# `checkpoint.model_config` writes every checkpoint's `config.json`: the hub's 0.6B file, with `SIZE_1_7B` (the 1.7B
# model cards' values) laid over the talker for 1.7B; VoiceDesign is CustomVoice's without speakers. A row for each of
# `paths.SYNTHETIC` (`tiny-*`, and `full-*`: full size, random weights): only the talker widens, the x-vector with it:

# %%
import inspect

import pandas as pd
from IPython.display import display

print(inspect.getsource(checkpoint.model_config), "\nSIZE_1_7B =", checkpoint.SIZE_1_7B)

SIZES = {"hidden": "hidden_size", "intermediate": "intermediate_size",
         "layers": "num_hidden_layers"}

def dims(size: str, variant: str, model_size: str) -> dict:
    c = checkpoint.model_config(size, variant, model_size)
    t, p = c["talker_config"], c["talker_config"]["code_predictor_config"]
    return ({f"talker {k}": t[v] for k, v in SIZES.items()}
            | {f"predictor {k}": p[v] for k, v in SIZES.items()}
            | {"heads / kv": f"{t['num_attention_heads']} / {t['num_key_value_heads']}",
               "x-vector (enc_dim)": c.get("speaker_encoder_config", {}).get("enc_dim"),
               "speakers": len(t["spk_id"]), "tts_model_size": c["tts_model_size"]})

configs = pd.DataFrame({name: dims(*spec) for name, spec in paths.SYNTHETIC.items()}).T
display(configs)
PUBLIC_1_7B = {"talker hidden": 2048, "talker intermediate": 6144, "talker layers": 28,
               "heads / kv": "16 / 8", "predictor hidden": 1024, "predictor layers": 5,
               "predictor intermediate": 3072, "tts_model_size": "1b7"}
for name in ("full-1.7b-base", "full-1.7b-customvoice", "full-1.7b-voicedesign"):
    wrong = [k for k, v in PUBLIC_1_7B.items() if configs.loc[name, k] != v]
    differ = ", ".join(wrong) or "none differ"
    check.equal(f"{name}: the public 1.7B dimensions ({differ})", "fields differing",
                len(wrong), 0)
check.equal("full-1.7b-base: x-vector as wide as the talker", "enc_dim",
            configs.loc["full-1.7b-base", "x-vector (enc_dim)"], 2048)

# %% [markdown]
# ## 4. Fold the projection into the code predictor
# The code predictor reads talker-wide rows (the talker's last hidden state, then codec embeddings). Where widths
# differ, qwen-tts puts a `Linear(talker hidden → predictor hidden, bias)` before its layers (0.6B: an `Identity`):

# %%
from qwen_tts.core.models import modeling_qwen3_tts as qm  # the reference's model

predictor_class = qm.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration
show(predictor_class.__init__, "hidden_size != talker_config.hidden_size", after=3)
show(predictor_class.forward, "small_to_mtp_projection")
proj = refs[WIDE].model.talker.code_predictor.small_to_mtp_projection
small_proj = refs[SMALL].model.talker.code_predictor.small_to_mtp_projection
check.equal("0.6B: the projection is an Identity", "type", type(small_proj).__name__,
            "Identity")
shape = f"{proj.in_features} {proj.out_features} {proj.bias is not None}"
check.equal(f"{WIDE}: Linear(192 -> 128, bias)", "in out bias", shape, "192 128 True")

# %% [markdown]
# The export wraps it into the same graph (`modules.talker.Decoder(proj=...)`), so `predictor_decoder` takes
# talker-wide rows and each position stays one graph call: chapter 07's loop is the same code on 0.6B and 1.7B. In
# the `.param` it is the first `Gemm` (a layer line: type, name, input and output counts, blobs, then `k=v` params):
# `9=` is K (192 in), `8=` is N (128 out), `10=4` a constant C of shape (1, N) added to every row, the bias (`-1`:
# none); its `.bin` weights are the projection's, bit for bit. Last, the whole graph against the reference module
# (`small_to_mtp_projection`, then the decoder layers) at its two lengths:

# %%
from qtts_lib import modules
from qtts_lib.runtime.binding.net import Net
from qtts_lib.runtime.binding.weights import split_bin

ncnn_dir = paths.ncnn_dir(WIDE)
param = (ncnn_dir / "predictor_decoder.param").read_text()
gemms = [line for line in param.splitlines() if line.startswith("Gemm")]
print(gemms[0], "\n", gemms[1], "   <- the first q_proj: 128 in, no bias")
fields = dict(p.split("=") for p in gemms[0].split()[6:])
check.equal("predictor_decoder: first Gemm is the projection (K N bias)", "9 8 10",
            f"{fields['9']} {fields['8']} {fields['10']}", "192 128 4")
blobs = split_bin(param, (ncnn_dir / "predictor_decoder.bin").read_bytes())
weight, bias = blobs[gemms[0].split()[1]]
same = (np.array_equal(weight.array(), proj.weight.detach().numpy().ravel())
        and np.array_equal(bias.array(), proj.bias.detach().numpy()))
check.equal("first Gemm's weight and bias = small_to_mtp_projection's", "bitwise equal",
            bool(same), True)
spec = modules.get("predictor_decoder")
net = Net(ncnn_dir, "predictor_decoder", threads=THREADS)
for length in spec.lengths:
    ins = spec.inputs(refs[WIDE], length, seed=1300 + length)  # (1, L, 192), mask, ...
    with torch.inference_mode():
        ref = spec.run_original(refs[WIDE], ins)["hidden"].numpy()  # (1, L, 128)
    ours = net(*[t.numpy() for t in ins.values()])[0]
    name = f"predictor_decoder with the projection, ncnn vs reference @ L={length}"
    check.close(name, ours, ref, rel=1e-5)

# %% [markdown]
# ## 5. Keep the acoustic tables talker-wide
# The predictor's 15 embedding tables (codebooks 1..15) are `embedding_dim`, the talker's width: the talker's next
# input sums the frame's 16 rows (07); the projection narrows them only on their way in. `Embeddings.acoustic_table`
# stacks them (codebook s+1 at rows `s·2048 + code`); `Embeddings.frame`, the sum, is held to the reference's lines:

# %%
show(predictor_class.__init__, "Qwen3TTSTalkerCodePredictorModel(")
show(qm.Qwen3TTSTalkerCodePredictorModel.__init__, "nn.Embedding(config.vocab_size")
show(qm.Qwen3TTSTalkerForConditionalGeneration.forward, "codec_hiddens = torch.cat",
     "code_predictor.get_input_emb", "codec_hiddens.sum")
emb, talker = synths[WIDE].embeddings, refs[WIDE].model.talker
width = synths[WIDE].config.talker["hidden_size"]
print(f"acoustic_table {emb.acoustic_table.shape}, codec_table {emb.codec_table.shape}")
check.equal("acoustic tables: (15 x 2048, talker hidden)", "shape",
            str(emb.acoustic_table.shape), str((30720, width)))
codes = np.random.default_rng(13).integers(0, 2048, size=(6, 16))  # (T, 16)
with torch.inference_mode():
    c = torch.from_numpy(codes)
    tables = talker.code_predictor.get_input_embeddings()  # the 15 acoustic tables
    parts = [talker.get_input_embeddings()(c[:, :1])]
    parts += [tables[i](c[:, i + 1:i + 2]) for i in range(15)]
    ref_frames = torch.cat(parts, dim=1).sum(1).numpy()  # (T, 192)
check.close("frame embeddings (codebook 0 + 15 tables) = reference", emb.frame(codes),
            ref_frames, max_abs=1e-6)

# %% [markdown]
# ## 6. Match the reference token for token, every prompt kind
# Chapter 03's greedy goldens (`golden.cases`: x-vector and ICL clones, a speaker with and without an instruction,
# a voice described and not) against the product path, `synthesize(..., GREEDY)`, each voice made by the runtime:

# %%
from qtts_lib import golden

results, rows = {}, []

def compare(name: str, case: str, voice, gold: dict) -> None:
    results[(name, case)] = result = synths[name].synthesize(
        TEXT, LANG, voice, GREEDY, max_frames=FRAMES, on_warning=print)
    extra = len(result.wav) - len(gold["wav"])  # ICL: one sample more (08's cut)
    key = f"{name} {case}"
    row = check.tokens_equal(f"{key}: codes = reference", result.codes, gold["codes"])
    check.equal(f"{key}: EOS step = reference", "eos_step", result.eos_step,
                int(gold["eos_step"]))
    snr = check.snr(f"{key}: waveform vs reference", result.wav[max(extra, 0):],
                    gold["wav"], 60.0)
    rows.append({"checkpoint": name, "prompt": case.removesuffix("_greedy"),
                 "voice": voice.mode, "instruction": bool(voice.instruct),
                 "frames": len(result.codes), "codes mismatched": row["value"],
                 "EOS step": result.eos_step, "wav SNR dB": snr["value"],
                 "warnings": len(result.warnings)})

for name in ("tiny-1.7b-base", WIDE, DESIGN):
    goldens = golden.ensure(name, refs[name])
    for case, a in golden.cases(refs[name]).items():
        voice = synths[name].voice(wav=a.get("voice_wav"), text=a.get("voice_text"),
                                   speaker=a.get("speaker"), instruct=a.get("instruct"))
        compare(name, case, voice, goldens[case])
check.equal(f"{WIDE} speaker_instruct_greedy: no warning (1.7B follows it)", "warnings",
            len(results[(WIDE, "speaker_instruct_greedy")].warnings), 0)

# %% [markdown]
# 0.6B CustomVoice drops an instruction in the reference (`generate_custom_voice`, below) and in the runtime, which
# says so (`Result.warnings`): its codes with one are the golden made without. Then this section's runs in a table,
# green where no code differs (`codes mismatched` reads mismatched/total):

# %%
show(reference.import_qwen_tts().Qwen3TTSModel.generate_custom_voice, "0b6")
voice_args = dict(speaker=cv.speakers[0], instruct=reference.STYLE)
ref = reference.capture_generation(refs[SMALL], TEXT, LANG, max_new_tokens=2,
                                   **voice_args)
plain = golden.ensure(SMALL, refs[SMALL])["speaker_greedy"]
check.equal("0.6B reference: prompt rows with an instruction = without", "rows",
            len(ref["inputs_embeds"]), len(plain["inputs_embeds"]))
check.equal(f"{SMALL}: follows instructions", "follows", cv.follows_instructions, False)
compare(SMALL, "speaker_instruct_dropped", cv.voice(**voice_args), plain)
check.equal("0.6B: the dropped instruction is reported", "warnings",
            len(results[(SMALL, "speaker_instruct_dropped")].warnings), 1)
matched = lambda v: "background: #cfc" if str(v).startswith("0/") else ""
parity = pd.DataFrame(rows).set_index(["checkpoint", "prompt"])
parity.style.format({"wav SNR dB": "{:.1f}"}).map(matched, subset=["codes mismatched"])

# %% [markdown]
# ## 7. Use them: `qtts export`, `qtts say`
# A checkpoint from the hub has no `ncnn/`. `qtts export DIR` is chapters 04-05 in one command (with torch, the `port`
# extra). On a copy of `tiny-1.7b-customvoice` as downloaded (no `ncnn/`, no manifest; hard-linked where one disk
# holds both), it must give the chapters' graphs bit for bit:

# %%
import os
import shutil
import subprocess
import sys

user_dir = paths.outputs_dir(ckpt) / "09_user_checkpoint"
shutil.rmtree(user_dir, ignore_errors=True)
user_dir.parent.mkdir(parents=True, exist_ok=True)
one_disk = os.stat(paths.model_dir(WIDE)).st_dev == os.stat(user_dir.parent).st_dev
shutil.copytree(paths.model_dir(WIDE), user_dir,
                copy_function=os.link if one_disk else shutil.copy2,
                ignore=shutil.ignore_patterns("ncnn", checkpoint.MANIFEST))
cli = [sys.executable, "-m", "qtts_lib.runtime.app.cli"]
run = subprocess.run([*cli, "export", str(user_dir), "--threads", str(THREADS)],
                     capture_output=True, text=True)
print(run.stdout or run.stderr[-2000:])
check.equal("qtts export DIR", "exit status", run.returncode, 0)
graphs = sorted(p.name for p in ncnn_dir.iterdir() if p.suffix in (".param", ".bin"))
same = [g for g in graphs
        if (user_dir / "ncnn" / g).read_bytes() == (ncnn_dir / g).read_bytes()]
check.equal(f"qtts export: the chapters' {len(graphs)} graph files, bit for bit",
            "equal files", len(same), len(graphs))

# %% [markdown]
# Then `qtts say`, torch blocked: a speaker with an instruction on the converted directory (= section 6's run); a
# speaker, a described voice and none; an instruction on Base, refused (exit 2). `qtts serve`: chapter 18.

# %%
from qtts_lib.isolation import qtts_without_torch

SAY = ("say", "--text", TEXT, "--language", LANG, "--greedy", "--threads", str(THREADS),
       "--max-frames", str(FRAMES))

def say(label: str, model: os.PathLike, *args: str) -> int:
    out = paths.outputs_dir(ckpt) / f"09_say_{label}.wav"
    r = qtts_without_torch(*SAY, "--checkpoint", str(model), "-o", str(out), *args)
    print(r.stdout.strip() if r.returncode == 0 else r.stderr.strip()[-600:])
    return r.returncode

styled = say("instruct", user_dir, "--speaker", speaker, "--instruct", reference.STYLE)
check.equal("qtts say --instruct, torch blocked", "exit status", styled, 0)
check.snr("qtts say --instruct = synthesize(speaker + instruction)",
          load_wav(paths.outputs_dir(ckpt) / "09_say_instruct.wav"),
          results[(WIDE, "speaker_instruct_greedy")].wav, 60.0)
runs = {"speaker": [SMALL, "--speaker", cv.speakers[0]], "design_plain": [DESIGN],
        "design": [DESIGN, "--instruct", reference.DESIGNED_VOICE]}
for label, (name, *args) in runs.items():
    status = say(label, paths.model_dir(name), *args)
    check.equal(f"qtts say ({label}) with torch blocked", "exit status", status, 0)
refused = say("refused", paths.model_dir("tiny-1.7b-base"), "--voice",
              str(paths.voice_wav()), "--instruct", reference.STYLE)
check.equal("qtts say --instruct on a Base checkpoint", "exit status", refused, 2)

# %% [markdown]
# ## Summary
# - A built-in speaker is a codec-embedding row where a clone's x-vector goes; a dialect switches the language tag.
#   An instruction is a user turn in front of the prompt; a designed voice is that alone; 0.6B drops it, warning.
# - 1.7B widens the talker only; `small_to_mtp_projection` is the exported `predictor_decoder`'s first Gemm and the
#   15 tables are talker-wide: 07's loop is unchanged. Every prompt kind matches the reference token for token;
#   `qtts export DIR` makes the chapters' graphs; `qtts say --instruct` speaks with torch blocked.
#
# **Artifacts left:** `data/outputs/<ckpt>/09_user_checkpoint/` (a converted copy), `09_say_*.wav`, the report.
#
# **If your numbers differ**
# - *A dialect speaker diverges* → the language tag was not switched to the dialect id.
# - *Prompt rows off by the instruction's* → dropped where `follows_instructions` holds, given a codec track,
#   tokenized with the text, or in another template. *One row too many on VoiceDesign* → a speaker row.
# - *192-vs-128 shape error, or 1.7B codes off at codebook ≥ 1* → projection lost or doubled, tables predictor-wide.
# - *`qtts export` graphs differ from the chapters'* → another pnnx or torch version (see the manifests).

# %%
check.table()

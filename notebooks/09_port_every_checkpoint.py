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
# > The method does not change. What does: the speaker row, the prompt's first rows, a projection and the width of
# > the predictor's tables.
#
# **You will:** speak with every built-in speaker (CustomVoice), with an instruction, and in a voice described in
# words (VoiceDesign), and draw those prompts; find what 1.7B changes (a projection folded into the code predictor,
# talker-wide tables); match the reference token for token for every prompt kind; use `qtts export`, `qtts say
# --instruct` and `instructions` in `qtts serve`; read the full-size 1.7B parity report.
#
# **You will learn:** how a built-in speaker and a dialect enter the prompt; where an instruction goes (first, text
# only) and why a designed voice has no speaker row; that 0.6B CustomVoice drops an instruction, in the reference and
# here; why a talker wider than its code predictor needs no change in the runtime's loop.
#
# **You need:** nothing: `tiny-customvoice`, `tiny-1.7b-customvoice`, `tiny-voicedesign`, `tiny-1.7b-base` (talker
# 192 wide, predictor 128, as 1.7B's 2048 and 1024) and their goldens are made here if missing (chapters 00, 03-05),
# whatever `QTTS_CHECKPOINT` says; the report goes to that checkpoint's folder.
# **Leaves behind:** `data/outputs/<ckpt>/08_*` (a converted checkpoint, wavs), the chapter report.

# %%
import importlib
import inspect
import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from IPython.display import display
from starlette.testclient import TestClient

from qtts_lib import check, checkpoint, export, golden, inputs, modules, paths, plots, reference, settings
from qtts_lib.isolation import qtts_without_torch
from qtts_lib.runtime import Sampling, Synthesizer, load_wav, stream_long
from qtts_lib.runtime.app import server
from qtts_lib.runtime.audio.wav import pcm16
from qtts_lib.runtime.binding.net import Net
from qtts_lib.runtime.binding.weights import split_bin
from qtts_lib.runtime.errors import InputError
from qtts_lib.runtime.pipeline.prompt import END_TOKENS, INSTRUCT, ROLE_TOKENS

ckpt = settings.checkpoint()
THREADS = settings.threads()
torch.set_num_threads(THREADS)
report = check.begin("09_port_every_checkpoint", ckpt)
qwen_tts = reference.import_qwen_tts()
qm = importlib.import_module("qwen_tts.core.models.modeling_qwen3_tts")  # the reference's model code
SMALL, WIDE, DESIGN = "tiny-customvoice", "tiny-1.7b-customvoice", "tiny-voicedesign"
refs, synths = {}, {}
for name in (SMALL, WIDE, DESIGN, "tiny-1.7b-base"):
    refs[name] = reference.load(checkpoint.ensure(name), threads=THREADS)
    export.ensure(refs[name], name)  # chapters 04-05's graphs, reused when current
    synths[name] = Synthesizer(paths.model_dir(name), threads=THREADS)
GREEDY, FRAMES = Sampling(greedy=True), inputs.GOLDEN_MAX_NEW_TOKENS - 1
print(f"qwen-tts {metadata.version('qwen-tts')} | {THREADS} threads | report for {ckpt}")


def show(obj, *needles: str, after: int = 0) -> None:
    """The lines of `obj`'s source that hold a needle (and `after` lines below each), with file and line number."""
    obj = inspect.unwrap(obj)  # past decorators (torch.no_grad, can_return_tuple) to the function itself
    src, first = inspect.getsourcelines(obj)
    keep = sorted({i + k for i, line in enumerate(src) if any(n in line for n in needles) for k in range(after + 1)})
    for i in keep:
        print(f"{Path(inspect.getsourcefile(obj)).name}:{first + i}  {src[i].rstrip()}")


def refusal(make_voice) -> str:
    """The message a bad voice is refused with ("" if it was not refused)."""
    try:
        make_voice()
    except InputError as e:
        print(e)
        return str(e)
    return ""

# %% [markdown]
# ## 1. Speak with built-in speakers (CustomVoice)
# A CustomVoice checkpoint has no speaker encoder: a speaker is a row of the talker's codec embedding (`spk_id` in
# the config) where a clone's x-vector goes. The prompt is **non-streaming**: the whole text and `tts_eos` ride on
# `codec_pad` rows, `tts_pad + codec_bos` closes it, and the trailing text is `tts_pad` alone. A dialect speaker
# switches the language tag to its dialect for Chinese and auto. Every speaker, against the reference:

# %%
cv_cfg = synths[SMALL].config.talker
print("speakers:", cv_cfg["spk_id"], "\ndialect speakers:", {s: d for s, d in cv_cfg["spk_is_dialect"].items() if d})
N = 16  # the reference's new tokens per voice (N - 1 frames)
for speaker in synths[SMALL].speakers:
    language = "auto" if cv_cfg["spk_is_dialect"][speaker] else inputs.LANGUAGE
    ref = reference.capture_generation(refs[SMALL], inputs.TARGET_TEXT, language, speaker=speaker, max_new_tokens=N)
    voice = synths[SMALL].voice(speaker=speaker)
    check.close(f"{speaker} ({language}): prompt = reference", synths[SMALL].prompt(inputs.TARGET_TEXT, language,
                voice).embeds, ref["inputs_embeds"], rel=1e-5)
    ours = synths[SMALL].synthesize(inputs.TARGET_TEXT, language, voice, GREEDY, max_frames=N - 1)
    check.tokens_equal(f"{speaker} ({language}): all codes = reference", ours.codes, ref["codes"])
message = refusal(lambda: synths[SMALL].voice(speaker="nobody"))
check.equal("unknown speaker refused with every valid name", "lists all",
            bool(message) and all(s in message for s in synths[SMALL].speakers), True)

# %% [markdown]
# ## 2. Add an instruction, or describe the voice (VoiceDesign)
# An instruction is a user turn of its own, `<|im_start|>user\n{instruct}<|im_end|>\n`, tokenized alone and put **in
# front** of the prompt, text rows only: a style for a built-in speaker (`synth.voice(speaker=..., instruct=...)`).
# A VoiceDesign checkpoint has no speaker encoder and no speakers: the instruction *is* the voice
# (`synth.voice(instruct=...)`), and the codec track has no speaker row; an empty description lets the model pick.
# `tracks` lays a non-streaming prompt out cell by cell, as chapter 07 laid out the clones'. Four prompts, each
# re-summed from its cells (= the runtime's prompt) and held to the reference's: a speaker with and without an
# instruction (`reference.STYLE`), a designed voice (`reference.DESIGNED_VOICE`) and no description. The instruction
# adds exactly its own tokens, and a voice clip given to a VoiceDesign checkpoint is refused.

# %%
def tracks(synth: Synthesizer, prompt, voice, language: str) -> tuple[list, list]:
    """A non-streaming prompt's text track and codec track: one (label, row) cell per position, None for nothing."""
    e, ids, c, top = synth.embeddings, prompt.text_ids, synth.config.talker, synth.config.config
    text = lambda label, tokens: [(label, row) for row in e.text(tokens)]  # noqa: E731
    codec = lambda label, tokens: [(label, row) for row in e.codec(tokens)]  # noqa: E731
    special = lambda label: text(label, [top[f"{label}_token_id"]])  # noqa: E731
    instruct = (text("instruction", synth.tokenizer.encode_template(INSTRUCT, voice.instruct))
                if voice.instruct and synth.follows_instructions else [])
    speaker = [] if voice.speaker_row is None else [("speaker", voice.speaker_row)]
    voice_rows = (codec("codec tag", synth.prompts.codec_tags(language, voice.speaker)) + speaker
                  + codec("codec_pad", [c["codec_pad_id"]]))
    words = text("text", ids[ROLE_TOKENS:-END_TOKENS]) + special("tts_eos")
    upper = (instruct + text("role", ids[:ROLE_TOKENS]) + special("tts_pad") * (len(voice_rows) - 1)
             + special("tts_bos") + words + special("tts_pad"))
    lower = ([None] * (len(instruct) + ROLE_TOKENS) + voice_rows + codec("codec_pad", [c["codec_pad_id"]]) * len(words)
             + codec("codec_bos", [c["codec_bos_id"]]))
    return upper, lower

# %%
speaker = synths[WIDE].speakers[0]
PROMPTS = {"speaker": (WIDE, dict(speaker=speaker)),
           "speaker + instruction": (WIDE, dict(speaker=speaker, instruct=reference.STYLE)),
           "designed voice": (DESIGN, dict(instruct=reference.DESIGNED_VOICE)),
           "no description": (DESIGN, dict(instruct=""))}
drawn, built = {}, {}
for label, (name, voice_args) in PROMPTS.items():
    synth, voice = synths[name], synths[name].voice(**voice_args)
    built[label] = prompt = synth.prompt(inputs.TARGET_TEXT, inputs.LANGUAGE, voice)
    upper, lower = tracks(synth, prompt, voice, inputs.LANGUAGE)
    summed = np.stack([u[1] + (0 if d is None else d[1]) for u, d in zip(upper, lower)])
    check.close(f"{label}: the picture, summed, = synth.prompt", summed, prompt.embeds, rel=1e-6)
    ref = reference.capture_generation(refs[name], inputs.TARGET_TEXT, inputs.LANGUAGE, max_new_tokens=2, **voice_args)
    check.equal(f"{label}: prompt rows = reference", "rows", len(prompt.embeds), len(ref["inputs_embeds"]))
    check.close(f"{label}: prompt embeddings = reference", prompt.embeds, ref["inputs_embeds"], rel=1e-5)
    check.close(f"{label}: trailing text = reference", prompt.trailing, ref["trailing_text_hidden"], rel=1e-5)
    drawn[label] = [[None if cell is None else cell[0] for cell in t] for t in (upper, lower, ["tts_pad"])]
plots.prompt_tracks(drawn, title="non-streaming prompts: the whole text in the prompt, trailing text tts_pad alone");

# %%
instruction_rows = lambda name, words: len(refs[name].processor.tokenizer(INSTRUCT.format(words)).input_ids)  # noqa: E731
check.equal(f"{speaker} + instruction: prompt rows added = the instruction's tokens", "rows",
            len(built["speaker + instruction"].embeds) - len(built["speaker"].embeds),
            instruction_rows(WIDE, reference.STYLE))
check.equal("described - no description: prompt rows = the description's tokens", "rows",
            len(built["designed voice"].embeds) - len(built["no description"].embeds),
            instruction_rows(DESIGN, reference.DESIGNED_VOICE))
for label, words in (("described", reference.DESIGNED_VOICE), ("no description", "")):
    check.equal(f"{label}: no speaker row", "speaker_row is None", synths[DESIGN].voice(instruct=words).speaker_row
                is None, True)
check.equal("a voice clip on VoiceDesign is refused, naming an instruction", "says instruction",
            "instruction" in refusal(lambda: synths[DESIGN].voice(wav=load_wav(paths.voice_wav()))), True)

# %% [markdown]
# ## 3. Read what 1.7B changes in the config
# `checkpoint.model_config(size, variant, model_size)` writes every checkpoint's `config.json`: the real 0.6B file
# (`qtts_lib/configs/`, the hub's), with `checkpoint.SIZE_1_7B` (the 1.7B model cards' `config.json` values) laid
# over the talker for 1.7B; VoiceDesign is CustomVoice's file without speakers. One row per checkpoint: only the
# talker widens; the code predictor stays 0.6B's, and the x-vector follows the talker. The model cards' numbers:

# %%
print(inspect.getsource(checkpoint.model_config))
print("SIZE_1_7B =", checkpoint.SIZE_1_7B, "| TINY_1_7B_TALKER =", checkpoint.TINY_1_7B_TALKER)


def dims(size: str, variant: str, model_size: str) -> dict:
    c = checkpoint.model_config(size, variant, model_size)
    t, p = c["talker_config"], c["talker_config"]["code_predictor_config"]
    return {"talker hidden": t["hidden_size"], "talker intermediate": t["intermediate_size"], "talker layers":
            t["num_hidden_layers"], "heads / kv": f"{t['num_attention_heads']} / {t['num_key_value_heads']}",
            "predictor hidden": p["hidden_size"], "predictor intermediate": p["intermediate_size"],
            "predictor layers": p["num_hidden_layers"], "x-vector (enc_dim)": c.get("speaker_encoder_config",
            {}).get("enc_dim", "—"), "speakers": len(t["spk_id"]), "tts_model_size": c["tts_model_size"]}


configs = pd.DataFrame({name: dims(*spec) for name, spec in paths.SYNTHETIC.items()}).T
display(configs.style.map(lambda v: "font-weight: bold", subset=["talker hidden", "x-vector (enc_dim)"]))
PUBLIC_1_7B = {"talker hidden": 2048, "talker intermediate": 6144, "talker layers": 28, "heads / kv": "16 / 8",
               "predictor hidden": 1024, "predictor intermediate": 3072, "predictor layers": 5, "tts_model_size": "1b7"}
for name in ("full-1.7b-base", "full-1.7b-customvoice", "full-1.7b-voicedesign"):
    wrong = [k for k, v in PUBLIC_1_7B.items() if configs.loc[name, k] != v]
    check.equal(f"{name}: the public 1.7B dimensions ({', '.join(wrong) or 'none differ'})", "fields differing",
                len(wrong), 0)
check.equal("full-1.7b-base: x-vector as wide as the talker", "enc_dim",
            configs.loc["full-1.7b-base", "x-vector (enc_dim)"], 2048)

# %% [markdown]
# ## 4. Fold the projection into the code predictor
# The code predictor reads talker-wide rows (the talker's last hidden state, then codec embeddings). Where its own
# width differs, qwen-tts puts a `Linear(talker hidden → predictor hidden, bias)` in front of its layers, and an
# `Identity` where they agree (every 0.6B checkpoint):

# %%
predictor_class = qm.Qwen3TTSTalkerCodePredictorModelForConditionalGeneration
show(predictor_class.__init__, "hidden_size != talker_config.hidden_size", after=3)
show(predictor_class.forward, "small_to_mtp_projection")
projection = refs[WIDE].model.talker.code_predictor.small_to_mtp_projection
check.equal("0.6B: the projection is an Identity", "type",
            type(refs[SMALL].model.talker.code_predictor.small_to_mtp_projection).__name__, "Identity")
check.equal(f"{WIDE}: Linear(192 -> 128, bias)", "in out bias",
            f"{projection.in_features} {projection.out_features} {projection.bias is not None}", "192 128 True")

# %% [markdown]
# The export wraps it into the same graph (`modules.talker.Decoder(proj=...)`: the projection first, then the
# layers), so `predictor_decoder` takes talker-wide rows and the runtime feeds it exactly what it fed on 0.6B. In the
# `.param` it is the first `Gemm`, before the first `RMSNorm`: `9=` is K (192 in), `8=` is N (128 out), `10=4` a
# constant C of shape (1, N) added to every row, the bias (`-1`: none). Its weights in the `.bin` are the
# projection's, bit for bit. Folded, the projection's one Gemm runs inside the call the predictor makes for that row
# anyway: each position stays one graph call, and chapter 07's loop is the same code on 0.6B and 1.7B. Last, the
# whole graph against the reference module (`small_to_mtp_projection`, then the decoder layers) at two lengths:

# %%
ncnn_dir = paths.ncnn_dir(WIDE)
param = (ncnn_dir / "predictor_decoder.param").read_text()
gemms = [line for line in param.splitlines() if line.startswith("Gemm")]
print(gemms[0], "\n", gemms[1], "   <- the first q_proj: 128 in, no bias")
fields = dict(p.split("=") for p in gemms[0].split()[6:])
check.equal("predictor_decoder: first Gemm is the projection (K N bias)", "9 8 10",
            f"{fields['9']} {fields['8']} {fields['10']}", "192 128 4")
weight, bias = split_bin(param, (ncnn_dir / "predictor_decoder.bin").read_bytes())[gemms[0].split()[1]]
same = (np.array_equal(weight.array(), projection.weight.detach().numpy().ravel())
        and np.array_equal(bias.array(), projection.bias.detach().numpy()))
check.equal("first Gemm's weight and bias = small_to_mtp_projection's", "bitwise equal", bool(same), True)
spec, net = modules.get("predictor_decoder"), Net(ncnn_dir, "predictor_decoder", threads=THREADS)
for length in spec.lengths:
    ins = spec.inputs(refs[WIDE], length, seed=1300 + length)  # inputs_embeds (1, L, 192), mask, cos, sin
    with torch.inference_mode():
        ref = spec.run_original(refs[WIDE], ins)["hidden"].numpy()  # (1, L, 128)
    ours = net(*[t.numpy() for t in ins.values()])[0]
    check.close(f"predictor_decoder with the projection, ncnn vs reference @ L={length}", ours, ref, rel=1e-5)

# %% [markdown]
# ## 5. Keep the acoustic tables talker-wide
# The code predictor's 15 tables (codebooks 1..15) are `embedding_dim` wide, the talker's width: the talker's next
# input sums the frame's 16 rows (chapter 07), so all are talker-wide; section 4's projection narrows them only on
# their way into the predictor. The runtime holds the 15 in one array, `Embeddings.acoustic_table` (row
# `s·2048 + code`); `Embeddings.frame` is the sum, checked against the reference's lines on random codes:

# %%
show(predictor_class.__init__, "Qwen3TTSTalkerCodePredictorModel(")
show(qm.Qwen3TTSTalkerCodePredictorModel.__init__, "nn.Embedding(config.vocab_size, embedding_dim)")
show(qm.Qwen3TTSTalkerForConditionalGeneration.forward, "codec_hiddens = torch.cat", "code_predictor.get_input_emb",
     "codec_hiddens.sum")
emb, talker = synths[WIDE].embeddings, refs[WIDE].model.talker
width = synths[WIDE].config.talker["hidden_size"]
print(f"acoustic_table {emb.acoustic_table.shape}, codec_table {emb.codec_table.shape}")
check.equal("acoustic tables: (15 x 2048, talker hidden)", "shape", str(emb.acoustic_table.shape), str((30720, width)))
codes = np.random.default_rng(13).integers(0, 2048, size=(6, 16))  # (T, 16)
with torch.inference_mode():
    c = torch.from_numpy(codes)
    tables = talker.code_predictor.get_input_embeddings()  # the 15 acoustic tables
    parts = [talker.get_input_embeddings()(c[:, :1])] + [tables[i](c[:, i + 1:i + 2]) for i in range(15)]
    ref_frames = torch.cat(parts, dim=1).sum(1).numpy()  # (T, 192)
check.close("frame embeddings (codebook 0 + 15 tables) = reference", emb.frame(codes), ref_frames, max_abs=1e-6)

# %% [markdown]
# ## 6. Match the reference token for token, every prompt kind
# Chapter 03's greedy goldens (`golden.cases`: x-vector and ICL clones, a speaker with and without an instruction,
# a voice described and not) against the product path, `synthesize(..., Sampling(greedy=True))`, each voice made
# by the runtime itself:

# %%
def compare(name: str, case: str, voice, gold: dict) -> None:
    result = synths[name].synthesize(inputs.TARGET_TEXT, inputs.LANGUAGE, voice, GREEDY, max_frames=FRAMES,
                                     on_warning=lambda w: print(f"warning: {w}"))
    results[(name, case)] = result
    extra = len(result.wav) - len(gold["wav"])  # ICL: one sample more (the reference's float-ratio cut, chapter 08)
    row = check.tokens_equal(f"{name} {case}: codes = reference", result.codes, gold["codes"])
    check.equal(f"{name} {case}: EOS step = reference", "eos_step", result.eos_step, int(gold["eos_step"]))
    snr = check.snr(f"{name} {case}: waveform vs reference", result.wav[max(extra, 0):], gold["wav"], 60.0)
    rows.append({"checkpoint": name, "prompt": case.removesuffix("_greedy"), "voice": voice.mode,
                 "instruction": bool(voice.instruct), "frames": len(result.codes), "codes mismatched": row["value"],
                 "EOS step": result.eos_step, "wav SNR dB": snr["value"], "warnings": len(result.warnings)})


results, rows = {}, []
for name in ("tiny-1.7b-base", WIDE, DESIGN):
    goldens = golden.ensure(name, refs[name])
    for case, args in golden.cases(refs[name]).items():
        voice = synths[name].voice(wav=args.get("voice_wav"), text=args.get("voice_text"),
                                   speaker=args.get("speaker"), instruct=args.get("instruct"))
        compare(name, case, voice, goldens[case])
check.equal(f"{WIDE} speaker_instruct_greedy: no warning (1.7B follows it)", "warnings",
            len(results[(WIDE, "speaker_instruct_greedy")].warnings), 0)

# %% [markdown]
# On 0.6B CustomVoice the reference drops an instruction (`generate_custom_voice`, the line below). The runtime drops
# it too (`ModelConfig.follows_instructions`) and says so (`on_warning`, `Result.warnings`): its codes with the
# instruction are the golden made without.

# %%
show(qwen_tts.Qwen3TTSModel.generate_custom_voice, "0b6")
voice_args = dict(speaker=synths[SMALL].speakers[0], instruct=reference.STYLE)
ref = reference.capture_generation(refs[SMALL], inputs.TARGET_TEXT, inputs.LANGUAGE, max_new_tokens=2, **voice_args)
plain = golden.ensure(SMALL, refs[SMALL])["speaker_greedy"]
check.equal("0.6B reference: prompt rows with an instruction = without", "rows", len(ref["inputs_embeds"]),
            len(plain["inputs_embeds"]))
check.equal(f"{SMALL}: follows instructions", "follows", synths[SMALL].follows_instructions, False)
compare(SMALL, "speaker_instruct_dropped", synths[SMALL].voice(**voice_args), plain)
check.equal("0.6B: the dropped instruction is reported", "warnings", len(results[(SMALL,
            "speaker_instruct_dropped")].warnings), 1)

# %%
parity = pd.DataFrame(rows).set_index(["checkpoint", "prompt"])
parity.style.format({"wav SNR dB": "{:.1f}"}).map(lambda v: "background: #cfc" if str(v).startswith("0/") else "",
                                                  subset=["codes mismatched"])

# %% [markdown]
# ## 7. Use them: `qtts export`, `qtts say`, `qtts serve`
# A checkpoint from the hub has no `ncnn/` folder. `qtts export DIR` is chapters 04-05 in one command
# (`qtts_lib/export/command.py`); it needs torch (the `port` extra). Here it converts a copy of
# `tiny-1.7b-customvoice` as a download looks (hard links, no `ncnn/`, no manifest of this project's):

# %%
user_dir = paths.outputs_dir(ckpt) / "09_user_checkpoint"
shutil.rmtree(user_dir, ignore_errors=True)
user_dir.parent.mkdir(parents=True, exist_ok=True)
one_disk = os.stat(paths.model_dir(WIDE)).st_dev == os.stat(user_dir.parent).st_dev  # hard links where they can be
shutil.copytree(paths.model_dir(WIDE), user_dir, ignore=shutil.ignore_patterns("ncnn", checkpoint.MANIFEST),
                copy_function=os.link if one_disk else shutil.copy2)
run = subprocess.run([sys.executable, "-m", "qtts_lib.runtime.app.cli", "export", str(user_dir),
                      "--threads", str(THREADS)], capture_output=True, text=True)
print(run.stdout or run.stderr[-2000:])
check.equal("qtts export DIR", "exit status", run.returncode, 0)
graphs = sorted(p.name for p in ncnn_dir.iterdir() if p.suffix in (".param", ".bin"))
same = [g for g in graphs if (user_dir / "ncnn" / g).read_bytes() == (ncnn_dir / g).read_bytes()]
check.equal(f"qtts export: the chapters' {len(graphs)} graph files, bit for bit", "equal files", len(same), len(graphs))

# %% [markdown]
# Then the runtime, torch blocked: a speaker with an instruction on the converted directory (section 6's run); a
# speaker, a described voice and none (`--instruct` describes); an instruction on Base, refused in one line:

# %%
def say(label: str, *args: str):
    """`qtts say`, greedy, in a process where torch cannot be imported, into data/outputs/<ckpt>/09_say_<label>.wav."""
    r = qtts_without_torch("say", "--text", inputs.TARGET_TEXT, "--language", inputs.LANGUAGE, "--greedy", "--threads",
                           str(THREADS), "--max-frames", str(FRAMES), "-o",
                           str(paths.outputs_dir(ckpt) / f"09_say_{label}.wav"), *args)
    print(r.stdout.strip() if r.returncode == 0 else r.stderr.strip()[-600:])
    return r


styled = say("instruct", "--checkpoint", str(user_dir), "--speaker", speaker, "--instruct", reference.STYLE)
check.equal("qtts say --instruct, torch blocked", "exit status", styled.returncode, 0)
check.snr("qtts say --instruct = synthesize(speaker + instruction)", load_wav(paths.outputs_dir(ckpt) /
          "09_say_instruct.wav"), results[(WIDE, "speaker_instruct_greedy")].wav, 60.0)
for label, (name, *args) in {"speaker": [SMALL, "--speaker", synths[SMALL].speakers[0]], "design_plain": [DESIGN],
                             "design": [DESIGN, "--instruct", reference.DESIGNED_VOICE]}.items():
    check.equal(f"qtts say ({label}) with torch blocked", "exit status",
                say(label, "--checkpoint", str(paths.model_dir(name)), *args).returncode, 0)
refused = say("refused", "--checkpoint", str(paths.model_dir("tiny-1.7b-base")), "--voice", str(paths.voice_wav()),
              "--instruct", reference.STYLE)
check.equal("qtts say --instruct on a Base checkpoint", "exit status", refused.returncode, 2)

# %% [markdown]
# `qtts serve` (chapter 18) takes OpenAI's `instructions` field: a style for a built-in speaker on 1.7B, the voice
# itself on VoiceDesign (voice `design`). Where the checkpoint cannot follow one the request is **refused** with a
# 400 naming `instructions`, before any audio: a server cannot show a client a warning, so it does not drop silently
# what `synthesize` drops with one. `/v1/models` says which it is. One live request per case, in process:

# %%
def ask(name: str, body: dict):
    engine = server.Engine(synths[name], None, max_frames=8, chunk_frames=4, queue_places=2)
    client = TestClient(server.build_app(engine, name))
    answer, listed = client.post("/v1/audio/speech", json=body), client.get("/v1/models").json()
    engine.stop()
    print(f"{name}: {answer.status_code}, /v1/models instructions={listed['data'][0]['qtts']['instructions']}")
    return answer


body = {"input": inputs.TARGET_TEXT, "language": "english", "greedy": True, "response_format": "pcm"}
styled = ask(WIDE, body | {"voice": speaker, "instructions": reference.STYLE})
spoken = np.concatenate(list(stream_long(synths[WIDE], inputs.TARGET_TEXT, "english", synths[WIDE].voice(
    speaker=speaker, instruct=reference.STYLE), synths[WIDE].sampling.replace(greedy=True), max_frames=8)))
check.equal("serve: instructions reach the prompt (pcm = stream_long with the instruction)", "equal",
            styled.content == pcm16(spoken), True)
designed = ask(DESIGN, body | {"voice": "design", "instructions": reference.DESIGNED_VOICE})
check.equal("serve, VoiceDesign: voice 'design' with instructions", "status", designed.status_code, 200)
small_answer = ask(SMALL, body | {"voice": synths[SMALL].speakers[0], "instructions": reference.STYLE})
print(json.dumps(small_answer.json())[:260])
check.equal("serve, 0.6B CustomVoice: instructions refused", "status param",
            f"{small_answer.status_code} {small_answer.json()['error']['param']}", "400 instructions")

# %% [markdown]
# ## 8. Read the full-size parity report
# Tiny checkpoints prove the code paths; full-size 1.7B runs, too big for this machine, prove real widths and memory:
# committed under `data/bench/parity/`, read as they are (no check: they cannot fail).

# %%
COLUMNS = ["case", "frames", "codes_compared", "codes_mismatched", "eos_step", "prompt_rel_err", "wav_snr_db"]
for path in sorted((paths.DATA / "bench" / "parity").glob("*.json")):
    run = json.loads(path.read_text())
    print(f"{path.name}: {run['checkpoint']} on {run['machine']['cpu']} ({run['machine']['cores']} cores)")
    display(pd.DataFrame(run["parity"]).reindex(columns=COLUMNS))
    if "align" in run:  # every exported graph against its module, at two lengths
        display(pd.DataFrame(run["align"]).set_index(["module", "length"]))

# %% [markdown]
# ## Summary
# - A built-in speaker is a codec-embedding row where a clone's x-vector goes, in a non-streaming prompt; a dialect
#   speaker switches the language tag. An instruction is a user turn of text rows in front of the prompt; a designed
#   voice is that instruction alone, with no speaker row. 0.6B CustomVoice drops an instruction, as the reference
#   does, with a warning (`qtts serve` refuses it with a 400).
# - 1.7B widens the talker only; `small_to_mtp_projection` is the first Gemm of the exported `predictor_decoder`,
#   weights bit for bit, and the predictor's 15 tables are talker-wide: chapter 07's loop needs no change.
# - Prompts and codes match the reference token for token for every prompt kind of every checkpoint kind.
# - `qtts export DIR` makes the chapters' graphs; `qtts say --instruct` speaks with torch blocked.
#
# **Artifacts left:** `data/outputs/<ckpt>/09_user_checkpoint/` (a converted copy), `09_say_*.wav`, the report.
#
# **If your numbers differ**
# - *A dialect speaker diverges* → the language tag was not switched to the dialect id.
# - *Prompt rows = reference minus the instruction's* → the instruction dropped where `follows_instructions` holds.
# - *Prompt rows right, the instruction's rows off* → the instruction given a codec track, tokenized with the text,
#   or wrapped in another template than `<|im_start|>user\n…<|im_end|>\n`.
# - *Designed voice one row longer than the reference* → a speaker row where VoiceDesign has none.
# - *A 192-vs-128 shape error in the trace on 1.7B* → the wrapper lost `small_to_mtp_projection`.
# - *Codes diverge at frame 0, codebook ≥ 1, only on 1.7B* → the rows projected twice (on the host and in the
#   graph), or the tables taken as predictor-wide.
# - *`qtts export` graphs differ from the chapters'* → another pnnx or torch version (the manifests record both).

# %%
check.table()

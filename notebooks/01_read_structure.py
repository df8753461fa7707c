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
# # 01 · Read the model's structure
# > Every later decision about where to cut the graph rests on knowing what each block takes and returns.
#
# **You will:** draw the model's data flow with this checkpoint's dimensions, hang forward hooks on every block of
# the original model, run it once, and tabulate the real tensor shapes; then establish two facts live, each with
# a check.
#
# **You will learn:** Qwen3-TTS = the talker (an autoregressive decoder, each step reading what the steps before
# it made → codebook 0 of each frame) + the code
# predictor (MTP, multi-token prediction: 15 more codes per frame → codebooks 1..15) + the codec decoder
# (codes → a 24 kHz waveform), plus two encoders for cloning (the ECAPA-TDNN speaker encoder: a mel spectrogram
# → an x-vector, one speaker embedding; the Mimi encoder: a voice clip → codes for ICL, in-context learning);
# that the talker's position encoding (mrope, a multimodal form of rope, the rotary position embedding) is plain
# rope here; that `config.json`, not the class defaults, is the truth.
#
# **You need:** `models/<ckpt>/` (chapter 00; synthesized here if missing) and the committed
# `data/inputs/voice.wav`. **Leaves behind:** `data/reports/<ckpt>/01_read_structure.json`.

# %% [markdown]
# The set-up of chapter 00 (settings, the report), then the original model: `model` is the `torch.nn.Module`,
# `codec` its codec (`qwen-tts` calls it the speech tokenizer), `cfg` the checkpoint's `config.json`:

# %%
import torch

from qtts_lib import check, checkpoint, reference, settings

ckpt = settings.checkpoint()
torch.set_num_threads(settings.threads())
report = check.begin("01_read_structure", ckpt)
tts = reference.load(checkpoint.ensure(ckpt), threads=settings.threads())
model, codec = tts.model, tts.model.speech_tokenizer.model
cfg = checkpoint.load_config(ckpt)

# %% [markdown]
# ## 1. Draw the model
# Speech is made frame by frame, 12.5 frames a second, each frame 16 codes (one per codebook). The text and the
# voice become the **prompt**: rows of embeddings, one per position, each the sum of two tracks, a *text track*
# (the embedding of a text token id) and a *codec track* (the embedding of a codec id: a code, or a control id
# such as a language or begin-of-speech). The **talker** reads the prompt in one call (the **prefill**), then runs
# one position per frame: its `codec_head` picks codebook 0, or EOS (end of speech). The **code predictor** takes
# the talker's hidden state and codebook 0's embedding and makes codebooks 1..15, one call each: a prefill of
# those two rows, then fourteen steps. The sum of the frame's 16 code embeddings is the talker's next input, plus
# one text row: the text that did not fit in the prompt is fed one token per frame (chapter 07 draws it). The
# **codec decoder** turns the frames into audio. For cloning, the **speaker encoder** (ECAPA-TDNN) turns a mel
# spectrogram of the voice clip into the **x-vector**, one prompt row; in **ICL** mode the **Mimi encoder** also turns
# the clip into codes that go into the prompt with the clip's transcript. The dimensions below are read from this
# checkpoint's `config.json` (the released 0.6B model has a 28-layer talker of width 1024 and a 5-layer code
# predictor; the tiny checkpoints keep every id and stride and shrink the rest). Read the figure left to right:
# the inputs, what turns them into prompt rows, the talker and the code predictor (once per frame, the frame fed
# back), the codec decoder; on a Base checkpoint the two cloning encoders sit under the text path:

# %%
import matplotlib.pyplot as plt

from qtts_lib import plots

plots.architecture(cfg, title=f"Qwen3-TTS (12 Hz) as {ckpt} builds it: "
                   "the data flow and its dimensions")
plt.show()

# %% [markdown]
# ## 2. Hook every block and run once
# The figure says what the code should do; forward hooks show what it does, with real shapes, without reading
# the source. First, which blocks: every submodule down to a given depth, plus each member of a `ModuleList` (the
# layers, the code predictor's tables and heads), and a short description of what a block returned (a tensor's
# shape, or the shapes inside a tuple or a model output):

# %%
def blocks(root: torch.nn.Module, prefix: str, depth: int):
    """Submodules to `depth` dots below `prefix`, and every ModuleList's members."""
    lists = {n for n, m in root.named_modules() if isinstance(m, torch.nn.ModuleList)}
    for name, mod in root.named_modules():
        parent = name.rsplit(".", 1)[0] if "." in name else ""
        shallow = name.count(".") < depth or parent in lists
        if name and not isinstance(mod, torch.nn.ModuleList) and shallow:
            yield f"{prefix}.{name}", mod


def shape_of(x):
    if torch.is_tensor(x):
        return tuple(x.shape)
    if isinstance(x, (tuple, list)):
        shapes = [shape_of(v) for v in x
                  if torch.is_tensor(v) or isinstance(v, (tuple, list))]
        return shapes[0] if len(shapes) == 1 else shapes
    if hasattr(x, "last_hidden_state"):
        return tuple(x.last_hidden_state.shape)
    return type(x).__name__

# %% [markdown]
# One forward hook per block counts the calls and records, at the first call, the shape of the first tensor
# argument (the "first input") and of the output:

# %%
from collections import OrderedDict

seen: "OrderedDict[str, dict]" = OrderedDict()


def hook(name):
    def fn(mod, args, kwargs, out):
        params = sum(p.numel() for p in mod.parameters())
        row = seen.setdefault(name, {"class": type(mod).__name__, "calls": 0,
                                     "params": params})
        row["calls"] += 1
        if row["calls"] == 1:
            tensors = [a for a in [*args, *kwargs.values()] if torch.is_tensor(a)]
            first = tensors[0] if tensors else None
            row["in"], row["out"] = shape_of(first), shape_of(out)
    return fn

# %% [markdown]
# We hook the talker, the codec decoder, the speaker encoder (a Base checkpoint has one) and the Mimi encoder, run
# a short x-vector clone (prefill + a few frames, then the codec decoder) and encode the voice clip with the Mimi
# encoder (the ICL path), so every component shows up. `max_new_tokens=4` gives 3 frames of 16 codes (chapter
# 00); the voice clip gives 16 codes per frame of its length:

# %%
from qtts_lib import paths
from qtts_lib.runtime.audio.wav import load_wav

targets = [*blocks(model.talker, "talker", 2),
           *blocks(codec.decoder, "codec_decoder", 1)]
if model.speaker_encoder is not None:
    targets += list(blocks(model.speaker_encoder, "speaker_encoder", 1))
targets += [(f"mimi_encoder.{n}", m) for n, m in codec.encoder.named_children()
            if m is not None and n != "quantizer"]
targets += [("mimi_encoder.quantizer", codec.encoder.quantizer)]
handles = [m.register_forward_hook(hook(n), with_kwargs=True) for n, m in targets]

voice_wav = load_wav(paths.voice_wav())
voice = reference.default_voice(tts, voice_wav)
run = reference.capture_generation(tts, "Read the structure.", "english",
                                   max_new_tokens=4, **voice)
with torch.inference_mode():
    wav = torch.from_numpy(voice_wav)[None]
    padding_mask = torch.ones_like(wav, dtype=torch.long)
    voice_codes = codec.encode(wav, padding_mask).audio_codes[0]
for h in handles:
    h.remove()
print(f"{len(seen)} blocks called; generated codes {run['codes'].shape}, "
      f"voice codes {tuple(voice_codes.shape)}")

# %% [markdown]
# The table of the talker's blocks, one row each (member 0 of each `ModuleList` stands for its siblings):

# %%
from IPython.display import HTML, display


def show(rows, keep):
    head = "".join(f"<th>{h}</th>" for h in
                   ("block", "class", "calls", "first input", "first output", "params"))
    cells = lambda n, r: (f"<code>{n}</code>", r["class"], r["calls"], r.get("in"),
                          r.get("out"), f"{r['params']:,}")
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in cells(n, r)) + "</tr>"
                   for n, r in rows.items() if keep(n))
    display(HTML(f"<table><tr>{head}</tr>{body}</table>"))


def first_of_list(n: str) -> bool:
    """Member 0 of each ModuleList (layers, tables, heads); their siblings match it."""
    last = n.rsplit(".", 1)[-1]
    return not last.isdigit() or last == "0"


show(seen, keep=lambda n: n.startswith("talker") and first_of_list(n))

# %% [markdown]
# Read the talker rows like this:
# - `talker.model.text_embedding` + `talker.text_projection`: token ids of Qwen2's tokenizer (BPE, byte-pair
#   encoding: text cut into frequent byte sequences, vocab 151936; chapter 06) → text width → talker width. The
#   text track of the prompt.
# - `talker.model.codec_embedding`: codec ids (vocab 3072: 0..2047 the codes of codebook 0, then control ids
#   such as pad/bos/eos and language ids) → talker width. The codec track.
# - `talker.model.layers.*`: the decoder; first call is the prefill of the whole prompt, every later call one frame.
# - `talker.codec_head`: hidden → 3072 logits; only codebook 0 is predicted here.
# - `talker.code_predictor.*`: the code predictor (the MTP). Per frame a 2-token prefill
#   `[talker hidden, embedding(codebook 0)]` whose last row goes to head 0 (codebook 1), then 14 single steps;
#   step *s* = 1..14 embeds codebook *s* with table *s-1* and predicts codebook *s+1* with head *s*. Table *i* and
#   head *i* both belong to codebook *i+1*: an index off by one there makes every frame wrong.
#
# The other components' blocks:

# %%
show(seen, keep=lambda n: not n.startswith("talker") and first_of_list(n))

# %% [markdown]
# The codec decoder is a single feed-forward pass. *Split-RVQ dequantization*: codebook 0 (the *semantic* one,
# trained to carry what is said) and codebooks 1..15 (the *acoustic* ones, how it sounds) are two RVQ chains,
# each summing its codes' vectors. Then a transformer whose attention sees only a sliding window of recent frames,
# two upsampling stages of ConvNeXt blocks (depthwise convolution + MLP) and a vocoder, transposed convolutions
# with SnakeBeta activations (`x + sin²(αx)/β`), with strides 8·5·4·3 (×2·2) = **1920 samples per 12.5 Hz
# frame**. No iterative sampler (diffusion, flow matching), no inverse FFT, no complex numbers: this is why the
# 12 Hz model, not the 25 Hz one, is the one to put on an edge runtime. The strides, from the codec's config,
# must multiply to the samples per frame:

# %%
import numpy as np

from qtts_lib.runtime.audio.wav import SAMPLES_PER_FRAME

dec = codec.config.decoder_config
upsample = int(np.prod(dec.upsample_rates + dec.upsampling_ratios))
print(f"upsample_rates {dec.upsample_rates}, upsampling_ratios {dec.upsampling_ratios}")
check.equal("codec upsampling = samples per frame", "samples/frame",
            upsample, SAMPLES_PER_FRAME)

# %% [markdown]
# Where the parameters are, by component (each top-level hooked block counted once). The tiny checkpoints shrink
# every width, so the bars' proportions are not the released model's, where the talker dominates:

# %%
groups = {
    "text embedding + projection": ["talker.model.text_embedding",
                                    "talker.text_projection"],
    "talker decoder": ["talker.model.layers", "talker.model.norm",
                       "talker.model.codec_embedding", "talker.codec_head"],
    "code predictor": ["talker.code_predictor"],
    "codec decoder": ["codec_decoder"],
    "speaker encoder": ["speaker_encoder"],
    "mimi encoder": ["mimi_encoder"],
}


def inside(name: str, prefixes: list[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


sizes = {}
for g, prefixes in groups.items():
    mods = {n: m for n, m in targets if inside(n, prefixes)}
    top = [n for n in mods if not any(n != o and n.startswith(o + ".") for o in mods)]
    sizes[g] = sum(sum(p.numel() for p in mods[n].parameters()) for n in top) / 1e6

fig, ax = plt.subplots(figsize=(7, 2.6))
ax.barh(list(sizes), list(sizes.values()), color="tab:blue")
ax.set_xlabel("parameters (M)")
ax.set_title(f"where the parameters are ({ckpt})")
for y, v in enumerate(sizes.values()):
    ax.text(v, y, f" {v:.2f} M", va="center", fontsize=8)
fig.tight_layout()

# %% [markdown]
# ## 3. Fact one: the multimodal rope is plain rope here
# Attention by itself does not know where a token is. **Rope** (rotary position embedding) tells it: it rotates each
# pair of features `(i, i + head_dim/2)` of a query and of a key by the angle `position · θ_i`, where `θ_i` is a
# fixed frequency per pair, so the dot product of a query and a key depends only on the distance between their
# positions. The talker uses Qwen2-VL's **mrope** (multimodal rope): three position rows (time, height, width, for
# video and images), interleaved over the frequency bands `mrope_section`. For text and audio tokens
# `get_rope_index` gives three **identical** rows, and interleaving identical rows is the identity. So the exported
# decoder can use the stock `RotaryEmbed` layer of **ncnn** (the inference framework this book ports to, where a
# model is a graph of built-in layers) and no custom layer. First, the three rows, for a prompt of 29 text tokens
# (any length would do):

# %%
from qwen_tts.core.models.modeling_qwen3_tts import (
    apply_multimodal_rotary_pos_emb,
    apply_rotary_pos_emb,
)

tc = model.talker.config
seq_len, hd = 29, tc.head_dim
ids = torch.ones(1, seq_len, dtype=torch.long)
position_ids, _ = model.talker.get_rope_index(ids)  # (3, 1, seq_len)
rows_equal = bool((position_ids[0] == position_ids[1]).all()
                  and (position_ids[0] == position_ids[2]).all())
check.equal("get_rope_index: the 3 position rows are equal", "rows equal",
            rows_equal, True)

# %% [markdown]
# Then both rotations with the original functions, on random queries and keys of this checkpoint's sizes: the
# multimodal one with its sections, and plain rope with the first row's tables. Equal means a difference of
# exactly zero:

# %%
g = torch.Generator().manual_seed(0)
q = torch.randn(1, tc.num_attention_heads, seq_len, hd, generator=g)
k = torch.randn(1, tc.num_key_value_heads, seq_len, hd, generator=g)
cos3, sin3 = model.talker.model.rotary_emb(q, position_ids)  # (3, 1, seq_len, hd)
section, interleaved = tc.rope_scaling["mrope_section"], tc.rope_scaling["interleaved"]
q_m, k_m = apply_multimodal_rotary_pos_emb(q, k, cos3, sin3, section, interleaved)
q_p, k_p = apply_rotary_pos_emb(q, k, cos3[0], sin3[0])
diff = max((q_m - q_p).abs().max().item(), (k_m - k_p).abs().max().item())
print(f"mrope_section {section}, interleaved={interleaved}: "
      f"max |mrope - rope| = {diff}")
check.equal("mrope == plain rope on text/audio positions", "max_abs", diff, 0.0)

# %% [markdown]
# ## 4. Fact two: trust config.json, not the class defaults
# `Qwen3TTSTalkerConfig()` has defaults from another model size. Any code that builds a config from defaults
# (or reads a missing key) silently gets the wrong model. The real 0.6B `config.json` (carried in
# `qtts_lib/configs/`) against the class defaults; the table lists every key where they differ:

# %%
import json

from qwen_tts.core.models import configuration_qwen3_tts as qcfg

real_cfg = json.loads((paths.CONFIGS / "base" / "config.json").read_text())
real_cfg = real_cfg["talker_config"]
defaults = qcfg.Qwen3TTSTalkerConfig()
pred_defaults = qcfg.Qwen3TTSTalkerCodePredictorConfig()
rows = []
for key, real in real_cfg.items():
    if key != "code_predictor_config" and getattr(defaults, key, "<missing>") != real:
        rows.append(("talker", key, getattr(defaults, key, "<missing>"), real))
for key, real in real_cfg["code_predictor_config"].items():
    default = getattr(pred_defaults, key, "<missing>")
    if key not in ("id2label", "label2id") and default != real:
        rows.append(("code predictor", key, default, real))
titles = ("part", "key", "class default", "config.json (0.6B)")
head = "".join(f"<th>{h}</th>" for h in titles)
body = "".join(f"<tr><td>{p}</td><td><code>{k}</code></td><td>{d}</td><td>{r}</td></tr>"
               for p, k, d, r in rows)
display(HTML(f"<table><tr>{head}</tr>{body}</table>"))

# %% [markdown]
# Two of those keys decide whether a port works at all: without `head_dim` attention splits the width differently,
# and the EOS id differs:

# %%
split = defaults.hidden_size // defaults.num_attention_heads
missing_head_dim = getattr(defaults, "head_dim", split)
print(f"without head_dim in the config, attention uses hidden/heads = "
      f"{missing_head_dim} instead of {real_cfg['head_dim']}")
check.equal("class default eos id", "codec_eos_token_id",
            defaults.codec_eos_token_id, 4198)
check.equal("config.json eos id", "codec_eos_token_id",
            real_cfg["codec_eos_token_id"], 2150)
check.equal("this checkpoint's eos id is the real one", "codec_eos_token_id",
            cfg["talker_config"]["codec_eos_token_id"], 2150)
check.at_least("keys where the defaults are wrong", "count", len(rows), 10)

# %% [markdown]
# A generation loop built on the defaults would wait for token 4198, which a 3072-entry vocabulary can never
# produce: it would run to `max_new_tokens` every time.
#
# ## Summary
# - The talker predicts codebook 0 per 12.5 Hz frame; the code predictor fills codebooks 1..15 with a 2-token
#   prefill and 14 steps (table *s-1*, head *s*); the codec decoder turns 16 codes into 1920 samples.
# - Rope rotates feature pairs by position; mrope with identical position rows is plain rope (max diff exactly
#   0.0), so ncnn's RotaryEmbed suffices.
# - Read every id and dimension from `config.json`; the class defaults differ in many keys (eos 4198 vs 2150).
#
# **Artifacts left:** `data/reports/<ckpt>/01_read_structure.json`.
#
# **If your numbers differ**
# - *mrope diff not 0.0* → position ids with unequal rows (e.g. left padding in a batch);
#   the port assumes batch 1 without padding.
# - *A block missing from the tables* → a checkpoint of another kind (chapter 09) has no speaker encoder; that is
#   expected.

# %%
check.table()

"""Figure helpers shared by the chapters. Introduced in 00."""
from __future__ import annotations

import numpy as np

from .runtime.audio.wav import SAMPLE_RATE


def waveform(wavs: dict[str, np.ndarray], sr: int = SAMPLE_RATE, title: str = ""):
    """Waveform and log spectrogram of one or more signals, stacked."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(wavs), 2, figsize=(11, 2.2 * len(wavs)), squeeze=False)
    for (name, w), (ax_w, ax_s) in zip(wavs.items(), axes):
        t = np.arange(len(w)) / sr
        ax_w.plot(t, w, lw=0.4)
        ax_w.set_title(f"{name}: waveform", fontsize=9)
        ax_w.set_xlabel("s")
        ax_s.specgram(w + 1e-9, NFFT=1024, Fs=sr, noverlap=768, cmap="magma")
        ax_s.set_title(f"{name}: spectrogram", fontsize=9)
        ax_s.set_xlabel("s")
        ax_s.set_ylabel("Hz")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def errors(rows: list[dict], value: str, group: str, series: str, threshold: float | None = None,
           ylabel: str = "", title: str = ""):
    """Grouped bars on a log axis: one group per `group` key, one bar per `series` key."""
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys(r[group] for r in rows))
    names = list(dict.fromkeys(r[series] for r in rows))
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(groups)), 3.4))
    for i, s in enumerate(names):
        xs, ys = [], []
        for j, g in enumerate(groups):
            for r in rows:
                if r[group] == g and r[series] == s:
                    xs.append(j + i * width)
                    ys.append(max(float(r[value]), 1e-12))
        ax.bar(xs, ys, width=width, label=str(s))
    if threshold is not None:
        ax.axhline(threshold, color="crimson", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_yscale("log")
    ax.set_xticks([j + width * (len(names) - 1) / 2 for j in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel or value)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _floor(values) -> np.ndarray:
    # exact zeros (embeddings, identical runs) are drawn a decade below the smallest error instead of vanishing
    v = np.asarray(values, dtype=np.float64)
    positive = v[v > 0]
    return np.maximum(v, positive.min() / 10 if positive.size else 1e-12)


def _threshold_for(threshold, key: str) -> float | None:
    return threshold.get(key) if isinstance(threshold, dict) else threshold


def _depth_axis(ax, result, threshold: float | None, label: str | None = None, mark_worst: bool = True) -> None:
    """One probe's error along depth on `ax`: a point per tap, stage boundaries, the threshold, the worst tap."""
    errs = _floor(result.errors)
    x = np.arange(len(errs))
    ax.semilogy(x, errs, marker="o", ms=2.5, lw=0.9, label=label)
    stages = [r["stage"] for r in result.rows]
    starts = [i for i, s in enumerate(stages) if i == 0 or s != stages[i - 1]]
    for i in starts[1:]:
        ax.axvline(i - 0.5, color="0.85", lw=0.6, zorder=0)
    if len(starts) < len(stages):  # ticks at stage starts; one tick per tap when every tap is its own stage
        kinds = [result.rows[i].get("stage_type", "") for i in starts]
        names = [f"{stages[i]} {k}" if len(k) <= 16 else stages[i] for i, k in zip(starts, kinds)]
        ax.set_xticks(starts)
        ax.set_xticklabels(names, rotation=0 if len(starts) <= 8 else 90, fontsize=6)
    else:  # ncnn-vs-ncnn probes: a tick per layer, thinned to about 60 labels
        every = max(1, -(-len(x) // 60))
        ax.set_xticks(x[::every])
        ax.set_xticklabels([r["label"] for r in result.rows][::every], rotation=90, fontsize=5)
    if threshold is not None:
        ax.axhline(threshold, color="crimson", ls="--", lw=1, label=f"threshold {threshold:g}")
    if mark_worst and len(errs):
        i = int(np.argmax(errs))
        ax.plot([i], [errs[i]], "v", color="crimson", ms=6)
        right = i > 0.6 * len(errs)
        ax.annotate(f"worst {result.rows[i]['label']}\n{result.rows[i]['rel']:.2g}", (i, errs[i]),
                    textcoords="offset points", xytext=(-4 if right else 4, 4), fontsize=7,
                    ha="right" if right else "left")
    ax.set_xlim(-0.8, len(errs) - 0.2)
    top = max([errs.max() if len(errs) else 1e-12] + ([threshold] if threshold is not None else []))
    ax.set_ylim(top=top * 300)  # room above the data for the legend and the note on the worst tap
    ax.set_ylabel("relative L2 error")
    ax.set_xlabel("paired layers in forward order", fontsize=8)
    ax.legend(fontsize=7, loc="upper left", ncol=2)


def layer_errors(results, threshold: float | dict | None = None, title: str = ""):
    """Error along depth from `qtts_lib.probe`, on a log axis with the threshold drawn. Introduced in 04.

    `results`: one ProbeResult; or {name: ProbeResult} drawn one panel each (their `threshold[name]` when a
    dict), or overlaid on one axis when every result has the same taps (the same graph at several decode steps).
    Each panel says what was compared (`a` vs `b`); `title` should add checkpoint, versions and threads."""
    import matplotlib.pyplot as plt

    if not isinstance(results, dict):
        results = {results.name: results}
    same = len({tuple(r.labels) for r in results.values()}) == 1
    if same and len(results) > 1:
        fig, ax = plt.subplots(figsize=(11, 3.6), layout="constrained")
        first = next(iter(results.values()))
        for key, r in results.items():
            _depth_axis(ax, r, None, label=str(key), mark_worst=False)
        t = _threshold_for(threshold, first.name)
        if t is not None:
            ax.axhline(t, color="crimson", ls="--", lw=1, label=f"threshold {t:g}")
        shown = np.concatenate([_floor(r.errors) for r in results.values()] + ([[t]] if t is not None else []))
        ax.set_ylim(shown.min() / 2, shown.max() * 300)
        ax.legend(fontsize=7, loc="upper left", ncol=4)
        ax.set_title(f"{first.name}: {first.b} vs ncnn", fontsize=9)
        axes = [ax]
    else:
        fig, axes = plt.subplots(len(results), 1, figsize=(11, 3.4 * len(results)), squeeze=False,
                                 layout="constrained")
        axes = list(axes[:, 0])
        for ax, (key, r) in zip(axes, results.items()):
            _depth_axis(ax, r, _threshold_for(threshold, key), label=f"{r.a} vs {r.b}")
            ax.set_title(f"{key}: {len(r.rows)} taps in forward order", fontsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def step_errors(series: dict, threshold: float | None = None, title: str = "",
                xlabel: str = "call (0 = prefill, then one step each)", ylabel: str = "relative L2 error"):
    """Error along decode steps, one line per series ({name: [error per call]} or {name: {call: error}}),
    log y, threshold drawn. Introduced in 05."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.2))
    for name, errs in series.items():
        xs, ys = (list(errs), list(errs.values())) if isinstance(errs, dict) else (range(len(errs)), errs)
        ax.semilogy(list(xs), _floor(ys), marker="o", ms=3, lw=1, label=str(name))
    if threshold is not None:
        ax.axhline(threshold, color="crimson", ls="--", lw=1, label=f"threshold {threshold:g}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


PROMPT_COLORS = {"instruction": "#8e44ad", "role": "#7f8c8d", "tts_pad": "#dcdde1", "tts_bos": "#f1c40f",
                 "voice transcript": "#82e0aa", "text": "#27ae60", "tts_eos": "#145a32", "codec tag": "#2e86de",
                 "speaker": "#e74c3c", "codec_pad": "#aed6f1", "codec_bos": "#e67e22", "voice codes": "#a04000"}


def prompt_tracks(prompts: dict[str, tuple], title: str = ""):
    """Talker prompts drawn as rows x tracks, one panel each. Introduced in 07.

    `prompts`: {name: (text track, codec track[, trailing text])}, each a list of one label per position (None:
    nothing on that track there); the two tracks are summed position by position. The trailing text, fed one row
    per frame after the prompt, is drawn after a gap on the text track. Labels of `PROMPT_COLORS` keep their
    colours across chapters; others get the next of matplotlib's."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    seen = [label for p in prompts.values() for track in p for label in track if label is not None]
    labels = list(PROMPT_COLORS) + sorted(set(seen) - set(PROMPT_COLORS))
    colors = [PROMPT_COLORS.get(label, f"C{i % 10}") for i, label in enumerate(labels)]
    fig, axes = plt.subplots(len(prompts), 1, figsize=(12, 1.15 * len(prompts) + 1.0), squeeze=False)
    for ax, (name, (upper, lower, *rest)) in zip(axes[:, 0], prompts.items()):
        trailing = rest[0] if rest else []
        start = len(upper) + 1  # one empty column between the prompt and its trailing text
        grid = np.full((2, start + len(trailing) if trailing else len(upper)), np.nan)
        for row, track, offset in ((0, upper, 0), (1, lower, 0), (0, trailing, start)):
            for x, label in enumerate(track):
                if label is not None:
                    grid[row, offset + x] = labels.index(label)
        ax.imshow(grid, cmap=ListedColormap(colors), vmin=-0.5, vmax=len(labels) - 0.5, aspect="auto",
                  interpolation="nearest")
        ax.set_yticks([0, 1], ["text", "codec"])
        ax.set_xticks(np.arange(grid.shape[1] + 1) - 0.5, minor=True)
        ax.grid(which="minor", axis="x", color="white", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        rows = f"{len(trailing)} trailing text row" + ("s, one per frame" if len(trailing) > 1 else "")
        note = f", then {rows}" if trailing else ""
        ax.set_title(f"{name}: {len(upper)} prompt rows{note}", loc="left", fontsize=9)
    axes[-1, 0].set_xlabel("position")
    fig.legend(handles=[Patch(color=c, label=label) for label, c in zip(labels, colors) if label in seen],
               ncol=6, loc="upper center", bbox_to_anchor=(0.5, 0.0), fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig



def architecture(cfg: dict, title: str = ""):
    """Qwen3-TTS as boxes and arrows, with the dimensions of `cfg` (a checkpoint's config.json). Introduced in 01.

    Left to right: the inputs, what turns them into prompt rows, the talker and the code predictor (which run once
    per frame and feed the frame back), the codec decoder. For a Base checkpoint the two cloning encoders are drawn
    under the text path; for the other kinds the voice box says what replaces them."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    from .runtime.audio.wav import FRAME_RATE, SAMPLES_PER_FRAME

    talker = cfg["talker_config"]
    pred = talker["code_predictor_config"]
    groups, hidden = talker["num_code_groups"], talker["hidden_size"]
    cloning = cfg.get("tts_model_type", "base") == "base"
    colors = {"in": "#f4f6f7", "embed": "#d6eaf8", "loop": "#fdebd0", "codec": "#d5f5e3", "clone": "#f5eef8"}
    purple, red = "#7d3c98", "#c0392b"
    fig, ax = plt.subplots(figsize=(13, 6.4))
    ax.set_xlim(0, 16.6)
    ax.set_ylim(0.2, 8.4)
    ax.axis("off")

    def box(x, y, w, h, text, kind):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.08", fc=colors[kind],
                                    ec="0.35", lw=0.9))
        ax.text(x, y, text, ha="center", va="center", fontsize=8.5)

    def arrow(a, b, text="", color="0.25", rad=0.0, dx=0.0, dy=0.1):
        ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="-|>", color=color, lw=1.1, shrinkA=2, shrinkB=2,
                                                        connectionstyle=f"arc3,rad={rad}"))
        if text:
            ax.text((a[0] + b[0]) / 2 + dx, (a[1] + b[1]) / 2 + dy, text, fontsize=7.5, ha="center", va="bottom",
                    color=color)

    # the inputs, and what turns them into prompt rows
    box(1.3, 7.0, 2.0, 0.9, "text\n(BPE token ids)", "in")
    box(4.6, 7.0, 3.0, 1.1, f"text embedding\n{talker['text_vocab_size']} ids → {talker['text_hidden_size']}\n"
        f"projection (MLP) → {hidden}", "embed")
    box(4.6, 5.4, 3.0, 0.9, f"codec embedding\n{talker['vocab_size']} ids → {hidden}\n(codes, control tags)", "embed")
    arrow((2.3, 7.0), (3.1, 7.0))
    if cloning:
        box(1.3, 2.8, 2.0, 1.1, f"voice clip\n{SAMPLE_RATE // 1000} kHz\n(+ its transcript)", "in")
        box(4.6, 3.7, 3.0, 1.1, f"Mimi encoder\nclip → {groups} codes a frame\n(ICL mode)", "clone")
        box(4.6, 1.9, 3.0, 1.1, "speaker encoder (ECAPA-TDNN)\nmel spectrogram →\n"
            f"x-vector ({cfg['speaker_encoder_config']['enc_dim']})", "clone")
        arrow((2.3, 3.0), (3.1, 3.6))
        arrow((2.3, 2.6), (3.1, 2.0))
        arrow((4.6, 4.25), (4.6, 4.95), "voice codes", color=purple, dx=0.75, dy=-0.1)
        arrow((6.1, 1.9), (7.1, 3.3), "x-vector", color=purple, dx=0.05, dy=-0.45)
        ax.text(4.6, 0.95, "cloning (Base checkpoints)", ha="center", fontsize=7.5, style="italic", color="0.4")
    else:
        box(1.3, 3.2, 2.0, 1.1, "voice: a speaker\nor a description\n(chapter 09)", "in")
        arrow((2.3, 3.2), (7.1, 3.8))

    # the prompt
    rows = "text track\n+ codec track" + ("\n(one codec row:\nthe x-vector)" if cloning else "")
    box(8.2, 5.0, 2.2, 3.6, f"prompt\none row of {hidden}\nper position:\n{rows}", "embed")
    arrow((6.1, 7.0), (7.1, 6.4))
    arrow((6.1, 5.4), (7.1, 5.4))

    # the loop: talker, codebook 0, the code predictor, one frame
    box(11.6, 7.4, 3.0, 0.9, f"talker: {talker['num_hidden_layers']}-layer decoder\nhidden {hidden}, "
        "one position a frame", "loop")
    box(11.6, 6.05, 3.0, 0.8, f"codec head → {talker['vocab_size']} logits\n→ codebook 0 (or EOS: stop)", "loop")
    box(11.6, 4.3, 3.0, 1.7, f"code predictor: {pred['num_hidden_layers']}-layer decoder\n"
        "input: talker hidden state\n+ embedding of codebook 0;\n"
        f"{groups - 1} calls a frame (prefill of 2,\nthen {groups - 2} steps), one head each\n"
        f"→ codebooks 1..{groups - 1}", "loop")
    box(11.6, 2.5, 3.0, 0.8, f"one frame: {groups} codes", "loop")
    arrow((9.3, 6.5), (10.1, 7.3), "prefill", dy=0.05, dx=-0.2)
    arrow((11.6, 6.95), (11.6, 6.45))
    arrow((11.6, 5.65), (11.6, 5.15))
    arrow((11.6, 3.45), (11.6, 2.9))
    arrow((10.1, 2.5), (10.1, 7.1), color=red, rad=-0.35)
    ax.text(9.45, 2.1, f"next talker input:\nsum of the frame's\n{groups} code embeddings\n+ next text row",
            fontsize=7.5, color=red, ha="center", va="top")

    # the codec decoder
    box(15.0, 4.3, 2.6, 1.5, f"codec decoder\ncodes → waveform\n{SAMPLES_PER_FRAME} samples a frame", "codec")
    box(15.0, 2.0, 2.6, 0.9, f"{SAMPLE_RATE // 1000} kHz waveform\n{FRAME_RATE:g} frames a second", "codec")
    arrow((13.1, 2.5), (13.7, 3.7), "frames", dx=0.35, dy=-0.2)
    arrow((15.0, 3.55), (15.0, 2.45))
    ax.set_title(title or "Qwen3-TTS (12 Hz): the data flow, with this checkpoint's dimensions", fontsize=10)
    fig.tight_layout()
    return fig


def polyphase(x: np.ndarray, w: np.ndarray, stride: int, transposed: np.ndarray, phases: np.ndarray,
              title: str = ""):
    """A transposed convolution against its polyphase form, one channel in and out. Introduced in 13.

    `x` (T,) the input, `w` (K,) the kernel, `transposed` (T*stride,) the transposed convolution's output
    (trimmed as the codec trims it), `phases` (stride, T) the outputs of the `stride` stride-1 convolutions.
    Top: the input with stride-1 zeros stuffed between its samples, which the transposed convolution slides its
    K taps over, and the taps coloured by the phase they serve (tap k: phase k % stride). Bottom: the
    transposed convolution's output, and each phase's output placed at every stride-th sample (phase r at
    q*stride + r): the same values, none computed from a zero."""
    import matplotlib.pyplot as plt

    T, K = len(x), len(w)
    colors = [f"C{r % 10}" for r in range(stride)]
    fig = plt.figure(figsize=(11, 4.6))
    grid = fig.add_gridspec(2, 4)
    ax_in, ax_w, ax_out = fig.add_subplot(grid[0, :3]), fig.add_subplot(grid[0, 3]), fig.add_subplot(grid[1, :])
    stuffed = np.zeros(T * stride)
    stuffed[::stride] = x
    pos = np.arange(T * stride)
    ax_in.vlines(pos, 0, stuffed, color="0.6", lw=1)
    ax_in.plot(pos[::stride], x, "o", color="black", ms=5, label="input sample")
    zeros = pos % stride != 0
    ax_in.plot(pos[zeros], stuffed[zeros], "x", color="0.55", ms=5, label=f"{stride - 1} stuffed zeros")
    ax_in.axhline(0, color="0.8", lw=0.6)
    ax_in.set_ylim(top=1.9 * np.abs(x).max())  # room for the legend above the stems
    ax_in.set_title(f"transposed convolution, stride {stride}: {T} samples, zeros stuffed between them",
                    loc="left", fontsize=9)
    ax_in.legend(fontsize=8, loc="upper right", ncol=2)
    ax_w.bar(np.arange(K), w, color=[colors[k % stride] for k in range(K)])
    ax_w.set_title(f"its {K} taps, by phase (k mod {stride})", loc="left", fontsize=9)
    ax_w.set_xticks(range(K))
    out_pos = np.arange(len(transposed))
    ax_out.plot(out_pos, transposed, color="0.75", lw=4, label="transposed convolution")
    for r in range(stride):
        ax_out.plot(np.arange(phases.shape[1]) * stride + r, phases[r], "o", color=colors[r], ms=4,
                    label=f"phase {r}: taps {list(range(r, K, stride))}, a stride-1 conv")
    ax_out.set_xlabel("output sample")
    ax_out.xaxis.get_major_locator().set_params(integer=True)
    ax_out.set_title("the phases, interleaved: the same output", loc="left", fontsize=9)
    ax_out.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def param_line(line: str, keys: dict[str, str] | None = None, title: str = ""):
    """One layer line of an ncnn `.param`, its fields boxed and named: layer type, layer name,
    input and output counts, input blobs, output blobs, `key=value` parameters. `keys` names what
    some keys mean (ncnn's operator reference numbers them per layer type). Introduced in 04."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    tok = line.split()
    n_in, n_out = int(tok[2]), int(tok[3])
    groups = [("layer type", tok[:1], "#2e86de"), ("layer name", tok[1:2], "#7f8c8d"),
              ("#in #out", tok[2:4], "#f39c12"), ("input blobs", tok[4 : 4 + n_in], "#27ae60"),
              ("output blobs", tok[4 + n_in : 4 + n_in + n_out], "#8e44ad"),
              ("parameters key=value", tok[4 + n_in + n_out :], "#c0392b")]
    groups = [g for g in groups if g[1]]
    n_chars = sum(len(" ".join(t)) for _, t, _ in groups) + 2 * len(groups)
    char = 0.602 * 10 / 72  # inches per character of a 10 pt monospace font: one x unit
    width = max(8.0, (n_chars + 2) * char / 0.98)
    fig = plt.figure(figsize=(width, 2.8))
    ax = fig.add_axes((0.01, 0.02, 0.98, 0.86))
    ax.set_xlim(-1, width * 0.98 / char - 1)
    ax.set_ylim(-1.9, 2.6)
    ax.axis("off")
    x, param_x = max(0.0, (width * 0.98 / char - 2 - n_chars) / 2), {}  # centred
    for g, (label, toks, color) in enumerate(groups):
        text = " ".join(toks)
        ax.add_patch(FancyBboxPatch((x - 0.3, -0.45), len(text) + 0.6, 0.9, boxstyle="round,pad=0.1",
                                    fc=color, alpha=0.15, ec=color))
        ax.text(x, 0, text, family="monospace", fontsize=10, va="center", ha="left")
        ax.text(x + len(text) / 2, -0.7 - 0.5 * (g % 2), label, ha="center", va="top", fontsize=8,
                color=color)
        if label.startswith("parameters"):
            pos = x
            for t in toks:
                param_x[t.split("=", 1)[0]] = pos + len(t) / 2
                pos += len(t) + 1
        x += len(text) + 2
    for i, (k, meaning) in enumerate((k, m) for k, m in (keys or {}).items() if k in param_x):
        y = 0.9 + 0.5 * (i % 3)
        ax.annotate(f"{k}= {meaning}", (param_x[k], 0.45), (param_x[k], y), ha="center", fontsize=7.5,
                    color="#c0392b", arrowprops={"arrowstyle": "-", "color": "#c0392b", "lw": 0.6})
    ax.set_title(title or "one layer of a .param", fontsize=10)
    return fig


def cache_growth(shapes: list[list[tuple[int, int, int, int]]], title: str = ""):
    """The K cache Mats of a cached decoder across calls: for each call (the prefill, then one step
    each), one bar per layer, filled to the positions the Mat holds (its `h`) and outlined up to the
    rows its buffer has room for (`cstep / w`). `shapes[call][layer]` = (w, h, c, cstep), read from
    the Mats the graph handed back. Introduced in 05."""
    import matplotlib.pyplot as plt

    n_layers = len(shapes[0])
    fig, ax = plt.subplots(figsize=(10, 3.4))
    for call, mats in enumerate(shapes):
        for i, (w, h, _c, cstep) in enumerate(mats):
            x = call * (n_layers + 1) + i
            ax.bar(x, cstep // w, width=0.85, fc="none", ec="0.55", lw=0.6,
                   label="rows reserved (cstep / w)" if call == i == 0 else None)
            ax.bar(x, h, width=0.85, color="#2e86de",
                   label="positions held (h)" if call == i == 0 else None)
    centers = [call * (n_layers + 1) + (n_layers - 1) / 2 for call in range(len(shapes))]
    ax.set_xticks(centers, ["prefill"] + [str(t) for t in range(1, len(shapes))], fontsize=7)
    for call in (0, len(shapes) - 1):
        w, h, c, _ = shapes[call][0]
        ax.annotate(f"w×h×c\n{w}×{h}×{c}", (centers[call], h), (0, 6), textcoords="offset points",
                    ha="center", fontsize=7.5, bbox={"fc": "white", "ec": "none", "pad": 1})
    ax.set_xlabel(f"call (prefill, then one step each); one bar per layer ({n_layers} layers)")
    ax.set_ylabel("rows of the K cache Mat")
    ax.set_title(title or "K cache Mats across calls", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def prompt_cells(synth, text: str, language: str, voice) -> tuple[list, list, list]:
    """A talker prompt laid out cell by cell for `prompt_tracks`: the text track, the codec track (one
    (label, row) cell per position, None where a track holds nothing) and the trailing text. Summed
    position by position the two tracks are `synth.prompt(text, language, voice).embeds`. The form
    chapter 07 writes in its cells (`tracks`), over `synth`'s embeddings; reused in 09 for the other
    kinds' prompts (an instruction first, the whole text over `codec_pad`)."""
    from .runtime.pipeline import prompt as chat

    e, c, top, tok = synth.embeddings, synth.config.talker, synth.config.config, synth.tokenizer
    text_rows = lambda label, ids: [(label, row) for row in e.text(ids)]  # noqa: E731
    codec_rows = lambda label, ids: [(label, row) for row in e.codec(ids)]  # noqa: E731
    pad, bos, eos = (text_rows(k, [top[f"{k}_token_id"]])[0] for k in ("tts_pad", "tts_bos", "tts_eos"))
    ids = tok.encode_template(chat.TEXT, text)
    speaker = [] if voice.speaker_row is None else [("speaker", voice.speaker_row)]
    head = (codec_rows("codec tag", synth.prompts.codec_tags(language, voice.speaker)) + speaker
            + codec_rows("codec_pad", [c["codec_pad_id"]]))
    upper = text_rows("role", ids[:chat.ROLE_TOKENS]) + [pad] * (len(head) - 1) + [bos]
    lower = [None] * chat.ROLE_TOKENS + head
    codec_bos = codec_rows("codec_bos", [c["codec_bos_id"]])
    said = text_rows("text", ids[chat.ROLE_TOKENS:-chat.END_TOKENS]) + [eos]
    if voice.codes is not None:  # ICL: transcript + text + tts_eos beside codec_bos + the clip's frames
        heard = tok.encode_template(chat.VOICE_TEXT, voice.text)[chat.ROLE_TOKENS:-chat.VOICE_END_TOKENS]
        said = text_rows("voice transcript", heard) + said
        clip = codec_bos + [("voice codes", row) for row in e.frame(voice.codes)]
        return upper + said[: len(clip)] + [pad] * (len(clip) - len(said)), lower + clip, said[len(clip):] or [pad]
    if voice.mode == "xvector":  # the first text token rides on codec_bos; the rest trails
        return upper + said[:1], lower + codec_bos, said[1:]
    # a built-in speaker or a described voice: the instruction first, the whole text over codec_pad
    follows = voice.instruct and synth.follows_instructions
    first = text_rows("instruction", tok.encode_template(chat.INSTRUCT, voice.instruct)) if follows else []
    return (first + upper + said + [pad], [None] * len(first) + lower
            + codec_rows("codec_pad", [c["codec_pad_id"]]) * len(said) + codec_bos, [pad])


def bench_components(res: dict, title: str = ""):
    """One benchmark result (data/bench's schema): talker, predictor and codec stacked per row, the row's
    generation floor as a black bar, real time (80 ms of audio a frame) as a red line. Introduced in 11."""
    import matplotlib.pyplot as plt

    rows = sorted(res["rows"], key=lambda r: (r["threads"], r["runtime"], r["precision"]))
    labels = [f"{r['runtime']} {r['precision']}\n{r['threads']} thr" for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(rows)), 3.4))
    bottom = np.zeros(len(rows))
    for part in ("talker", "predictor", "codec"):
        vals = np.array([r["ms_per_frame"][part] for r in rows])
        ax.bar(labels, vals, bottom=bottom, label=part)
        bottom += vals
    floors = [(i, r["floor_ms_per_frame"]) for i, r in enumerate(rows) if r["floor_ms_per_frame"]]
    for n, (i, floor) in enumerate(floors):
        ax.plot([i - 0.4, i + 0.4], [floor] * 2, color="black", lw=2, label="generation floor" if n == 0 else None)
    ax.axhline(80, color="crimson", ls="--", lw=1, label="real time (80 ms a frame)")
    ax.set(ylabel="ms per frame", title=title)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    return fig

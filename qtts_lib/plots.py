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

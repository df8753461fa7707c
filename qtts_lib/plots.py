"""Figure helpers shared by the chapters. Introduced in 00."""
from __future__ import annotations

import numpy as np

from .runtime.audio import SAMPLE_RATE


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

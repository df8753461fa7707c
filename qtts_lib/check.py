"""Metrics and the per-chapter report. Introduced in 00.

Every number a chapter claims goes through here: it is computed, printed as
`OK name  metric value (<= threshold)` or `NOT OK ...`, appended to
`data/reports/<ckpt>/<stem>.json`, and a failed check raises at once.
The report is a JSON list of `{name, metric, value, threshold, ok}`.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import paths, settings


class CheckFailed(AssertionError):
    pass


# ---------------------------------------------------------------- metrics
def _f64(x) -> np.ndarray:
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


def rel_err(ours, ref) -> float:
    """||ours - ref|| / ||ref|| over all elements (L2). Introduced in 02."""
    a, b = _f64(ours), _f64(ref)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: ours {a.shape} vs ref {b.shape}")
    den = np.linalg.norm(b)
    num = np.linalg.norm(a - b)
    return float(num / den) if den > 0 else float(num)


def max_abs_err(ours, ref) -> float:
    """Largest elementwise |ours - ref|. Introduced in 02."""
    a, b = _f64(ours), _f64(ref)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: ours {a.shape} vs ref {b.shape}")
    return float(np.max(np.abs(a - b))) if a.size else 0.0


def snr_db(ours, ref) -> float:
    """10·log10(Σref² / Σ(ours-ref)²); inf when equal. Introduced in 03."""
    a, b = _f64(ours).ravel(), _f64(ref).ravel()
    if a.shape != b.shape:
        raise ValueError(f"length mismatch: ours {a.shape} vs ref {b.shape}")
    noise = float(np.sum((a - b) ** 2))
    signal = float(np.sum(b**2))
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def log_spectral_distance(ours, ref, n_fft: int = 1024, hop: int = 256) -> float:
    """Root-mean-square difference of the two power spectra in dB (Hann frames of `n_fft`, `hop` apart), averaged
    over frames; 0 when equal. A level-independent companion of `snr_db` for audio. Introduced in 14."""
    a, b = _f64(ours).ravel(), _f64(ref).ravel()
    if a.shape != b.shape:
        raise ValueError(f"length mismatch: ours {a.shape} vs ref {b.shape}")
    if len(a) < n_fft:
        raise ValueError(f"need at least {n_fft} samples, got {len(a)}")
    frames = 1 + (len(a) - n_fft) // hop
    idx = np.arange(n_fft)[None] + hop * np.arange(frames)[:, None]
    window = np.hanning(n_fft)
    power = [np.abs(np.fft.rfft(x[idx] * window, axis=1)) ** 2 for x in (a, b)]
    floor = 1e-10 * max(float(power[1].max()), 1e-30)  # ignore bins far below the loudest
    db = [10 * np.log10(np.maximum(p, floor)) for p in power]
    return float(np.mean(np.sqrt(np.mean((db[0] - db[1]) ** 2, axis=1))))


def cos_sim(ours, ref) -> float:
    a, b = _f64(ours).ravel(), _f64(ref).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def mismatches(ours, ref) -> tuple[int, int]:
    """(number of unequal tokens, total) for two integer arrays of one shape."""
    a, b = np.asarray(ours), np.asarray(ref)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: ours {a.shape} vs ref {b.shape}")
    return int(np.sum(a != b)), int(a.size)


# ---------------------------------------------------------------- report
class Row(dict):
    """One recorded check. Already printed as an OK / NOT OK line, so a notebook cell that
    ends in a check shows nothing more."""

    def _ipython_display_(self) -> None:
        pass


@dataclass
class Report:
    stem: str
    ckpt: str
    checks: list[dict] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return paths.reports_dir(self.ckpt) / f"{self.stem}.json"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.checks, indent=1, allow_nan=True))

    def record(self, name: str, metric: str, value, threshold, ok: bool, op: str = "<=") -> Row:
        if value is None or isinstance(value, (list, tuple)):
            value = str(value)
        value = value if isinstance(value, (str, int)) else float(value)
        row = Row(name=name, metric=metric, value=value, threshold=threshold, ok=bool(ok))
        self.checks = [c for c in self.checks if c["name"] != name] + [row]
        self.save()
        shown = f"{value:.3g}" if isinstance(value, float) else str(value)
        print(f"{'OK' if ok else 'NOT OK'} {name}  {metric} {shown} ({op} {threshold})")
        if not ok:
            raise CheckFailed(f"{name}: {metric} {shown} not {op} {threshold}")
        return row


_current: Report | None = None


def begin(stem: str, ckpt: str | None = None) -> Report:
    """Start (and reset) the report of one chapter. Introduced in 00."""
    global _current
    _current = Report(stem, ckpt or settings.checkpoint())
    _current.save()
    return _current


def current() -> Report:
    if _current is None:
        raise RuntimeError("call check.begin('<notebook stem>') first")
    return _current


def at_most(name: str, metric: str, value: float, threshold: float) -> dict:
    return current().record(name, metric, value, threshold, value <= threshold, "<=")


def at_least(name: str, metric: str, value: float, threshold: float) -> dict:
    return current().record(name, metric, value, threshold, value >= threshold, ">=")


def equal(name: str, metric: str, value, expected) -> dict:
    return current().record(name, metric, value, expected, value == expected, "==")


def close(name: str, ours, ref, rel: float | None = None, max_abs: float | None = None) -> dict:
    """Relative (L2) or max-abs closeness of two arrays. Introduced in 02."""
    if (rel is None) == (max_abs is None):
        raise ValueError("give exactly one of rel= or max_abs=")
    if rel is not None:
        return at_most(name, "rel", rel_err(ours, ref), rel)
    return at_most(name, "max_abs", max_abs_err(ours, ref), max_abs)


def snr(name: str, ours, ref, min_db: float) -> dict:
    return at_least(name, "snr_db", snr_db(ours, ref), min_db)


def cos(name: str, ours, ref, min_cos: float) -> dict:
    return at_least(name, "cos", cos_sim(ours, ref), min_cos)


def within(name: str, metric: str, ours, ref, tolerance: float) -> dict:
    """One comparison by metric name: rel, max_abs (at most `tolerance`), snr_db, cos (at least). Introduced in 02."""
    if metric == "rel":
        return close(name, ours, ref, rel=tolerance)
    if metric == "max_abs":
        return close(name, ours, ref, max_abs=tolerance)
    if metric == "snr_db":
        return snr(name, ours, ref, tolerance)
    if metric == "cos":
        return cos(name, ours, ref, tolerance)
    raise ValueError(f"unknown metric {metric!r}: rel, max_abs, snr_db or cos")


def tokens_equal(name: str, ours, ref) -> dict:
    bad, total = mismatches(ours, ref)
    return current().record(name, "mismatched/total", f"{bad}/{total}", f"0/{total}", bad == 0, "==")


def load(stem: str, ckpt: str | None = None) -> list[dict]:
    path = paths.reports_dir(ckpt or settings.checkpoint()) / f"{stem}.json"
    return json.loads(path.read_text())


def all_ok(stem: str | None = None, ckpt: str | None = None) -> bool:
    rows = current().checks if stem is None else load(stem, ckpt)
    return bool(rows) and all(r["ok"] for r in rows)


def table(rows: list[dict] | None = None):
    """The report as a pandas-free HTML-able table (list of rows) for display."""
    rows = current().checks if rows is None else rows
    from IPython.display import HTML

    head = "<tr><th>check</th><th>metric</th><th>value</th><th>threshold</th><th>ok</th></tr>"
    body = "".join(
        f"<tr><td>{r['name']}</td><td>{r['metric']}</td><td>{_fmt(r['value'])}</td>"
        f"<td>{r['threshold']}</td><td>{'✅' if r['ok'] else '❌'}</td></tr>"
        for r in rows
    )
    return HTML(f"<table>{head}{body}</table>")


def _fmt(v) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)

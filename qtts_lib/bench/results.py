"""Benchmark results on disk: data/bench's schema, one writer. Introduced in 11.

A result file is `{machine, checkpoint, frames, rows, ...}`; a row is `{runtime, device, precision, threads,
ms_per_frame: {talker, predictor, codec, total}, prefill_ms, rtf, peak_rss_gb, floor_ms_per_frame, floor_ratio,
repeats, ...}` (data/bench/README.md). GPU rows have no floor (None): their loop is bound by round trips, not by
reading memory.
"""
from __future__ import annotations

import json
from pathlib import Path

SCHEMA_KEYS = ("runtime", "device", "precision", "threads", "ms_per_frame", "prefill_ms", "rtf", "peak_rss_gb",
               "floor_ms_per_frame", "floor_ratio", "repeats")


def check_schema(result: dict) -> None:
    """Raise if `result` does not have data/bench's shape (chapter 11, the results page and the tests use this)."""
    for key in ("machine", "checkpoint", "frames", "rows"):
        if key not in result:
            raise ValueError(f"bench result has no {key!r}")
    if not result["rows"]:
        raise ValueError("bench result has no rows")
    for r in result["rows"]:
        missing = [k for k in SCHEMA_KEYS if k not in r]
        if missing:
            raise ValueError(f"a row lacks {missing}")
        if set(r["ms_per_frame"]) != {"talker", "predictor", "codec", "total"}:
            raise ValueError(f"ms_per_frame keys {sorted(r['ms_per_frame'])}")


def write_result(result: dict, output: Path | None) -> str:
    """`result` as indented JSON, written to `output` (folders made) when given; the text is returned."""
    text = json.dumps(result, indent=1)
    if output:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
    return text


def merge(out: str | Path, parts: list[str | Path], note: str = "") -> dict:
    """One result file from several runs of the same checkpoint (each a result: rows concatenated, the first
    run's machine kept, every machine listed)."""
    docs = [json.loads(Path(p).read_text()) for p in parts]
    doc = {"machine": docs[0]["machine"], "machines": [d["machine"] for d in docs], "checkpoint": docs[0]["checkpoint"],
           "frames": docs[0]["frames"], "note": note, "rows": [r for d in docs for r in d["rows"]]}
    Path(out).write_text(json.dumps(doc, indent=1) + "\n")
    return doc

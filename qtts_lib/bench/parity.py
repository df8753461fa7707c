"""Greedy parity at any size: the ncnn runtime (fp32, CPU) against qwen-tts on the same machine, every prompt kind
of a checkpoint. Introduced in 09.

`python -m qtts_lib.bench parity --checkpoint full-1.7b-customvoice --frames 48` runs, for every case of
`golden.cases` (Base: an x-vector and an ICL clone; CustomVoice: a built-in speaker, with an instruction where the
checkpoint follows one; VoiceDesign: a described voice and none), the reference once (greedy, the talker's logits
kept) and the runtime once, and compares the codes frame by frame, the prompt embeddings and the waveform. Where a
code differs, the row names the first frame and codebook, and for codebook 0 the reference's two best logits there
and their margin (a near-tie flips under float32 rounding; anything else is a bug). Nothing is saved as a golden:
the chapters' goldens are tiny and live in data/golden/; full-size rows are committed under data/bench/parity/.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np


def divergence(ours: np.ndarray, ref: np.ndarray, logits: np.ndarray) -> dict | None:
    """None when the (T, 16) codes are equal; else the first differing frame and codebook, both codes, and for
    codebook 0 the reference's logits of the two codes at that step and the margin between its two best."""
    if ours.shape == ref.shape and np.array_equal(ours, ref):
        return None
    frames = min(len(ours), len(ref))
    diff = np.argwhere(ours[:frames] != ref[:frames])
    if not len(diff):  # equal up to the shorter one: one stopped earlier
        return {"frame": frames, "codebook": None, "ours": None, "reference": None, "lengths": [len(ours), len(ref)]}
    frame, book = (int(v) for v in diff[0])
    out = {"frame": frame, "codebook": book, "ours": int(ours[frame, book]), "reference": int(ref[frame, book])}
    if book == 0 and frame < len(logits):
        row = logits[frame].astype(np.float64)
        top2 = np.sort(row)[-2:]
        out.update(logit_ours=float(row[out["ours"]]), logit_reference=float(row[out["reference"]]),
                   margin=float(top2[1] - top2[0]))
    return out


def compare(synth, tts, name: str, voice: dict, text: str, language: str, frames: int, threads: int) -> dict:
    """One case: the reference and the runtime, greedy, `frames` frames of `text`, each on `threads` threads."""
    from .. import check, golden
    from ..runtime import Sampling

    t0 = time.perf_counter()
    ref = golden.run_with_logits(tts, voice, threads, max_new_tokens=frames + 1)  # N new tokens give N - 1 frames
    t_ref = time.perf_counter() - t0
    if "voice_wav" in voice:
        v = synth.voice(wav=voice["voice_wav"], text=voice.get("voice_text"))
        described = {"clone": "icl" if voice.get("voice_text") else "xvector", "clip": "data/inputs/voice.wav"}
    elif "speaker" in voice:
        v = synth.voice(speaker=voice["speaker"], instruct=voice.get("instruct"))
        described = {"speaker": voice["speaker"], "instruct": voice.get("instruct")}
    else:
        v = synth.voice(instruct=voice["instruct"])
        described = {"instruct": voice["instruct"]}
    prompt = synth.prompt(text, language, v).embeds
    t0 = time.perf_counter()
    result = synth.synthesize(text, language, v, Sampling(greedy=True), max_frames=frames)
    t_run = time.perf_counter() - t0
    ours, theirs = result.codes, ref["codes"]
    same_shape = ours.shape == theirs.shape
    bad = check.mismatches(ours, theirs)[0] if same_shape else None
    extra = len(result.wav) - len(ref["wav"])  # ICL: one sample more (the reference's float-ratio cut)
    snr = check.snr_db(result.wav[extra:], ref["wav"]) if 0 <= extra <= 1 else None
    eos = ref["talker_sequences"] == int(tts.model.config.talker_config.codec_eos_token_id)
    return {"case": name, "voice": described, "text": text, "language": language, "frames": int(len(theirs)),
            "codes_compared": int(theirs.size), "codes_mismatched": bad,
            "divergence": divergence(ours, theirs, ref["logits"]),
            "eos_step": {"reference": int(np.flatnonzero(eos)[0]) if eos.any() else -1, "runtime": result.eos_step},
            "prompt_rows": int(prompt.shape[0]),
            "prompt_rel_err": check.rel_err(prompt, ref["inputs_embeds"]) if prompt.shape == ref["inputs_embeds"].shape
            else None,
            "wav_snr_db": snr,
            "seconds": {"reference_generate": round(t_ref, 1), "runtime_synthesize": round(t_run, 1)}}


def measure(model_dir: Path, frames: int = 48, threads: int = 2, cases: list[str] | None = None) -> dict:
    """Every case of `golden.cases` (or those named) on the checkpoint in `model_dir`: export (reused when current),
    then reference and runtime side by side. The result: `{what, checkpoint, machine, versions, frames, parity}`."""
    import importlib.metadata as md

    import torch

    from .. import export, golden, inputs, reference
    from ..runtime import Synthesizer
    from .machine import describe

    machine = describe([threads])
    tts = reference.load(model_dir, threads=threads)
    t0 = time.perf_counter()
    export.ensure(tts, model_dir.name)
    export_s = time.perf_counter() - t0
    synth = Synthesizer(model_dir, threads=threads)
    rows = []
    for name, voice in golden.cases(tts).items():
        if cases and name not in cases:
            continue
        row = compare(synth, tts, name, voice, inputs.TARGET_TEXT, inputs.LANGUAGE, frames, threads)
        row.update(threads=threads, device="cpu")
        print(f"{name}: {row['codes_mismatched']}/{row['codes_compared']} codes differ, wav "
              f"{row['wav_snr_db']:.1f} dB, divergence {row['divergence']}", flush=True)
        rows.append(row)
    versions = {"torch": torch.__version__, **{p: md.version(p) for p in
                                               ("transformers", "qwen-tts", "pnnx", "ncnn")}}
    return {"what": "greedy parity of the ncnn runtime (fp32, CPU) against qwen-tts on the same machine and threads, "
                    "every prompt kind of the checkpoint (qtts_lib.bench.parity)",
            "checkpoint": model_dir.name, "kind": tts.model.tts_model_type, "machine": machine, "versions": versions,
            "frames": frames, "export_seconds": round(export_s, 1), "parity": rows}

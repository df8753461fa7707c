"""Golden references: greedy fp32 CPU runs of the reference, saved with a manifest. Introduced in 03.

Chapter 03 makes them and explains each field; chapters 06-11 and tests/test_golden.py hold the runtime to them.
A golden run captures (`reference.capture_generation`) the prompt embeddings, the x-vector, the codes going into the
codec and the decoded waveform, and (a forward hook on `codec_head`) the talker's logits at every step, which tell
later how close each argmax decision was. Each `.npz` has a manifest entry (producer chapter, inputs, sha256,
versions, threads, checkpoint fingerprint) that `artifacts.load_npz` verifies, naming chapter 03 when it is stale.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from . import artifacts, inputs, paths, reference
from .runtime.audio.wav import load_wav

PRODUCER = "03_make_golden"
THREADS = 1
"""Goldens are made on one CPU thread. There a BLAS has no work to split or schedule, so a rerun is bitwise equal on
any processor; on more threads MKL (torch's BLAS) promises that only under conditions it lists ("conditional numerical
reproducibility"). Chapter 03 measures what another thread count changes."""


def voice_of(tts) -> dict:
    """The main golden's voice (`capture_generation` arguments): a clone of data/inputs/voice.wav (Base), the first
    built-in speaker (CustomVoice), a described voice (VoiceDesign)."""
    return reference.default_voice(tts, load_wav(paths.voice_wav()))


def mode_of(tts) -> str:
    """The main golden's name stem: xvec, speaker or design."""
    return {"custom_voice": "speaker", "voice_design": "design"}.get(tts.model.tts_model_type, "xvec")


def cases(tts) -> dict[str, dict]:
    """Every greedy golden a checkpoint has, name -> `capture_generation` voice arguments: Base an x-vector and an
    ICL clone; CustomVoice its first speaker, and with an instruction where the checkpoint follows one (the
    reference drops it on 0.6B); VoiceDesign a described voice and no description at all."""
    voice = voice_of(tts)
    kind = tts.model.tts_model_type
    if kind == "custom_voice":
        out = {"speaker_greedy": voice}
        if (tts.model.tts_model_size or "") not in "0b6":  # qwen_tts's own test (qwen3_tts_model.py:799)
            out["speaker_instruct_greedy"] = voice | {"instruct": reference.STYLE}
        return out
    if kind == "voice_design":
        return {"design_greedy": voice, "design_plain_greedy": {"instruct": ""}}
    transcript = (paths.INPUTS / "voice.txt").read_text().strip()
    return {"xvec_greedy": voice, "icl_greedy": voice | {"voice_text": transcript}}


def run_with_logits(tts, voice: dict, threads: int = THREADS, **kw) -> dict:
    """One greedy reference run of the golden text (`capture_generation`) on `threads` CPU threads (the thread count
    is restored after), with the talker's logits per step."""
    import torch

    logits = []
    hook = tts.model.talker.codec_head.register_forward_hook(
        lambda m, a, out: logits.append(out[0, -1].detach().clone()))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = reference.capture_generation(tts, inputs.TARGET_TEXT, inputs.LANGUAGE, voice.get("voice_wav"),
                                           voice.get("voice_text"), speaker=voice.get("speaker"),
                                           instruct=voice.get("instruct"), **kw)
    finally:
        torch.set_num_threads(before)
        hook.remove()
    out["logits"] = torch.stack(logits).numpy()  # (steps, vocab)
    return out


def save(ckpt: str, name: str, run: dict, eos_id: int, voice: dict, threads: int = THREADS, **more_inputs) -> Path:
    """`data/golden/<ckpt>/<name>.npz` and its manifest entry."""
    described = voice.get("speaker") or (None if voice.get("voice_wav") is None else
                                         f"voice.wav sha256 {artifacts.sha256(paths.voice_wav())[:16]}")
    common = {"text": inputs.TARGET_TEXT, "language": inputs.LANGUAGE, "max_new_tokens": inputs.GOLDEN_MAX_NEW_TOKENS,
              "voice": described, "instruct": voice.get("instruct"), "voice_text": voice.get("voice_text")}
    extra = {"threads": threads, "dtype": "float32", "device": "cpu", "attn": "sdpa", "greedy": True}
    seq = run["talker_sequences"]
    hit = np.flatnonzero(seq == eos_id)
    arrays = {key: run[key] for key in ("codes", "wav", "inputs_embeds", "trailing_text_hidden", "tts_pad_embed",
                                        "talker_sequences", "logits", "voice_codes", "xvector") if key in run}
    arrays["eos_step"] = np.array(int(hit[0]) if hit.size else -1)
    arrays["eos_id"] = np.array(eos_id)
    return artifacts.save_npz(paths.golden_dir(ckpt) / f"{name}.npz", PRODUCER, ckpt,
                              dict(common, eos_id=eos_id, **more_inputs), extra, **arrays)


def ensure(ckpt: str, tts) -> dict[str, dict[str, np.ndarray]]:
    """The greedy goldens of `ckpt` (`cases`), loaded where chapter 03 left them current, made here (by the same
    functions chapter 03 runs) where it did not."""
    eos = int(tts.model.config.talker_config.codec_eos_token_id)
    out = {}
    for name, voice in cases(tts).items():
        path = paths.golden_dir(ckpt) / f"{name}.npz"
        try:
            out[name] = artifacts.load_npz(path, ckpt)[0]
            continue
        except artifacts.StaleArtifact:  # missing, changed, or made from another checkpoint
            pass
        save(ckpt, name, run_with_logits(tts, voice, max_new_tokens=inputs.GOLDEN_MAX_NEW_TOKENS), eos, voice)
        out[name] = artifacts.load_npz(path, ckpt)[0]
    return out

"""Golden references: greedy fp32 CPU runs of the reference, saved with a manifest. Introduced in 03.

Chapter 03 makes them and explains each field; chapters 06-08 and tests/test_golden.py hold the runtime to them.
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


def voice_of(tts) -> dict:
    """The golden voice: a clone of data/inputs/voice.wav (Base), or the first built-in speaker (CustomVoice)."""
    return reference.default_voice(tts, load_wav(paths.voice_wav()))


def run_with_logits(tts, voice: dict, **kw) -> dict:
    """One greedy reference run of the golden text (`capture_generation`), with the talker's logits per step."""
    import torch

    logits = []
    hook = tts.model.talker.codec_head.register_forward_hook(
        lambda m, a, out: logits.append(out[0, -1].detach().clone()))
    try:
        out = reference.capture_generation(tts, inputs.TARGET_TEXT, inputs.LANGUAGE, voice.get("voice_wav"),
                                           speaker=voice.get("speaker"), **kw)
    finally:
        hook.remove()
    out["logits"] = torch.stack(logits).numpy()  # (steps, vocab)
    return out


def save(ckpt: str, name: str, run: dict, eos_id: int, voice: dict, threads: int, **more_inputs) -> Path:
    """`data/golden/<ckpt>/<name>.npz` and its manifest entry."""
    common = {"text": inputs.TARGET_TEXT, "language": inputs.LANGUAGE, "max_new_tokens": inputs.GOLDEN_MAX_NEW_TOKENS,
              "voice": voice.get("speaker") or f"voice.wav sha256 {artifacts.sha256(paths.voice_wav())[:16]}"}
    extra = {"threads": threads, "dtype": "float32", "device": "cpu", "attn": "sdpa", "greedy": True}
    seq = run["talker_sequences"]
    hit = np.flatnonzero(seq == eos_id)
    arrays = {key: run[key] for key in ("codes", "wav", "inputs_embeds", "trailing_text_hidden", "tts_pad_embed",
                                        "talker_sequences", "logits", "voice_codes", "xvector") if key in run}
    arrays["eos_step"] = np.array(int(hit[0]) if hit.size else -1)
    arrays["eos_id"] = np.array(eos_id)
    return artifacts.save_npz(paths.golden_dir(ckpt) / f"{name}.npz", PRODUCER, ckpt,
                              dict(common, eos_id=eos_id, **more_inputs), extra, **arrays)


def names(custom_voice: bool) -> list[str]:
    """The greedy goldens a checkpoint has: a built-in speaker's, or an x-vector clone's and an ICL clone's."""
    return ["speaker_greedy"] if custom_voice else ["xvec_greedy", "icl_greedy"]


def ensure(ckpt: str, tts, threads: int = 2) -> dict[str, dict[str, np.ndarray]]:
    """The greedy goldens of `ckpt` (`names`), loaded where chapter 03 left them current, made here (by the same
    functions chapter 03 runs) where it did not."""
    custom_voice = tts.model.tts_model_type == "custom_voice"
    eos = int(tts.model.config.talker_config.codec_eos_token_id)
    voice = voice_of(tts)
    out = {}
    for name in names(custom_voice):
        path = paths.golden_dir(ckpt) / f"{name}.npz"
        try:
            out[name] = artifacts.load_npz(path, ckpt)[0]
            continue
        except artifacts.StaleArtifact:  # missing, changed, or made from another checkpoint
            pass
        if name == "icl_greedy":
            text = (paths.INPUTS / "voice.txt").read_text().strip()
            run = run_with_logits(tts, voice, max_new_tokens=inputs.GOLDEN_MAX_NEW_TOKENS, voice_text=text)
            save(ckpt, name, run, eos, voice, threads, voice_text=text)
        else:
            save(ckpt, name, run_with_logits(tts, voice, max_new_tokens=inputs.GOLDEN_MAX_NEW_TOKENS), eos, voice,
                 threads)
        out[name] = artifacts.load_npz(path, ckpt)[0]
    return out

"""The reference model: the real `qwen-tts` package, 12 Hz path only. Introduced in 00.

`qwen_tts/__init__` imports the 25 Hz speech tokenizer module, and only that
module needs torchaudio/sox/onnxruntime/einops. We register a placeholder under
its name before the first import; the 12 Hz path never touches it.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

V1_MODULE = "qwen_tts.core.tokenizer_25hz.modeling_qwen3_tts_tokenizer_v1"


class _Tokenizer25HzUnavailable:
    """Stands in for the 25 Hz tokenizer model, which this project does not use."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError("the 25 Hz speech tokenizer is not available in qtts (12 Hz path only)")


def import_qwen_tts():
    """Import `qwen_tts` without its 25 Hz dependencies; returns the package."""
    if V1_MODULE not in sys.modules:
        placeholder = types.ModuleType(V1_MODULE)
        placeholder.Qwen3TTSTokenizerV1Model = _Tokenizer25HzUnavailable
        placeholder.__doc__ = "placeholder registered by qtts_lib.reference (12 Hz path only)"
        sys.modules[V1_MODULE] = placeholder
    import qwen_tts

    return qwen_tts


def load(model_dir: str | Path, threads: int | None = None, attn: str = "sdpa", device: str = "cpu"):
    """Load a checkpoint directory with qwen_tts's own loader, fp32, offline, on `device` (cpu, or cuda for the GPU
    benchmark)."""
    import os

    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # MKL (torch's BLAS) may pick another kernel for another memory alignment, so two runs of one process can differ
    # in the last bits; STRICT makes a rerun bitwise equal (read at MKL's first call; the Makefile also exports it).
    os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
    import transformers

    # generate() warns on every call about flags the greedy path ignores (temperature) and pad_token_id.
    transformers.logging.set_verbosity_error()
    if threads is not None:
        torch.set_num_threads(threads)
    qwen_tts = import_qwen_tts()
    placed = {} if device == "cpu" else {"device_map": device}
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation=attn, local_files_only=True, **placed
    )
    tts.model.eval()
    return tts


GREEDY = dict(do_sample=False, subtalker_dosample=False)
"""Greedy settings for golden references: talker and sub-talker take the argmax.

Everything else (repetition_penalty 1.05, min_new_tokens 2, the suppressed
control-token range) stays as the checkpoint's generation_config and
`Qwen3TTSForConditionalGeneration.generate` set it, so the port must reproduce it."""


def _np(t):
    return t.detach().float().cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy()


def capture_generation(tts, text: str, language: str, voice_wav=None, voice_text: str | None = None,
                       max_new_tokens: int = 45, eos_token_id: int | None = None, speaker: str | None = None,
                       non_streaming: bool | None = None, instruct: str | None = None, xvector=None,
                       **gen_kwargs) -> dict:
    """Run the original pipeline once and capture what the port must reproduce.

    Base checkpoints clone `voice_wav`: x-vector mode without `voice_text`, ICL mode with it.
    CustomVoice checkpoints use the built-in `speaker` instead, with an optional `instruct` (which the reference
    drops on 0.6B); VoiceDesign checkpoints speak the voice `instruct` describes (empty: none). A Base checkpoint can
    also be given an `xvector` (a speaker embedding) instead of a clip (no mel frontend needed). Greedy unless
    `gen_kwargs` say
    otherwise. Probes wrap three methods of this model instance for the duration of the call:
    the talker's `generate` (prompt embeddings in, codebook-0 sequence out), the speaker
    encoder call (the x-vector) and the codec `decode` (the (T, 16) codes). Returns numpy arrays.
    """
    import numpy as np
    import torch

    from ..runtime.audio.wav import SAMPLE_RATE

    model = tts.model
    got: dict = {}
    talker_generate = model.talker.generate
    extract = model.extract_speaker_embedding
    decode = model.speech_tokenizer.decode

    def talker_probe(*args, **kw):
        got["inputs_embeds"] = _np(kw["inputs_embeds"][0])
        got["trailing_text_hidden"] = _np(kw["trailing_text_hidden"][0])
        got["tts_pad_embed"] = _np(kw["tts_pad_embed"].reshape(-1))
        out = talker_generate(*args, **kw)
        got["talker_sequences"] = _np(out.sequences[0])
        return out

    def extract_probe(audio, sr):  # noqa: ANN001
        x = extract(audio=audio, sr=sr)
        got["xvector"] = _np(x)
        return x

    def decode_probe(items):
        got["decoded_codes"] = _np(items[0]["audio_codes"])
        return decode(items)

    model.talker.generate = talker_probe
    model.extract_speaker_embedding = extract_probe
    model.speech_tokenizer.decode = decode_probe
    try:
        kwargs = dict(GREEDY, **gen_kwargs)
        if eos_token_id is not None:
            kwargs["eos_token_id"] = eos_token_id
        if non_streaming is not None:  # else each entry point's own default
            kwargs["non_streaming_mode"] = non_streaming
        with torch.inference_mode():
            if tts.model.tts_model_type == "voice_design":
                wavs, sr = tts.generate_voice_design(
                    text=text, language=language, instruct=instruct or "", max_new_tokens=max_new_tokens, **kwargs)
            elif xvector is not None:
                prompt = {"ref_code": [None], "ref_spk_embedding": [torch.as_tensor(np.asarray(xvector, np.float32))],
                          "x_vector_only_mode": [True], "icl_mode": [False]}
                wavs, sr = tts.generate_voice_clone(text=text, language=language, voice_clone_prompt=prompt,
                                                    max_new_tokens=max_new_tokens, **kwargs)
                got.setdefault("xvector", np.asarray(xvector, np.float32))
            elif speaker is not None:
                wavs, sr = tts.generate_custom_voice(
                    text=text, language=language, speaker=speaker, instruct=instruct, max_new_tokens=max_new_tokens,
                    **kwargs)
            else:
                wavs, sr = tts.generate_voice_clone(
                    text=text, language=language, ref_audio=(np.asarray(voice_wav, np.float32), SAMPLE_RATE),
                    ref_text=voice_text, x_vector_only_mode=voice_text is None,
                    max_new_tokens=max_new_tokens, **kwargs,
                )
    finally:
        del model.talker.generate, model.extract_speaker_embedding, model.speech_tokenizer.decode
    codes = got.pop("decoded_codes")
    n_ref = 0 if voice_text is None else codes.shape[0] - _generated_frames(got["talker_sequences"], eos_token_id, tts)
    got.update(codes=codes[n_ref:], voice_codes=codes[:n_ref], wav=np.asarray(wavs[0], np.float32), sr=sr)
    return got


def _generated_frames(sequence, eos_token_id, tts) -> int:
    eos = eos_token_id if eos_token_id is not None else tts.model.config.talker_config.codec_eos_token_id
    hits = [i for i, t in enumerate(sequence.tolist()) if t == eos]
    return hits[0] if hits else len(sequence) - 1


DESIGNED_VOICE = "A calm, low female voice, speaking slowly and clearly."  # what the VoiceDesign goldens describe
STYLE = "Speak cheerfully, a little faster than usual."                   # an instruction for a built-in speaker


def default_voice(tts, voice_wav) -> dict:
    """Voice arguments for `capture_generation`: the voice clip for Base checkpoints, the first
    built-in speaker (alphabetically) for CustomVoice ones, which have no speaker encoder, and a described voice
    for VoiceDesign ones."""
    if tts.model.tts_model_type == "custom_voice":
        return {"speaker": sorted(tts.model.config.talker_config.spk_id)[0]}
    if tts.model.tts_model_type == "voice_design":
        return {"instruct": DESIGNED_VOICE}
    return {"voice_wav": voice_wav}


def show_source(obj, *needles: str, after: int = 0) -> None:
    """Print the lines of `obj`'s source that hold one of `needles` (and `after` lines below each), each with its
    file name and line number: how a chapter quotes the reference's own code where it matters. Introduced in 09."""
    import inspect

    obj = inspect.unwrap(obj)  # past decorators (torch.no_grad, can_return_tuple) to the function itself
    src, first = inspect.getsourcelines(obj)
    hits = [i for i, line in enumerate(src) if any(n in line for n in needles)]
    for i in sorted({i + k for i in hits for k in range(after + 1)} & set(range(len(src)))):
        print(f"{Path(inspect.getsourcefile(obj)).name}:{first + i}  {src[i].rstrip()}")

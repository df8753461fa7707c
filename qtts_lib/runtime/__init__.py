"""The torch-free runtime: numpy + ncnn (+ soundfile) only. The deployable product of the tutorial.

    from qtts_lib.runtime import Synthesizer, load_wav
    synth = Synthesizer("models/tiny-base")
    voice = synth.voice(wav=load_wav("data/inputs/voice.wav"))
    result = synth.synthesize("Hello.", "english", voice)        # result.wav: float32 at 24 kHz

Layers, from the bottom (a module imports only from layers below its own, and from `errors`):

    binding/     ncnn through its Python binding: Mats and nets (`net`), the `.param` text (`param`), the `.bin`
                 weights (`weights`), graph editing (`graph`), rope tables and masks (`rope`), cached decoders
                 (`cached`), the SDPA kernel's cache layout (`cache_layout`)
    rewrites/    pure transforms of a graph's text and weights: the KV cache (`kv_cache`), decode steps
                 (`decode_step`), int8 (`int8`), the codec's CPU form (`codec_cpu`), the GPU forms (`gpu`),
                 sequences folded into attention heads (`batch`)
    text/        the BPE tokenizer (`bpe`), the sentence segmenter (`segment`)
    audio/       wav I/O and the wire formats (`wav`), mp3/opus/aac/flac piece by piece (`encode`), voice-clip
                 checks (`clips`), the mel frontend (`mel`), the split RVQ (`rvq`)
    codec/       codes to waveform: the decoder (`decoder`), its CPU form on disk (`cpu_form`) in parts (`parts`),
                 streaming (`stream`)
    pipeline/    the model: config, embeddings, prompt, voices, sampling, precision tiers, the generation loop
                 (`loop`), continuous batching (`scheduler`), the `Synthesizer` façade (`synthesizer`), long texts
                 (`longform`)
    app/         the front ends: shared options (`options`), `qtts say` (`cli`), `qtts serve` (`server/`: the
                 engine thread (`engine`), the voice store (`voices`), the HTTP layer (`http`, its answers
                 `reply`), the request and answers (`schema`, `forms`, `openapi`), `metrics`, the page `static/`)
    experimental/  measured ideas that are not part of the product (`codec_process`)

It must import with torch, transformers and qwen_tts unavailable (tests/test_runtime_imports.py).
"""
from .audio.clips import prepare_voice_clip
from .audio.wav import SAMPLE_RATE, load_wav, save_wav
from .errors import AudioError, BatchError, DeviceError, InputError, MissingArtifact, PrecisionError, QttsError
from .pipeline.longform import stream_long, synthesize_long
from .pipeline.prompt import Voice
from .pipeline.sampling import Sampling
from .pipeline.synthesizer import Result, Scheduler, Stream, Synthesizer, Utterance

__all__ = ["Synthesizer", "Voice", "Sampling", "Result", "Stream", "Utterance", "Scheduler", "load_wav", "save_wav",
           "prepare_voice_clip", "synthesize_long", "stream_long", "SAMPLE_RATE", "QttsError", "InputError",
           "AudioError", "MissingArtifact", "DeviceError", "PrecisionError", "BatchError"]

"""Text to speech with ncnn alone: the product's one pipeline. Introduced in 07.

    synth = Synthesizer("models/tiny-base")                     # a checkpoint directory with its ncnn/ exports
    voice = synth.voice(wav=load_wav("clip.wav"))                # x-vector clone (add text=... for ICL)
    result = synth.synthesize("Hello.", "english", voice)        # result.wav: float32 at 24 kHz
    for piece in synth.stream("Hello.", "english", voice): ...   # the same audio, as it is generated

A `Synthesizer` is made of parts, each its own module: the checkpoint's config (`pipeline.config`), the tokenizer
and prompt builder (`pipeline.prompt`), the voice encoders (`pipeline.voices`), the generation loop
(`pipeline.loop`) and the codec (`codec`). `synthesize` and `stream` are one path: the loop's frames are pushed
into a decoder, which returns audio when it has some (`codec.stream`): at the end for `synthesize` (the reference's
whole decode), every `chunk_frames` frames for `stream`.

Many utterances at once: `synthesize_many` (a list of `Utterance`s, results in order), or a `Scheduler`
(`pipeline.scheduler`) that utterances are submitted to at any time and that makes one frame of every running one per
`step` (continuous batching over `pipeline.loop.Batch`; the server runs one). `synthesize` and `stream` are a
scheduler of one. The scheduler stands on four of the synthesizer's parts: `loop`, `decoders`, `jobs`, the job
builder (`pipeline.scheduler.Jobs`: an utterance checked and turned into a prompt, a sampler and a frame cap), and
`prefixes`, the talker caches of the prompt heads spoken so far (`pipeline.scheduler.Prefixes`: the next utterance
with the same voice and language prefills only its text).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np

from ..binding.net import parse_device
from ..codec.decoder import Codec, check_codec_tier
from ..codec.stream import Decoders
from ..errors import InputError, MissingArtifact
from ..text.bpe import Tokenizer
from .config import ModelConfig
from .embeddings import Embeddings
from .loop import Loop
from .precision import check_tier
from .prompt import Prompt, PromptBuilder, Voice
from .sampling import Sampling
from .scheduler import DEFAULT_MAX_BATCH, Event, Job, Jobs, Prefixes, Result, Scheduler, Ticket, Utterance
from .voices import VoiceEncoder

__all__ = ["Synthesizer", "Stream", "Result", "Scheduler", "Utterance", "Ticket", "Event", "Job", "Jobs",
           "DEFAULT_MAX_BATCH", "missing_graphs"]

GRAPHS = ["talker_text_embed", "talker_codec_embed", "talker_decoder", "talker_codec_head",
          "predictor_decoder", "predictor_embeds", "predictor_heads", "codec_decoder"]
CACHED_GRAPHS = ["talker_decoder", "predictor_decoder"]


class Stream:
    """`Synthesizer.stream`'s answer: iterate it for float32 pieces at 24 kHz; `result` is the `Result` once it is
    exhausted (its wav None). `close()` (or leaving a `with` block) stops the generation at once."""

    def __init__(self, pieces: Iterator[np.ndarray]):
        self._pieces, self.result = pieces, None

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> np.ndarray:
        try:
            return next(self._pieces)
        except StopIteration as end:
            self.result = end.value
            raise

    def close(self) -> None:
        self._pieces.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Synthesizer:
    """The deployable pipeline over a checkpoint directory and its `ncnn/` exports (module docstring)."""

    def __init__(self, model_dir: str | Path, threads: int = 2, device: str = "cpu", precision: str = "fp32",
                 log: Callable[[str], None] | None = None, decoders=None, codec_precision: str = "fp32",
                 gpu_batches: bool = False):
        """`threads`: CPU threads for ncnn; `device`: cpu, vulkan or vulkan:N; `precision`: fp32 (the default, the
        parity tier), fp16 or int8, the talker's and code predictor's weights (CPU only; chapter 13);
        `codec_precision`: fp32 (the default), bf16 or int8, the codec's upsampling stages (CPU only; chapter 14).
        `log` hears about one-time work (writing the text table or a tier's files, calibrating the codec's int8 tier).
        `decoders`: where frames become audio, if not this process's codec (`experimental.codec_process`).
        `gpu_batches`, on a GPU: load the graphs that take several sequences per call (the CPU's, folded: about 240
        round trips per step, shared by the batch) instead of the GPU forms that take one (18 per frame; chapter 10).
        On the CPU the loop always batches."""
        if not (Path(model_dir) / "config.json").is_file():
            raise MissingArtifact(f"{model_dir} has no config.json: not a checkpoint directory; pass one, or run "
                                  "notebooks/00_get_checkpoint.py")
        self.precision = check_tier(precision, device)
        check_codec_tier(codec_precision, "cpu" if parse_device(device) is None else "gpu")
        missing_graphs(Path(model_dir) / "ncnn", raise_error=True)  # what a checkpoint without exports needs first
        self.config = cfg = ModelConfig.load(model_dir)
        self.tokenizer = Tokenizer.from_dir(cfg.directory)
        self.embeddings = Embeddings(cfg, threads, log)
        self.prompts = PromptBuilder(cfg, self.tokenizer, self.embeddings)
        self.voices = VoiceEncoder(cfg, threads, device)
        self.loop = Loop.load(cfg, self.embeddings, threads, device, self.precision, gpu_forms=not gpu_batches,
                              log=log)
        self.codec = Codec(cfg.ncnn_dir, cfg.codec, threads, device, precision=codec_precision, log=log) \
            if decoders is None else None
        self.decoders = Decoders(self.codec) if decoders is None else decoders
        self.sampling = Sampling.from_generation_config(cfg.generation)
        self.jobs = Jobs(cfg, self.prompts, self.sampling)
        self.prefixes = Prefixes()  # the talker caches of prompt heads, for every scheduler of this synthesizer

    def close(self) -> None:
        """Stop what runs beside this process (a codec process); nothing else needs closing."""
        self.decoders.close()

    def __enter__(self) -> Synthesizer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ what it can do
    @property
    def languages(self) -> list[str]:
        return self.config.languages

    @property
    def speakers(self) -> list[str]:
        return self.config.speakers

    @property
    def kind(self) -> str:
        """"base" (clones a voice clip), "custom_voice" (built-in speakers), "voice_design" (described voices)."""
        return self.config.kind

    @property
    def follows_instructions(self) -> bool:
        """Whether `Voice.instruct` reaches the model (VoiceDesign; CustomVoice above 0.6B)."""
        return self.config.follows_instructions

    # ------------------------------------------------------------ voice
    def voice(self, wav: np.ndarray | None = None, text: str | None = None, speaker: str | None = None,
              xvector: np.ndarray | None = None, instruct: str | None = None) -> Voice:
        """A `Voice`: on a Base checkpoint from a voice clip (x-vector; ICL with its transcript `text`) or a
        precomputed `xvector`; on a CustomVoice checkpoint a built-in `speaker`, with an optional `instruct` (a
        style in words); on a VoiceDesign checkpoint the voice `instruct` describes (empty or None: the model's
        own choice). Compute it once and reuse it for many texts."""
        if instruct is not None and not isinstance(instruct, str):
            raise InputError(f"an instruction is text, not {type(instruct).__name__}")
        instruct = instruct.strip() if instruct else None
        if self.kind == "voice_design":
            if any(x is not None for x in (wav, text, speaker, xvector)):
                raise InputError("a VoiceDesign checkpoint speaks a voice described in words: give an instruction "
                                 "(e.g. 'A calm, low female voice'), not a voice clip or a speaker")
            return Voice(None, instruct=instruct)
        if sum(x is not None for x in (wav, speaker, xvector)) != 1:
            options = (f"a built-in speaker ({', '.join(self.speakers)})" if self.kind == "custom_voice"
                       else "a voice clip to clone (x-vector; add its transcript for ICL)")
            raise InputError(f"give exactly one voice: {options}")
        if text is not None and wav is None:
            raise InputError("a voice transcript needs the voice clip it transcribes")
        if text is not None and not text.strip():
            raise InputError("the voice transcript is empty")
        if speaker is not None:
            spk_id = self.config.talker.get("spk_id") or {}
            if speaker.lower() not in spk_id:
                valid = ", ".join(self.speakers) or "(none in this checkpoint)"
                raise InputError(f"unknown speaker {speaker!r}; valid: {valid}")
            return Voice(self.embeddings.codec([spk_id[speaker.lower()]])[0], speaker=speaker.lower(),
                         instruct=instruct)
        if instruct:
            raise InputError("a Base checkpoint clones the voice it is given and takes no instruction; instructions "
                             "need a CustomVoice (1.7B) or VoiceDesign checkpoint")
        if xvector is not None:
            return Voice(np.asarray(xvector, np.float32).reshape(-1))
        return Voice(self.voices.xvector(wav), codes=self.voices.codes(wav) if text is not None else None, text=text)

    # ------------------------------------------------------------ speech
    def synthesize_many(self, utterances: Iterable[Utterance], max_batch: int = DEFAULT_MAX_BATCH,
                        on_frame: Callable[[int, int], None] | None = None,
                        on_warning: Callable[[int, str], None] | None = None) -> list[Result]:
        """Every utterance, `max_batch` at a time in one batch (a new one joins as soon as one ends); results in
        the order given, each as `synthesize` would give it (chapter 17 says how equal). Every utterance is checked
        before the first frame. `on_frame(i, n)` after frame n of utterance i; `on_warning(i, message)`."""
        todo = list(utterances)
        scheduler = Scheduler(self, max_batch)
        tickets = [scheduler.submit(u, on_warning=(lambda m, i=i: on_warning(i, m)) if on_warning else None,
                                    on_frame=(lambda n, i=i: on_frame(i, n)) if on_frame else None)
                   for i, u in enumerate(todo)]
        audio: dict[int, list[np.ndarray]] = {t.id: [] for t in tickets}
        try:
            while scheduler:
                for event in scheduler.step():
                    audio[event.ticket.id] += event.pieces
        finally:
            scheduler.close()
        for t in tickets:
            t.result.wav = np.concatenate(audio[t.id]).astype(np.float32) if audio[t.id] else np.zeros(0, np.float32)
        return [t.result for t in tickets]

    def synthesize(self, text: str, language: str, voice: Voice, sampling: Sampling | None = None,
                   max_frames: int | None = None, non_streaming: bool | None = None,
                   on_frame: Callable[[int], None] | None = None,
                   on_warning: Callable[[str], None] | None = None) -> Result:
        """Prompt, loop, decode: the whole utterance at once. Introduced in 07.

        `sampling`: the checkpoint's defaults (`self.sampling`) unless given; `max_frames`: the most frames to
        generate (12.5 per second), by default the text's own cap (`prompt.frame_cap`); `non_streaming`: the
        prompt's layout (`PromptBuilder.build`). `on_frame(n)` after each frame (progress bars); `on_warning` as
        soon as a problem is known (text longer than the cap), also kept in `Result.warnings`."""
        job = self.jobs.build(text, language, voice, sampling, max_frames, non_streaming, on_warning)
        stream = Stream(self._speak(job, self.decoders.decoder(None, voice.codes), on_frame))
        wav = list(stream)
        result = stream.result
        result.wav = np.concatenate(wav).astype(np.float32) if wav else np.zeros(0, np.float32)
        return result

    def stream(self, text: str, language: str, voice: Voice, sampling: Sampling | None = None,
               max_frames: int | None = None, chunk_frames: int = 4, non_streaming: bool | None = None,
               on_frame: Callable[[int], None] | None = None,
               on_warning: Callable[[str], None] | None = None) -> Stream:
        """`synthesize`, streamed: float32 pieces of `chunk_frames` frames (80 ms each) as they are generated;
        concatenated they are `synthesize`'s wav (`codec.stream.StreamDecoder` says how exactly). Bad input is
        refused here, before any piece; the generation runs in the caller's thread, a frame per `next`.
        Introduced in 15."""
        if not isinstance(chunk_frames, int) or isinstance(chunk_frames, bool) or chunk_frames < 1:
            raise InputError(f"chunk_frames must be a whole number, at least 1, not {chunk_frames!r}")
        job = self.jobs.build(text, language, voice, sampling, max_frames, non_streaming, on_warning)
        return Stream(self._speak(job, self.decoders.decoder(chunk_frames, voice.codes), on_frame))

    def prompt(self, text: str, language: str, voice: Voice, non_streaming: bool | None = None) -> Prompt:
        """The talker's prompt for `text` (what `synthesize` builds first)."""
        return self.prompts.build(text, language, voice, non_streaming)

    def _speak(self, job: Job, decoder, on_frame):
        """The one path: a scheduler of one, its pieces yielded as they come; returns the `Result`. Closed early,
        the loop stops at once and the decoder is closed."""
        scheduler = Scheduler(self, 1)
        ticket = scheduler.enqueue(job, decoder, on_frame)
        try:
            while ticket.result is None:
                for event in scheduler.step():
                    yield from event.pieces
        finally:
            scheduler.close()
        return ticket.result


def missing_graphs(ncnn_dir: Path, raise_error: bool = False) -> list[str]:
    """The exported graphs the synthesizer needs that `ncnn_dir` lacks (with the chapter to run)."""
    missing = [g for g in GRAPHS if not (ncnn_dir / f"{g}.param").is_file()]
    missing += [f"{g}_kv" for g in CACHED_GRAPHS if not (ncnn_dir / f"{g}_kv.param").is_file()]
    if missing and raise_error:
        first = "04_export_align" if any(not m.endswith("_kv") for m in missing) else "05_inject_kv_cache"
        raise MissingArtifact(f"missing ncnn graphs in {ncnn_dir}: {', '.join(missing)}; run notebooks/{first}.py"
                              " (and the chapters after it)")
    return missing

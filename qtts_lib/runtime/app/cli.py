"""`qtts say ...`: text to a wav file with numpy + ncnn only; `qtts serve`: the speech server. Introduced in 07.

    qtts say --checkpoint models/tiny-base --voice data/inputs/voice.wav --text "Hello." -o out.wav
    qtts say --voice clip.wav --voice-text "what clip.wav says" ...     (ICL cloning)
    qtts say --checkpoint tiny-customvoice --speaker serena ...        (built-in voice)
    qtts say --checkpoint tiny-1.7b-customvoice --speaker serena --instruct "Speak cheerfully." ...
    qtts say --checkpoint tiny-voicedesign --instruct "A calm, low female voice" ...   (a voice described)
    qtts say --text-file chapter.txt ...     (any length: spoken segment by segment, chapter 16, four segments at
                                             a time, chapter 17, --max-batch N; - reads stdin)
    qtts say ... --temperature 0.7 --top-k 30 --seed 3                 (sampling; --greedy for the argmax)
    qtts say ... --speed 1.25                                          (faster, same pitch: FFmpeg's atempo)
    qtts say ... --timestamps spans.json     (where each segment's audio starts and ends, in seconds, as JSON)

Without --seed every run is a fresh take; the seed it drew is printed (`qtts: seed N: replay with --seed N`).

`--checkpoint` is a checkpoint directory (with its `ncnn/` exports), or a name looked up
under `$QTTS_MODELS` and then `./models`. Every user mistake ends in one line on stderr and
exit status 2 (bad input) or 3 (missing artifacts), never in a traceback from inside ncnn.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..audio import encode
from ..audio.clips import read_voice_clip
from ..audio.tempo import MAX_SPEED, MIN_SPEED, Tempo, change_tempo, check_speed
from ..audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, WavFile, pcm16, save_wav, wav_header
from ..errors import InputError, MissingArtifact, QttsError
from ..pipeline.longform import PAUSE_SECONDS, Span, plan, synthesize_long
from .hugepages import restart_with_huge_pages
from .options import (
    add_batch_option,
    add_generation_options,
    add_model_options,
    load_synthesizer,
    max_batch_of,
    positive_int,
    sampling_of,
)


class Parser(argparse.ArgumentParser):
    """Usage mistakes end in one line and exit status 2, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"qtts: error: {message} (see {self.prog} --help)\n")


def serve_extra():
    """The server package, or the name of the serve extra's module that is missing (`qtts say` and `qtts export`
    run without that extra; `qtts serve` then says what to install)."""
    try:
        from . import server
    except ModuleNotFoundError as e:
        if (e.name or "qtts_lib").split(".")[0] == "qtts_lib":
            raise
        return e.name
    return server


def parser() -> argparse.ArgumentParser:
    server = serve_extra()
    p = Parser(prog="qtts", description="Qwen3-TTS on ncnn (no torch).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    say = sub.add_parser("say", help="synthesize speech into a wav file",
                         description="Base checkpoints clone a voice clip (--voice, plus --voice-text for ICL); "
                                     "CustomVoice checkpoints speak with a built-in --speaker (the 1.7B ones follow "
                                     "an --instruct too); VoiceDesign checkpoints speak the voice --instruct "
                                     "describes.")
    text = say.add_mutually_exclusive_group(required=True)
    text.add_argument("--text", help="the text to speak")
    text.add_argument("--text-file", help="a UTF-8 text file to speak, of any length (- reads stdin)")
    say.add_argument("--language", default="auto", help="a language of the checkpoint, or auto")
    voice = say.add_mutually_exclusive_group()
    voice.add_argument("--voice", type=Path,
                       help="24 kHz mono voice clip to clone (x-vector); needed by Base checkpoints")
    voice.add_argument("--speaker", help="a built-in speaker; needed by CustomVoice checkpoints")
    say.add_argument("--voice-text", "--ref-text", dest="voice_text",
                     help="transcript of --voice: clone in ICL mode (x-vector only without it)")
    say.add_argument("--instruct", help="an instruction in words: the voice itself on a VoiceDesign checkpoint, a "
                                        "style for a --speaker of a 1.7B CustomVoice checkpoint")
    say.add_argument("--resample", action="store_true", help="accept a wav at another rate/channels and convert it")
    say.add_argument("--keep-long-voice", action="store_true",
                     help="use all of a voice clip longer than 15 s instead of trimming it at a quiet point")
    say.add_argument("-o", "--output", type=Path, required=True,
                     help="wav file, or .mp3, .opus (or .ogg), .aac, .flac by its suffix (PyAV); - writes to stdout "
                          "as it is generated (16-bit PCM, WAV header of unknown length)")
    say.add_argument("--stream", action="store_true",
                     help="write the file piece by piece as frames are generated (a wav is complete after each "
                          "piece; mp3, opus, aac and flac are encoded as the pieces come)")
    say.add_argument("--speed", type=speed_value, default=1.0,
                     help=f"tempo from {MIN_SPEED} to {MAX_SPEED} at the same pitch (FFmpeg's atempo through PyAV; "
                          "default 1.0: as generated)")
    say.add_argument("--timestamps", type=Path, metavar="FILE",
                     help="write where each segment's audio starts and ends (seconds in the output, and its text) "
                          "to FILE as JSON")
    add_model_options(say)
    add_generation_options(say, "cap on generated frames per segment (12.5 per second); each segment's own cap "
                                "also scales with its text")
    add_batch_option(say, "segments of a long text")
    serve = sub.add_parser("serve", help="a local HTTP speech server (OpenAI's /v1/audio/speech), streamed",
                           description="Needs the serve extra: pip install 'qtts[serve]'.")
    if not isinstance(server, str):  # else the extra is missing, and `main` says so whatever follows `serve`
        server.add_arguments(serve)
    export = sub.add_parser("export", help="convert a checkpoint directory for the runtime (chapters 04-05 in one "
                                           "command)", description="Needs the port extra: pip install 'qtts[port]' "
                                                                   "and pip install --no-deps qwen-tts==0.1.1.")
    export.add_argument("directory", type=Path, help="a Qwen3-TTS 12 Hz checkpoint directory (config.json, "
                                                     "model.safetensors, speech_tokenizer/, tokenizer files)")
    export.add_argument("--threads", type=positive_int, default=2, help="CPU threads (at least 1)")
    export.add_argument("--no-int8", action="store_true", help="skip writing the int8 tier's files")
    return p


def speed_value(text: str) -> float:
    """--speed: a number in [MIN_SPEED, MAX_SPEED] (a usage error otherwise)."""
    try:
        return check_speed(float(text))
    except (ValueError, InputError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a speed from {MIN_SPEED} to {MAX_SPEED}") from None


def export(args: argparse.Namespace) -> int:
    """`qtts export DIR`: the port's own code (`qtts_lib.export.command`), which needs torch and qwen-tts."""
    if not (args.directory / "config.json").is_file() or not (args.directory / "model.safetensors").is_file():
        raise MissingArtifact(f"{args.directory} is not a checkpoint directory (config.json and model.safetensors "
                              "are needed)")
    import importlib.util

    missing = [m for m in ("torch", "transformers", "pnnx", "qwen_tts") if importlib.util.find_spec(m) is None]
    if missing:
        raise InputError(f"qtts export needs the port extra ({', '.join(missing)} missing): pip install 'qtts[port]'"
                         " and pip install --no-deps qwen-tts==0.1.1")
    from ...export import command  # the port's side of qtts_lib: it imports torch when it runs

    return command.run(args.directory, args.threads, int8=not args.no_int8)


def say(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    text = read_text(args.text, args.text_file)
    if not text.strip():
        raise InputError("the text is empty")
    if encode.format_of_path(args.output):
        encode.require(encode.format_of_path(args.output))  # before the model loads, not after it spoke
    if args.speed != 1.0:
        encode.require("--speed")
    if args.voice_text is not None and args.voice is None:
        raise InputError("--voice-text needs --voice (the clip it transcribes)")
    clip = None
    if args.voice:
        voice_clip = read_voice_clip(args.voice, args.voice_text, args.keep_long_voice, strict=not args.resample)
        for message in voice_clip.messages:
            print(f"qtts: {message}", file=sys.stderr)
        clip = voice_clip.wav
    t0 = time.perf_counter()
    synth = load_synthesizer(args, log=lambda m: print(f"qtts: {m}", file=sys.stderr))
    if clip is None and args.speaker is None and synth.kind != "voice_design":
        raise InputError("this CustomVoice checkpoint speaks with a built-in voice: give --speaker "
                         f"({', '.join(synth.speakers)})" if synth.kind == "custom_voice" else
                         "this Base checkpoint clones a voice: give --voice CLIP.wav (x-vector), and add "
                         "--voice-text 'what the clip says' for ICL cloning")
    voice = synth.voice(wav=clip, text=args.voice_text, speaker=args.speaker, instruct=args.instruct)
    sampling = sampling_of(synth, args)
    if sampling.draws:
        print(f"qtts: seed {sampling.seed}: replay with --seed {sampling.seed}", file=sys.stderr)
    todo = plan(synth, text, max_frames=args.max_frames)
    if len(todo) > 1:
        return say_long(args, synth, voice, sampling, text, len(todo), t0)
    cap = todo[0].cap

    streamed = args.stream or str(args.output) == "-"
    with tqdm(total=cap, unit="frame", desc="generating", file=sys.stderr) as bar:
        kwargs = dict(sampling=sampling, max_frames=cap, on_frame=lambda n: bar.update(1),
                      on_warning=lambda m: bar.write(f"qtts: warning: {m} (raise --max-frames)", file=sys.stderr))
        if streamed:
            stream = synth.stream(text, args.language, voice, chunk_frames=args.chunk_frames, **kwargs)
            samples = write_pieces(args.output, stream, args.speed)
            result = stream.result
        else:
            result = synth.synthesize(text, args.language, voice, **kwargs)
            samples = save_audio(args.output, result.wav, args.speed)
    seconds = time.perf_counter() - t0
    audio_s = samples / SAMPLE_RATE
    if args.timestamps:
        write_timestamps(args.timestamps, [Span(todo[0].text, 0.0, len(result.codes) * SAMPLES_PER_FRAME /
                                                SAMPLE_RATE)], samples)
    stop = "EOS" if result.stopped == "eos" else f"the {cap}-frame cap"
    print(f"{args.output}: {len(result.codes)} frames, {audio_s:.2f} s of audio, stopped at {stop}; "
          f"{seconds:.2f} s wall, RTF {seconds / max(audio_s, 1e-9):.2f}",
          file=sys.stderr if str(args.output) == "-" else sys.stdout)
    return 0


def read_text(text: str | None, text_file: str | None) -> str:
    """--text, or the UTF-8 text of --text-file (- is stdin)."""
    if text_file is None:
        return text
    if text_file == "-":
        return sys.stdin.read()
    try:
        return Path(text_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"text file not found: {text_file}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {text_file} as UTF-8 text: {e}") from None


def save_audio(path: Path, wav: np.ndarray, speed: float = 1.0) -> int:
    """A float32 wav (`save_wav`), or the compressed format the suffix names (`audio.encode`), at `speed`
    (`audio.tempo`); returns the samples written."""
    wav = change_tempo(wav, speed)
    if encode.format_of_path(path):
        encode.save_encoded(path, wav)
    else:
        save_wav(path, wav)
    return len(wav)


class PieceWriter:
    """Pieces written as they come: to a `WavFile` (a complete float32 wav after every piece), to an mp3, opus, aac
    or flac file as its encoder gives bytes (`audio.encode.Encoder`), or with output "-" to stdout as 16-bit PCM
    behind a WAV header of unknown length (for piping into a player); at `speed` (`audio.tempo.Tempo`) first."""

    def __init__(self, output: Path, speed: float = 1.0):
        self.tempo = Tempo(speed)
        self.to_stdout = str(output) == "-"
        fmt = None if self.to_stdout else encode.format_of_path(output)
        self.encoder = encode.Encoder(fmt) if fmt else None
        self.file = None if self.to_stdout else open(output, "wb") if fmt else WavFile(output)
        if self.to_stdout:
            sys.stdout.buffer.write(wav_header())
        self.samples = 0

    def write(self, piece: np.ndarray) -> None:
        self._write(self.tempo.write(piece))

    def _write(self, piece: np.ndarray) -> None:
        if not len(piece):
            return
        if self.to_stdout:
            sys.stdout.buffer.write(pcm16(piece))
            sys.stdout.buffer.flush()
        elif self.encoder:
            self.file.write(self.encoder.write(piece))
            self.file.flush()
        else:
            self.file.write(piece)
        self.samples += len(piece)

    def close(self) -> None:
        self._write(self.tempo.close())
        if self.encoder:
            self.file.write(self.encoder.close())
        if self.file is not None:
            self.file.close()


def write_pieces(output: Path, pieces: Iterable[np.ndarray], speed: float = 1.0) -> int:
    """Write every piece (`PieceWriter`) at `speed`; returns the samples written."""
    writer = PieceWriter(output, speed)
    try:
        for piece in pieces:
            writer.write(piece)
    finally:
        writer.close()
    return writer.samples


def say_long(args: argparse.Namespace, synth, voice, sampling, text: str, segments: int, t0: float) -> int:
    """A text of several segments (`longform.synthesize_long`): a progress bar over segments; with
    --stream or -o -, each segment is written as soon as it is spoken. Introduced in 16."""
    from tqdm import tqdm

    writer = PieceWriter(args.output, args.speed) if args.stream or str(args.output) == "-" else None
    pause = int(round(PAUSE_SECONDS * SAMPLE_RATE))
    with tqdm(total=segments, unit="segment", desc="speaking", file=sys.stderr) as bar:
        def done(i, n, seg, wav):
            if writer:
                writer.write(np.concatenate([np.zeros(pause if i else 0, np.float32), wav]))
            bar.update(1)

        try:
            batch = max_batch_of(synth, args, lambda m: bar.write(f"qtts: {m}", file=sys.stderr))
            result = synthesize_long(synth, text, args.language, voice, sampling, max_frames=args.max_frames,
                                     max_batch=batch, on_segment=done,
                                     on_frame=lambda n: bar.set_postfix_str(f"frame {n}", refresh=n % 8 == 0),
                                     on_warning=lambda m: bar.write(f"qtts: warning: {m} (raise --max-frames)",
                                                                    file=sys.stderr))
        finally:
            if writer:
                writer.close()
    samples = save_audio(args.output, result.wav, args.speed) if writer is None else writer.samples
    if args.timestamps:
        write_timestamps(args.timestamps, result.spans(), samples)
    seconds, audio_s = time.perf_counter() - t0, samples / SAMPLE_RATE
    n = len(result.segments)
    at_eos = sum(s.stopped == "eos" for s in result.segments)
    print(f"{args.output}: {n} segments, {sum(s.frames for s in result.segments)} frames, {audio_s:.2f} s "
          f"of audio with {n - 1} pauses of {result.pause_samples / SAMPLE_RATE / args.speed:.2f} s; {at_eos} stopped "
          f"at EOS, {n - at_eos} at their caps; {seconds:.2f} s wall, RTF {seconds / max(audio_s, 1e-9):.2f}",
          file=sys.stderr if str(args.output) == "-" else sys.stdout)
    return 0


def write_timestamps(path: Path, spans: list[Span], samples: int) -> None:
    """`--timestamps`: `{"audio_seconds": s, "segments": [{"text", "start", "end"}, ...]}`, the spans in seconds of
    the audio written (`samples` of it: at a --speed other than 1 every time scales with it)."""
    generated = spans[-1].end if spans else 0.0
    scale = samples / SAMPLE_RATE / generated if generated else 1.0
    rows = [Span(s.text, s.start * scale, s.end * scale).as_dict() for s in spans]
    try:
        path.write_text(json.dumps({"audio_seconds": round(samples / SAMPLE_RATE, 6), "segments": rows},
                                   ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot write --timestamps {path}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    if words[:1] == ["serve"] and isinstance(missing := serve_extra(), str):
        print(f"qtts: error: qtts serve needs the serve extra ({missing} is not installed): pip install "
              "'qtts[serve]'", file=sys.stderr)
        return 2
    args = parser().parse_args(argv)
    try:
        if args.command == "serve":
            restart_with_huge_pages(argv)  # a server loads once and reads its weights every frame
            from .server import serve

            return serve(args)
        if args.command == "export":
            return export(args)
        return say(args)
    except MissingArtifact as e:
        print(f"qtts: error: {e}", file=sys.stderr)
        return 3
    except QttsError as e:
        print(f"qtts: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

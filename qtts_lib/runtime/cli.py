"""`qtts say ...`: text to a wav file with numpy + ncnn only. Introduced in 06.

    qtts say --checkpoint models/tiny-base --voice data/inputs/voice.wav --text "Hello." -o out.wav
    qtts say --voice clip.wav --voice-text "what clip.wav says" ...     (ICL cloning)
    qtts say --checkpoint tiny-customvoice --speaker serena ...        (built-in voice)
    qtts say --text-file chapter.txt ...     (any length: spoken segment by segment, chapter 12; - reads stdin)

`--checkpoint` is a checkpoint directory (with its `ncnn/` exports), or a name looked up
under `$QTTS_MODELS` and then `./models`. Every user mistake ends in one line on stderr and
exit status 2 (bad input) or 3 (missing artifacts), never in a traceback from inside ncnn.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .audio import SAMPLE_RATE, AudioError, load_wav, prepare_voice_clip, save_wav
from .net import DeviceError, MissingArtifact
from .precision import PrecisionError
from .synthesizer import InputError

CODEC_PROCESS_HELP = ("decode in a second process on one more core while --threads generate (CPU only; on two cores "
                      "try --threads 1 and measure: it can pay where one thread reads memory nearly as fast as two; "
                      "chapter 10)")


def model_dir(checkpoint: str) -> Path:
    """A checkpoint directory, or a name under $QTTS_MODELS or ./models."""
    p = Path(checkpoint)
    if p.is_dir():
        return p
    roots = [Path(r) for r in (os.environ.get("QTTS_MODELS"), "models") if r]
    for root in roots:
        if (root / checkpoint).is_dir():
            return root / checkpoint
    found = sorted({d.name for r in roots if r.is_dir()
                    for d in r.iterdir() if d.is_dir() and not d.name.startswith(".")})
    raise MissingArtifact(f"no checkpoint {checkpoint!r}: not a directory, and not under {' or '.join(map(str, roots))}"
                          f" (found: {', '.join(found) or 'none'}); pass a checkpoint directory, or run"
                          " notebooks/00_get_checkpoint.py with QTTS_CHECKPOINT set")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


class Parser(argparse.ArgumentParser):
    """Usage mistakes end in one line and exit status 2, like every other bad input."""

    def error(self, message: str):
        self.exit(2, f"qtts: error: {message} (see {self.prog} --help)\n")


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="qtts", description="Qwen3-TTS on ncnn (no torch).")
    sub = p.add_subparsers(dest="command", required=True)
    say = sub.add_parser("say", help="synthesize speech into a wav file",
                         description="Base checkpoints clone a voice clip (--voice, plus --voice-text for ICL); "
                                     "CustomVoice checkpoints speak with a built-in --speaker.")
    say.add_argument("--checkpoint", default="tiny-base",
                     help="checkpoint directory, or a name under $QTTS_MODELS or ./models")
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
    say.add_argument("--resample", action="store_true", help="accept a wav at another rate/channels and convert it")
    say.add_argument("--keep-long-voice", action="store_true",
                     help="use all of a voice clip longer than 15 s instead of trimming it at a quiet point")
    say.add_argument("-o", "--output", type=Path, required=True,
                     help="wav file; - writes to stdout as it is generated (16-bit PCM, WAV header of unknown length)")
    say.add_argument("--stream", action="store_true",
                     help="write the wav piece by piece as frames are generated (a complete wav after each piece)")
    say.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece (80 ms each)")
    say.add_argument("--context-frames", type=positive_int,
                     help="re-decode each streamed piece with this many frames of left context (default on the "
                          "CPU: decode every frame once, exact; on a GPU: re-decode with the receptive field; "
                          "less is approximate, chapter 11)")
    say.add_argument("--seed", type=int, default=0, help="sampling seed (ignored with --greedy)")
    say.add_argument("--greedy", action="store_true", help="argmax instead of sampling (what the parity tests use)")
    say.add_argument("--max-frames", type=positive_int, default=600,
                     help="cap on generated frames per segment (12.5 per second); each segment's own cap also "
                          "scales with its text")
    say.add_argument("--threads", type=positive_int, default=2, help="CPU threads (at least 1)")
    say.add_argument("--device", default="cpu", help="cpu, vulkan or vulkan:N")
    say.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "int8"],
                     help="weights of the talker and code predictor: fp32 (exact), fp16 or int8 (faster, "
                          "approximate; CPU only; chapter 10 measures the cost)")
    say.add_argument("--codec-process", action="store_true", help=CODEC_PROCESS_HELP)
    from .server import add_arguments

    add_arguments(sub.add_parser("serve", help="a local HTTP speech server (OpenAI's /v1/audio/speech), streamed",
                                 description="Needs the serve extra: pip install 'qtts[serve]'."), positive_int)
    return p


def say(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .longform import plan
    from .synthesizer import Synthesizer

    text = read_text(args.text, args.text_file)
    if not text.strip():
        raise InputError("the text is empty")
    if args.voice_text is not None and args.voice is None:
        raise InputError("--voice-text needs --voice (the clip it transcribes)")
    clip = load_wav(args.voice, strict=not args.resample) if args.voice else None
    if clip is not None:
        clip, notes = prepare_voice_clip(clip, args.voice_text, args.keep_long_voice)
        for note in notes:
            print(f"qtts: {note}", file=sys.stderr)
    if args.codec_process and args.context_frames is not None:
        raise InputError("--context-frames re-decodes each piece in this process; it cannot be combined with "
                         "--codec-process (which decodes every frame once, in the other)")
    t0 = time.perf_counter()
    synth = Synthesizer(model_dir(args.checkpoint), threads=args.threads, device=args.device,
                        precision=args.precision, log=lambda m: print(f"qtts: {m}", file=sys.stderr),
                        codec_process=args.codec_process)
    if clip is None and args.speaker is None:
        raise InputError("this CustomVoice checkpoint speaks with a built-in voice: give --speaker "
                         f"({', '.join(synth.speakers)})" if synth.kind == "custom_voice" else
                         "this Base checkpoint clones a voice: give --voice CLIP.wav (x-vector), and add "
                         "--voice-text 'what the clip says' for ICL cloning")
    voice = synth.voice(wav=clip, text=args.voice_text, speaker=args.speaker)
    todo = plan(synth, text, max_frames=args.max_frames)
    if len(todo) > 1:
        return say_long(args, synth, voice, todo, t0)
    cap = todo[0].cap

    streamed = args.stream or str(args.output) == "-"
    with tqdm(total=cap, unit="frame", desc="generating", file=sys.stderr) as bar:
        run = synth.stream if streamed else synth.synthesize
        extra = {"chunk_frames": args.chunk_frames, "context_frames": args.context_frames} if streamed else {}
        result = run(text, args.language, voice, max_new_tokens=cap + 1,
                     greedy=args.greedy, seed=args.seed, on_frame=lambda n: bar.update(1),
                     on_warning=lambda m: bar.write(f"qtts: warning: {m} (raise --max-frames)", file=sys.stderr),
                     **extra)
        if streamed:
            from .stream import write_stream

            result, samples = write_stream(args.output, result)
        else:
            save_wav(args.output, result.wav)
            samples = len(result.wav)
    seconds = time.perf_counter() - t0
    audio_s = samples / SAMPLE_RATE
    stop = "EOS" if result.eos_step >= 0 else f"the {cap}-frame cap"
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


def say_long(args: argparse.Namespace, synth, voice, todo, t0: float) -> int:
    """A text of several segments (`longform.synthesize_long`): a progress bar over segments; with
    --stream or -o -, each segment is written as soon as it is spoken. Introduced in 12."""
    import numpy as np
    from tqdm import tqdm

    from .longform import PAUSE_SECONDS, synthesize_long
    from .stream import WavFile, pcm16, wav_header

    sink, wav_file = None, None
    if str(args.output) == "-":
        sys.stdout.buffer.write(wav_header())
        sink = lambda w: (sys.stdout.buffer.write(pcm16(w)), sys.stdout.buffer.flush())  # noqa: E731
    elif args.stream:
        wav_file = WavFile(args.output)
        sink = wav_file.write
    pause = int(round(PAUSE_SECONDS * SAMPLE_RATE))
    with tqdm(total=len(todo), unit="segment", desc="speaking", file=sys.stderr) as bar:
        def done(i, n, seg, wav):
            if sink:
                sink(np.concatenate([np.zeros(pause if i else 0, np.float32), wav]))
            bar.update(1)

        try:
            result = synthesize_long(synth, todo, args.language, voice, greedy=args.greedy, seed=args.seed,
                                     on_segment=done,
                                     on_frame=lambda n: bar.set_postfix_str(f"frame {n}", refresh=n % 8 == 0),
                                     on_warning=lambda m: bar.write(f"qtts: warning: {m} (raise --max-frames)",
                                                                    file=sys.stderr))
        finally:
            if wav_file:
                wav_file.close()
    if sink is None:
        save_wav(args.output, result.wav)
    seconds, audio_s = time.perf_counter() - t0, len(result.wav) / SAMPLE_RATE
    at_eos = sum(s.stopped == "eos" for s in result.segments)
    print(f"{args.output}: {len(todo)} segments, {sum(s.frames for s in result.segments)} frames, {audio_s:.2f} s "
          f"of audio with {len(todo) - 1} pauses of {result.pause_samples / SAMPLE_RATE:.2f} s; {at_eos} stopped "
          f"at EOS, {len(todo) - at_eos} at their caps; {seconds:.2f} s wall, RTF {seconds / max(audio_s, 1e-9):.2f}",
          file=sys.stderr if str(args.output) == "-" else sys.stdout)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command == "serve":
            from .server import serve

            return serve(args)
        return say(args)
    except (InputError, AudioError, DeviceError, PrecisionError) as e:
        print(f"qtts: error: {e}", file=sys.stderr)
        return 2
    except MissingArtifact as e:
        print(f"qtts: error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())

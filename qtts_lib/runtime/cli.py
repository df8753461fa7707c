"""`qtts say ...`: text to a wav file with numpy + ncnn only. Introduced in 06.

    qtts say --checkpoint tiny-base --voice data/inputs/voice.wav --text "Hello." --language english -o out.wav
    qtts say --voice voice.wav --voice-text "what voice.wav says" ...       (ICL cloning)
    qtts say --checkpoint tiny-customvoice --speaker serena ...       (built-in voice)

Every user mistake ends in one line on stderr and exit status 2 (bad input) or 3 (missing
artifacts), never in a traceback from inside ncnn.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .audio import SAMPLE_RATE, AudioError, load_wav, save_wav
from .net import MissingArtifact
from .synthesizer import SAMPLES_PER_FRAME, InputError

FRAME_RATE = SAMPLE_RATE / SAMPLES_PER_FRAME  # 12.5 frames per second


def _model_dir(checkpoint: str) -> Path:
    from .. import paths

    p = Path(checkpoint)
    if p.is_dir():
        return p
    d = paths.model_dir(checkpoint)
    if not d.is_dir():
        names = sorted(x.name for x in paths.MODELS.iterdir() if x.is_dir() and not x.name.startswith(".")) if paths.MODELS.is_dir() else []
        raise MissingArtifact(f"no checkpoint {checkpoint!r} under {paths.MODELS} (found: {', '.join(names) or 'none'});"
                              " run notebooks/00_get_checkpoint.py with QTTS_CHECKPOINT set, or pass a directory")
    return d


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qtts", description="Qwen3-TTS on ncnn (no torch).")
    sub = p.add_subparsers(dest="command", required=True)
    say = sub.add_parser("say", help="synthesize speech into a wav file")
    say.add_argument("--checkpoint", default="tiny-base", help="name under models/ or a checkpoint directory")
    say.add_argument("--text", required=True)
    say.add_argument("--language", default="auto", help="a language of the checkpoint, or auto")
    voice = say.add_mutually_exclusive_group()
    voice.add_argument("--voice", type=Path, help="24 kHz mono reference wav to clone (x-vector)")
    voice.add_argument("--speaker", help="a built-in speaker of a CustomVoice checkpoint")
    say.add_argument("--voice-text", help="transcript of --voice: clone in ICL mode (x-vector only without it)")
    say.add_argument("--resample", action="store_true", help="accept a wav at another rate/channels and convert it")
    say.add_argument("-o", "--output", type=Path, required=True)
    say.add_argument("--seed", type=int, default=0, help="sampling seed (ignored with --greedy)")
    say.add_argument("--greedy", action="store_true", help="argmax instead of sampling (what the parity tests use)")
    say.add_argument("--max-frames", type=int, default=600, help="cap on generated frames (12.5 per second)")
    say.add_argument("--threads", type=int, default=2)
    return p


def say(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .synthesizer import Synthesizer

    if not args.text.strip():
        raise InputError("the text is empty")
    if args.max_frames < 1:
        raise InputError("--max-frames must be at least 1")
    if args.voice_text is not None and args.voice is None:
        raise InputError("--voice-text needs --voice (the wav it transcribes)")
    wav_ref = load_wav(args.voice, strict=not args.resample) if args.voice else None
    t0 = time.perf_counter()
    synth = Synthesizer(_model_dir(args.checkpoint), threads=args.threads)
    xvector = synth.xvector(wav_ref) if wav_ref is not None else None
    voice_codes = synth.encode_voice(wav_ref) if args.voice_text is not None else None
    prompt = synth.build_prompt(args.text, args.language, xvector=xvector, speaker=args.speaker,
                                voice_codes=voice_codes, voice_text=args.voice_text)
    if len(prompt.trailing) > args.max_frames:
        print(f"warning: the text has {len(prompt.text_ids)} tokens but --max-frames {args.max_frames} "
              f"({args.max_frames / FRAME_RATE:.0f} s) is the cap: the end of the text will not be spoken",
              file=sys.stderr)
    with tqdm(total=args.max_frames, unit="frame", desc="generating", file=sys.stderr) as bar:
        result = synth.generate(prompt, args.max_frames + 1, greedy=args.greedy, seed=args.seed,
                                on_frame=lambda n: bar.update(1))
    result.wav = synth.decode_with_voice(result.codes, voice_codes)
    seconds = time.perf_counter() - t0
    save_wav(args.output, result.wav)
    audio_s = len(result.wav) / SAMPLE_RATE
    stop = "EOS" if result.eos_step >= 0 else f"the {args.max_frames}-frame cap"
    print(f"{args.output}: {len(result.codes)} frames, {audio_s:.2f} s of audio, stopped at {stop}; "
          f"{seconds:.2f} s wall, RTF {seconds / max(audio_s, 1e-9):.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return say(args)
    except (InputError, AudioError) as e:
        print(f"qtts: error: {e}", file=sys.stderr)
        return 2
    except MissingArtifact as e:
        print(f"qtts: error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())

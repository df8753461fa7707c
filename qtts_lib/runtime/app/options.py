"""What `qtts say` and `qtts serve` share: the checkpoint, the machine, the sampling. Introduced in 07.

Each option is declared once here, with one help text, and both front ends add the groups they need (llama.cpp's
`common/arg.cpp` in spirit). The choices come from where they are defined (the tiers from `pipeline.precision`,
the sampling fields from `pipeline.sampling.Sampling`), never listed by hand.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..codec.decoder import CODEC_TIERS
from ..errors import MissingArtifact
from ..pipeline.precision import TIERS
from ..pipeline.sampling import Sampling
from ..pipeline.synthesizer import DEFAULT_MAX_BATCH, Synthesizer

SAMPLING_OPTIONS = ("temperature", "top_k", "top_p", "repetition_penalty")  # exposed beside --greedy and --seed


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


def threads_option(text: str) -> int | str:
    """--threads: a whole number, at least 1, or auto."""
    return "auto" if text == "auto" else positive_int(text)


def resolve_threads(threads: int | str, log) -> int:
    """--threads as a number: auto is `binding.cores.auto_threads`, said in the log when it is not the most."""
    from ..binding.cores import AUTO_MOST, auto_threads, register

    if threads != "auto":
        register()  # counted by the processes that choose theirs
        return threads
    chosen, busy, peers = auto_threads()
    if chosen < AUTO_MOST:
        log(f"threads: {chosen} (other processes keep {busy:.1f} CPUs busy, {peers} other qtts processes run ncnn "
            "here; --threads N to choose)")
    return chosen


def add_model_options(p: argparse.ArgumentParser) -> None:
    """--checkpoint, --threads, --device, --precision, --codec-precision."""
    g = p.add_argument_group("model")
    g.add_argument("--checkpoint", default="tiny-base",
                   help="checkpoint directory (with its ncnn/ exports), or a name under $QTTS_MODELS or ./models")
    g.add_argument("--threads", type=threads_option, default="auto",
                   help="CPU threads for ncnn: a number, or auto (the default: up to 2, less the CPUs other processes "
                        "keep busy when it starts; appendix D)")
    g.add_argument("--device", default="cpu", help="cpu, vulkan or vulkan:N")
    g.add_argument("--precision", default="fp32", choices=TIERS,
                   help="weights of the talker and code predictor: fp32 (exact) or fewer bytes (faster, approximate;"
                        " CPU only; chapter 13 measures the cost)")
    g.add_argument("--codec-precision", default="fp32", choices=CODEC_TIERS,
                   help="the codec's upsampling stages: fp32 (exact), bf16 storage (faster where the CPU has"
                        " AVX512-BF16, approximate) or int8 (int8 residual convolutions, input scales calibrated once;"
                        " approximate); CPU only; chapter 14 measures the cost")


def add_generation_options(p: argparse.ArgumentParser, max_frames_help: str) -> None:
    """--max-frames, --chunk-frames and the sampling parameters (defaults: the checkpoint's generation_config)."""
    g = p.add_argument_group("generation")
    g.add_argument("--max-frames", type=positive_int, default=600, help=max_frames_help)
    g.add_argument("--chunk-frames", type=positive_int, default=4, help="frames per streamed piece (80 ms each)")
    g.add_argument("--greedy", action="store_true", help="argmax instead of sampling (what the parity tests use)")
    g.add_argument("--seed", type=int, default=None,
                   help="sampling seed: equal seeds, equal audio (default: a fresh one each run, printed so the take "
                        "can be replayed)")
    g.add_argument("--temperature", type=float, help="sampling temperature (default: the checkpoint's, 0.9)")
    g.add_argument("--top-k", type=int, help="keep the k most likely codes (default: the checkpoint's, 50; 0: all)")
    g.add_argument("--top-p", type=float, help="nucleus sampling mass in (0, 1] (default: the checkpoint's, 1.0)")
    g.add_argument("--repetition-penalty", type=float,
                   help="penalty on codebook-0 codes already spoken (default: the checkpoint's, 1.05)")


def add_batch_option(p, what: str) -> None:
    """--max-batch: how many `what` are decoded together (chapter 17); default DEFAULT_MAX_BATCH on the CPU, one on
    a GPU (where more than one loads the batching graphs instead of the faster single-sequence ones)."""
    p.add_argument("--max-batch", type=positive_int, default=None,
                   help=f"{what} decoded together in one batch (default {DEFAULT_MAX_BATCH}; on a GPU 1, and more "
                        "loads the graphs that batch, slower for one sequence)")


def max_batch_of(synth: Synthesizer, args: argparse.Namespace, log) -> int:
    """--max-batch, or its default; a loop whose graphs take one sequence per call gets 1 (told to `log` when more
    was asked)."""
    if synth.loop.batches:
        return args.max_batch or (DEFAULT_MAX_BATCH if args.device == "cpu" else 1)
    if (args.max_batch or 1) > 1:
        log(f"--max-batch {args.max_batch}: the {args.device} loop takes one sequence per call; using 1")
    return 1


def sampling_of(synth: Synthesizer, args: argparse.Namespace) -> Sampling:
    """The checkpoint's sampling with the options given on the command line (an `InputError` when invalid), resolved:
    without --seed, a fresh seed (`Sampling.resolve`), which the caller reports so the take can be replayed."""
    given = {k: getattr(args, k) for k in SAMPLING_OPTIONS if getattr(args, k) is not None}
    if args.greedy:
        given["greedy"] = True
    return synth.sampling.replace(seed=args.seed, **given).resolve()


def load_synthesizer(args: argparse.Namespace, log) -> Synthesizer:
    """The Synthesizer the model options describe."""
    return Synthesizer(model_dir(args.checkpoint), threads=resolve_threads(args.threads, log), device=args.device,
                       precision=args.precision, codec_precision=args.codec_precision, log=log,
                       gpu_batches=(getattr(args, "max_batch", None) or 1) > 1)

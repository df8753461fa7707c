"""`python -m qtts_lib.bench WHAT ...`: every measurement of `qtts_lib.bench` from one command line."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def thread_counts(text: str) -> list[int]:
    return sorted({os.cpu_count() if t == "all" else int(t) for t in text.split(",")})


def huge_pages(text: str, parser) -> tuple[bool, ...]:
    """--huge-pages: off, on or off,on as (False,), (True,), (False, True)."""
    pages = {"off": False, "on": True}
    chosen = [x.strip() for x in text.split(",")]
    if not chosen or not set(chosen) <= set(pages):
        parser.error(f"--huge-pages takes off, on or off,on, not {text!r}")
    return tuple(pages[x] for x in chosen)


def main(argv: list[str] | None = None) -> int:
    from .. import paths
    from .results import write_result

    p = argparse.ArgumentParser(prog="python -m qtts_lib.bench", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)

    def measurement(name: str, help: str, frames: int = 40):
        s = sub.add_parser(name, help=help)
        s.add_argument("--checkpoint", default="full-base", help="a name under models/ or a checkpoint directory")
        s.add_argument("--frames", type=int, default=frames)
        s.add_argument("-o", "--output", type=Path)
        return s

    loop = measurement("loop", "PyTorch vs ncnn end to end")
    loop.add_argument("--threads", default="1,2", help="comma-separated thread counts; 'all' = every core")
    loop.add_argument("--repeats", type=int, default=3)
    loop.add_argument("--runtimes", default="pytorch,ncnn", help="comma-separated: pytorch, ncnn")
    loop.add_argument("--devices", default="cpu", help="comma-separated: cpu, vulkan (ncnn), cuda (PyTorch)")
    loop.add_argument("--precision", default="fp32", help="comma-separated ncnn tiers (fp32, fp16, int8)")
    loop.add_argument("--codec-precision", default="fp32", help="comma-separated codec tiers of the ncnn CPU rows")
    loop.add_argument("--huge-pages", default="off", help="comma-separated: off, on (glibc's malloc asks for "
                      "transparent huge pages in the runs; off,on measures both)")
    codec = measurement("codec", "the codec alone, ncnn vs PyTorch in one process")
    codec.add_argument("--threads", default="1,2")
    codec.add_argument("--rounds", type=int, default=9)
    codec.add_argument("--tiers", help="instead: the runtime's codec in these tiers against fp32 (fp32,bf16,int8)")
    stream = measurement("stream", "time to first audio; stream vs synthesize")
    stream.add_argument("--threads", default="1,2")
    stream.add_argument("--repeats", type=int, default=3)
    stream.add_argument("--precision", default="fp32", help="comma-separated tier:codec-tier pairs, e.g. int8:int8")
    stream.add_argument("--against", type=Path, help="another source tree (holding this bench) measured in turn")
    stream.add_argument("--huge-pages", default="off", help="comma-separated: off, on (as for loop)")
    calls = measurement("calls", "the loop's graph calls against their weight reads")
    calls.add_argument("--threads", type=int, default=2)
    calls.add_argument("--repeats", type=int, default=3)
    calls.add_argument("--precision", default="int8")
    calls.add_argument("--against", type=Path, help="another source tree (holding this bench) measured in turn")
    quality = measurement("quality", "what a precision tier costs against fp32", frames=200)
    quality.add_argument("--precision", default="fp32,fp16,int8")
    quality.add_argument("--threads", type=int, default=2)
    quality.add_argument("--keep-fp32", metavar="CLASS", help="a probe: the int8 tiers with one class of projection "
                                                                "left fp32 (q, k, v, o, gate, up, down, in_proj)")
    overlap = measurement("overlap", "decoding on one core while the other generates")
    overlap.add_argument("--precision", default="int8")
    overlap.add_argument("--threads", type=int, default=0, help="cores for the sequential run (default: all)")
    overlap.add_argument("--repeats", type=int, default=2)
    overlap.add_argument("--codec-precision", default="fp32", help="the codec's tier in every arrangement")
    batch = measurement("batch", "many utterances at once: throughput against the batch size")
    batch.add_argument("--batch", default="1,2,4,8", help="comma-separated batch sizes")
    batch.add_argument("--precision", default="fp32,int8")
    batch.add_argument("--threads", type=int, default=2)
    batch.add_argument("--repeats", type=int, default=3)
    batch.add_argument("--codec-precision", default="fp32", help="comma-separated codec tiers (fp32, bf16, int8)")
    batch.add_argument("--device", default="cpu", help="cpu, or vulkan / vulkan:N (the graphs that batch, fp32)")
    batch.add_argument("--parity", action="store_true",
                       help="instead: the first --batch prompts alone vs batched, greedy, --frames frames")
    proj = measurement("projections", "the int8 loop's projections alone against its floor (chapter 13)")
    proj.add_argument("--threads", type=int, default=2)
    proj.add_argument("--repeats", type=int, default=9)
    parity = measurement("parity", "greedy parity of the runtime against qwen-tts, every prompt kind", frames=48)
    parity.add_argument("--threads", type=int, default=2)
    parity.add_argument("--cases", help="comma-separated golden case names (default: every case of the kind)")
    serve = sub.add_parser("serve", help="qtts serve under load: N streaming clients against a server process")
    serve.add_argument("--checkpoint", default="full-base", help="a name under models/ or a checkpoint directory")
    serve.add_argument("--threads", type=int, default=2)
    serve.add_argument("--precision", default="int8")
    serve.add_argument("--codec-precision", default="fp32")
    serve.add_argument("--clients", default="1,2,4,8", help="comma-separated: that many clients at once")
    serve.add_argument("--staggered", default="8", help="comma-separated: that many clients, --stagger s apart")
    serve.add_argument("--stagger", type=float, default=2.0, help="seconds between two staggered arrivals")
    serve.add_argument("--max-batch", type=int, default=4)
    serve.add_argument("--max-frames", type=int, default=100, help="the server's cap on frames per segment")
    serve.add_argument("--chunk-frames", type=int, default=4)
    serve.add_argument("--tree", type=Path, help="the source tree whose qtts serve runs (default: this one; a "
                                                 "worktree of an older commit gives a 'before')")
    serve.add_argument("--python", help="the interpreter that runs the server (default: this one)")
    serve.add_argument("--admit", choices=("realtime", "all", "none"), default="realtime",
                       help="the server's --admit (default realtime; none: pass no --admit, for a --tree whose "
                            "server has none)")
    serve.add_argument("--max-wait", type=float, help="the server's --max-wait (default: the server's own)")
    serve.add_argument("--queue", type=int, help="the server's --queue (default: 8, or the most clients if more)")
    serve.add_argument("--library-repeats", type=int, default=5,
                       help="timed runs of the library's first audio in this process, before the server starts")
    serve.add_argument("--no-streamed-text", action="store_true",
                       help="leave out the WebSocket's first audio from streamed text (a --tree without it)")
    serve.add_argument("-o", "--output", type=Path)
    cores = measurement("cores", "qtts say alone, two at once and beside a busy neighbour; qtts serve beside it",
                        frames=120)
    cores.add_argument("--settings", default="3000:2,300000:2,3000:1,3000:auto",
                       help="comma-separated GOMP_SPINCOUNT:threads, threads a number or auto (the first is the "
                            "one the others are held against)")
    cores.add_argument("--precision", default="int8")
    cores.add_argument("--codec-precision", default="int8")
    cores.add_argument("--repeats", type=int, default=3)
    cores.add_argument("--no-server", action="store_true", help="leave out the server beside the neighbour")
    zeros = sub.add_parser("zeros", help="zero-filled .bin files of the sizes in DIR/bin_sizes.json")
    zeros.add_argument("dir")
    profile = sub.add_parser("profile", help="where a Vulkan frame's time goes")
    profile.add_argument("model_dir")
    profile.add_argument("output", type=Path)
    profile.add_argument("--device", default="vulkan")
    merge = sub.add_parser("merge", help="one result file from several")
    merge.add_argument("output")
    merge.add_argument("parts", nargs="+")
    merge.add_argument("--note", default="")
    a = p.parse_args(argv)

    if a.what == "zeros":
        from .gpu import write_zero_bins

        write_zero_bins(a.dir)
        return 0
    if a.what == "profile":
        from .gpu import profile_vulkan

        print(write_result(profile_vulkan(a.model_dir, a.device), a.output))
        return 0
    if a.what == "merge":
        from .results import merge as merge_results

        merge_results(a.output, a.parts, a.note)
        return 0
    if a.what == "serve":
        from .serve import benchmark as serve_benchmark
        from .serve import table

        ints = lambda s: tuple(int(x) for x in s.split(",") if x.strip())  # noqa: E731
        result = serve_benchmark(paths.checkpoint_dir(a.checkpoint), a.threads, a.precision, a.codec_precision,
                                 ints(a.clients), ints(a.staggered), a.stagger, a.max_batch, a.max_frames,
                                 a.chunk_frames, a.tree, a.python, admit=None if a.admit == "none" else a.admit,
                                 max_wait=a.max_wait, queue=a.queue, library_repeats=a.library_repeats,
                                 streamed_text=not a.no_streamed_text)
        write_result(result, a.output)
        print(table(result))
        return 0
    if a.what == "cores":
        from .cores import benchmark as cores_benchmark
        from .cores import table

        settings = tuple((int(spin), threads if threads == "auto" else int(threads))
                         for spin, threads in (x.split(":") for x in a.settings.split(",")))
        result = cores_benchmark(paths.checkpoint_dir(a.checkpoint), settings, a.precision, a.codec_precision,
                                 a.frames, a.repeats, not a.no_server)
        write_result(result, a.output)
        print(table(result))
        return 0
    model_dir = paths.checkpoint_dir(a.checkpoint)
    if a.what == "loop":
        from .loop import benchmark

        split = lambda s: tuple(x.strip() for x in s.split(","))  # noqa: E731
        result = benchmark(model_dir, a.frames, thread_counts(a.threads), a.repeats, split(a.runtimes),
                           split(a.precision), split(a.devices), codecs=split(a.codec_precision),
                           huge_pages=huge_pages(a.huge_pages, p))
    elif a.what == "batch":
        from .batch import benchmark as batch_benchmark
        from .batch import parity

        sizes = [int(b) for b in a.batch.split(",")]
        result = parity(model_dir, a.frames, sizes[0], a.precision.split(",")[0].strip(), a.threads) if a.parity \
            else batch_benchmark(model_dir, a.frames, sizes, [t.strip() for t in a.precision.split(",")],
                                   a.threads, a.repeats, codecs=[t.strip() for t in a.codec_precision.split(",")],
                                   device=a.device)
    elif a.what == "codec":
        from .codec import codec_benchmark, tier_benchmark

        result = tier_benchmark(model_dir, thread_counts(a.threads), [t.strip() for t in a.tiers.split(",")],
                                a.frames, a.rounds) if a.tiers \
            else codec_benchmark(model_dir, thread_counts(a.threads), a.frames, a.rounds)
    elif a.what == "projections":
        from .machine import describe
        from .projections import measure as projections

        result = {"machine": describe([a.threads]), "checkpoint": a.checkpoint,
                  **projections(model_dir / "ncnn", a.threads, a.repeats)}
    elif a.what == "stream":
        from .stream import stream_benchmark

        tiers = [tuple((t.strip() + ":" + t.strip()).split(":")[:2]) if ":" not in t else tuple(t.strip().split(":"))
                 for t in a.precision.split(",")]
        result = stream_benchmark(model_dir, a.frames, thread_counts(a.threads), a.repeats, tiers, a.against,
                                  huge_pages(a.huge_pages, p))
    elif a.what == "calls":
        from .calls import calls_benchmark

        result = calls_benchmark(model_dir, a.frames, a.threads, a.repeats, a.precision, against=a.against)
    elif a.what == "parity":
        from .parity import measure as parity_measure

        result = parity_measure(model_dir, a.frames, a.threads, a.cases.split(",") if a.cases else None)
    elif a.what == "quality":
        from contextlib import nullcontext

        from .quality import kept_fp32, measure

        with kept_fp32(model_dir, a.keep_fp32) if a.keep_fp32 else nullcontext() as kept:
            def probe(r: dict) -> dict:
                return r | {"kept_fp32": {"class": a.keep_fp32, "projections": kept}} if a.keep_fp32 else r

            result = probe(measure(model_dir, tuple(t.strip() for t in a.precision.split(",")), a.frames,
                                   a.threads, on_tier=lambda partial: write_result(probe(partial), a.output)))
        summary = {t: {k: v for k, v in r.items() if k != "layer_errors"} for t, r in result["tiers"].items()}
        print(json.dumps(summary, indent=1))
    else:
        from .overlap import measure

        result = measure(model_dir, a.precision, a.threads or None, a.frames, a.repeats, a.codec_precision)
    text = write_result(result, a.output)
    if a.what != "quality":
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

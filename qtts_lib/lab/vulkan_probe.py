"""Where a Vulkan extract's time goes through the pip binding: chains of N layers of one type, ncnn's options, and
the real decoder graphs at several lengths. Introduced in 10.

    python -m qtts_lib.lab.vulkan_probe DIR OUT.json [--device vulkan] [--quick]

Every number is the median of `repeats` timed extracts after one warm-up, in ms per extract (`wall`), with the
calling thread's CPU time beside it (`cpu`: the host-side recording, uploads, casts and downloads; a wall time well
above it is time spent waiting for the GPU). A chain's slope over N is the cost of one more layer of that type.
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _timed(fn, repeats: int = 10) -> dict:
    fn()
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    return {"wall": round(float(np.median(wall)) * 1e3, 3), "cpu": round(float(np.median(cpu)) * 1e3, 3)}


GEMM = "10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8={n} 9={k}"


def chain_param(kind: str, n: int, width: int) -> tuple[str, int]:
    """Input + `n` layers of `kind` in a chain over a (rows, width) blob -> (.param text, .bin bytes needed)."""
    rows, prev, need = [], "in0", 0
    for i in range(n):
        out = "out0" if i == n - 1 else f"b{i}"
        if kind == "AbsVal":
            rows.append(f"AbsVal a{i} 1 1 {prev} {out}")
        elif kind == "BinaryOp":
            rows += [f"Split s{i} 1 2 {prev} {out}_x {out}_y", f"BinaryOp a{i} 2 1 {out}_x {out}_y {out} 0=0"]
        elif kind == "Split":
            rows.append(f"Split a{i} 1 1 {prev} {out}")
        elif kind == "RMSNorm":
            rows.append(f"RMSNorm a{i} 1 1 {prev} {out} 0={width} 1=1e-6 2=0")
        elif kind == "ReshapePermute":  # the decoders' head split: (w, L) -> (128, w/128, L) -> (128, L, w/128)
            rows += [f"Reshape r{i} 1 1 {prev} {out}_r 0=128 1={width // 128} 2=-1",
                     f"Permute p{i} 1 1 {out}_r {out}_p 0=2", f"Permute q{i} 1 1 {out}_p {out}_q 0=2",
                     f"Reshape t{i} 1 1 {out}_q {out} 0={width} 1=-1"]
        elif kind.startswith("Gemm"):
            rows.append(f"Gemm a{i} 1 1 {prev} {out} " + GEMM.format(n=width, k=width))
            need += 4 + 4 * width * width
        else:
            raise ValueError(kind)
        prev = out
    layers = [r for r in rows]
    blobs = {b for r in layers for b in r.split()[4:] if "=" not in b} | {"in0"}
    text = f"7767517\n{len(layers) + 1} {len(blobs)}\nInput in0 0 1 in0\n" + "\n".join(layers) + "\n"
    return text, need


def _load(text: str, need: int, tmp: Path, device: str, threads: int, options: dict | None):
    from ..runtime.binding.net import net_from_text

    bin_ = tmp / f"z{need}.bin"
    if not bin_.exists():
        with bin_.open("wb") as f:
            f.truncate(need)
    return net_from_text(text, bin_, threads, device, options=options)


def _allocators(device: str) -> dict:
    import ncnn

    from ..runtime.binding.net import parse_device

    dev = ncnn.get_gpu_device(parse_device(device))
    return {"blob_vkallocator": ncnn.VkBlobAllocator(dev), "workspace_vkallocator": ncnn.VkBlobAllocator(dev),
            "staging_vkallocator": ncnn.VkStagingAllocator(dev)}


VARIANTS = {
    "base (threads 2)": {},
    "threads 1": {"num_threads": 1},
    "threads 16": {"num_threads": 16},
    "lightmode off": {"lightmode": False},
    "packing off": {"use_packing_layout": False},
    "fp16 storage+packed": {"use_fp16_storage": True, "use_fp16_packed": True},
    "fp16 storage+packed+arith": {"use_fp16_storage": True, "use_fp16_packed": True, "use_fp16_arithmetic": True},
    "own vk allocators": "allocators",
    "subgroup ops off": {"use_subgroup_ops": False},
    "tensor storage on": {"use_tensor_storage": True},
}


def probe(model_dir: str | Path, device: str = "vulkan", quick: bool = False, log=print) -> dict:
    from ..runtime.binding import rope
    from ..runtime.binding.net import run
    from ..runtime.pipeline.config import ModelConfig
    from ..runtime.rewrites.gpu import fused_predictor_param

    out: dict = {"chains": {}, "variants": {}, "transfer": {}, "graphs": {}}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        x = rng.standard_normal((1, 1024)).astype(np.float32)
        # 1. chains: the cost of one more layer of each type
        for kind, sizes, width in (("AbsVal", (1, 100, 400), 1024), ("Split", (1, 400), 1024),
                                   ("BinaryOp", (1, 200), 1024), ("RMSNorm", (1, 200), 1024),
                                   ("ReshapePermute", (1, 100), 2048), ("Gemm64", (1, 200), 64),
                                   ("Gemm1024", (1, 100), 1024)):
            xin = rng.standard_normal((1, width)).astype(np.float32)
            for n in sizes:
                text, need = chain_param(kind, n, width)
                net = _load(text, need, tmp, device, 2, None)
                out["chains"][f"{kind} x{n}"] = _timed(lambda net=net, xin=xin: run(net, {"in0": xin}, ["out0"]))
                log(kind, n, out["chains"][f"{kind} x{n}"])
                del net
        # 2. transfers: one AbsVal on inputs of several sizes
        for rows in (1, 256, 4096):
            text, need = chain_param("AbsVal", 1, 1024)
            net = _load(text, need, tmp, device, 2, None)
            xin = rng.standard_normal((rows, 1024)).astype(np.float32)
            out["transfer"][f"{rows * 4} KB up+down"] = _timed(
                lambda net=net, xin=xin: run(net, {"in0": xin}, ["out0"]))
            log("transfer", rows, out["transfer"][f"{rows * 4} KB up+down"])
        # 3. ncnn's options on two chains and on the fused code predictor (9 positions)
        cfg = ModelConfig.load(model_dir)
        d, p = cfg.ncnn_dir, cfg.predictor
        fused = fused_predictor_param((d / "predictor_decoder.param").read_text(),
                                      (d / "predictor_heads.param").read_text())
        merged = tmp / "fused.bin"
        with merged.open("wb") as f:
            f.truncate((d / "predictor_decoder.bin").stat().st_size + (d / "predictor_heads.bin").stat().st_size)
        from ..runtime.rewrites.gpu_layers import ensure_gpu_decoder

        forms = ensure_gpu_decoder(d, "predictor_decoder", log=log)
        lean_param, lean_bin = forms["full"], forms["bin"]
        lean = fused_predictor_param(lean_param.read_text(), (d / "predictor_heads.param").read_text())
        lean_merged = tmp / "fused_lean.bin"
        with lean_merged.open("wb") as f:
            f.truncate(lean_bin.stat().st_size + (d / "predictor_heads.bin").stat().st_size)
        seq = rng.standard_normal((9, p["hidden_size"])).astype(np.float32)
        cos, sin = rope.tables(p["head_dim"], p["rope_theta"], 0, 9)
        pin = {"in0": seq, "in1": rope.causal_mask(9), "in2": cos, "in3": sin}
        variants = {"base (threads 2)": {}} if quick else VARIANTS
        for label, opts in variants.items():
            opts = _allocators(device) if opts == "allocators" else opts
            row = {}
            for kind, n in (("AbsVal", 400), ("Gemm1024", 100)):
                text, need = chain_param(kind, n, 1024)
                net = _load(text, need, tmp, device, 2, opts)
                row[f"{kind} x{n}"] = _timed(lambda net=net: run(net, {"in0": x}, ["out0"]))
                del net
            from ..runtime.binding.net import net_from_text

            net = net_from_text(fused, merged, 2, device, options=opts)
            row["predictor fused, 9 positions"] = _timed(lambda net=net: run(net, pin, ["logits_3"]))
            del net
            net = net_from_text(lean, lean_merged, 2, device, options=opts)
            row["predictor GPU form fused, 9 positions"] = _timed(lambda net=net: run(net, pin, ["logits_3"]))
            del net
            out["variants"][label] = row
            log(label, row)
        # 4. the talker without a cache (full sequence) and the predictor at several lengths
        t = cfg.talker
        from ..runtime.binding.net import net_from_text

        tforms = ensure_gpu_decoder(d, "talker_decoder", log=log)
        tp, tb = tforms["full"], tforms["bin"]
        for label, param, bin_ in (("exported", d / "talker_decoder.param", d / "talker_decoder.bin"),
                                   ("GPU form", tp, tb)):
            talker = net_from_text(param.read_text(), bin_, 2, device)
            for length in ((16, 128) if quick else (1, 16, 64, 128, 256, 512, 1024, 2048)):
                e = rng.standard_normal((length, t["hidden_size"])).astype(np.float32)
                c, s = rope.tables(t["head_dim"], t["rope_theta"], 0, length)
                inp = {"in0": e, "in1": rope.causal_mask(length), "in2": c, "in3": s}
                key = f"talker {label} full sequence, {length} rows"
                out["graphs"][key] = _timed(lambda inp=inp, talker=talker: run(talker, inp, ["out0"]), 5)
                log(key, out["graphs"][key])
            del talker
    out["layers"] = {"talker_decoder": _count(d / "talker_decoder.param"), "talker GPU form": _count(tp),
                     "predictor fused": len(fused.splitlines()) - 2,
                     "predictor GPU form fused": len(lean.splitlines()) - 2}
    return out


def _count(path: Path) -> int:
    return len([ln for ln in path.read_text().splitlines()[2:] if ln.strip()])


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m qtts_lib.lab.vulkan_probe")
    ap.add_argument("model_dir")
    ap.add_argument("output", type=Path)
    ap.add_argument("--device", default="vulkan")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gemm", action="store_true", help="instead: the projection forms (gemm_forms)")
    ap.add_argument("--forms", action="store_true", help="instead: the GPU loop's graphs per call (gpu_forms)")
    ap.add_argument("--frames", action="store_true", help="instead: ms of every frame (frame_times)")
    ap.add_argument("--threads", default="16,2,1", help="--frames: the ncnn CPU thread counts")
    a = ap.parse_args(argv)
    threads = [int(x) for x in a.threads.split(",")]
    result = (gemm_forms(a.device) if a.gemm else gpu_forms(a.model_dir, a.device) if a.forms
              else frame_times(a.model_dir, a.device, threads) if a.frames else probe(a.model_dir, a.device, a.quick))
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _gemm_layer(form: str, i: int, src: str, dst: str, n: int, k: int) -> tuple[list[str], int]:
    """One projection (k -> n) in one of ncnn's forms, and the .bin bytes it reads."""
    w = 4 + 4 * n * k
    if form == "gemm B transB=1":   # the exported form: B (n, k)
        return [f"Gemm g{i} 1 1 {src} {dst} 10=-1 2=0 3=1 4=0 5=1 6=1 7=0 8={n} 9={k}"], w
    if form == "gemm B transB=0":   # B stored (k, n)
        return [f"Gemm g{i} 1 1 {src} {dst} 10=-1 2=0 3=0 4=0 5=1 6=1 7=0 8={n} 9={k}"], w
    if form == "gemm A transA=0":   # weights as A (n, k), input as B, output transposed back
        return [f"Gemm g{i} 1 1 {src} {dst} 2=0 3=1 4=1 5=0 6=0 7={n} 8=0 9={k} 14=1"], w
    if form == "gemm A transA=1":   # weights as A stored (k, n)
        return [f"Gemm g{i} 1 1 {src} {dst} 2=1 3=1 4=1 5=0 6=0 7={n} 8=0 9={k} 14=1"], w
    if form.startswith("innerproduct"):
        return [f"InnerProduct g{i} 1 1 {src} {dst} 0={n} 1=0 2={n * k}"], w
    raise ValueError(form)


FORMS = ("gemm B transB=1", "gemm B transB=0", "gemm A transA=0", "gemm A transA=1", "innerproduct")


def gemm_forms(device: str = "vulkan", pairs: int = 25, log=print) -> dict:
    """ms per extract of `pairs` x (1024 -> 4096 -> 1024) projections in each form, at 1 and 9 rows (innerproduct also
    on a 1-D input: its GEMV path), fp32 and fp16 storage; with GB/s of fp32 weights."""
    from ..runtime.binding.net import net_from_text, run

    out = {}
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        for form in FORMS:
            rows, need, prev = [], 0, "in0"
            for i in range(2 * pairs):
                n, k = (4096, 1024) if i % 2 == 0 else (1024, 4096)
                dst = "out0" if i == 2 * pairs - 1 else f"b{i}"
                layer, w = _gemm_layer(form, i, prev, dst, n, k)
                rows += layer
                need += w
                prev = dst
            text = f"7767517\n{len(rows) + 1} {len(rows) + 1}\nInput in0 0 1 in0\n" + "\n".join(rows) + "\n"
            bin_ = tmp / "w.bin"
            with bin_.open("wb") as f:
                f.truncate(need)
            for fp16 in (False, True):
                opts = {"use_fp16_storage": True, "use_fp16_packed": True} if fp16 else None
                net = net_from_text(text, bin_, 2, device, options=opts)
                shapes = [(1, 1024), (9, 1024)] + ([(1024,)] if form == "innerproduct" else [])
                for shape in shapes:
                    x = rng.standard_normal(shape).astype(np.float32)
                    key = f"{form}{' fp16' if fp16 else ''}, input {shape}"
                    try:
                        r = _timed(lambda net=net, x=x: run(net, {"in0": x}, ["out0"]))
                    except RuntimeError as e:
                        r = {"error": str(e)}
                    if "wall" in r:
                        r["fp32 weight GB/s"] = round((need / 1e9) / (r["wall"] / 1e3), 1)
                    out[key] = r
                    log(key, r)
                del net
    return out


def gpu_forms(model_dir: str | Path, device: str = "vulkan", threads: int = 2, log=print) -> dict:
    """ms per call of the GPU loop's graphs (`pipeline.loop`: `GpuDecoder`, `GemvCodePredictor`) at full size:
    the talker's cached GEMV step (packed caches in and out) and its full-sequence forward at several lengths (where
    one stops paying against the other: `loop.TALKER_MAX_CACHED`), its prefill, the predictor's first position and a
    step at several positions, the codec head, one predictor frame; and the layer count of every GPU graph with the
    layers that have no Vulkan kernel."""
    from ..runtime.binding import rope
    from ..runtime.binding.net import Net, run
    from ..runtime.pipeline.config import ModelConfig
    from ..runtime.pipeline.embeddings import Embeddings
    from ..runtime.pipeline.loop import Loop

    cfg = ModelConfig.load(model_dir)
    t = cfg.talker
    loop = Loop.load(cfg, Embeddings(cfg, threads, log), threads, device, log=log)
    talker, pred = loop.talker, loop.predictor
    rng = np.random.default_rng(0)
    out: dict = {"ms_per_call": {}, "layers": {}}
    ms = out["ms_per_call"]
    for label, net in (("talker prefill (kv form)", talker.prefill_net), ("talker step (GEMV form)", talker.step_net),
                       ("talker full sequence", talker.full), ("predictor first position (GEMV)", pred.first),
                       ("predictor step (GEMV)", pred.step), ("codec head", loop.head.net)):
        layers = net.layers()
        out["layers"][label] = {"layers": len(layers),
                                "cpu_fallback": [lyr.name for lyr in layers if not lyr.support_vulkan]}
    hidden = t["hidden_size"]
    talker.max_cached = 1 << 20  # cached steps at every length measured here
    for past in (16, 32, 64, 128, 256, 512):
        rows = rng.standard_normal((1, past, hidden)).astype(np.float32)
        _, cache = talker.prefill(rows)
        x = rng.standard_normal((1, 1, hidden)).astype(np.float32)

        def step(flat=cache.flat, past=past, rows=rows, x=x):
            c = talker.new_cache()
            c.flat, c.rows, c.past, c.lengths = flat, rows[0], past, [past]
            return talker.forward(x, c)
        ms[f"talker GEMV step at past {past}, caches in and out"] = _timed(step)
        ms[f"flat cache MB at past {past}"] = round(cache.flat.nbytes / 2**20, 2)
        full = rng.standard_normal((past + 1, hidden)).astype(np.float32)
        cos, sin = rope.tables(t["head_dim"], t["rope_theta"], 0, past + 1)
        inp = {"in0": full[None], "in1": rope.causal_mask(past + 1), "in2": cos, "in3": sin}
        ms[f"talker full sequence, {past + 1} rows"] = _timed(
            lambda inp=inp: run(talker.full, inp, ["out0"], axes={"in0": 0, "out0": 0}), 5)
        log(past, ms[f"talker GEMV step at past {past}, caches in and out"],
            ms[f"talker full sequence, {past + 1} rows"])
    prompt = rng.standard_normal((1, 40, hidden)).astype(np.float32)
    ms["talker prefill, 40 rows"] = _timed(lambda: talker.prefill(prompt), 5)
    h = rng.standard_normal(hidden).astype(np.float32)
    ms["predictor first position"] = _timed(lambda: pred.start(h))
    cache = pred.start(h)
    for s in range(15):
        if s in (0, 7, 14):
            ms[f"predictor step at position {s + 1} (logits + caches)"] = _timed(
                lambda cache=cache, s=s: pred.logits(h, cache, s + 1, s))
            ms[f"predictor step at position {s + 1} (logits only)"] = _timed(
                lambda cache=cache, s=s: pred.logits(h, cache, s + 1, s, last=True))
        cache = pred.logits(h, cache, s + 1, s)[1]
    head = Net(cfg.ncnn_dir, "talker_codec_head", threads, device)
    x1 = rng.standard_normal((1, hidden)).astype(np.float32)
    ms["codec head"] = _timed(lambda: head(x1))
    ms["predictor frame (16 calls, greedy sampling)"] = _timed(_frame_timer(loop, rng, hidden, t), 5)
    log(out)
    return out


def _frame_timer(loop, rng, hidden, talker_cfg):
    from ..runtime import Sampling
    from ..runtime.pipeline.sampling import Sampler

    sampler = Sampler(Sampling(greedy=True), talker_cfg)
    h = rng.standard_normal(hidden).astype(np.float32)
    return lambda: loop.predictor.frame(h, 5, sampler)



def frame_times(model_dir: str | Path, device: str = "vulkan", thread_counts=(16, 2, 1), frames: int = 40,
                log=print) -> dict:
    """The loop as the benchmark harness runs it (`Synthesizer.synthesize`, the harness's prompt, greedy), twice in
    one process per thread count: ms per frame of each frame (first run, then a warm second run)."""
    from ..bench.workload import LANGUAGE, TEXT, voice_wav
    from ..runtime import Sampling, Synthesizer
    from ..runtime.audio.wav import load_wav

    out = {}
    for threads in thread_counts:
        synth = Synthesizer(model_dir, threads=threads, device=device)
        voice = synth.voice(wav=load_wav(voice_wav()))
        for run_ in ("first", "second"):
            stamps = [time.perf_counter()]
            result = synth.synthesize(TEXT, LANGUAGE, voice, Sampling(greedy=True), max_frames=frames,
                                      on_frame=lambda n, stamps=stamps: stamps.append(time.perf_counter()))
            per = np.diff(stamps[1:]) * 1e3
            s = result.seconds
            out[f"threads {threads}, {run_} run"] = {
                "median ms/frame": round(float(np.median(per)), 1), "first 5": [round(float(x), 1) for x in per[:5]],
                "last 5": [round(float(x), 1) for x in per[-5:]],
                "talker ms/frame": round(1e3 * s["talker"] / len(result.codes), 1),
                "predictor ms/frame": round(1e3 * s["predictor"] / len(result.codes), 1)}
            log(threads, run_, out[f"threads {threads}, {run_} run"])
        del synth
    return out


if __name__ == "__main__":
    sys.exit(main())

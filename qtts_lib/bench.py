"""What a GPU buys: per-frame timings of the generation loop and the codec, and the Vulkan gate. Introduced in 08.

One function per measured thing; the ncnn side imports no torch (it runs wherever the runtime does),
the PyTorch side only inside `torch_row`. `python -m qtts_lib.bench ...` is the entry point for a
run on another machine (see chapter 08 for the H200 run):

    python -m qtts_lib.bench zeros DIR            # write zero-filled .bin files of the sizes in DIR/bin_sizes.json
    python -m qtts_lib.bench ncnn DIR OUT.json --configs vulkan:rewritten,vulkan:landed,cpu:16,cpu:2
    python -m qtts_lib.bench torch DIR OUT.json --device cuda
    python -m qtts_lib.bench merge OUT.json A.json B.json ...

Rows follow data/bench/README.md: {runtime, device, precision, threads, ms_per_frame{talker, predictor,
codec, total}, prefill_ms, rtf, repeats}. Timings are medians over interleaved repeats; a frame is 80 ms
of audio (12.5 Hz), so rtf = total / 80.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

FRAME_MS = 80.0
TEXT = ("Hello from ncnn. Every token of this sentence is checked against PyTorch, and this is a longer "
        "sentence so that the prompt looks like a real one.")


class NoVulkanInCI(RuntimeError):
    """CI is set and ncnn sees no Vulkan device: chapter 08 must not pass as a skip there."""


def vulkan_or_skip(gpu_count: int | None = None, ci: str | None = None) -> tuple[bool, str]:
    """(True, device names) when ncnn sees a Vulkan device; (False, why) when not. Introduced in 08.

    Where the environment variable CI is set (CI=true on CI machines) a missing device raises
    `NoVulkanInCI` instead: CI installs lavapipe, so a skip there means the set-up broke."""
    if gpu_count is None:
        import ncnn

        gpu_count = ncnn.get_gpu_count()
    ci = os.environ.get("CI", "") if ci is None else ci
    if gpu_count > 0:
        from .runtime.net import gpu_names

        return True, ", ".join(gpu_names()) or f"{gpu_count} Vulkan device(s)"
    reason = ("ncnn sees no Vulkan device (get_gpu_count() == 0): install a Vulkan driver, e.g. Mesa's "
              "lavapipe (apt-get install mesa-vulkan-drivers libvulkan1), or run on a GPU")
    if ci and ci.lower() not in ("0", "false", "no"):
        raise NoVulkanInCI(f"CI={ci}: {reason}. .ci/run installs lavapipe when it runs as root.")
    return False, reason


def submissions_per_frame(talker_layers: int, predictor_layers: int, groups: int = 16, rewritten: bool = False) -> int:
    """Blocking extracts (each one GPU submission + download in the pip binding) per generated frame."""
    if rewritten:  # talker: hidden + packed caches; codec head; one fused graph per codebook
        return 2 + 1 + (groups - 1)
    kv = lambda layers: 1 + 2 * layers  # noqa: E731  (output, then K and V of every layer)
    talker = kv(talker_layers) + 1  # + codec head
    predictor = 1 + kv(predictor_layers) + 2 * (groups - 1) + (groups - 2) * kv(predictor_layers)
    return talker + predictor


def machine() -> dict:
    """GPU name and driver (nvidia-smi or ncnn), CPU model, cores, Python and ncnn versions."""
    from .perf import cpu_model  # the CPU side of the description is the CPU harness's

    info = {"cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        if q.returncode == 0 and q.stdout.strip():
            name, driver, mem = [s.strip() for s in q.stdout.splitlines()[0].split(",")]
            info.update(gpu=name, driver=driver, gpu_memory=mem)
    except (OSError, subprocess.TimeoutExpired):
        pass
    try:
        from importlib import metadata

        import ncnn

        info["ncnn"] = metadata.version("ncnn")
        info["vulkan_devices"] = [ncnn.get_gpu_info(i).device_name() for i in range(ncnn.get_gpu_count())]
    except Exception:  # noqa: BLE001  (a machine without ncnn is still described)
        pass
    return info


# ---------------------------------------------------------------- ncnn
def ncnn_synth(model_dir: str | Path, device: str, threads: int, rewritten: bool = True):
    """A Synthesizer on `device`; `rewritten=False` is the landed loop (the 'before' of chapter 08)."""
    from .runtime.synthesizer import Synthesizer

    return Synthesizer(model_dir, threads=threads, device=device, gpu_rewrites=rewritten)


def ncnn_frames(synth, frames: int, seed: int = 0) -> dict:
    """One greedy run of `frames` frames and its codec decode: ms per frame of each part."""
    from .runtime.synthesizer import Voice

    row = np.random.default_rng(seed).standard_normal(synth.talker_cfg["hidden_size"]).astype(np.float32)
    prompt = synth.build_prompt(TEXT, "english", Voice(row))
    result = synth.generate(prompt, frames + 1)
    t0 = time.perf_counter()
    synth.codec.decode(result.codes)
    codec = time.perf_counter() - t0
    n = len(result.codes)
    ms = {"talker": result.seconds["talker"] / n * 1e3, "predictor": result.seconds["predictor"] / n * 1e3,
          "codec": codec / n * 1e3}
    ms["total"] = sum(ms.values())
    return {"ms_per_frame": ms, "prefill_ms": result.seconds["prefill"] * 1e3, "frames": n}


def median_row(runs: list[dict]) -> dict:
    keys = runs[0]["ms_per_frame"]
    ms = {k: float(np.median([r["ms_per_frame"][k] for r in runs])) for k in keys}
    return {"ms_per_frame": {k: round(v, 2) for k, v in ms.items()},
            "prefill_ms": round(float(np.median([r["prefill_ms"] for r in runs])), 2),
            "rtf": round(ms["total"] / FRAME_MS, 3), "repeats": len(runs), "frames": runs[0]["frames"]}


def ncnn_rows(model_dir: str | Path, configs: list[str], frames: int = 30, repeats: int = 3,
              warmup_frames: int = 4) -> list[dict]:
    """configs like 'vulkan:rewritten', 'vulkan:landed', 'cpu:16': every config built once, then the
    repeats interleaved (config order rotates) so that drift hits all of them alike."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())["talker_config"]
    layers = cfg["num_hidden_layers"], cfg["code_predictor_config"]["num_hidden_layers"]
    synths = {}
    for c in configs:
        dev, _, how = c.partition(":")
        threads = int(how) if how.isdigit() else (os.cpu_count() or 1)
        rewritten = how != "landed"
        synths[c] = (ncnn_synth(model_dir, dev, threads, rewritten), dev, threads, how)
        ncnn_frames(synths[c][0], warmup_frames)
        print(f"ready {c}", flush=True)
    runs: dict[str, list] = {c: [] for c in configs}
    for r in range(repeats):
        for c in configs[r % len(configs):] + configs[: r % len(configs)]:
            runs[c].append(ncnn_frames(synths[c][0], frames))
            print(c, runs[c][-1]["ms_per_frame"], flush=True)
    rows = []
    for c, (_, dev, threads, how) in synths.items():
        gpu = dev != "cpu"
        subs = submissions_per_frame(*layers, rewritten=how != "landed") if gpu else None
        rows.append({"runtime": "ncnn", "device": "vulkan" if gpu else "cpu", "precision": "fp32",
                     "threads": threads, "variant": how if gpu else "cpu loop", "submissions_per_frame": subs,
                     **median_row(runs[c])})
    return rows


def _ms(fn, repeats: int = 20) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(float(np.median(times)) * 1e3, 3)


def profile_vulkan(model_dir: str | Path, device: str = "vulkan", threads: int = 2) -> dict:
    """Where a rewritten frame's time goes on `device`: ms per call of each piece, medians of 20.

    floor: a one-layer graph (upload + submission + download); predictor at 2/9/17 positions;
    the talker step at past 100 with and without downloading the packed caches; the codec head."""
    import ncnn

    from .runtime import rope
    from .runtime.net import Net, from_mat, to_mat
    from .runtime.vulkan import FusedPredictor, PackedKvCacheNet, net_from_text

    model_dir = Path(model_dir)
    ncnn_dir = model_dir / "ncnn"
    cfg = json.loads((model_dir / "config.json").read_text())["talker_config"]
    pc, hidden = cfg["code_predictor_config"], cfg["hidden_size"]
    rng = np.random.default_rng(0)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "e.bin").write_bytes(b"")
        tiny = net_from_text("7767517\n2 2\nInput in0 0 1 in0\nAbsVal a 1 1 in0 out0\n", Path(tmp) / "e.bin",
                             threads, device)
    x = rng.standard_normal((1, hidden)).astype(np.float32)

    def floor():
        ex = tiny.create_extractor()
        m = to_mat(x)
        ex.input("in0", m)
        ex.extract("out0")
    out["floor: 1-layer graph"] = _ms(floor)
    fused = FusedPredictor(ncnn_dir, pc["head_dim"], pc["rope_theta"], threads, device)
    for length in (2, 9, 17):
        seq = rng.standard_normal((length, pc["hidden_size"])).astype(np.float32)
        out[f"predictor fused call, {length} positions"] = _ms(lambda seq=seq: fused.logits(seq, 3))
    head = Net(ncnn_dir, "talker_codec_head", threads, device)
    out["talker codec head"] = _ms(lambda: head(x))
    talker = PackedKvCacheNet(ncnn_dir, "talker_decoder", cfg["head_dim"], cfg["rope_theta"], threads, device)
    talker.prefill(rng.standard_normal((1, 100, hidden)).astype(np.float32))
    e = rng.standard_normal((1, 1, hidden)).astype(np.float32)
    saved = talker.cache

    def step(with_cache: bool):
        talker.cache, talker.past = saved, 100
        cos, sin = rope.tables(cfg["head_dim"], cfg["rope_theta"], 100, 1)
        ex = talker.nets[1].create_extractor()
        held = [to_mat(e, 0), to_mat(rope.causal_mask(1, 100)), to_mat(cos), to_mat(sin)]
        for i, m in enumerate(held):
            ex.input(f"in{i}", m)
        ex.input("cache_all_in", saved)
        o = ncnn.Mat()
        ex.extract("out0", o)
        if with_cache:
            c = ncnn.Mat()
            ex.extract("cache_all_out", c, 1)
        return from_mat(o)
    out["talker step at past 100, hidden only"] = _ms(lambda: step(False))
    out["talker step at past 100, hidden + caches"] = _ms(lambda: step(True))
    out["packed cache MB at past 100"] = round(saved.c * saved.cstep * saved.elemsize / 2**20, 2)
    return out


def write_zero_bins(directory: str | Path) -> None:
    """Zero-filled `.bin` files of the sizes in bin_sizes.json (sparse: instant, no disk).

    fp32 kernels take the same time whatever the weights, so zeros time like real weights."""
    directory = Path(directory)
    for name, size in json.loads((directory / "bin_sizes.json").read_text()).items():
        with (directory / name).open("wb") as f:
            f.truncate(size)


# ---------------------------------------------------------------- PyTorch
def _stub(*names: str) -> None:
    """Modules the 12 Hz generate path imports but never calls (librosa, soundfile) when absent."""
    import importlib
    import importlib.machinery
    import types

    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            def missing(*a, _n=name, **k):
                raise RuntimeError(f"{_n} is not installed here")
            for part in (name, *[name + s for s in (".filters",)]):
                mod = types.ModuleType(part)
                mod.__spec__ = importlib.machinery.ModuleSpec(part, None)
                mod.mel = mod.load = mod.resample = missing
                sys.modules[part] = mod


def torch_row(model_dir: str | Path, device: str = "cuda", frames: int = 30, repeats: int = 3,
              warmup_frames: int = 4) -> dict:
    """qwen_tts's own generate loop on `device`, fp32, greedy, x-vector prompt; talker and predictor
    split by timing the code predictor's generate calls, codec timed around speech_tokenizer.decode."""
    import torch

    _stub("librosa", "soundfile")
    from .reference import import_qwen_tts

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    qwen_tts = import_qwen_tts()
    tts = qwen_tts.Qwen3TTSModel.from_pretrained(str(model_dir), device_map=device, dtype=torch.float32,
                                                 attn_implementation="sdpa", local_files_only=True)
    model = tts.model.eval()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    spent = {"predictor": 0.0, "generate": 0.0, "codec": 0.0}

    def timed(key, fn):
        def wrapper(*a, **k):
            sync()
            t0 = time.perf_counter()
            out = fn(*a, **k)
            sync()
            spent[key] += time.perf_counter() - t0
            return out
        return wrapper

    model.talker.code_predictor.generate = timed("predictor", model.talker.code_predictor.generate)
    model.generate = timed("generate", model.generate)
    model.speech_tokenizer.decode = timed("codec", model.speech_tokenizer.decode)
    dim = model.config.speaker_encoder_config.enc_dim
    xvec = torch.from_numpy(np.random.default_rng(0).standard_normal(dim).astype(np.float32))
    prompt = {"ref_code": [None], "ref_spk_embedding": [xvec], "x_vector_only_mode": [True], "icl_mode": [False]}

    def one(n):
        for k in spent:
            spent[k] = 0.0
        with torch.inference_mode():
            tts.generate_voice_clone(text=TEXT, language="english", voice_clone_prompt=prompt, max_new_tokens=n + 1,
                                     do_sample=False, subtalker_dosample=False)
        ms = {"talker": (spent["generate"] - spent["predictor"]) / n * 1e3, "predictor": spent["predictor"] / n * 1e3,
              "codec": spent["codec"] / n * 1e3}
        ms["total"] = sum(ms.values())
        return {"ms_per_frame": ms, "prefill_ms": float("nan"), "frames": n}

    one(warmup_frames)
    runs = [one(frames) for _ in range(repeats)]
    for r in runs:
        print("torch", device, r["ms_per_frame"], flush=True)
    row = median_row(runs)
    row.pop("prefill_ms")
    variant = f"qwen-tts {_version('qwen-tts')}, torch {torch.__version__}, transformers {_version('transformers')}"
    return {"runtime": "pytorch", "device": "cuda" if device.startswith("cuda") else device, "precision": "fp32",
            "threads": torch.get_num_threads(), "variant": variant + ", sdpa", **row}


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


# ---------------------------------------------------------------- files
def merge(out: str | Path, parts: list[str | Path], checkpoint: str = "full-base", note: str = "") -> dict:
    """One data/bench JSON from the parts a run wrote (each {machine, rows})."""
    docs = [json.loads(Path(p).read_text()) for p in parts]
    doc = {"machine": docs[0]["machine"], "checkpoint": checkpoint, "frames": docs[0]["rows"][0]["frames"],
           "note": note, "rows": [r for d in docs for r in d["rows"]]}
    Path(out).write_text(json.dumps(doc, indent=1))
    return doc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m qtts_lib.bench")
    sub = p.add_subparsers(dest="cmd", required=True)
    z = sub.add_parser("zeros")
    z.add_argument("dir")
    n = sub.add_parser("ncnn")
    n.add_argument("model_dir")
    n.add_argument("out")
    n.add_argument("--configs", default="vulkan:rewritten,vulkan:landed,cpu:16,cpu:2")
    n.add_argument("--frames", type=int, default=30)
    n.add_argument("--repeats", type=int, default=3)
    t = sub.add_parser("torch")
    t.add_argument("model_dir")
    t.add_argument("out")
    t.add_argument("--device", default="cuda")
    t.add_argument("--frames", type=int, default=30)
    t.add_argument("--repeats", type=int, default=3)
    f = sub.add_parser("profile")
    f.add_argument("model_dir")
    f.add_argument("out")
    f.add_argument("--device", default="vulkan")
    m = sub.add_parser("merge")
    m.add_argument("out")
    m.add_argument("parts", nargs="+")
    m.add_argument("--note", default="")
    a = p.parse_args(argv)
    if a.cmd == "zeros":
        write_zero_bins(a.dir)
    elif a.cmd == "ncnn":
        rows = ncnn_rows(a.model_dir, a.configs.split(","), a.frames, a.repeats)
        Path(a.out).write_text(json.dumps({"machine": machine(), "rows": rows}, indent=1))
    elif a.cmd == "torch":
        row = torch_row(a.model_dir, a.device, a.frames, a.repeats)
        Path(a.out).write_text(json.dumps({"machine": machine(), "rows": [row]}, indent=1))
    elif a.cmd == "profile":
        Path(a.out).write_text(json.dumps(profile_vulkan(a.model_dir, a.device), indent=1))
    else:
        merge(a.out, a.parts, note=a.note)


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------- chapter 08's small graphs and probes
def net_from_text(text: str, device: str, threads: int = 2, weights: bytes = b"", fp16: bool = False):
    """An ncnn.Net from .param text without its magic line (and .bin bytes), fp16 on or off. Introduced in 08."""
    import ncnn

    net = ncnn.Net()
    o = net.opt
    o.num_threads = threads
    o.use_fp16_packed = o.use_fp16_storage = o.use_fp16_arithmetic = fp16
    o.use_bf16_storage = False
    o.use_vulkan_compute = device != "cpu"
    with tempfile.TemporaryDirectory() as tmp:  # load_model_mem keeps pointers into a buffer Python frees
        (Path(tmp) / "g.param").write_text("7767517\n" + text)
        (Path(tmp) / "g.bin").write_bytes(weights)
        if net.load_param(str(Path(tmp) / "g.param")) != 0 or net.load_model(str(Path(tmp) / "g.bin")) != 0:
            raise RuntimeError("ncnn could not load the graph")
    return net


def run_graph(net, **arrays) -> np.ndarray:
    """Blob `out` of `net` for named numpy inputs (each held, then cloned into a Mat)."""
    import ncnn

    held = {k: np.ascontiguousarray(a) for k, a in arrays.items()}
    mats = {k: ncnn.Mat(a).clone() for k, a in held.items()}
    ex = net.create_extractor()
    for k, m in mats.items():
        ex.input(k, m)
    _, out = ex.extract("out")
    return np.array(out.numpy(), copy=True)


ROPE = "4 4\nInput x 0 1 x\nInput cos 0 1 cos\nInput sin 0 1 sin\nRotaryEmbed rope 3 1 x cos sin out 0=0\n"
SDPA = "5 5\nInput q 0 1 q\nInput k 0 1 k\nInput v 0 1 v\nInput m 0 1 m\nSDPA sdpa 4 1 q k v m out 5=1\n"


def convention_rows(devices: list[str], threads: int = 2) -> list[dict]:
    """Rope with half- and full-width tables, SDPA with 2-D and 3-D masks, on each device, against numpy
    (max |diff|). The seed found full width and 3-D masks wrong on Vulkan; chapter 08 shows this version."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 5, 8)).astype(np.float32)  # (heads, seq, head_dim): ncnn's c, h, w
    ang = np.arange(5, dtype=np.float32)[:, None] / 10000 ** (np.arange(0, 8, 2, dtype=np.float32) / 8)
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)  # (seq, head_dim/2)
    rope_ref = np.concatenate([x[..., :4] * cos - x[..., 4:] * sin, x[..., 4:] * cos + x[..., :4] * sin], -1)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3, 8), (2, 6, 8), (2, 6, 8)))

    def sdpa_ref(mask: np.ndarray) -> np.ndarray:  # GQA: 4 query heads over 2 kv heads
        s = q @ np.repeat(k, 2, 0).transpose(0, 2, 1) / np.sqrt(8) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        return (p / p.sum(-1, keepdims=True)) @ np.repeat(v, 2, 0)

    masks = {"2-D (L, S)": rng.standard_normal((3, 6)), "3-D (1, L, S)": rng.standard_normal((1, 3, 6)),
             "3-D (heads, L, S)": rng.standard_normal((4, 3, 6))}
    rows = []
    for dev in devices:
        for width, c, s in (("half", cos, sin), ("full", np.tile(cos, 2), np.tile(sin, 2))):
            y = run_graph(net_from_text(ROPE, dev, threads), x=x, cos=c, sin=s)
            rows.append({"test": f"rope, {width}-width tables", "device": dev,
                         "max_abs": float(np.abs(y - rope_ref).max())})
        for label, m in masks.items():
            y = run_graph(net_from_text(SDPA, dev, threads), q=q, k=k, v=v, m=m.astype(np.float32))
            rows.append({"test": f"SDPA mask {label}", "device": dev, "max_abs": float(np.abs(y - sdpa_ref(m)).max())})
    return rows


class Counted:
    """An extractor that counts its `extract` calls."""

    def __init__(self, ex, counter: list):
        self.ex, self.counter = ex, counter

    def input(self, *args):
        return self.ex.input(*args)

    def extract(self, *args):
        self.counter[0] += 1
        return self.ex.extract(*args)


@contextlib.contextmanager
def patched_ncnn(fp16: bool = False, counter: list | None = None):
    """Nets created inside: fp16 forced on at load time (the runtime turns it off), extracts counted.
    Introduced in 08."""
    import ncnn

    real = ncnn.Net

    class Patched(real):
        def _opts(self):
            if fp16:
                o = self.opt
                o.use_fp16_packed = o.use_fp16_storage = o.use_fp16_arithmetic = True

        def load_param(self, path):
            self._opts()
            return super().load_param(path)

        def load_param_mem(self, text):
            self._opts()
            return super().load_param_mem(text)

        def create_extractor(self):
            ex = super().create_extractor()
            return ex if counter is None else Counted(ex, counter)

    ncnn.Net = Patched
    try:
        yield
    finally:
        ncnn.Net = real

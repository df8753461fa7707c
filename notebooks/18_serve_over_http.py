# ---
# jupyter:
#   jupytext:
#     formats: py:percent,ipynb
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 18 · Serve over HTTP
# > OpenAI's speech API in front of one engine thread: any OpenAI client can speak through it, and no client can
# > take more than its share.
#
# **You will:** start `qtts serve` and speak to it with OpenAI's own Python SDK, in every format, whole and
# streamed; draw fresh takes and replay one by its seed; read server-sent events; change the speed; add, use and
# delete a voice while the server runs; lock it with a key; watch it refuse work it cannot bound; and read how
# streams fare under load at full size.
#
# **You will learn:** what the server adds to the library (a request is parsed, bounded, given a place and streamed;
# the audio is the library's, bit for bit); why a seed is drawn per request and told back; what each bound on work
# protects; why a request keeps its place from its first segment to its last.
#
# **You need:** `models/<ckpt>/ncnn/` (chapters 04–05; exported here if missing), the committed voice clip, the
# server's packages and `openai` (`make setup` installs both). The full-size load runs are read from
# `data/bench/serve/`.
# **Leaves behind:** `data/outputs/<ckpt>/18_voices/`, `data/reports/<ckpt>/18_serve_over_http.json`.

# %%
import atexit
import base64
import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from unittest.mock import Mock

import av
import httpx
import matplotlib.pyplot as plt
import numpy as np
import openai
import pandas as pd
from IPython.display import Audio, display
from starlette.testclient import TestClient

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.bench import serve as bench_serve
from qtts_lib.isolation import PRELUDE
from qtts_lib.runtime import Synthesizer, load_wav
from qtts_lib.runtime.app import cli, schema, server
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, pcm16, wav_header
from qtts_lib.runtime.pipeline import longform
from qtts_lib.runtime.pipeline.scheduler import DEFAULT_MAX_BATCH

ckpt = settings.checkpoint()
THREADS = settings.threads()
report = check.begin("18_serve_over_http", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # chapters 04-05's graphs, reused when current
synth = Synthesizer(model_dir, threads=THREADS)  # the library in this process: what the server's audio must equal
clip, clip_text = load_wav(paths.voice_wav()), (paths.INPUTS / "voice.txt").read_text().strip()
VOICE, voice = {"base": lambda: ("alice", synth.voice(wav=clip)),
                "custom_voice": lambda: (synth.speakers[0], synth.voice(speaker=synth.speakers[0])),
                "voice_design": lambda: ("design", synth.voice(instruct=None))}[synth.kind]()
TEXT, MAX_FRAMES, KEY = "Hello from a speech server.", 24, "sk-chapter-17"

# %% [markdown]
# ## 1. Start the server
# `qtts serve` loads the checkpoint, builds the voices of its folder once (here `alice.wav`, the committed clip) and
# listens on a port. It runs here as a user starts it: its own process, torch not importable in it, the API key in
# `$QTTS_API_KEY` (a key given as `--api-key` would show in `ps`), and a small `--max-frames` so that the tiny
# checkpoint's takes stay short. `start` returns once `/health` answers; every server is stopped at the end.

# %%
voices_dir = paths.outputs_dir(ckpt) / "18_voices"
shutil.rmtree(voices_dir, ignore_errors=True)
voices_dir.mkdir(parents=True)
shutil.copy(paths.voice_wav(), voices_dir / "alice.wav")
servers = []


def start(*flags: str) -> str:
    """`qtts serve` on a free port with the key in its environment; its URL once /health answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = paths.outputs_dir(ckpt) / f"18_server_{len(servers)}.log"
    main = "from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + main, "serve", "--checkpoint", str(model_dir),
                             "--port", str(port), "--voices", str(voices_dir), "--threads", str(THREADS),
                             "--max-frames", str(MAX_FRAMES), *flags], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=dict(os.environ, QTTS_API_KEY=KEY))
    servers.append(proc)
    atexit.register(proc.terminate)  # a chapter stopped half-way leaves no server behind
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"qtts serve exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health").status_code == 200:
                print(log.read_text().strip())
                return url
        time.sleep(0.2)
    raise RuntimeError("qtts serve did not come up")


url = start()
http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=600)
health = http.get("/health")
print(health.json())
check.equal("qtts serve answers /health", "status", f"{health.status_code} {health.json()['status']}", "200 ok")

# %% [markdown]
# ## 2. Speak with OpenAI's SDK
# The official `openai` package speaks to it unchanged: only `base_url` points here. `model` may be OpenAI's names
# (`tts-1`, ...) or the checkpoint's; `voice` a clip's name; fields OpenAI does not have (`language`, `seed`, the
# sampling parameters) go in `extra_body`. One take, in each of the six formats, with the same seed: `pcm` is the raw
# 16-bit samples, `wav` the same behind a header, `flac` the same compressed without loss, mp3, Opus and AAC lossy
# (a decoder adds its codec's priming and padding).

# %%
client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)
same = {"model": "tts-1", "voice": VOICE, "input": TEXT, "extra_body": {"language": "english", "seed": 7}}


def decoded(body: bytes) -> np.ndarray:
    """A body's samples as a player hears them (PyAV, FFmpeg's decoders), at 24 kHz."""
    with av.open(io.BytesIO(body)) as f:
        frames = [fr.to_ndarray().reshape(-1) for fr in f.decode(f.streams.audio[0])]
        return np.concatenate(frames)[::f.streams.audio[0].codec_context.sample_rate // SAMPLE_RATE]


bodies, rows = {}, []
for fmt in ("pcm", "wav", "flac", "mp3", "opus", "aac"):
    answer = client.audio.speech.create(**same, response_format=fmt)
    bodies[fmt] = answer.content
    n = len(answer.content) // 2 if fmt == "pcm" else len(decoded(answer.content))
    rows.append({"format": fmt, "content-type": answer.response.headers["content-type"],
                 "bytes": len(answer.content), "samples decoded": n})
display(pd.DataFrame(rows))
pcm = np.frombuffer(bodies["pcm"], "<i2")
display(Audio(pcm / 32768, rate=SAMPLE_RATE))
check.equal("wav and flac carry pcm's samples exactly", "equal", bool(np.array_equal(
    np.frombuffer(bodies["wav"][44:], "<i2"), pcm) and np.array_equal(decoded(bodies["flac"]), pcm)), True)
extra = [r["samples decoded"] - len(pcm) for r in rows]
check.at_least("every format: at least pcm's samples", "samples", min(extra), 0)
check.at_most("mp3, opus, aac: a decoder's extra samples (priming + padding)", "samples", max(extra), 2 * 1152)

# %% [markdown]
# What a server streams is the library's own path, `longform.stream_long` (a long input is spoken segment by
# segment, chapter 16), with the request's sampling. The same request in this process, and one more with another
# `top_k`, must give the server's samples exactly; the `top_k` must have reached the sampler; and a value the
# sampler refuses is a 400 naming its field, before any work:

# %%
def library(voice, sampling) -> np.ndarray:
    """What the server streams for TEXT, made in this process: `stream_long`'s pieces as 16-bit samples."""
    pieces = longform.stream_long(synth, TEXT, "english", voice, sampling, max_frames=MAX_FRAMES)
    return np.frombuffer(pcm16(np.concatenate(list(pieces))), "<i2")


served = np.frombuffer(client.audio.speech.create(**same | {"extra_body": same["extra_body"] | {"top_k": 5}},
                                                  response_format="pcm").content, "<i2")
for name, changes, got in (("seed 7", {}, pcm), ("seed 7, top_k 5", {"top_k": 5}, served)):
    ours = library(voice, synth.sampling.replace(seed=7, **changes))
    check.equal(f"served pcm = stream_long here, {name}", "bitwise equal", bool(np.array_equal(got, ours)), True)
check.equal("the request's top_k reached the sampler", "same audio", bool(np.array_equal(served, pcm)), False)
bad = http.post("/v1/audio/speech", json={"input": TEXT, "voice": VOICE, "temperature": 0})
print(bad.status_code, bad.json()["error"])
check.equal("temperature 0: a 400 naming `temperature`", "status param",
            f"{bad.status_code} {bad.json()['error']['param']}", "400 temperature")

# %% [markdown]
# ## 3. Stream over HTTP
# The answer is sent as it is generated: a chunked body, one chunk per piece of `--chunk-frames` frames (four, by
# default), each encoded as it comes. `with_streaming_response` reads the chunks as they arrive; time each one:

# %%
t0, arrivals = time.perf_counter(), []
with client.audio.speech.with_streaming_response.create(**same, response_format="pcm") as streamed:
    for chunk in streamed.iter_bytes():
        arrivals.append((time.perf_counter() - t0, len(chunk) / 2 / SAMPLE_RATE))
    encoding = streamed.headers.get("transfer-encoding")
arrivals = np.array(arrivals)
fig, ax = plt.subplots(figsize=(8, 3))
ax.step(np.r_[0, arrivals[:, 0]], np.r_[0, np.cumsum(arrivals[:, 1])], where="post", label="audio received")
ax.axvline(arrivals[0, 0], color="gray", ls=":", label=f"first audio {arrivals[0, 0] * 1000:.0f} ms")
ax.set(xlabel="wall time since the request (s)", ylabel="audio (s)", title=f"One streamed request ({ckpt})")
ax.legend(fontsize=8)
plt.show()
print(f"{len(arrivals)} chunks, transfer-encoding {encoding}; first audio after {arrivals[0, 0]:.2f} s of "
      f"{arrivals[-1, 0]:.2f} s (this machine, now; on tiny mostly call overhead)")
check.equal("the answer is chunked: sent while it is generated", "transfer-encoding", encoding, "chunked")
check.at_most("first audio early in the answer (streamed, not whole)", "ttfa / total",
              arrivals[0, 0] / arrivals[-1, 0], 0.5)

# %% [markdown]
# ## 4. A fresh take, or the same one again
# A request without a seed gets a fresh one, as OpenAI's API and the reference do: ask twice, hear two takes. Every
# answer names its seed in its `X-Seed` header (`with_raw_response` shows it), and sending it back replays the take.

# %%
def take(voice: str = VOICE, speed: float = 1.0, **extra) -> tuple[bytes, int]:
    """One pcm take of TEXT and the seed it used (X-Seed); `extra`: fields OpenAI's API does not have."""
    raw = client.audio.speech.with_raw_response.create(model="tts-1", voice=voice, input=TEXT, speed=speed,
                                                       response_format="pcm",
                                                       extra_body={"language": "english", **extra})
    return raw.content, int(raw.headers["x-seed"])


(first, seed_a), (second, seed_b) = take(), take()
replayed, seed_c = take(seed=seed_a)
print(f"X-Seed {seed_a} and {seed_b}; replayed with seed {seed_a}: X-Seed {seed_c}")
check.equal("two requests without a seed: two takes", "same audio", first == second, False)
check.equal("a take replayed with its X-Seed", "bitwise equal", replayed == first and seed_c == seed_a, True)

# %% [markdown]
# ## 5. Server-sent events
# Newer OpenAI clients ask for `stream_format="sse"`: each `speech.audio.delta` event holds the next bytes in base64,
# and `speech.audio.done` ends the stream with the usage. Joined, the deltas must be the take above:

# %%
with client.audio.speech.with_streaming_response.create(model="tts-1", voice=VOICE, input=TEXT, response_format="pcm",
                                                        stream_format="sse",
                                                        extra_body={"language": "english", "seed": seed_a}) as sse:
    kind = sse.headers["content-type"]
    events = [json.loads(line[5:]) for line in sse.iter_lines() if line.startswith("data:")]
audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
print(kind, pd.Series([e["type"] for e in events]).value_counts().to_dict(), events[-1])
check.equal("sse: deltas, then one done event with the usage", "last event", events[-1]["type"], "speech.audio.done")
check.equal("sse: the deltas joined = the same take as audio", "bitwise equal", audio == first, True)

# %% [markdown]
# ## 6. Speed, at the same pitch
# `speed` (0.25 to 4.0) changes the tempo, not the pitch: FFmpeg's `atempo` (PyAV) overlaps and adds short windows
# as the pieces stream, where playing the samples faster would raise every frequency. The same take at three speeds:

# %%
def spectrum(x: np.ndarray, n: int = 1024) -> np.ndarray:
    """The mean magnitude spectrum of windows of n samples."""
    frames = x[: len(x) // n * n].reshape(-1, n) * np.hanning(n)
    return np.abs(np.fft.rfft(frames, axis=1)).mean(0)


freqs = np.fft.rfftfreq(1024, 1 / SAMPLE_RATE)
takes = {s: np.frombuffer(take(seed=seed_a, speed=s)[0], "<i2") / 32768 for s in (0.5, 1.0, 2.0)}
fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3.2), gridspec_kw={"width_ratios": [2, 1]})
centroid = {}
for s, x in takes.items():
    spec = spectrum(x)
    centroid[s] = float((freqs * spec).sum() / spec.sum())
    a1.semilogy(freqs, spec, lw=1, label=f"speed {s}: centroid {centroid[s]:.0f} Hz")
a1.set(xlabel="frequency (Hz)", ylabel="mean magnitude", title="spectra: where the energy is")
a1.legend(fontsize=8)
a2.bar([str(s) for s in takes], [len(x) / SAMPLE_RATE for x in takes.values()])
a2.set(xlabel="speed", ylabel="seconds", title="durations")
plt.tight_layout()
plt.show()
for s in (0.5, 2.0):
    check.close(f"speed {s}: duration = speed 1.0's / {s}", len(takes[s]) / SAMPLE_RATE,
                len(takes[1.0]) / SAMPLE_RATE / s, rel=0.05)
    check.close(f"speed {s}: spectral centroid kept", centroid[s], centroid[1.0], rel=0.05)

# %% [markdown]
# ## 7. Voices over HTTP
# On a Base checkpoint voices can change while the server runs: `GET /v1/voices` lists them, `POST /v1/voices` (a
# form: `name`, the clip file `audio`, optionally its transcript `text` for ICL) adds one, stored in the voices folder,
# and `DELETE /v1/voices/{name}` removes it. An upload passes the same clip checks as `qtts say` (chapter 16) and its
# prompt parts are computed once. Upload the committed clip with its transcript, as chapter 08 clones it; a voice
# made from it in this process must speak the same take:

# %%
if synth.kind != "base":
    print(f"{ckpt} speaks built-in voices only: {http.get('/v1/voices').json()}")
else:
    before = [v["name"] for v in http.get("/v1/voices").json()["voices"]]
    made = http.post("/v1/voices", data={"name": "bob", "text": clip_text},
                     files={"audio": ("bob.wav", paths.voice_wav().read_bytes(), "audio/wav")})
    print(before, made.status_code, made.json())
    bob = np.frombuffer(take("bob", seed=7)[0], "<i2")
    ours = library(synth.voice(wav=clip, text=clip_text), synth.sampling.replace(seed=7))
    check.equal("upload a clip with its transcript", "status mode", f"{made.status_code} {made.json()['mode']}",
                "201 icl")
    check.equal("the uploaded voice = synth.voice(clip, transcript), same seed", "bitwise equal",
                bool(np.array_equal(bob, ours)), True)

# %% [markdown]
# A clip the model cannot use is refused with a 400 that says why, before it becomes a voice: here one too short
# and one silent. Then the voice is deleted, and a request for it is refused like any unknown voice.

# %%
if synth.kind == "base":
    for name, bad in (("short", clip[: SAMPLE_RATE // 2]), ("silent", np.zeros(2 * SAMPLE_RATE, np.float32))):
        wav = wav_header(data_bytes=2 * len(bad)) + pcm16(bad)  # a 16-bit wav file of the bad samples
        refused = http.post("/v1/voices", data={"name": name}, files={"audio": (f"{name}.wav", wav)})
        print(refused.status_code, refused.json()["error"]["message"])
        check.equal(f"a {name} clip refused", "status", refused.status_code, 400)
    gone = http.delete("/v1/voices/bob")
    after = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "bob"})
    print(gone.json(), [v["name"] for v in http.get("/v1/voices").json()["voices"]], after.json()["error"]["param"])
    check.equal("delete the voice; a request for it is a 400 naming `voice`", "deleted, status param",
                f"{gone.json()['deleted']}, {after.status_code} {after.json()['error']['param']}", "bob, 400 voice")

# %% [markdown]
# OpenAI's SDK makes a voice from a sample and the id of a consent recording uploaded first, and names it by the id
# it gets back (`{"id": ...}`); made from the committed clip, it must speak alice's take:

# %%
if synth.kind == "base":
    sample = ("voice.wav", paths.voice_wav().read_bytes(), "audio/wav")
    consent = client.audio.voice_consents.create(name="Alice", language="en", recording=sample)
    made = client.audio.voices.create(name="carol", audio_sample=sample, consent=consent.id)
    carol = client.audio.speech.create(**same | {"voice": {"id": made.id}}, response_format="pcm").content
    check.equal(f"a voice made through the SDK ({made.id}) = its clip's, same seed", "bitwise equal",
                bool(np.array_equal(np.frombuffer(carol, "<i2"), pcm)), True)

# %% [markdown]
# ## 8. A key
# With `$QTTS_API_KEY` (or `--api-key`) set, every `/v1/` path, `/openapi.json` and `/metrics` need `Authorization:
# Bearer KEY`, what OpenAI's clients send (the scheme's name in any case, RFC 7235); `/` and `/health` stay open.
# The key came from the environment, so it is not on the server's command line, which any user can read:

# %%
keys = {"none": None, "a wrong one": "Bearer sk-wrong", "bearer, lower case": f"bearer {KEY}"}
answers = {who: httpx.get(f"{url}/v1/models", headers={"Authorization": k} if k else {}) for who, k in keys.items()}
for who, a in answers.items():
    print(f"key {who}: {a.status_code}", a.json().get("error", {}).get("message", ""))
schema_open = httpx.get(f"{url}/openapi.json").status_code
command_line = open(f"/proc/{servers[0].pid}/cmdline", "rb").read()
check.equal("no key, a wrong key, 'bearer' in lower case", "status", [a.status_code for a in answers.values()],
            [401, 401, 200])
check.equal("/openapi.json without the key", "status", schema_open, 401)
check.equal("the key is not on the server's command line", "found", KEY.encode() in command_line, False)

# %% [markdown]
# ## 9. Bound the work
# A server shares one engine among strangers, so every request's work is bounded and a request past a bound is
# refused at once. The bounds and their defaults, then two of them live on a second server (one place, a small budget):

# %%
d = cli.parser().parse_args(["serve"])  # the defaults, as `qtts serve --help` shows them
bounds = pd.DataFrame([
    ("a request's body", "", f"{schema.MAX_BODY_BYTES // 1024} KiB", "413, before it is read whole"),
    ("frames a request may take", "--frame-budget", d.frame_budget, "400, before any work"),
    ("places: speaking + waiting", "--max-batch, --queue", f"{DEFAULT_MAX_BATCH} + {d.queue}", "503, Retry-After"),
    ("connections uvicorn serves", "--max-connections", "places + 32", "503, from uvicorn"),
    ("audio a client leaves unread", "--backlog", f"{d.backlog:g} s", "its text's next segment waits"),
    ("a client that takes no audio", "--send-timeout", f"{d.send_timeout:g} s", "dropped, its place freed"),
], columns=["bound", "flag", "default", "past it"])
display(bounds)

# %%
small = start("--frame-budget", str(MAX_FRAMES + 8), "--max-batch", "1", "--queue", "0")
long_text = " ".join(bench_serve.texts(1))
over = httpx.post(f"{small}/v1/audio/speech", headers=http.headers, json={"input": long_text, "voice": VOICE})
print(over.status_code, over.json()["error"])
holder = httpx.Client(base_url=small, headers=http.headers, timeout=600)
with holder.stream("POST", "/v1/audio/speech", json={"input": TEXT, "voice": VOICE}) as speaking:  # holds the place
    full = httpx.post(f"{small}/v1/audio/speech", headers=http.headers, json={"input": TEXT, "voice": VOICE})
    print(speaking.status_code, "|", full.status_code, full.headers.get("retry-after"), full.json()["error"])
check.equal("a text over --frame-budget: 400 before any work", "status code", f"{over.status_code} "
            f"{over.json()['error']['code']}", "400 over_budget")
check.equal("every place taken: 503 at once, with Retry-After", "status retry", f"{full.status_code} "
            f"{full.headers.get('retry-after') is not None}", "503 True")

# %% [markdown]
# Failures are seen: an engine whose thread has died makes `/health` answer 503 and every request a JSON 5xx, so a
# supervisor restarts the process. Shown in this process, on the same app with its engine's step made to raise:

# %%
engine = server.Engine(synth, voices_dir, max_frames=MAX_FRAMES)
app = TestClient(server.build_app(engine, ckpt))
engine.scheduler.step = Mock(side_effect=RuntimeError("a failure inside the engine, simulated"))
failed = app.post("/v1/audio/speech", json={"input": TEXT, "voice": VOICE})
dead = app.get("/health")
print(failed.status_code, failed.json()["error"]["message"], "|", dead.status_code, dead.json())
check.equal("a dead engine: the request a 5xx, /health 503", "statuses", (failed.status_code // 100,
                                                                          dead.status_code), (5, 503))

# %% [markdown]
# ## 10. The server under load, at full size
# `python -m qtts_lib.bench serve` sends a real server streaming clients, 1 to 8 at once and 8 arriving a few
# seconds apart, each a text of two segments, timing every chunk. Its committed runs on one reference machine,
# `full-base` in int8: *before*, a long text's next segment queued behind new requests; *after*, a request keeps its
# place from its first segment to its last (chapter 17's lanes), and a joining one is prefilled in pieces between
# frames. Each file records the machine and its load: a shared host varies, so only large differences count.

# %%
files = [paths.DATA / "bench" / "serve" / f"dev-2core-xeon-amx-full-base-int8-{run}.json" for run in
         ("before", "after")]
for f in files:
    doc = json.loads(f.read_text())
    m = doc["machine"]
    print(f"{f.stem}: {m['cpu']}, {m['cores']} cores, {doc['threads']} threads, max batch {doc['max_batch']}, "
          f"load average {m['load_average']} -> {m['load_average_end']}, read GB/s {m['read_bandwidth_gbs']}")
load = pd.DataFrame(bench_serve.load_table(files))
cols = ["gap_p50_ms", "gap_p99_over_p50", "longest_gap_p99_ms", "ttfa_p99_ms", "rtf", "errors"]
display(load.pivot(index="scenario", columns="run", values=cols).reindex(load.scenario.unique())
        .reindex(columns=["before", "after"], level=1))
bench_serve.plot(files)
plt.show()

# %% [markdown]
# Look at the ratio of a stream's p99 gap to its median (`gap_p99_over_p50`, the bench's target: at most 2) and at
# each stream's longest gap (ms). With room in the batch both runs stay under the target. Past it (8 clients, 4
# places), *before*, newcomers took a running stream's place between its segments and its longest gap grew to tens
# of seconds; *after*, every stream that started keeps its pace, and the wait moves to where a server can bound it:
# the first audio of a request that waits for a place. Here one stream is already slower than real time (`rtf`
# above 1): the figure is about evenness; other machines are on the [results](results.ipynb) page.

# %% [markdown]
# ## Summary
# - `qtts serve` speaks OpenAI's speech API: the official SDK works with only `base_url` changed, in six formats,
#   whole or streamed as a chunked body or server-sent events; its samples are `stream_long`'s, bit for bit.
# - A request without a seed is a fresh take that `X-Seed` lets you replay exactly; `speed` changes the tempo and
#   keeps the spectrum; voices are listed, uploaded (with `qtts say`'s clip checks, or through OpenAI's SDK with a
#   consent recording) and deleted while it runs.
# - A key from `$QTTS_API_KEY` guards the API (any case of `Bearer`); every request's work is bounded, refused at
#   once past a bound (400, 413, 503 with Retry-After), and a dead engine shows in `/health`.
# - Under load, a request keeps its place from its first segment to its last: running streams stay even, and the
#   wait moves to a newcomer's first audio.
#
# **Artifacts left:** `data/outputs/<ckpt>/18_voices/` (the voices folder), `18_server_*.log`, the chapter report.
#
# **If your numbers differ**
# - *The server does not come up* → read `18_server_*.log`: `pip install 'qtts[serve]'`, or export (chapters 04–05).
# - *Served pcm ≠ `stream_long`* → another thread count in the server than here (`--threads`), or another seed or
#   language; the server's default language is `auto`.
# - *Two requests without a seed give the same audio* → a server that does not resolve a fresh seed per request.
# - *Speed changes the centroid* → samples resampled instead of `atempo` (the pitch moves with the speed).
# - *No 503 when the places are full* → the first request ended before the second came: give it a longer text.

# %%
for proc in servers:
    proc.terminate()
    proc.wait(30)
engine.stop()
check.equal("every server started here has stopped", "running", [p.poll() is None for p in servers],
            [False] * len(servers))
check.table()

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
# > OpenAI's speech API in front of one engine thread (the one thread that runs every ncnn call, appendix D):
# > any OpenAI client can speak through it, and no client can take more than its share.
#
# **You will:** start `qtts serve`, speak to it with OpenAI's Python SDK, whole and streamed; replay a take by its
# seed; add and delete voices while it runs; lock it with a key; watch it refuse work it cannot bound.
#
# **You will learn:** what the server adds to the library (a request is parsed, bounded, given a place, a row of the
# engine's batch (chapter 17), streamed; the audio is the library's, bit for bit); why a seed is drawn per request;
# what each bound protects; how streams fare under load. Every option is listed on the [how-to page](../howto.md).
#
# **You need:** the exported graphs (chapters 04–05; made here if missing), the server's packages and `openai`
# (`make setup`). **Leaves behind:** `data/outputs/<ckpt>/18_voices/`, the chapter report. The set-up loads the
# checkpoint here too, to make what the server's audio must equal:

# %%
import numpy as np

from qtts_lib import check, checkpoint, export, paths, reference, settings
from qtts_lib.runtime import Synthesizer, load_wav
from qtts_lib.runtime.audio.wav import SAMPLE_RATE

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("18_serve_over_http", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # 04-05's graphs
synth = Synthesizer(model_dir, threads=THREADS)
clip = load_wav(paths.voice_wav())
clip_text = (paths.INPUTS / "voice.txt").read_text().strip()
VOICE = {"base": "alice", "voice_design": "design"}.get(synth.kind) or synth.speakers[0]
voice = synth.voice(**{"alice": {"wav": clip}, "design": {"instruct": None}}.get(
    VOICE, {"speaker": VOICE}))  # the committed clip, a designed voice or a speaker
TEXT, MAX_FRAMES, KEY = "Hello from a speech server.", 24, "sk-chapter-18"

# %% [markdown]
# ## 1. Start the server
# `qtts serve` loads the checkpoint, builds the voices of its folder (here `alice.wav`) once and listens. It runs as
# a user starts it (`isolation.serve_without_torch`: its own process on a free port, torch not importable), the key
# in `$QTTS_API_KEY` (`--api-key` would show in `ps`), a small `--max-frames`; `start` returns once it answers:

# %%
import atexit
import os
import shutil
import time

import httpx

from qtts_lib.isolation import serve_without_torch

voices_dir = paths.outputs_dir(ckpt) / "18_voices"
shutil.rmtree(voices_dir, ignore_errors=True)
voices_dir.mkdir(parents=True)
shutil.copy(paths.voice_wav(), voices_dir / "alice.wav")
servers = []


def start(*flags: str) -> str:
    """`qtts serve` of this checkpoint and voices, the key in its environment."""
    log = paths.outputs_dir(ckpt) / f"18_server_{len(servers)}.log"
    args = ["--checkpoint", str(model_dir), "--voices", str(voices_dir), "--threads",
            str(THREADS), "--max-frames", str(MAX_FRAMES), *flags]
    proc, url = serve_without_torch(args, log, env=dict(os.environ, QTTS_API_KEY=KEY))
    servers.append(proc)
    atexit.register(proc.terminate)  # a chapter stopped half-way leaves no server
    print(log.read_text().strip())
    return url


url = start("--admit", "all")  # admission by capacity shapes pieces too: section 10
http = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"},
                    timeout=600)
health = http.get("/health")
check.equal("qtts serve answers /health", "status",
            f"{health.status_code} {health.json()['status']}", "200 ok")

# %% [markdown]
# ## 2. Speak with OpenAI's SDK
# The official `openai` package speaks to it unchanged: only `base_url` points here; fields OpenAI lacks
# (`language`, `seed`, sampling) go in `extra_body`. What the server streams is the library's own path,
# `longform.stream_long` (a long input spoken in segments, chapter 16), with the request's sampling: a take as `pcm`
# (raw 16-bit samples), and one with another `top_k`, must equal the same made here; a bad value is a 400:

# %%
import openai

from qtts_lib.runtime.audio.wav import pcm16
from qtts_lib.runtime.pipeline import longform

client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=600)
same = {"model": "tts-1", "voice": VOICE, "input": TEXT,
        "extra_body": {"language": "english", "seed": 7}}


def library(voice, sampling) -> np.ndarray:
    """What the server streams for TEXT, made here: `stream_long`'s, in 16 bits."""
    pieces = longform.stream_long(synth, TEXT, "english", voice, sampling,
                                  max_frames=MAX_FRAMES)
    return np.frombuffer(pcm16(np.concatenate(list(pieces))), "<i2")


speech = client.audio.speech
pcm = np.frombuffer(speech.create(**same, response_format="pcm").content, "<i2")
top_k = same | {"extra_body": same["extra_body"] | {"top_k": 5}}
served = np.frombuffer(speech.create(**top_k, response_format="pcm").content, "<i2")
for name, changes, got in (("", {}, pcm), (", top_k 5", {"top_k": 5}, served)):
    ours = library(voice, synth.sampling.replace(seed=7, **changes))
    check.equal(f"served pcm = stream_long here, seed 7{name}", "bitwise equal",
                bool(np.array_equal(got, ours)), True)
check.equal("the request's top_k reached the sampler", "same audio",
            bool(np.array_equal(served, pcm)), False)
bad = http.post("/v1/audio/speech", json={"input": TEXT, "voice": VOICE,
                                          "temperature": 0})
check.equal("temperature 0: a 400 naming `temperature`", "status param",
            f"{bad.status_code} {bad.json()['error']['param']}", "400 temperature")

# %% [markdown]
# ## 3. Stream over HTTP
# The answer is sent as it is generated: a chunked body (HTTP's `Transfer-Encoding: chunked`, a body sent in
# pieces of announced length, its total unknown up front), a chunk per piece of `--chunk-frames` frames, read here as
# it arrives. Newer OpenAI clients ask for `stream_format="sse"`, server-sent events: lines `data: {json}` between
# blank lines. `speech.audio.delta` events hold the bytes in base64, a `speech.segment` says where a segment lies,
# one `speech.audio.done` ends with the usage; joined, the deltas are the same take:

# %%
import base64
import json

streaming, t0, arrivals = speech.with_streaming_response, time.time(), []
with streaming.create(**same, response_format="pcm") as r:
    for chunk in r.iter_bytes():
        arrivals.append((time.time() - t0, len(chunk) / 2 / SAMPLE_RATE))
at, seconds = np.array(arrivals).T
print(f"audio received by then (s): {np.cumsum(seconds).round(2)}; first after "
      f"{at[0]:.2f} s of {at[-1]:.2f} s (tiny checkpoints: mostly call overhead)")
check.equal("the answer is chunked: sent while it is generated", "transfer-encoding",
            r.headers.get("transfer-encoding"), "chunked")
check.at_most("first audio early in the answer (streamed, not whole)", "ttfa / total",
              at[0] / at[-1], 0.5)
with streaming.create(**same, response_format="pcm", stream_format="sse") as sse:
    events = [json.loads(line[5:]) for line in sse.iter_lines() if line[:5] == "data:"]
deltas = b"".join(base64.b64decode(e["audio"]) for e in events if "audio" in e)
print(len(events) - 1, "deltas and speech.segment events, then", events[-1])
check.equal("sse: deltas, then one done event with the usage", "last event",
            events[-1]["type"], "speech.audio.done")
check.equal("sse: the deltas joined = the same take as audio", "bitwise equal",
            deltas == pcm.tobytes(), True)

# %% [markdown]
# ## 4. A fresh take, or the same one again
# A request without a seed gets a fresh one, as OpenAI's API and the reference do: ask twice, hear two takes. Every
# answer names its seed in its `X-Seed` header (`with_raw_response` shows it); sending it back replays the take.

# %%
def take(voice: str = VOICE, speed: float = 1.0, **extra) -> tuple[bytes, int]:
    """A pcm take of TEXT and its seed (X-Seed); `extra`: fields OpenAI's API lacks."""
    raw = speech.with_raw_response.create(
        model="tts-1", voice=voice, input=TEXT, speed=speed, response_format="pcm",
        extra_body={"language": "english", **extra})
    return raw.content, int(raw.headers["x-seed"])


(first, seed_a), (second, seed_b) = take(), take()
replayed, seed_c = take(seed=seed_a)
print(f"X-Seed {seed_a} and {seed_b}; replayed with seed {seed_a}: X-Seed {seed_c}")
check.equal("two requests without a seed: two takes", "same audio", first == second,
            False)
check.equal("a take replayed with its X-Seed", "bitwise equal",
            replayed == first and seed_c == seed_a, True)

# %% [markdown]
# ## 5. Voices over HTTP
# On a Base checkpoint voices change while the server runs: `POST /v1/voices` (a form: `name`, the clip `audio`, its
# transcript `text` for ICL, in-context cloning) adds one, `DELETE /v1/voices/{name}` removes it; uploads pass
# `qtts say`'s clip checks (chapter 08). The clip with its transcript must speak what a voice made from them here does:

# %%
from qtts_lib.runtime.audio.wav import wav_header

if synth.kind == "base":
    made = http.post("/v1/voices", data={"name": "bob", "text": clip_text},
                     files={"audio": ("bob.wav", paths.voice_wav().read_bytes())})
    bob = np.frombuffer(take("bob", seed=7)[0], "<i2")
    icl = synth.voice(wav=clip, text=clip_text)
    check.equal("upload a clip with its transcript", "status mode",
                f"{made.status_code} {made.json()['mode']}", "201 icl")
    ours = library(icl, synth.sampling.replace(seed=7))
    check.equal("the uploaded voice = synth.voice(clip, transcript), same seed",
                "bitwise equal", bool(np.array_equal(bob, ours)), True)

# %% [markdown]
# A clip too short and a silent one are refused with a 400 that says why; then bob is deleted; then a voice made
# through OpenAI's SDK, from a sample and a consent recording's id (`{"id": ...}`), must speak alice's take:

# %%
if synth.kind == "base":
    for name, bad in (("short", clip[: SAMPLE_RATE // 2]),
                      ("silent", np.zeros(2 * SAMPLE_RATE, np.float32))):
        wav = wav_header(data_bytes=2 * len(bad)) + pcm16(bad)  # a wav file of them
        refused = http.post("/v1/voices", data={"name": name},
                            files={"audio": (f"{name}.wav", wav)})
        print(refused.status_code, refused.json()["error"]["message"])
        check.equal(f"a {name} clip refused", "status", refused.status_code, 400)
    gone = http.delete("/v1/voices/bob").json()["deleted"]
    after = http.post("/v1/audio/speech", json={"input": TEXT, "voice": "bob"})
    check.equal("delete the voice; a request for it is a 400 naming `voice`",
                "deleted, status param", f"{gone}, {after.status_code} "
                f"{after.json()['error']['param']}", "bob, 400 voice")
    sample = ("voice.wav", paths.voice_wav().read_bytes(), "audio/wav")
    consent = client.audio.voice_consents.create(name="Alice", language="en",
                                                 recording=sample)
    made = client.audio.voices.create(name="carol", audio_sample=sample,
                                      consent=consent.id)
    carol = speech.create(**same | {"voice": {"id": made.id}}, response_format="pcm")
    check.equal(f"a voice made through the SDK ({made.id}) = its clip's, same seed",
                "bitwise equal", carol.content == pcm.tobytes(), True)

# %% [markdown]
# ## 6. Instructions, by checkpoint kind
# OpenAI's `instructions` is a style for a built-in speaker on 1.7B CustomVoice and the voice itself on VoiceDesign
# (voice `design`); 0.6B CustomVoice cannot follow one, and a server cannot show a warning, so it refuses the request
# (400) where `synthesize` drops the field with one. One request per kind, to the app `qtts serve` runs, admitting
# all (its pieces then follow `stream_long`'s schedule, not one sized by a capacity measured now):

# %%
from starlette.testclient import TestClient

from qtts_lib.runtime.app.server.engine import Engine
from qtts_lib.runtime.app.server.http import build_app
from qtts_lib.runtime.app.server.voices import Voices


def ask(name: str, voice: str, instructions: str):
    """A greedy pcm request with `instructions` to an app of checkpoint `name`, here."""
    export.ensure(reference.load(checkpoint.ensure(name), threads=THREADS), name)
    other = Synthesizer(paths.model_dir(name), threads=THREADS)
    engine = Engine(other, max_frames=8, chunk_frames=4, queue_places=2, admit="all")
    body = {"input": TEXT, "language": "english", "greedy": True, "instructions":
            instructions, "voice": voice or other.speakers[0], "response_format": "pcm"}
    app = build_app(engine, Voices(other, None), name)  # no voices folder: its own
    answer = TestClient(app).post("/v1/audio/speech", json=body)
    engine.stop()
    return answer, other


styled, wide = ask("tiny-1.7b-customvoice", "", reference.STYLE)
styles = wide.voice(speaker=wide.speakers[0], instruct=reference.STYLE)
spoken = longform.stream_long(wide, TEXT, "english", styles,
                              wide.sampling.replace(greedy=True), max_frames=8)
check.equal("serve: instructions reach the prompt (pcm = stream_long with the "
            "instruction)", "equal", styled.content == pcm16(np.concatenate([*spoken])),
            True)
designed, _ = ask("tiny-voicedesign", "design", reference.DESIGNED_VOICE)
check.equal("serve, VoiceDesign: voice 'design' with instructions", "status",
            designed.status_code, 200)
refused, _ = ask("tiny-customvoice", "", reference.STYLE)
print(refused.json()["error"])
check.equal("serve, 0.6B CustomVoice: instructions refused", "status param",
            f"{refused.status_code} {refused.json()['error']['param']}",
            "400 instructions")

# %% [markdown]
# ## 7. A key
# With a key set, every `/v1/` path, `/openapi.json` and `/metrics` need `Authorization: Bearer KEY` (the scheme's
# name in any case, RFC 7235); `/` and `/health` stay open. The key is not on the command line, which anyone reads:

# %%
keys = {"none": None, "a wrong one": "Bearer sk-wrong", "lower case": f"bearer {KEY}"}
status = [httpx.get(f"{url}/v1/models", headers={"Authorization": k} if k else {})
          .status_code for k in keys.values()]
print(dict(zip(keys, status)))
check.equal("no key, a wrong key, lower-case bearer", "status", status, [401, 401, 200])
check.equal("/openapi.json without the key", "status",
            httpx.get(f"{url}/openapi.json").status_code, 401)
check.equal("the key is not on the server's command line", "found",
            KEY.encode() in open(f"/proc/{servers[0].pid}/cmdline", "rb").read(), False)

# %% [markdown]
# ## 8. Hold the options to the how-to page
# The [how-to page](../howto.md) lists every field and flag; two promises are held here. `wav` and `flac` carry
# pcm's samples; mp3, Opus and AAC are lossy (a decoder, FFmpeg's through PyAV here, adds priming and padding).
# `speed` changes the tempo, not the pitch: the duration scales, the spectral centroid (mean frequency) stays:

# %%
import io

import av


def decoded(body: bytes) -> np.ndarray:  # a body's samples as a player hears them
    with av.open(io.BytesIO(body)) as f:
        a = f.streams.audio[0]
        got = np.concatenate([fr.to_ndarray().reshape(-1) for fr in f.decode(a)])
        return got[::a.codec_context.sample_rate // SAMPLE_RATE]


def centroid(x: np.ndarray, n: int = 1024) -> float:  # Hz, over windows of n samples
    windows = x[: len(x) // n * n].reshape(-1, n) * np.hanning(n)
    spec = np.abs(np.fft.rfft(windows)).mean(0)
    return float(np.fft.rfftfreq(n, 1 / SAMPLE_RATE) @ spec / spec.sum())


bodies = {fmt: speech.create(**same, response_format=fmt).content
          for fmt in ("wav", "flac", "mp3", "opus", "aac")}
past = {fmt: len(decoded(b)) - len(pcm) for fmt, b in bodies.items()}
exact = (np.array_equal(np.frombuffer(bodies["wav"][44:], "<i2"), pcm)
         and np.array_equal(decoded(bodies["flac"]), pcm))
check.equal("wav and flac carry pcm's samples exactly", "equal", bool(exact), True)
check.at_least("every format: at least pcm's samples", "samples", min(past.values()), 0)
check.at_most("mp3, opus, aac: a decoder's extra samples (priming + padding)",
              "samples", max(past.values()), 2 * 1152)
takes = {s: np.frombuffer(take(seed=seed_a, speed=s)[0], "<i2") / 32768
         for s in (0.5, 1.0, 2.0)}
for s in (0.5, 2.0):
    check.close(f"speed {s}: duration = speed 1.0's / {s}", len(takes[s]) / SAMPLE_RATE,
                len(takes[1.0]) / SAMPLE_RATE / s, rel=0.05)
    check.close(f"speed {s}: spectral centroid kept", centroid(takes[s]),
                centroid(takes[1.0]), rel=0.05)

# %% [markdown]
# ## 9. Bound the work
# A server shares one engine among strangers, so work is bounded and refused at once past a bound (the how-to page
# lists them). A second server with one place and a small frame budget gets a text over the budget, then a request
# while its place is held. Last, failures: a real engine rarely fails or hangs on demand, so the app is served in
# this process (starlette's `TestClient`) over the server's three parts, `Engine` (the thread that runs ncnn; its
# surface is `speak` and `status`), `Voices` (the store of every file under `--voices`) and `build_app` (the HTTP
# layer over those two), with the engine's step replaced by a `Mock` that raises, then by one that hangs for longer
# than the watchdog allows (`stall_seconds`). Either way the request must get a 5xx and `/health` a 503 that says
# why, which is what a supervisor restarts on:

# %%
from unittest.mock import Mock

from qtts_lib.bench import serve as bench_serve

small = start("--frame-budget", str(MAX_FRAMES + 8), "--max-batch", "1", "--queue", "0")
over = httpx.post(f"{small}/v1/audio/speech", headers=http.headers,
                  json={"input": " ".join(bench_serve.texts(1)), "voice": VOICE})
request = {"headers": http.headers, "json": {"input": TEXT, "voice": VOICE}}
with httpx.stream("POST", f"{small}/v1/audio/speech", timeout=600, **request):
    full = httpx.post(f"{small}/v1/audio/speech", **request)  # while that one speaks
check.equal("a text over --frame-budget: 400 before any work", "status code",
            f"{over.status_code} {over.json()['error']['code']}", "400 over_budget")
check.equal("every place taken: 503 at once, with Retry-After", "status retry",
            f"{full.status_code} {'retry-after' in full.headers}", "503 True")
store = Voices(synth, voices_dir)
failures = {"raises": RuntimeError("an engine failure, simulated"),
            "hangs": lambda step: time.sleep(5)}  # the watchdog allows 1 s here
for what, effect in failures.items():  # in place of the engine's steps (`around_step`)
    engine = Engine(synth, max_frames=MAX_FRAMES, stall_seconds=1.0,
                    around_step=Mock(side_effect=effect))
    app = TestClient(build_app(engine, store, ckpt))
    failed = app.post("/v1/audio/speech", json={"input": TEXT, "voice": VOICE})
    health = app.get("/health")
    print(f"{what}: {failed.status_code}", failed.json()["error"]["message"],
          health.json()["error"])
    check.equal(f"an engine that {what}: the request a 5xx, /health 503", "statuses",
                (failed.status_code // 100, health.status_code), (5, 503))
    engine.stop()
print(over.json()["error"], full.json()["error"], sep="\n")

# %% [markdown]
# ## 10. The server under load, at full size
# `python -m qtts_lib.bench serve` times every chunk of streaming clients (1 to 8 at once, 8 arriving 2 s apart) on
# `full-base` int8, here on a 2-core Intel Xeon VM with AMX, under two scheduling rules: in *before*, a long text's next
# segment queues behind new requests; in *after* (the server's), it keeps its place. `gap_p99_over_p50`: a stream's
# 99th-percentile wait between two pieces over its median (1 is an even pace); `longest_gap_p99_ms`, the longest such
# wait; `ttfa_p99_ms`, first audio of the slowest clients; `rtf`, the audio's real-time factor:

# %%
import matplotlib.pyplot as plt
import pandas as pd

files = [paths.DATA / "bench" / "serve" / f"dev-2core-xeon-amx-full-base-int8-{r}.json"
         for r in ("before", "after")]
load = pd.DataFrame(bench_serve.load_table(files)).set_index(["scenario", "run"])
bench_serve.plot(files)
plt.show()
load[["gap_p99_over_p50", "longest_gap_p99_ms", "ttfa_p99_ms", "rtf"]].unstack()

# %% [markdown]
# Past the batch's room (8 clients, 4 places), under *before* newcomers take a running stream's place between segments
# (its longest gap grows); under *after* every stream that started keeps its pace, and the wait moves to where a server
# can bound it: a waiting request's first audio. Other machines: the [results](results.ipynb) page.
#
# A stream that keeps its pace can still be slower than its listener: four streams in one batch each get a frame a step,
# but that step takes longer than a frame's 80 ms. So `qtts serve` admits by capacity: at start it times a step at each
# batch size and speaks as many requests at once as a step under 70% of a frame allows, one at least (the rest pays for
# prefills, encoding, the first piece's early parts); the others wait their turn up to `--max-wait` (30 s), then get a
# 503 with Retry-After. The same bench on the Xeon and an AMD EPYC Zen 5 VM plays each stream from its first byte:
# `admitted`, requests answered with audio (some after their turn came); `refused`, the 503s; `ran_dry`, streams whose
# next piece came after the audio before it had played out; `delivered_ratio`, audio a second over one client's alone.
# The bars: first audio within 30 ms of the library's, at least 0.9 of one client's audio a second at any load:

# %%
folder, vms = paths.DATA / "bench" / "serve", ("xeon-amx", "zen5")
runs = {vm: folder / f"dev-2core-{vm}-full-base-int8-realtime.json" for vm in vms}
for vm, doc in ((vm, json.loads(f.read_text())) for vm, f in runs.items()):
    print(f"{vm}: {doc['server_capacity']}")
    check.at_most(f"admission, {vm}: first audio over the library's, one client", "ms",
                  doc["first_audio_over_library_ms"], 30)
tables = {vm: pd.DataFrame(bench_serve.load_table([f])) for vm, f in runs.items()}
admission = pd.concat(tables).droplevel(1).set_index("scenario", append=True)
check.at_least("admission: audio a second, any load, over one client's", "ratio",
               admission["delivered_ratio"].min(), 0.9)
check.equal("admission, zen5 (a step under a frame): streams that ran dry", "streams",
            int(admission.loc["zen5", "ran_dry"].sum()), 0)
admission[["admitted", "refused", "ttfa_p50_ms", "library_first_audio_ms", "ran_dry",
           "underrun_max_ms", "delivered_ratio"]]

# %% [markdown]
# Both speak one stream at a time. On the Zen 5 (49 ms a frame) the pieces grow as fast as a listener from the first
# byte allows (chapter 16), and no stream runs dry. On the Xeon (96 ms, over a frame's 80 ms of audio) the pieces stay
# one frame; a listener waits, in total, about the difference (`underrun_max_ms`): a player should buffer that much.
#
# ## Summary
# - `qtts serve` speaks OpenAI's speech API: the official SDK works with only `base_url` changed, whole or streamed;
#   admitting all, its samples are `stream_long`'s, bit for bit. A fresh take per request, replayed by `X-Seed`.
# - Voices are uploaded and deleted while it runs; `instructions` are followed or refused, never dropped.
# - A key guards the API; work past a bound is refused; a hung engine shows in `/health`; admission keeps real time.
#
# **Artifacts left:** `data/outputs/<ckpt>/18_voices/`, `18_server_*.log`, the chapter report.
#
# **If your numbers differ**
# - *The server does not come up* → read `18_server_*.log`: `pip install 'qtts[serve]'`, or export (chapters 04–05).
# - *Served pcm ≠ `stream_long`* → another `--threads`, seed or language (the server's default is `auto`).
# - *No 503 when the places are full* → the first request ended before the second came: give it a longer text.

# %%
for proc in servers:
    proc.terminate()
    proc.wait(30)
store.close()
check.equal("every server started here has stopped", "running",
            [p.poll() is None for p in servers], [False] * len(servers))
check.table()

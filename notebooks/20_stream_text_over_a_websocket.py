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
# # 20 · Stream text over a WebSocket
# > A voice agent's text comes a few words at a time over one open connection; its audio goes back the same way,
# > before the text is finished, and it is the HTTP response's, byte for byte.
#
# **You will:** open `qtts serve`'s WebSocket, send it a text as a language model writes it, hear audio back before
# the rest is sent, read where each segment lies; get an error for a wrong message.
#
# **You will learn:** what a WebSocket is and why streamed text needs one; the messages each way and their fields;
# why the server runs with `--admit all` here; why the audio equals the library's and the HTTP response's.
#
# **You need:** a Base checkpoint (an x-vector voice, chapter 08), the exported graphs (chapters 04–05; made here if
# missing), chapter 19's library (`pipeline.textstream`), the server's packages and `websocket-client`
# (`make setup`). **Leaves behind:** `data/outputs/<ckpt>/20_voices/`, `20_streamed.wav`, `20_server.log`, the
# chapter report. The set-up loads the checkpoint here too, to make what the server's audio must equal:

# %%
import argparse
import atexit
import base64
import json
import os
import shutil
import time

import httpx
import numpy as np
import pandas as pd
import websocket  # the websocket-client package
from IPython.display import Audio, display

from qtts_lib import check, checkpoint, export, inputs, paths, reference, settings
from qtts_lib.inputs import words  # `text` in deltas of n words, as a model writes
from qtts_lib.isolation import serve_without_torch
from qtts_lib.runtime import Sampling, Synthesizer, load_wav
from qtts_lib.runtime.app.server import add_arguments  # qtts serve's options
from qtts_lib.runtime.app.server.live import IDLE_SECONDS
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, pcm16, save_wav
from qtts_lib.runtime.pipeline.textstream import TextStream

ckpt, THREADS = settings.checkpoint(), settings.threads()
report = check.begin("20_stream_text_over_a_websocket", ckpt)
model_dir = checkpoint.ensure(ckpt)
export.ensure(reference.load(model_dir, threads=THREADS), ckpt)  # 04-05's graphs
synth = Synthesizer(model_dir, threads=THREADS)
check.equal("a Base checkpoint: voices cloned from a clip (x-vector)", "kind",
            synth.kind, "base")
voice = synth.voice(wav=load_wav(paths.voice_wav()))  # the committed clip's x-vector
MAX_FRAMES, SEED, KEY = 24, 7, "sk-chapter-20"  # chapter 19's frame cap and seed

# %% [markdown]
# ## 1. Speak the text with the library first
# Chapter 19's answer (a language model's text), the same seed and frame cap. `TextStream` speaks it four words a
# **delta** (a stretch of the text, as it arrives) and keeps a **span** per segment (its text, where its audio starts
# and ends in seconds): the server must send this audio, and these spans, whichever way its text comes.

# %%
TEXT = inputs.ANSWER_TEXT  # a language model's answer (`qtts_lib.inputs`)

stream = TextStream(synth, "english", voice, Sampling(seed=SEED), max_frames=MAX_FRAMES)
chunks = []  # the audio, as the stream makes it
for delta in words(TEXT, 4):
    stream.feed(delta)
    while not stream.idle:  # what the text so far allows
        chunks += stream.step()
stream.finish()
while not stream.done:
    chunks += stream.step()
wav, spans = np.concatenate(chunks), stream.spans
print(f"{len(wav) / SAMPLE_RATE:.2f} s of audio, {len(spans)} segments")
check.at_most("the library's last span ends its audio", "|end - audio's length| (s)",
              abs(spans[-1].end - len(wav) / SAMPLE_RATE), 1e-6)

# %% [markdown]
# ## 2. Read the protocol
# An HTTP request (chapter 18) sends its whole body, then reads the response: the text must be complete before it is
# sent. A **WebSocket** is a connection opened by an HTTP request that asks to *upgrade* (the handshake, where the
# key is checked) and then kept open, carrying **messages** both ways at any time. `qtts serve` takes one at
# `/v1/audio/speech/stream`, one request per connection; every message is a JSON object whose `type` names it.
# JSON carries text, not bytes, so audio comes in **base64** (bytes written as letters, 4 for every 3 bytes). The
# messages each way, and what each carries:

# %%
PROTOCOL = pd.DataFrame([
    ("speech.start", "in", "a speech request's fields but input: voice, "
     "language, response_format, seed, ...", "first, once"),
    ("text.delta", "in", "text: the next delta of the text", "as the text is written"),
    ("text.done", "in", "(none)", "once, at the text's end"),
    ("speech.audio.delta", "out", "audio: the next bytes of response_format, base64",
     "as audio is made"),
    ("speech.segment", "out", "text, start, end: a span, in seconds of this audio",
     "once a segment's audio is all sent"),
    ("speech.audio.done", "out", "seed, usage (text tokens in, frames out)",
     "last; then the server closes"),
    ("error", "out", "error: message, type, param, code (HTTP's error body)",
     "instead, on anything wrong; then the close"),
], columns=["message", "direction", "fields", "when"]).set_index("message")
with pd.option_context("display.max_colwidth", 90):
    display(PROTOCOL.replace({"direction": {"in": "client → server",
                                            "out": "server → client"}}))

# %% [markdown]
# Text sent after `text.done` gets one `error` (on `type`) and the close, like any wrong message (section 4). A client
# that never sends `text.done` leaves its last segment open: the server waits for more text, and after `IDLE_SECONDS`
# (30 s) with no message it sends an `error` (code `idle_timeout`) and closes. Here `response_format` is `pcm`: raw
# 16-bit samples, 24 kHz mono, no header, so the bytes can be compared.
#
# ## 3. Start the server with every request admitted
# By default `qtts serve` admits by capacity (chapter 18, section 10): at start it times a step, speaks at once only
# as many requests as keep real time, and grows each stream's **pieces** (the frames the codec decodes at once,
# chapter 15) as fast as that measured step lets a listener keep up. Other piece sizes change the codec's audio, if
# only by float rounding, so that schedule, which differs from machine to machine, would change the last bits.
# `--admit all` starts every request that has a place and keeps the library's pieces: 1, 2, 4, 4, … frames, growing
# to `--chunk-frames`, 4 by default as in the library (checked). The audio can be checked bit for bit. One request
# runs at a time here, so there is nothing to refuse. The key goes in `$QTTS_API_KEY`, as in chapter 18;
# `serve_without_torch` returns once the server responds:

# %%
options = argparse.ArgumentParser()
add_arguments(options)
check.equal("the server's --chunk-frames default = the library's", "frames",
            (options.get_default("chunk_frames"), stream.long.chunk_frames), (4, 4))
voices_dir = paths.outputs_dir(ckpt) / "20_voices"  # the server's voices: alice alone
shutil.rmtree(voices_dir, ignore_errors=True)
voices_dir.mkdir(parents=True)
shutil.copy(paths.voice_wav(), voices_dir / "alice.wav")
log = paths.outputs_dir(ckpt) / "20_server.log"
args = ["--checkpoint", str(model_dir), "--voices", str(voices_dir), "--threads",
        str(THREADS), "--max-frames", str(MAX_FRAMES), "--admit", "all"]
server, url = serve_without_torch(args, log, env=dict(os.environ, QTTS_API_KEY=KEY))
atexit.register(server.terminate)  # a chapter stopped half-way leaves no server
print(log.read_text().strip())
STREAM = url.replace("http", "ws", 1) + "/v1/audio/speech/stream"  # ws://: a WebSocket
AUTH = [f"Authorization: Bearer {KEY}"]  # the key, on the handshake

# %% [markdown]
# ## 4. Get one error for a wrong message
# The first message must be a `speech.start`. Anything wrong (here, text before the start) gets one `error` message,
# shaped as an HTTP error's body, and the server closes the connection; nothing is spoken. Then text after
# `text.done`, the same way:

# %%
ws = websocket.create_connection(STREAM, header=AUTH, timeout=120)
ws.send(json.dumps({"type": "text.delta", "text": "Hello."}))
error = json.loads(ws.recv())
print(error)
try:  # websocket-client's recv gives "" for the server's close
    closed = ws.recv() == "" and not ws.connected
except websocket.WebSocketConnectionClosedException:
    closed = True
check.equal("text before speech.start: one error, on the field `type`", "type / param",
            (error["type"], error["error"]["param"]), ("error", "type"))
check.equal("after the error the server closes", "closed", closed, True)
ws = websocket.create_connection(STREAM, header=AUTH, timeout=120)
for message in ({"type": "speech.start", "voice": "alice", "language": "english",
                 "response_format": "pcm"}, {"type": "text.delta", "text": "Hello."},
                {"type": "text.done"}, {"type": "text.delta", "text": " More."}):
    ws.send(json.dumps(message))
late = [json.loads(ws.recv())]
while late[-1]["type"] not in ("speech.audio.done", "error"):
    late.append(json.loads(ws.recv()))
ws.close()
print(late[-1])
check.equal("text after text.done: one error, on the field `type`", "type / param",
            (late[-1]["type"], late[-1].get("error", {}).get("param")),
            ("error", "type"))
check.equal("a client silent while its text is open is closed after", "IDLE_SECONDS",
            IDLE_SECONDS, 30.0)

# %% [markdown]
# ## 5. Send text as it is written
# `websocket-client` (`import websocket`) speaks it from Python. The start, then four words a delta, 40 ms apart, as a
# model writes, up to the delta that holds the word after the first sentence: that word decides the sentence ends, so
# the first segment's start (`open_text`) is decided and its audio can begin (chapter 19 section 3). Then a wait for
# the server's first message, at most `FIRST_WAIT` seconds (a socket timeout, so a server that waits for more text
# fails the check instead of hanging): audio, before the rest is sent. Then the rest, `text.done`, and every reply
# until `speech.audio.done`:

# %%
ws = websocket.create_connection(STREAM, header=AUTH, timeout=120)
ws.send(json.dumps({"type": "speech.start", "voice": "alice", "language": "english",
                    "response_format": "pcm", "seed": SEED}))
FIRST, FIRST_WAIT = "Sure, here is the plan for tomorrow.", 30  # sentence 1; seconds
parts = words(TEXT, 4)
sent_first = next(i for i in range(1, len(parts) + 1)  # through the word after FIRST
                  if "".join(parts[:i]).startswith(FIRST + " Dr. "))
for delta in parts[:sent_first]:
    ws.send(json.dumps({"type": "text.delta", "text": delta}))
    time.sleep(0.04)
ws.settimeout(FIRST_WAIT)
try:  # the first message, before the rest of the text is sent
    messages = [json.loads(ws.recv())]
    first_type = messages[0]["type"]
except websocket.WebSocketTimeoutException:
    messages, first_type = [], f"nothing within {FIRST_WAIT} s"
ws.settimeout(120)
for delta in parts[sent_first:]:
    ws.send(json.dumps({"type": "text.delta", "text": delta}))
ws.send(json.dumps({"type": "text.done"}))
while not messages or messages[-1]["type"] not in ("speech.audio.done", "error"):
    messages.append(json.loads(ws.recv()))
ws.close()
check.equal(f"audio back after {sent_first} of {len(parts)} deltas, before the rest",
            "first message", first_type, "speech.audio.delta")
kinds = pd.Series([m["type"] for m in messages]).value_counts()
display(kinds.to_frame("messages"))
print(messages[-1])

# %% [markdown]
# The replies are the table's server messages, in order: audio first, each `speech.segment` once the audio up to its
# end has been sent, `speech.audio.done` last with the request's seed; each `speech.segment` carries exactly a span's
# fields:

# %%
replies = sorted(PROTOCOL.index[PROTOCOL.direction == "out"].drop("error"))
check.equal("the replies: the table's server messages, no error", "types",
            sorted(kinds.index), replies)
check.equal("speech.audio.done comes last, once", "count, last",
            (int(kinds["speech.audio.done"]), messages[-1]["type"]),
            (1, "speech.audio.done"))
check.equal("speech.audio.done carries the request's seed", "seed",
            messages[-1]["seed"], SEED)
sent, premature = 0, 0  # seconds of audio sent so far; segments sent before it ends
for m in messages:
    if m["type"] == "speech.audio.delta":
        sent += len(base64.b64decode(m["audio"])) / 2 / SAMPLE_RATE
    elif m["type"] == "speech.segment":
        premature += sent < m["end"] - 1e-6
check.equal("each speech.segment after the audio up to its end", "segments early",
            premature, 0)
fields = {k for m in messages if m["type"] == "speech.segment" for k in m}
check.equal("a speech.segment's fields", "keys", sorted(fields),
            ["end", "start", "text", "type"])

# %% [markdown]
# ## 6. Check the audio and the segments
# The `speech.audio.delta` messages' audio, decoded from base64 and joined, must be the HTTP response for the whole
# text with the same seed,
# byte for byte, and the library's audio of section 1 in 16 bits (`pcm16`); the `speech.segment` messages must be
# section 1's spans, one per segment, inside the audio:

# %%
pcm = b"".join(base64.b64decode(m["audio"]) for m in messages
               if m["type"] == "speech.audio.delta")
response = httpx.post(f"{url}/v1/audio/speech", timeout=600,
                    headers={"Authorization": f"Bearer {KEY}"},
                    json={"input": TEXT, "voice": "alice", "language": "english",
                          "response_format": "pcm", "seed": SEED})
check.equal("WebSocket pcm = the HTTP response for the whole text, same seed",
            "bitwise equal", pcm == response.content, True)
check.equal("WebSocket pcm = the library's streamed audio (section 1)", "bitwise equal",
            pcm == pcm16(wav), True)
events = pd.DataFrame([m for m in messages if m["type"] == "speech.segment"])
display(events[["start", "end", "text"]].assign(text=events.text.str[:50]))
same = events.drop(columns="type").to_dict("records") == [s.as_dict() for s in spans]
check.equal("one speech.segment per segment: section 1's spans", "equal", same, True)
check.at_most("segments inside the audio", "last end (s)", events.end.max(),
              len(pcm) / 2 / SAMPLE_RATE + 1e-6)
received = np.frombuffer(pcm, "<i2") / 32768  # the socket's pcm, as floats
save_wav(paths.outputs_dir(ckpt) / "20_streamed.wav", received)
display(Audio(received, rate=SAMPLE_RATE))

# %% [markdown]
# ## Summary
# - A WebSocket keeps one connection open with messages both ways, so the text can go in while the audio comes out:
#   `speech.start`, `text.delta`s and `text.done` in; `speech.audio.delta`, `speech.segment`, `speech.audio.done` out.
# - Audio comes back before the rest of the text is sent: once the word after the first sentence decides it, the
#   first segment's start (`open_text`, chapter 19 section 3) is spoken, long before that segment closes.
# - With `--admit all` its pcm is the HTTP response's and the library's, byte for byte; its segments are the spans.
# - A wrong message, text after `text.done` included, is one `error`, shaped as HTTP's, then the close.
#
# **Artifacts left:** `data/outputs/<ckpt>/20_voices/`, `20_streamed.wav`, `20_server.log`, the chapter report.
#
# **If your numbers differ**
# - *The first check fails* → not a Base checkpoint: run on `tiny-base` (only a cloned voice has an x-vector prompt).
# - *The server does not come up* → read `20_server.log`: `pip install 'qtts[serve]'`, or export (chapters 04–05).
# - *The handshake is refused (403)* → no key or the wrong one in `Authorization: Bearer`.
# - *Nothing within `FIRST_WAIT` s* → a slow machine (raise it), or the server waits for more text than chapter 19
#   says.
# - *First message an error* → read it: its `param` names the field (a voice the server lacks, `input` in the start).
# - *WebSocket pcm ≠ section 1 but = HTTP* → the server grew its pieces for its measured step: `--admit all`.
# - *WebSocket pcm ≠ HTTP* → another seed, language or `--threads` in one of the two requests.

# %%
server.terminate()
server.wait(30)
check.equal("the server started here has stopped", "running", server.poll() is None,
            False)
check.table()

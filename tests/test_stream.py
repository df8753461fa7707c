"""Streaming: the pieces of `Synthesizer.stream` concatenate to `synthesize`'s wav; the decoder's context."""
import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import soundfile as sf

from qtts_lib import paths
from qtts_lib.bench.stream import context_snr
from qtts_lib.check import snr_db
from qtts_lib.runtime.audio.wav import SAMPLES_PER_FRAME, WavFile, load_wav, wav_header
from qtts_lib.runtime.codec.stream import StreamDecoder, receptive_field

CKPT = "tiny-base"
TEXT = "Streaming speech, one piece at a time."


@pytest.fixture(scope="module")
def voices(synth):
    clip = load_wav(paths.voice_wav())
    text = (paths.INPUTS / "voice.txt").read_text(encoding="utf-8").strip()
    return {"xvector": synth.voice(wav=clip), "icl": synth.voice(wav=clip, text=text)}


def test_receptive_field_from_the_configs():
    tiny = json.loads((paths.model_dir(CKPT) / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    full = json.loads((paths.ROOT / "qtts_lib" / "configs" / "base" / "speech_tokenizer" / "config.json")
                      .read_text())["decoder_config"]
    assert receptive_field(tiny) == 2 + 2 * 71 + 10   # 2 layers
    assert receptive_field(full) == 2 + 8 * 71 + 10   # 8 layers: longer than the reference's 300-frame chunk


def test_context_covering_the_receptive_field_is_exact_and_none_is_not(synth):
    codes = np.random.default_rng(0).integers(0, 2048, size=(200, 16))
    R = receptive_field(synth.codec.config)
    exact, none = context_snr(synth.codec, codes, 190, 196, [R, 0])
    assert exact > 100 and none < 30


@pytest.mark.parametrize("context", [None, "R", 40])
def test_stream_decoder_equals_codec_decode_across_the_300_frame_chunk(synth, context):
    """Past 300 frames Codec.decode is the reference's chunked decode, not one-shot; the stream follows it:
    incrementally (None, the default), re-decoding with the receptive field (exact) or with less (close)."""
    codes = np.random.default_rng(1).integers(0, 2048, size=(316, 16))
    ref = synth.codec.decode(codes)
    context = receptive_field(synth.codec.config) if context == "R" else context
    dec = StreamDecoder(synth.codec, chunk_frames=102, context_frames=context)  # a piece straddles frame 300
    assert dec.incremental == (context is None)
    pieces = [p for frame in codes for p in dec.push(frame)] + [dec.finish()]
    ours = np.concatenate(pieces)
    assert len(ours) == len(ref) == 316 * SAMPLES_PER_FRAME
    assert snr_db(ours[300 * SAMPLES_PER_FRAME:], ref[300 * SAMPLES_PER_FRAME:]) > 100  # reference chunk 2: exact
    assert snr_db(ours, ref) >= (100 if context != 40 else 60)


def test_incremental_decode_equals_decode_once_and_needs_the_cpu_form(synth):
    """Codec.incremental fed 1, 3 or 8 frames at a time gives decode_once's samples; the exported graph (the GPU's
    form) has no parts, so the stream re-decodes there."""
    from qtts_lib.runtime.codec.decoder import Codec

    codes = np.random.default_rng(2).integers(0, 2048, size=(37, 16))
    once = synth.codec.decode_once(codes)
    for n in (1, 3, 8):
        inc = synth.codec.incremental()
        ours = np.concatenate([inc.push(codes[a:a + n]) for a in range(0, len(codes), n)])
        assert len(ours) == len(once) and snr_db(ours, once) > 100, n
    exported = Codec(synth.config.ncnn_dir, synth.codec.config, 2, form="exported")
    with pytest.raises(ValueError, match="CPU form"):
        exported.incremental()
    assert not StreamDecoder(exported).incremental


def first_piece_sizes(chunk: int) -> list[int]:
    """A stream's first piece in pieces (`StreamDecoder.drain`): an eighth of a frame, an eighth again, then each
    piece as long as all before it, up to the piece's `chunk` frames."""
    total, sizes = chunk * SAMPLES_PER_FRAME, []
    while sum(sizes) < total:
        sizes.append(min(max(SAMPLES_PER_FRAME // 8, sum(sizes)), total - sum(sizes)))
    return sizes


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_the_first_piece_in_pieces_is_the_same_audio(synth, chunk):
    """A stream hands out its first piece in pieces (held ones one per `drain`, or all at the next push): the samples
    are bit for bit those of the same incremental decode fed a piece at a time."""
    codes = np.random.default_rng(4).integers(0, 2048, size=(3 * chunk + 2, 16))
    inc = synth.codec.incremental()
    ref = np.concatenate([inc.push(codes[a:a + chunk]) for a in range(0, len(codes), chunk)])
    for drain in (True, False):
        dec, got = StreamDecoder(synth.codec, chunk_frames=chunk), []
        for frame in codes:
            got.append(dec.push(frame))
            while drain and dec.held:
                got.append(dec.drain())
        assert not dec.held
        first = first_piece_sizes(chunk)
        assert [len(p) for p in got[chunk - 1]] == first[:1]  # the push that completes the first piece: its head
        assert [len(p) for step in got for p in step][:len(first)] == first
        ours = np.concatenate([p for step in got for p in step] + [dec.finish()])
        assert np.array_equal(ours, ref), drain


def test_the_first_pieces_come_before_the_next_frame(synth, voices):
    """The stream's first piece is an eighth of a frame; the rest of it comes before the loop makes another frame."""
    generated, seen = [], []
    with synth.stream(TEXT, "english", voices["xvector"], max_frames=20, chunk_frames=1,
                      on_frame=generated.append) as pieces:
        for piece in pieces:
            seen.append((len(piece), len(generated)))
            if len(seen) == 5:
                break
    e = SAMPLES_PER_FRAME // 8
    assert seen == [(e, 1), (e, 1), (2 * e, 1), (4 * e, 1), (SAMPLES_PER_FRAME, 2)]


@pytest.mark.parametrize("mode", ["xvector", "icl"])
@pytest.mark.parametrize("chunk", [4, 7])
def test_stream_equals_synthesize(synth, voices, mode, chunk):
    voice = voices[mode]
    whole = synth.synthesize(TEXT, "english", voice, max_frames=30)  # a fresh take: the stream replays its seed
    frames = []
    pieces = synth.stream(TEXT, "english", voice, synth.sampling.replace(seed=whole.seed), max_frames=30,
                          chunk_frames=chunk, on_frame=frames.append)
    got = list(pieces)
    sizes, first = [len(p) for p in got], first_piece_sizes(chunk)
    if len(whole.codes) > chunk:  # else its one piece is the end's
        assert sizes[:len(first)] == first and set(sizes[len(first):-1]) <= {chunk * SAMPLES_PER_FRAME}
    ours = np.concatenate(got)
    # ICL: synthesize cuts the clip's share by a float ratio (as the reference does), which sometimes keeps one
    # sample of the clip's decode in front; the stream starts exactly at the first generated frame.
    extra = len(whole.wav) - len(ours)
    assert extra in ((0, 1) if mode == "icl" else (0,))
    assert len(ours) == len(whole.codes) * SAMPLES_PER_FRAME and frames[-1] == len(whole.codes)
    assert snr_db(ours, whole.wav[extra:]) >= 60


def test_closing_the_stream_stops_the_loop_and_starts_no_thread(synth, voices):
    before = threading.active_count()
    frames = []
    pieces = synth.stream(TEXT, "english", voices["xvector"], max_frames=399, chunk_frames=2, on_frame=frames.append)
    next(pieces)
    assert threading.active_count() == before  # the loop runs in the caller's thread, a frame per next()
    pieces.close()
    assert frames == [1, 2] and pieces.result is None
    with pytest.raises(StopIteration):
        next(pieces)


def test_a_stream_result_comes_at_its_end(synth, voices):
    with synth.stream(TEXT, "english", voices["xvector"], max_frames=5, chunk_frames=2) as pieces:
        got = list(pieces)
    assert sum(len(p) for p in got) == 5 * SAMPLES_PER_FRAME
    assert pieces.result.codes.shape == (5, 16) and pieces.result.stopped == "cap" and pieces.result.wav is None


@pytest.mark.parametrize("bad, match", [({"chunk_frames": 0}, "chunk_frames"), ({"max_frames": 0}, "max_frames"),
                                        ({"language": "klingon"}, "unknown language"), ({"text": " "}, "empty"),
                                        ({"sampling": {"temperature": 0.5}}, "Sampling")])
def test_bad_input_is_refused_before_any_piece(synth, voices, bad, match):
    from qtts_lib.runtime.errors import InputError

    args = {"text": TEXT, "language": "english"} | bad
    with pytest.raises(InputError, match=match):
        synth.stream(args.pop("text"), args.pop("language"), voices["xvector"], **args)


def test_wav_writers(tmp_path):
    wav = np.linspace(-1, 1, 3000, dtype=np.float32)
    f = WavFile(tmp_path / "a.wav")
    f.write(wav[:1000])
    assert len(sf.read(tmp_path / "a.wav")[0]) == 1000   # complete after every piece
    f.write(wav[1000:])
    f.close()
    back, sr = sf.read(tmp_path / "a.wav", dtype="float32")
    assert sr == 24000 and np.array_equal(back, wav)
    assert wav_header()[4:8] == b"\xff\xff\xff\xff" and len(wav_header()) == 44


def test_cli_stream_and_stdout(synth, tmp_path):
    """`say --stream` writes the same wav as `say`; `-o -` writes 16-bit PCM to stdout (torch blocked), and nothing
    else, even when the voice clip is resampled (its note goes to stderr)."""
    from qtts_lib.isolation import qtts_without_torch

    args = ["say", "--checkpoint", str(paths.model_dir(CKPT)), "--voice", str(paths.voice_wav()), "--text", TEXT,
            "--language", "english", "--greedy", "--max-frames", "10", "--threads", "2"]
    assert qtts_without_torch(*args, "-o", str(tmp_path / "n.wav")).returncode == 0
    assert qtts_without_torch(*args, "--stream", "-o", str(tmp_path / "s.wav")).returncode == 0
    whole, streamed = sf.read(tmp_path / "n.wav")[0], sf.read(tmp_path / "s.wav")[0]
    assert len(whole) == len(streamed) == 10 * SAMPLES_PER_FRAME and snr_db(streamed, whole) >= 60
    piped = subprocess.run([sys.executable, "-m", "qtts_lib.runtime.app.cli", *args, "-o", "-"], capture_output=True)
    assert piped.returncode == 0 and piped.stdout[:4] == b"RIFF"
    pcm = np.frombuffer(piped.stdout[44:], "<i2") / 32767.0
    assert len(pcm) == len(whole) and np.abs(pcm - whole).max() < 2 / 32767
    clip, sr = sf.read(paths.voice_wav(), dtype="float32")
    sf.write(tmp_path / "clip12k.wav", np.stack([clip, clip], 1)[::2], sr // 2)  # 12 kHz stereo: two notes
    args[args.index("--voice") + 1] = str(tmp_path / "clip12k.wav")
    resampled = subprocess.run([sys.executable, "-m", "qtts_lib.runtime.app.cli", *args, "--resample", "-o", "-"],
                               capture_output=True)
    assert resampled.returncode == 0 and resampled.stdout[:4] == b"RIFF", resampled.stdout[:80]
    assert b"resampling" in resampled.stderr and b"mono" in resampled.stderr


def test_every_incremental_decode_shares_the_codecs_transformer_net(synth):
    """The codec transformer's cached form is loaded once per `Codec`; each decode holds only its own cache."""
    a, b = synth.codec.incremental(), synth.codec.incremental()
    assert a.net is b.net is synth.codec.transformer_net and a.cache is not b.cache


@pytest.mark.parametrize("warm", [None, 1, 5], ids=["in-the-first-push", "one-frame-at-a-time", "five-at-a-time"])
def test_warming_the_prefix_changes_when_audio_comes_not_what(synth, voices, warm):
    """An ICL clip's codes are decoded in front (never emitted): ahead of the first frame with `warm` (what the
    scheduler does while the prompt is prefilled), or inside the first pushes. The pieces are bitwise the same; a
    decoder still warming gives nothing, then catches up. Across frame 300 too (the next reference chunk's left
    context is fed as its frames come)."""
    prefix = voices["icl"].codes
    codes = np.random.default_rng(5).integers(0, 2048, size=(330 - len(prefix), 16))
    plain = StreamDecoder(synth.codec, chunk_frames=4, prefix=prefix)
    ref = np.concatenate([p for f in codes for p in plain.push(f)] + [plain.finish()])
    dec = StreamDecoder(synth.codec, chunk_frames=4, prefix=prefix)
    warms = 0
    while warm is not None and not dec.warm(warm):
        warms += 1
    pieces, audio = [], []  # what each push gave; every piece in order (with the first piece's, drained)
    for f in codes:
        pieces.append(dec.push(f))
        audio += pieces[-1]
        while dec.held:  # as the scheduler drains them
            audio += dec.drain()
    ours = np.concatenate(audio + [dec.finish()])
    assert warm is None or warms > 2  # a few frames a call
    np.testing.assert_array_equal(ours, ref)
    assert all(len(ps) <= 2 for ps in pieces)
    assert len(ours) == len(codes) * SAMPLES_PER_FRAME

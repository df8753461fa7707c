"""A streamed text's first piece is one frame (`longform.FIRST_FRAMES`): its first audio waits for one frame, the
pieces after it grow to `chunk_frames`, and the audio is the same to float rounding."""
import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.check import snr_db
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav
from qtts_lib.runtime.codec.stream import StreamDecoder, piece_frames
from qtts_lib.runtime.pipeline import longform

CKPT = "tiny-base"
TEXT = ("The first piece of a streamed text is one frame long. The pieces after it grow until they are as long as "
        "the server's pieces. ")
CHUNK = 4
MAX_FRAMES = 16
MAX_TOKENS = 16  # two segments
PAUSE = int(round(longform.PAUSE_SECONDS * SAMPLE_RATE))


@pytest.fixture(scope="module")
def voice(synth):
    return synth.voice(wav=load_wav(paths.voice_wav()))


def stream(synth, voice, **options):
    return longform.stream_long(synth, TEXT, "english", voice, synth.sampling.replace(seed=3), max_tokens=MAX_TOKENS,
                                max_frames=MAX_FRAMES, chunk_frames=CHUNK, **options)


def test_the_decoders_pieces_grow_from_one_frame_and_are_one_decode(synth):
    """`StreamDecoder(first_frames=1)`: the audio of frame 1 once frame 1 is in, of frames 2-3 once frame 3 is, then
    of four frames every four; bit for bit the one incremental decode fed those pieces."""
    codes = np.random.default_rng(5).integers(0, 2048, size=(18, 16))
    dec, got = StreamDecoder(synth.codec, chunk_frames=CHUNK, first_frames=1), {}
    for made, frame in enumerate(codes, 1):
        pieces = dec.push(frame)
        while dec.held:
            pieces += dec.drain()
        if pieces:
            got[made] = pieces
    assert len(got[1][0]) <= SAMPLES_PER_FRAME
    assert {made: sum(map(len, p)) for made, p in got.items()} == {
        1: SAMPLES_PER_FRAME, 3: 2 * SAMPLES_PER_FRAME, 7: 4 * SAMPLES_PER_FRAME, 11: 4 * SAMPLES_PER_FRAME,
        15: 4 * SAMPLES_PER_FRAME}
    ours = np.concatenate([p for pieces in got.values() for p in pieces] + [dec.finish()])
    inc = synth.codec.incremental()
    ref = np.concatenate([inc.push(codes[a:b]) for a, b in [(0, 1), (1, 3), (3, 7), (7, 11), (11, 15), (15, 18)]])
    assert np.array_equal(ours, ref)


def test_a_streamed_texts_first_audio_waits_for_one_frame(synth, voice):
    """`stream_long` (what the server streams): the first piece comes when one frame exists and holds at most a
    frame's samples; the first segment's pieces then reach `chunk_frames` frames."""
    assert len(longform.plan(synth, TEXT, MAX_TOKENS, MAX_FRAMES)) == 2
    made, seen = [], []
    for piece in stream(synth, voice, on_frame=made.append):
        seen.append((len(piece), len(made)))  # len(made): the frames made so far
    assert seen[0][1] == 1 and 0 < seen[0][0] <= SAMPLES_PER_FRAME
    before_the_second_frame = sum(n for n, frames in seen[:next(i for i, s in enumerate(seen) if s[1] > 1)])
    assert before_the_second_frame <= SAMPLES_PER_FRAME
    first_segment = seen[:next(i for i, (n, _) in enumerate(seen) if n == PAUSE)]
    assert max(n for n, _ in first_segment) == CHUNK * SAMPLES_PER_FRAME


def test_a_one_frame_first_piece_is_the_same_audio(synth, voice):
    """The whole stream, its first piece of one frame or of `chunk_frames` frames: the same length, the pauses in
    the same places, the same samples to float rounding (the codec's transformer runs over other pieces)."""
    ones, chunks = list(stream(synth, voice)), list(stream(synth, voice, first_frames=CHUNK))

    def pauses(pieces):
        at = np.cumsum([0] + [len(p) for p in pieces])
        return [int(at[i]) for i, p in enumerate(pieces) if len(p) == PAUSE and not p.any()]

    a, b = np.concatenate(ones), np.concatenate(chunks)
    assert len(a) == len(b) > MAX_FRAMES * SAMPLES_PER_FRAME
    assert len(pauses(ones)) == 1 and pauses(ones) == pauses(chunks)
    assert snr_db(a, b) > 100


def listener_waits(sizes: list[int], rtf: float) -> float:
    """The playback model with a simulated clock: frame n (1-based) is made at n·rtf frame-lengths, a piece is out
    when its last frame is, and the listener starts at the first piece. The longest wait, in frame-lengths."""
    out, ready = np.cumsum(sizes), np.cumsum(sizes) * rtf
    due = ready[0] + np.concatenate([[0], out[:-1]])  # piece k plays once the audio before it has
    return float(max(0.0, (ready - due).max()))


def sizes_for(rtf: float, frames: int = 300, first: int = 1, chunk: int = 4) -> list[int]:
    sizes = []
    while sum(sizes) < frames:
        sizes.append(piece_frames(sum(sizes), first, chunk, rtf))
    return sizes


@pytest.mark.parametrize("rtf", [0.3, 0.5, 0.7, 0.85, 0.95, 0.99])
def test_pieces_grow_only_as_fast_as_a_listener_from_the_first_piece_allows(rtf):
    """`piece_frames` at the real-time factor the stream is made at: a listener who plays from the first piece
    never waits, the pieces reach `chunk_frames`, and the default (0.5) doubles them (1, 2, 4, ...)."""
    sizes = sizes_for(rtf)
    assert listener_waits(sizes, rtf) == 0.0
    assert sizes[0] == 1 and sizes[-1] == 4
    assert listener_waits(sizes_for(0.5), rtf) > 0.0 or rtf <= 0.5  # doubling outruns a slower stream


def test_the_default_growth_doubles_and_a_stream_at_real_time_keeps_its_first_size():
    assert sizes_for(0.5, 15) == [1, 2, 4, 4, 4]
    assert sizes_for(1.0, 6) == [1] * 6 and sizes_for(1.2, 6, first=2) == [2] * 3


def test_the_decoder_cuts_its_pieces_by_rtf(synth):
    """`StreamDecoder(rtf=0.8)`: the pieces are `piece_frames`' sizes, one frame while a quarter (1/0.8 - 1) of the
    frames out is under one frame, then growing."""
    codes = np.random.default_rng(6).integers(0, 2048, size=(12, 16))
    dec, sizes = StreamDecoder(synth.codec, chunk_frames=CHUNK, first_frames=1, rtf=0.8), []
    for frame in codes:
        pieces = dec.push(frame)
        while dec.held:
            pieces += dec.drain()
        sizes.append(sum(len(p) for p in pieces) // SAMPLES_PER_FRAME)
    assert [s for s in sizes if s] == sizes_for(0.8, 12)[:len([s for s in sizes if s])]
    assert sizes_for(0.8, 12) == [1, 1, 1, 1, 2, 2, 3, 3]

"""`audio.encode`: OpenAI's speech formats encoded piece by piece (PyAV), each piece's bytes out as it comes; and
`qtts say -o out.mp3` (the format by the file's suffix)."""
import numpy as np
import pytest
import soundfile as sf
from serving import MAGIC, PADDING, decoded, samples_at_24k

from qtts_lib import paths
from qtts_lib.runtime.app.cli import main
from qtts_lib.runtime.audio import encode
from qtts_lib.runtime.audio.wav import pcm16
from qtts_lib.runtime.errors import InputError

PIECE = 4 * 1920  # what the server sends at --chunk-frames 4


def speechlike(n: int) -> np.ndarray:
    t = np.arange(n) / 24000
    rng = np.random.default_rng(0)
    return (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t) + 0.01 * rng.standard_normal(n)).astype(
        np.float32)


@pytest.mark.parametrize("fmt", encode.COMPRESSED)
def test_each_piece_comes_out_as_it_goes_in(fmt):
    """Bytes after every piece, not only at the end (the stream a player starts on); joined, the whole encode; the
    samples within the codec's padding (FLAC: exactly `pcm`'s)."""
    wav = speechlike(5 * PIECE)
    encoder = encode.Encoder(fmt)
    parts = [encoder.write(wav[i:i + PIECE]) for i in range(0, len(wav), PIECE)] + [encoder.close()]
    assert all(len(p) > 0 for p in parts[:-1]), [len(p) for p in parts]
    body = b"".join(parts)
    assert body.startswith(MAGIC[fmt]) and body == encode.encode(fmt, wav) and encoder.samples == len(wav)
    n = samples_at_24k(fmt, body)
    assert len(wav) <= n <= len(wav) + PADDING[fmt]
    if fmt == "flac":
        assert np.array_equal(decoded(body)[0], np.frombuffer(pcm16(wav), "<i2"))


def test_a_discarded_stream_frees_its_encoder_and_says_nothing_more():
    encoder = encode.Encoder("mp3")
    encoder.write(speechlike(PIECE))
    encoder.discard()
    assert encoder.close() == b""


def test_the_wire_formats_need_no_ffmpeg():
    wav = speechlike(1000)
    assert encode.encode("pcm", wav) == pcm16(wav)
    assert encode.encode("wav", wav)[:4] == b"RIFF" and encode.encode("wav", wav)[44:] == pcm16(wav)


def test_formats_by_suffix_and_an_unknown_format():
    assert [encode.format_of_path(p) for p in ("a.mp3", "b.OGG", "c.opus", "d.aac", "e.flac", "f.wav", "g")] == [
        "mp3", "opus", "opus", "aac", "flac", None, None]
    with pytest.raises(InputError, match="unknown audio format"):
        encode.Encoder("ogg")


@pytest.mark.parametrize("stream", [False, True])
def test_qtts_say_writes_mp3_by_the_suffix(tts, tmp_path, capsys, stream):
    """`-o out.mp3` whole and with --stream: the same file (the same samples, encoded bit-exact), the wav's
    samples inside."""
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    common = ["say", "--checkpoint", str(paths.model_dir("tiny-base")), "--threads", "2", "--voice",
              str(paths.voice_wav()), "--text", "Hello there.", "--language", "english", "--greedy",
              "--max-frames", "4"]
    assert main([*common, "-o", str(tmp_path / "out.wav")]) == 0
    out = tmp_path / "out.mp3"
    assert main([*common, "-o", str(out), *(["--stream", "--chunk-frames", "1"] if stream else [])]) == 0
    body = out.read_bytes()
    assert body == encode.encode("mp3", sf.read(tmp_path / "out.wav", dtype="float32")[0])
    assert 4 * 1920 <= samples_at_24k("mp3", body) <= 4 * 1920 + PADDING["mp3"]

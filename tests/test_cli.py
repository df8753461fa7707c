"""`qtts say`: one clear line and a non-zero exit for every kind of bad input; a wav for good input."""
import shutil

import numpy as np
import pytest
import soundfile as sf

from qtts_lib import paths
from qtts_lib.runtime.app.cli import main

CKPT = "tiny-base"


def say(*args):
    return main(["say", "--checkpoint", str(paths.model_dir(CKPT)), "--threads", "2", *args])


def test_good_input_writes_a_wav(exported, tmp_path, capsys):
    out = tmp_path / "out.wav"
    rc = say("--voice", str(paths.voice_wav()), "--text", "Hello there.", "--language", "english",
             "--greedy", "--max-frames", "4", "-o", str(out))
    assert rc == 0
    wav, sr = sf.read(out)
    assert sr == 24000 and len(wav) == 4 * 1920
    assert "RTF" in capsys.readouterr().out


@pytest.mark.parametrize("text", ["", "     "])
def test_empty_text(exported, tmp_path, capsys, text):
    assert say("--text", text, "-o", str(tmp_path / "o.wav")) == 2
    assert "text is empty" in capsys.readouterr().err


def test_long_text_is_capped_with_a_warning(exported, tmp_path, capsys):
    text = ("This sentence is repeated to make a very long input. " * 100)[:5000]
    rc = say("--voice", str(paths.voice_wav()), "--text", text, "--language", "english", "--greedy",
             "--max-frames", "3", "-o", str(tmp_path / "o.wav"))
    assert rc == 0
    err = capsys.readouterr().err
    assert "warning" in err and "at most 3 frames" in err and "--max-frames" in err


def test_unknown_language(exported, tmp_path, capsys):
    assert say("--voice", str(paths.voice_wav()), "--text", "hi", "--language", "klingon",
               "-o", str(tmp_path / "o.wav")) == 2
    err = capsys.readouterr().err
    assert "klingon" in err and "english" in err


def test_missing_and_unreadable_wav(exported, tmp_path, capsys):
    assert say("--voice", str(tmp_path / "nope.wav"), "--text", "hi", "-o", str(tmp_path / "o.wav")) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "junk.wav").write_bytes(b"RIFF....not really")
    assert say("--voice", str(tmp_path / "junk.wav"), "--text", "hi", "-o", str(tmp_path / "o.wav")) == 2
    assert "cannot read" in capsys.readouterr().err


def test_wav_not_24k(exported, tmp_path, capsys):
    sf.write(tmp_path / "16k.wav", np.zeros(16000, np.float32), 16000)
    assert say("--voice", str(tmp_path / "16k.wav"), "--text", "hi", "-o", str(tmp_path / "o.wav")) == 2
    assert "16000 Hz" in capsys.readouterr().err


def test_missing_artifacts_name_the_chapter(exported, tmp_path, capsys):
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in ("config.json", "generation_config.json", "vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(exported / f, bare / f)
    assert main(["say", "--checkpoint", str(bare), "--text", "hi", "-o", str(tmp_path / "o.wav")]) == 3
    err = capsys.readouterr().err
    assert "04_export_align" in err


def test_unknown_checkpoint(tmp_path, capsys):
    assert main(["say", "--checkpoint", "no-such-ckpt", "--text", "hi", "-o", str(tmp_path / "o.wav")]) == 3
    assert "no checkpoint 'no-such-ckpt'" in capsys.readouterr().err


def test_icl_and_its_bad_input(exported, tmp_path, capsys):
    out = tmp_path / "icl.wav"
    rc = say("--voice", str(paths.voice_wav()), "--voice-text", "Good morning.", "--text", "Hello.",
             "--language", "english", "--greedy", "--max-frames", "3", "-o", str(out))
    assert rc == 0
    assert len(sf.read(out)[0]) == 3 * 1920  # the reference part is cut off
    capsys.readouterr()
    assert say("--voice-text", "Good morning.", "--text", "Hello.", "-o", str(out)) == 2
    assert "--voice-text needs --voice" in capsys.readouterr().err
    assert say("--voice", str(paths.voice_wav()), "--voice-text", "  ", "--text", "Hello.", "-o", str(out)) == 2
    assert "voice transcript is empty" in capsys.readouterr().err


def test_speaker_on_a_base_checkpoint(exported, tmp_path, capsys):
    assert say("--speaker", "serena", "--text", "Hello.", "-o", str(tmp_path / "o.wav")) == 2
    assert "unknown speaker 'serena'" in capsys.readouterr().err


@pytest.mark.parametrize("threads", ["0", "-1", "two"])
def test_bad_thread_count_is_one_line(tmp_path, capsys, threads):
    with pytest.raises(SystemExit) as e:
        main(["say", "--threads", threads, "--text", "hi", "-o", str(tmp_path / "o.wav")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--threads" in err


def test_base_checkpoint_needs_a_voice(exported, tmp_path, capsys):
    assert say("--text", "Hello.", "-o", str(tmp_path / "o.wav")) == 2
    err = capsys.readouterr().err
    assert "--voice" in err and "--voice-text" in err


def test_vulkan_without_a_device(exported, tmp_path, capsys, monkeypatch):
    from qtts_lib.runtime.binding import net

    monkeypatch.setattr(net, "gpu_names", lambda: [])  # what ncnn reports on a machine with no Vulkan driver
    assert say("--device", "vulkan", "--voice", str(paths.voice_wav()), "--text", "Hello.",
               "-o", str(tmp_path / "o.wav")) == 2
    assert "sees no Vulkan device" in capsys.readouterr().err


def test_vulkan_index_out_of_range(exported, tmp_path, capsys, monkeypatch):
    from qtts_lib.runtime.binding import net

    monkeypatch.setattr(net, "gpu_names", lambda: ["llvmpipe (LLVM 15.0.6, 256 bits)"])
    assert say("--device", "vulkan:3", "--voice", str(paths.voice_wav()), "--text", "Hello.",
               "-o", str(tmp_path / "o.wav")) == 2
    assert "vulkan:0 llvmpipe" in capsys.readouterr().err


def test_bad_device_name(exported, tmp_path, capsys):
    assert say("--device", "tpu", "--voice", str(paths.voice_wav()), "--text", "Hello.",
               "-o", str(tmp_path / "o.wav")) == 2
    assert "unknown device 'tpu'" in capsys.readouterr().err


def test_sampling_options_reach_the_loop(exported, tmp_path, capsys):
    """Without --greedy `say` samples (the checkpoint's defaults): a seed repeats, another seed differs; the sampling
    options change what is drawn."""
    args = ["--voice", str(paths.voice_wav()), "--text", "Hello there.", "--language", "english", "--max-frames", "8"]
    wavs = {}
    for name, extra in [("a", ["--seed", "1"]), ("b", ["--seed", "1"]), ("c", ["--seed", "2"]),
                        ("d", ["--seed", "1", "--temperature", "0.3", "--top-k", "3", "--top-p", "0.9",
                               "--repetition-penalty", "1.3"]), ("g", ["--greedy"])]:
        assert say(*args, *extra, "-o", str(tmp_path / f"{name}.wav")) == 0
        wavs[name] = sf.read(tmp_path / f"{name}.wav")[0]
    assert np.array_equal(wavs["a"], wavs["b"])
    assert not np.array_equal(wavs["a"], wavs["c"]) and not np.array_equal(wavs["a"], wavs["d"])
    assert not np.array_equal(wavs["a"], wavs["g"])


def test_without_a_seed_each_run_is_a_fresh_take_that_its_printed_seed_replays(exported, tmp_path, capsys):
    """No --seed: two runs differ; each prints the seed it drew (one line on stderr), and --seed with it gives the
    same samples bit for bit. Greedy draws nothing and prints no seed."""
    import re

    args = ["--voice", str(paths.voice_wav()), "--text", "Hello there.", "--language", "english", "--max-frames", "8"]
    takes = {}
    for name in ("a", "b"):
        assert say(*args, "-o", str(tmp_path / f"{name}.wav")) == 0
        (line,) = [x for x in capsys.readouterr().err.splitlines() if "seed" in x]
        seed = re.fullmatch(r"qtts: seed (\d+): replay with --seed (\d+)", line)
        assert seed and seed[1] == seed[2]
        takes[name] = int(seed[1]), sf.read(tmp_path / f"{name}.wav", dtype="float32")[0]
    (seed_a, a), (seed_b, b) = takes["a"], takes["b"]
    assert seed_a != seed_b and not np.array_equal(a, b)
    assert say(*args, "--seed", str(seed_a), "-o", str(tmp_path / "replay.wav")) == 0
    assert f"seed {seed_a}:" in capsys.readouterr().err
    assert np.array_equal(sf.read(tmp_path / "replay.wav", dtype="float32")[0], a)
    assert say(*args, "--greedy", "-o", str(tmp_path / "g.wav")) == 0
    assert "seed" not in capsys.readouterr().err


def test_speed_changes_the_duration_whole_or_streamed(exported, tmp_path, capsys):
    """--speed 2 halves the audio and 0.5 doubles it (within 5%); streamed (--stream, or a long text segment by
    segment) it writes the samples of the whole file."""
    args = ["--voice", str(paths.voice_wav()), "--text", "Hello there.", "--language", "english", "--greedy",
            "--max-frames", "12"]

    def run(*extra, name="o.wav") -> np.ndarray:
        assert say(*args, *extra, "-o", str(tmp_path / name)) == 0
        return sf.read(tmp_path / name, dtype="float32")[0]

    plain = run()
    assert len(plain) == 12 * 1920
    for speed in (2.0, 0.5):
        whole = run("--speed", str(speed))
        assert abs(len(whole) * speed / len(plain) - 1) < 0.05, (speed, len(whole))
        assert np.array_equal(run("--speed", str(speed), "--stream", name="s.wav"), whole)
    assert np.array_equal(run("--speed", "1"), plain)
    text = "The first sentence is here. " * 12
    long_args = ["--voice", str(paths.voice_wav()), "--text", text, "--language", "english", "--greedy",
                 "--max-frames", "3", "--speed", "1.5"]
    assert say(*long_args, "-o", str(tmp_path / "l.wav")) == 0
    assert "segments" in capsys.readouterr().out
    assert say(*long_args, "--stream", "-o", str(tmp_path / "ls.wav")) == 0
    assert np.array_equal(sf.read(tmp_path / "l.wav")[0], sf.read(tmp_path / "ls.wav")[0])


@pytest.mark.parametrize("value", ["0.2", "5", "fast", "nan"])
def test_bad_speed_is_one_line(tmp_path, capsys, value):
    with pytest.raises(SystemExit) as e:
        main(["say", "--speed", value, "--text", "hi", "-o", str(tmp_path / "o.wav")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--speed" in err and "0.25 to 4.0" in err


@pytest.mark.parametrize("option, value", [("--temperature", "0"), ("--top-p", "1.5"), ("--top-k", "-2"),
                                           ("--repetition-penalty", "-1")])
def test_bad_sampling_options_are_one_line(exported, tmp_path, capsys, option, value):
    assert say("--voice", str(paths.voice_wav()), "--text", "Hi.", option, value, "-o", str(tmp_path / "o.wav")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option.lstrip("-").replace("-", "_") in err


@pytest.fixture(scope="module")
def designer():
    from qtts_lib import checkpoint, export, reference

    tts = reference.load(checkpoint.ensure("tiny-voicedesign"), threads=2)
    export.ensure(tts, "tiny-voicedesign")
    return paths.model_dir("tiny-voicedesign")


def test_voice_design_and_instructions_from_the_command_line(designer, tmp_path, capsys):
    """--instruct describes the voice on a VoiceDesign checkpoint; it changes the audio; a clip is refused there,
    and an instruction is refused by a Base checkpoint."""
    args = ["say", "--checkpoint", str(designer), "--text", "Hello.", "--greedy", "--max-frames", "4"]
    assert main([*args, "--instruct", "A calm, low voice", "-o", str(tmp_path / "a.wav")]) == 0
    assert main([*args, "-o", str(tmp_path / "b.wav")]) == 0
    a, b = sf.read(tmp_path / "a.wav")[0], sf.read(tmp_path / "b.wav")[0]
    assert len(a) == len(b) == 4 * 1920 and not np.array_equal(a, b)
    capsys.readouterr()
    assert main([*args, "--voice", str(paths.voice_wav()), "-o", str(tmp_path / "c.wav")]) == 2
    assert "described in words" in capsys.readouterr().err
    assert say("--voice", str(paths.voice_wav()), "--text", "Hi.", "--instruct", "softly",
               "-o", str(tmp_path / "d.wav")) == 2
    assert "takes no instruction" in capsys.readouterr().err


def test_qtts_export_converts_a_checkpoint_directory(tmp_path, capsys):
    """`qtts export DIR` on a checkpoint that has no exports: every graph, then the runtime speaks from it."""
    from qtts_lib import checkpoint

    src = checkpoint.ensure("tiny-1.7b-customvoice")
    bare = tmp_path / "Qwen3-TTS-tiny"
    shutil.copytree(src, bare, ignore=shutil.ignore_patterns("ncnn"))
    assert main(["export", str(bare), "--no-int8"]) == 0
    out = capsys.readouterr().out
    assert "next: qtts say --checkpoint" in out and "--speaker" in out
    assert main(["say", "--checkpoint", str(bare), "--speaker", "serena", "--instruct", "Speak softly.",
                 "--text", "Hello.", "--greedy", "--max-frames", "3", "-o", str(tmp_path / "o.wav")]) == 0
    assert len(sf.read(tmp_path / "o.wav")[0]) == 3 * 1920
    capsys.readouterr()
    assert main(["export", str(tmp_path / "nothing")]) == 3
    assert "not a checkpoint directory" in capsys.readouterr().err


@pytest.mark.parametrize("stream", [False, True])
def test_timestamps_say_where_each_segment_lies_in_the_audio(exported, tmp_path, capsys, stream):
    """`--timestamps FILE`: one span per segment, in order, inside the audio, the pauses between them silent."""
    import json

    from qtts_lib.runtime.pipeline.longform import MAX_SEGMENT_TOKENS
    from qtts_lib.runtime.text.bpe import Tokenizer
    from qtts_lib.runtime.text.segment import segments

    text = ("The tutorial ports a speech model to a small runtime. Each chapter checks one claim against the "
            "reference, and every number lands in a report. Long texts are cut into sentences, packed into "
            "segments, and spoken one segment at a time with the same voice. ") * 2
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    out, spans = tmp_path / "o.wav", tmp_path / "spans.json"
    assert say("--voice", str(paths.voice_wav()), "--text-file", str(tmp_path / "t.txt"), "--max-frames", "5",
               "--seed", "3", "--timestamps", str(spans), "-o", str(out), *(["--stream"] if stream else [])) == 0
    wav, sr = sf.read(out, dtype="float32")
    got = json.loads(spans.read_text(encoding="utf-8"))
    tok = Tokenizer.from_dir(paths.model_dir(CKPT))
    texts = segments(text, MAX_SEGMENT_TOKENS, lambda s: len(tok.encode(s, added_tokens=False)))
    rows = got["segments"]
    assert got["audio_seconds"] == pytest.approx(len(wav) / sr, abs=1e-6)
    assert rows[0]["start"] == 0 and rows[-1]["end"] == pytest.approx(len(wav) / sr, abs=1e-6)
    assert all(a["end"] < b["start"] for a, b in zip(rows, rows[1:])) and all(r["start"] < r["end"] for r in rows)
    for a, b in zip(rows, rows[1:]):
        assert not wav[round(a["end"] * sr):round(b["start"] * sr)].any()
    assert [r["text"] for r in rows] == texts and len(texts) >= 2
    one = tmp_path / "one.json"
    assert say("--voice", str(paths.voice_wav()), "--text", "Hello there.", "--max-frames", "4", "--timestamps",
               str(one), "-o", str(tmp_path / "one.wav")) == 0
    assert json.loads(one.read_text())["segments"] == [{"text": "Hello there.", "start": 0.0,
                                                         "end": 4 * 1920 / 24000}]


SERVE_EXTRA = ("starlette", "uvicorn", "pydantic", "prometheus_client", "av", "multipart", "wsproto")


def test_say_runs_without_the_serve_extra_and_serve_says_what_to_install(exported, tmp_path):
    from qtts_lib.isolation import run_without

    def qtts(*args):
        return run_without(SERVE_EXTRA, "from qtts_lib.runtime.app.cli import main\nsys.exit(main(sys.argv[1:]))",
                           *args)

    out = tmp_path / "out.wav"
    r = qtts("say", "--checkpoint", str(paths.model_dir(CKPT)), "--voice", str(paths.voice_wav()), "--text",
             "Hello.", "--greedy", "--max-frames", "2", "--threads", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert sf.info(out).frames == 2 * 1920
    r = qtts("serve", "--checkpoint", "tiny-base", "--port", "8123")
    assert r.returncode == 2
    missing = r.stderr.partition("serve extra (")[2].partition(" is not installed)")[0]
    assert missing in SERVE_EXTRA, r.stderr
    assert r.stderr == (f"qtts: error: qtts serve needs the serve extra ({missing} is not installed): pip install "
                        "'qtts[serve]'\n")

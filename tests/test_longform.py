"""Long text (qtts_lib.runtime.longform and `qtts say --text-file`): per-segment caps, one voice, exact lengths."""
import io

import numpy as np
import pytest
import soundfile as sf

from qtts_lib import paths
from qtts_lib.runtime import Sampling
from qtts_lib.runtime.app.cli import main
from qtts_lib.runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME, load_wav
from qtts_lib.runtime.pipeline import longform, prompt

CKPT = "tiny-base"
PAUSE = int(round(longform.PAUSE_SECONDS * SAMPLE_RATE))
PARAGRAPH = ("The tutorial ports a speech model to a small runtime. Each chapter checks one claim against the "
             "reference, and every number lands in a report. Long texts are cut into sentences, packed into "
             "segments, and spoken one segment at a time with the same voice. ")


def test_frame_cap_scales_with_tokens_and_respects_max_frames():
    assert prompt.frame_cap(10) == 10 * prompt.FRAMES_PER_TOKEN + prompt.MARGIN_FRAMES
    assert prompt.frame_cap(20) - prompt.frame_cap(10) == 10 * prompt.FRAMES_PER_TOKEN
    assert prompt.frame_cap(60, max_frames=100) == 100
    assert prompt.frame_cap(3, frames_per_token=1.5, margin=0) == 5


def test_join_lengths_starts_and_fades():
    wavs = [np.ones(1000, np.float32), np.ones(500, np.float32), np.ones(1920, np.float32)]
    wav, starts = longform.join(wavs, 300, 240)
    assert len(wav) == 3420 + 2 * 300 and starts == [0, 1300, 2100]
    assert wav[0] < 0.01 and wav[999] < 0.01 and wav[500] == 1.0          # faded ends, untouched middle
    assert not wav[1000:1300].any()                                         # the pause is silence
    assert np.abs(np.diff(wav)).max() < 0.02                                # no step anywhere: no click


def test_plan_bounds_tokens_and_caps(synth):
    todo = longform.plan(synth, PARAGRAPH * 4, max_tokens=40, max_frames=100)
    assert len(todo) > 3 and all(s.tokens <= 40 for s in todo)
    assert all(s.tokens == len(synth.tokenizer.encode(s.text)) for s in todo)
    assert all(s.cap == min(100, prompt.frame_cap(s.tokens)) for s in todo)


def test_one_voice_for_every_segment_and_exact_lengths(synth, monkeypatch):
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    fail = lambda *a, **k: pytest.fail("recomputed the voice")  # noqa: E731 - the voice is the caller's, made once
    monkeypatch.setattr(synth, "voice", fail)
    for name in ("xvector", "codes"):
        monkeypatch.setattr(synth.voices, name, fail)
    seen = []
    result = longform.synthesize_long(synth, PARAGRAPH, "english", voice, max_tokens=20, frames_per_token=0.1,
                                      margin=2, on_segment=lambda i, n, seg, wav: seen.append((i, n, len(wav))))
    segs = result.segments
    assert len(segs) >= 3 and [s[:2] for s in seen] == [(i, len(segs)) for i in range(len(segs))]
    assert all(s.frames <= s.cap and s.samples == s.frames * SAMPLES_PER_FRAME for s in segs)
    assert len(result.wav) == sum(s.samples for s in segs) + (len(segs) - 1) * PAUSE
    assert [s.start for s in segs] == list(np.cumsum([0] + [s.samples + PAUSE for s in segs[:-1]]))
    assert [n for _, _, n in seen] == [s.samples for s in segs]


def test_icl_voice_is_reused_and_its_clip_never_spoken(synth):
    voice = synth.voice(wav=load_wav(paths.voice_wav()), text=(paths.INPUTS / "voice.txt").read_text().strip())
    result = longform.synthesize_long(synth, "First sentence here. Second sentence here.", "english", voice,
                                      max_tokens=4, max_frames=3)
    assert len(result.segments) == 2
    assert all(s.samples == s.frames * SAMPLES_PER_FRAME and s.frames <= 3 for s in result.segments)


def say(*args):
    return main(["say", "--checkpoint", str(paths.model_dir(CKPT)), "--voice", str(paths.voice_wav()),
                 "--language", "english", "--greedy", "--threads", "2", *args])


def test_cli_text_file_ten_segments_long(synth, tmp_path, capsys):
    """`qtts say --text-file` on a text more than ten segments long: the wav is its segments plus the pauses."""
    text = PARAGRAPH * 13
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    todo = longform.plan(synth, text, max_frames=4)
    assert len(todo) >= 10 and len(synth.tokenizer.encode(text)) >= 10 * longform.MAX_SEGMENT_TOKENS
    assert say("--text-file", str(tmp_path / "long.txt"), "--max-frames", "4", "-o", str(tmp_path / "o.wav")) == 0
    wav, sr = sf.read(tmp_path / "o.wav")
    out = capsys.readouterr().out
    assert f"{len(todo)} segments" in out
    frames = int(out.split(" segments, ")[1].split(" frames")[0])
    assert frames <= sum(s.cap for s in todo)
    assert sr == SAMPLE_RATE and len(wav) == frames * SAMPLES_PER_FRAME + (len(todo) - 1) * PAUSE


def test_cli_stdin_equals_the_library(synth, tmp_path, monkeypatch, capsys):
    text = PARAGRAPH * 2
    monkeypatch.setattr("sys.stdin", io.StringIO(text))
    assert say("--text-file", "-", "--max-frames", "3", "-o", str(tmp_path / "o.wav")) == 0
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    ours = longform.synthesize_long(synth, text, "english", voice, Sampling(greedy=True), max_frames=3)
    assert len(ours.segments) > 1 and f"{len(ours.segments)} segments" in capsys.readouterr().out
    np.testing.assert_allclose(sf.read(tmp_path / "o.wav", dtype="float32")[0], ours.wav, atol=1e-6)


def test_cli_text_options(tmp_path, capsys):
    assert say("--text-file", str(tmp_path / "nope.txt"), "-o", str(tmp_path / "o.wav")) == 2
    assert "text file not found" in capsys.readouterr().err
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    assert say("--text-file", str(tmp_path / "latin1.txt"), "-o", str(tmp_path / "o.wav")) == 2
    assert "UTF-8" in capsys.readouterr().err
    (tmp_path / "blank.txt").write_text("\n  \n")
    assert say("--text-file", str(tmp_path / "blank.txt"), "-o", str(tmp_path / "o.wav")) == 2
    assert "text is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        say("--text", "hi", "--text-file", str(tmp_path / "blank.txt"), "-o", str(tmp_path / "o.wav"))
    assert e.value.code == 2 and "not allowed with" in capsys.readouterr().err


def test_cli_stream_writes_each_segment_as_it_is_spoken(synth, tmp_path, capsys):
    (tmp_path / "t.txt").write_text(PARAGRAPH * 2, encoding="utf-8")
    args = ["--text-file", str(tmp_path / "t.txt"), "--max-frames", "3"]
    assert say(*args, "-o", str(tmp_path / "whole.wav")) == 0
    assert say(*args, "--stream", "-o", str(tmp_path / "streamed.wav")) == 0
    whole, streamed = (sf.read(tmp_path / f, dtype="float32")[0] for f in ("whole.wav", "streamed.wav"))
    assert len(whole) > 2 * 3 * SAMPLES_PER_FRAME and np.array_equal(whole, streamed)


@pytest.mark.parametrize("sizes", [[1920, 1920, 1920], [100, 50, 700], [300], [7680], [0, 1920, 0, 30]])
def test_streamed_fades_equal_the_whole_fade(sizes):
    rng = np.random.default_rng(len(sizes))
    pieces = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    whole = longform.fade(np.concatenate(pieces), 240)
    fader = longform.Fader(240)
    streamed = [f for p in pieces for f in fader.push(p)] + fader.finish()
    np.testing.assert_array_equal(np.concatenate(streamed), whole)


@pytest.mark.parametrize("sizes", [[480, 480, 960, 1920, 1920], [1920, 1920], [3840], [240, 1680, 1920, 7]])
def test_a_segment_known_to_reach_two_frames_gives_its_first_frame_whole(sizes):
    """A segment known to hold two frames at least (`at_least`): its first frame's samples go out as they come,
    none held for a fade-out that cannot fall on them, and the pieces still join to the whole fade."""
    rng = np.random.default_rng(len(sizes))
    pieces = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    fader = longform.Fader(240, at_least=3840)
    out = [fader.push(p) for p in pieces]
    given = np.cumsum([sum(len(f) for f in o) for o in out])
    pushed = np.cumsum(sizes)
    assert all(g == (p if p >= 480 else 0) for g, p in zip(given, pushed) if p <= 1920)  # all once faded in
    assert all(g == max(p, 3840) - 240 for g, p in zip(given, pushed) if p > 1920)  # then the last 10 ms held
    streamed = [f for o in out for f in o] + fader.finish()
    np.testing.assert_array_equal(np.concatenate(streamed), longform.fade(np.concatenate(pieces), 240))


def test_stream_long_equals_synthesize_long(synth):
    """Both sample (the checkpoint's defaults), each segment with its own seed, one segment at a time: the same audio
    (the stream given the seed the whole text drew). One at a time on both sides: a batch's rows agree with the same
    rows alone only to float rounding, which flips a sampled code in about one text in a hundred here (chapter 17)."""
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    todo = longform.plan(synth, PARAGRAPH, max_tokens=20, max_frames=6)
    assert len(todo) >= 3
    long = longform.synthesize_long(synth, PARAGRAPH, "english", voice, max_tokens=20, max_frames=6, max_batch=1)
    whole = long.wav
    pieces = list(longform.stream_long(synth, PARAGRAPH, "english", voice, synth.sampling.replace(seed=long.seed),
                                       max_tokens=20, max_frames=6, chunk_frames=2, max_batch=1))
    streamed = np.concatenate(pieces)
    assert len(streamed) == len(whole)
    snr = 10 * np.log10(np.sum(whole.astype(np.float64) ** 2) / max(np.sum((streamed - whole) ** 2), 1e-30))
    assert snr > 100, snr
    assert sum(1 for p in pieces if not p.any() and len(p) == PAUSE) == len(todo) - 1   # the pauses, as pieces


def test_a_text_keeps_its_place_from_its_first_segment_to_its_last(synth):
    """Two texts on a scheduler of one place, B submitted while A speaks its first segment: every segment of A is
    admitted before B's first (a continuing segment goes before a new request), so A never waits for B's whole
    text between two of its segments; B starts as soon as A is done."""
    from qtts_lib.runtime.pipeline.scheduler import Scheduler

    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    scheduler = Scheduler(synth, max_batch=1)
    a = longform.LongText(synth, scheduler, PARAGRAPH, "english", voice, max_tokens=20, max_frames=4, chunk_frames=2)
    events = scheduler.step()
    b = longform.LongText(synth, scheduler, "Another request, waiting.", "english", voice, max_frames=4,
                          chunk_frames=2)
    while not (a.done and b.done):
        a.take(events)
        b.take(events)
        events = scheduler.step()
    first, second = ([t for _, t in x.tickets.values()] for x in (a, b))
    assert len(first) >= 3 and all(t.result is not None for t in first + second)
    assert max(t.admitted for t in first) < min(t.admitted for t in second)
    assert a.lane.started


def test_a_step_that_hands_out_held_pieces_makes_no_frame(synth):
    """Streams in pieces of one frame: the steps that drain a first piece's held pieces are marked `drained` and
    make no frame, so the other steps make exactly one frame per utterance (what the server's batch metric counts)."""
    from qtts_lib.runtime.pipeline.scheduler import Scheduler
    from qtts_lib.runtime.pipeline.synthesizer import Utterance

    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    scheduler = Scheduler(synth, max_batch=2)
    tickets = [scheduler.submit(Utterance(t, "english", voice, Sampling(seed=i), max_frames=5), chunk_frames=1)
               for i, t in enumerate(["One stream.", "And another."])]
    framed = {t.id: 0 for t in tickets}
    drained = 0
    while any(t.result is None for t in tickets):
        events = scheduler.step()
        assert len({e.drained for e in events}) <= 1  # a step drains or makes frames, never both
        for e in events:
            if e.drained:
                drained += 1
                assert len(e.pieces) == 1 and 0 < len(e.pieces[0]) < SAMPLES_PER_FRAME
            else:
                framed[e.ticket.id] += 1
    assert drained >= len(tickets)
    assert framed == {t.id: len(t.result.codes) for t in tickets}


def test_a_text_over_its_budget_is_refused_before_any_work(synth):
    voice = synth.voice(wav=load_wav(paths.voice_wav()))
    todo = longform.plan(synth, PARAGRAPH, max_tokens=20, max_frames=6)
    need = sum(s.cap for s in todo)
    assert longform.check_budget(todo, need) == need
    with pytest.raises(longform.BudgetError, match=f"up to {need} frames"):
        longform.synthesize_long(synth, PARAGRAPH, "english", voice, max_tokens=20, max_frames=6, budget=need - 1)


def test_an_instruction_is_prefilled_once_per_text():
    """On a checkpoint that follows instructions, a text's segments all start with the same head (the instruction,
    the role, the codec tags): its positions go through the talker once, and every segment after the first copies
    their cache (`scheduler.Prefixes`)."""
    from qtts_lib import checkpoint, export, reference
    from qtts_lib.runtime import Synthesizer

    ckpt = "tiny-voicedesign"
    export.ensure(reference.load(checkpoint.ensure(ckpt), threads=2), ckpt)
    synth = Synthesizer(paths.model_dir(ckpt), threads=2)
    voice = synth.voice(instruct="A calm, low voice, speaking slowly and clearly to a room of listeners.")
    rows, talker, real = [], synth.loop.talker, synth.loop.talker.forward  # every prefill goes through forward
    talker.forward = lambda x, *a: (rows.append(x.shape[1]) if x.shape[:2] != (1, 1) else None) or real(x, *a)
    todo = longform.plan(synth, PARAGRAPH, max_tokens=20, max_frames=3)
    result = longform.synthesize_long(synth, PARAGRAPH, "english", voice, max_tokens=20, max_frames=3, max_batch=1)
    jobs = [synth.jobs.build(s.text, "english", voice) for s in todo]
    shared = jobs[0].prompt.head
    assert len(result.segments) == len(todo) >= 3 and shared > 10 and all(j.prompt.head == shared for j in jobs)
    assert sum(rows) == shared + sum(len(j.prompt.embeds) - shared for j in jobs)

"""The performance harness's pure parts: rows from runs, the schema check, the weight count. No timing asserted."""
import pytest

from qtts_lib import paths, perf


def fake_runs(frames=10, talker=0.1, predictor=0.2, codec=0.3):
    return [{"frames": frames, "load_s": 1.0, "prefill_s": 0.05, "talker_s": talker, "predictor_s": predictor,
             "codec_s": codec, "peak_rss_gb": 1.5}]


def test_row_is_per_frame_medians_with_the_floor():
    r = perf.row("ncnn", 2, fake_runs() * 3, floor_ms=20.0)
    assert r["ms_per_frame"] == {"talker": 10.0, "predictor": 20.0, "codec": 30.0, "total": 60.0}
    assert r["floor_ratio"] == 1.5  # (talker + predictor) / floor
    assert r["rtf"] == pytest.approx(0.6 / (10 / 12.5), abs=1e-3)
    assert r["repeats"] == 3
    assert "codec_warm_ms_per_frame" not in r  # runs without a second decode: no warm column
    perf.check_schema({"machine": {}, "checkpoint": "x", "frames": 10, "rows": [r]})
    warm = [dict(run, codec_warm_s=0.2) for run in fake_runs() * 3]
    assert perf.row("ncnn", 2, warm, floor_ms=20.0)["codec_warm_ms_per_frame"] == 20.0


def test_each_run_is_held_against_its_own_bandwidth():
    """Runs that measured the bandwidth around themselves get their own floors; the row reports the medians."""
    runs = [dict(r, read_bandwidth_gbs=bw) for r, bw in zip(fake_runs() * 3, ([10, 10], [20, 20], [40, 40]))]
    weight = 0.3e9  # bytes per frame: floors 30, 15 and 7.5 ms per frame; the loop takes 30 ms per frame every time
    r = perf.row("ncnn", 1, runs, floor_ms=1.0, weight_bytes=weight)
    assert r["floor_ms_per_frame"] == 15.0 and r["floor_ratio"] == 2.0   # medians of (30, 15, 7.5) and (1, 2, 4)
    assert perf.row("ncnn", 1, fake_runs() * 3, floor_ms=20.0, weight_bytes=weight)["floor_ratio"] == 1.5  # no probes


def test_schema_check_refuses_what_tools_cannot_read():
    r = perf.row("ncnn", 1, fake_runs(), 10.0)
    with pytest.raises(ValueError, match="no 'rows'"):
        perf.check_schema({"machine": {}, "checkpoint": "x", "frames": 1})
    with pytest.raises(ValueError, match="lacks"):
        perf.check_schema({"machine": {}, "checkpoint": "x", "frames": 1, "rows": [{k: v for k, v in r.items()
                                                                                    if k != "rtf"}]})


def test_weight_bytes_per_frame_counts_15_predictor_steps(tts):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    d = paths.ncnn_dir("tiny-base")
    size = lambda n: (d / f"{n}.bin").stat().st_size  # noqa: E731
    want = size("talker_decoder") + size("talker_codec_head") + 15 * size("predictor_decoder") + size("predictor_heads")
    assert perf.weight_bytes_per_frame(d) == pytest.approx(want, abs=16)


def test_read_bandwidth_is_positive():
    assert perf.read_bandwidth_gbs(1, gib=0.05, repeats=2) > 0.1


def test_stream_rounds_reports_first_audio_and_whole_streams(tts):
    """The streaming harness runs on tiny and leaves `release_threads` as it found it (no timing asserted)."""
    from qtts_lib import export
    from qtts_lib.runtime.codec import stream

    export.ensure(tts, "tiny-base")
    before = stream.release_threads
    out = perf.stream_rounds(paths.model_dir("tiny-base"), paths.voice_wav(), "Hi there.", frames=3, threads=1,
                             repeats=1, chunks=(1, 2))
    assert stream.release_threads is before
    assert [t["chunk_frames"] for t in out["ttfa"]] == [1, 2] and all(t["ttfa_ms"] > 0 for t in out["ttfa"])
    assert set(out["ms_per_frame"]) == {"synthesize", "stream", "stream_pool_kept", "codec_whole", "codec_pieces_of_4"}
    assert all(len(v) == 1 for v in out["rounds_ms_per_frame"].values())

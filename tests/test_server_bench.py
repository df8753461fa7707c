"""`python -m qtts_lib.bench serve` on tiny-base: the library's first audio timed in the process, then a real server
process, clients at once and staggered, every field of the load table filled (the playback model's underruns, the
refusals apart from the errors, the audio delivered a second against one client's), no errors; the table and the
figure read the result back, and the committed older results too (their missing fields shown as missing)."""
import json

import pytest

from qtts_lib import paths
from qtts_lib.bench import serve


def test_the_playback_model_measures_how_far_a_stream_ran_dry():
    """Playing starts with the first chunk; each later chunk must come before the audio before it has played."""
    tenth = serve.SAMPLE_RATE // 10  # 100 ms of audio a chunk
    assert serve.underrun([0.0], [tenth]) == 0.0
    assert serve.underrun([0.0, 0.1, 0.2, 0.3], [tenth] * 4) == pytest.approx(0.0, abs=1e-12)   # just in time
    assert serve.underrun([0.0, 0.01, 0.02, 0.3], [tenth] * 4) == 0.0                           # ahead
    assert serve.underrun([0.0, 0.15, 0.2, 0.3], [tenth] * 4) == pytest.approx(0.05)            # 50 ms dry once
    assert serve.underrun([0.0, 0.15, 0.4], [tenth] * 3) == pytest.approx(0.2)                  # the largest shortfall
    assert serve.underrun([0.0, 0.02, 0.05], [serve.SAMPLE_RATE // 100, 2 * tenth, tenth]) == pytest.approx(0.01)
    assert serve.ran_dry([0.0, 0.15, 0.4], [tenth] * 3) == pytest.approx((0.2, 0.2))  # after 200 ms of audio
    assert serve.ran_dry([0.0, 0.1], [tenth] * 2) == (0.0, None)


def test_a_503_is_a_refusal_only_when_the_server_says_it_is_overloaded():
    assert serve.error_code(b'{"error": {"code": "overloaded", "message": "server busy"}}') == "overloaded"
    assert serve.error_code(b'{"error": {"code": "engine_stopped"}}') == "engine_stopped"  # an error
    assert serve.error_code(b"<html>busy</html>") is None and serve.retry_after_of("soon") is None


def test_the_tables_read_the_committed_older_results():
    files = sorted((paths.DATA / "bench" / "serve").glob("*.json"))
    assert files
    for f in files:
        doc = json.loads(f.read_text())
        rows = serve.load_table([f])
        assert len(rows) == len(doc["scenarios"]) and rows[0]["scenario"] == "1 at once"
        if "underrun_ms" not in doc["scenarios"][0]:  # older than the playback model: missing, not made up
            assert all(r["underrun_max_ms"] is None and r["refused"] is None and r["delivered_ratio"] is None
                       for r in rows)
        text = serve.table(doc)
        assert "underrun" in text and "1 at once" in text


def test_the_load_bench_runs_against_a_server_process(tts, tmp_path):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    # two places, no waiting (--max-wait 0): of three clients at once at least one is refused with a 503
    result = serve.benchmark(paths.model_dir("tiny-base"), threads=2, precision="fp32", clients=(1, 3),
                             staggered=(3,), stagger=0.2, max_batch=2, max_frames=8, chunk_frames=2, warmup=False,
                             max_wait=0.0, library_repeats=2)
    names = [r["name"] for r in result["scenarios"]]
    assert names == ["1 at once", "3 at once", "3 staggered 0.2 s"]
    for r in result["scenarios"]:
        assert not r["errors"], r["errors"]
        assert r["admitted"] >= 1 and r["admitted"] + r["refused"] == r["clients"]
        admitted = [c for c in r["per_client"] if c["status"] == 200]
        assert all(c["chunks"] > 1 and c["audio_s"] > 0 and c["underrun_ms"] >= 0 for c in admitted)
        assert all(c["status"] == 503 and c["retry_after_s"] > 0 for c in r["per_client"] if c["refused"])
        assert r["ttfa_ms"]["p50"] > 0 and r["gap_ms"]["p50"] > 0 and r["rtf"] > 0 and r["piece_ms"] == 160
        assert r["gap_ms"]["p50"] <= r["gap_ms"]["p99"] <= r["gap_ms"]["max"]
        assert 0 <= r["underrun_ms"]["p50"] <= r["underrun_ms"]["max"] and 0 <= r["ran_dry"] <= r["admitted"]
        assert r["delivered_audio_per_s"] > 0 and r["delivered_ratio"] > 0
    one, three = result["scenarios"][:2]
    assert (one["admitted"], one["refused"], one["delivered_ratio"]) == (1, 0, 1.0)
    assert three["refused"] >= 1 and len(three["retry_after_s"]) == three["refused"]
    assert three["refused_after_ms"]["max"] > 0
    assert result["library_first_audio"]["p50_ms"] > 0 and len(result["library_first_audio"]["ms"]) == 2
    assert result["first_audio_over_library_ms"] == pytest.approx(
        one["ttfa_ms"]["p50"] - result["library_first_audio"]["p50_ms"], abs=0.11)
    streamed = result["streamed_text_first_audio"]
    assert streamed["p50_ms"] > 0 and len(streamed["ms"]) == 2
    assert result["streamed_text_over_library_ms"] == pytest.approx(
        streamed["p50_ms"] - result["library_first_audio"]["p50_ms"], abs=0.11)
    assert result["admit"] == "realtime" and result["server_options"][-4:] == ["--admit", "realtime", "--max-wait",
                                                                              "0"]
    assert "stream(s) at once in real time" in result["server_capacity"]
    assert len(result["load_average_start"]) == 3
    assert result["commit"] and result["machine"]["cores"]
    from qtts_lib.runtime.app import hugepages

    assert result["huge_pages"] is (hugepages.why_not() is None)  # the server started itself again where it can
    out = tmp_path / "serve-after.json"
    out.write_text(json.dumps(result))
    rows = serve.load_table([out])
    assert len(rows) == 3 and {r["run"] for r in rows} == {"after"}
    assert rows[1]["refused"] == three["refused"] and rows[0]["library_first_audio_ms"] > 0
    text = serve.table(result)
    assert "gap p50" in text and "underrun" in text and "refused" in text and "library first audio" in text
    serve.plot([out])

"""`python -m qtts_lib.bench serve` on tiny-base: a real server process, clients at once and staggered, every field
of the load table filled, no errors; the table and the figure read the result back."""
import json

from qtts_lib import paths
from qtts_lib.bench import serve


def test_the_load_bench_runs_against_a_server_process(tts, tmp_path):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    result = serve.benchmark(paths.model_dir("tiny-base"), threads=2, precision="fp32", clients=(1, 2),
                             staggered=(3,), stagger=0.2, max_batch=2, max_frames=8, chunk_frames=2, warmup=False)
    names = [r["name"] for r in result["scenarios"]]
    assert names == ["1 at once", "2 at once", "3 staggered 0.2 s"]
    for r in result["scenarios"]:
        assert not r["errors"], r["errors"]
        assert all(c["status"] == 200 and c["chunks"] > 1 and c["audio_s"] > 0 for c in r["per_client"])
        assert r["ttfa_ms"]["p50"] > 0 and r["gap_ms"]["p50"] > 0 and r["rtf"] > 0 and r["piece_ms"] == 160
        assert r["gap_ms"]["p50"] <= r["gap_ms"]["p99"] <= r["gap_ms"]["max"]
    assert result["commit"] and result["machine"]["cores"]
    from qtts_lib.runtime.app import hugepages

    assert result["huge_pages"] is (hugepages.why_not() is None)  # the server started itself again where it can
    out = tmp_path / "serve-after.json"
    out.write_text(json.dumps(result))
    rows = serve.load_table([out])
    assert len(rows) == 3 and {r["run"] for r in rows} == {"after"}
    assert "gap p50" in serve.table(result)
    serve.plot([out])

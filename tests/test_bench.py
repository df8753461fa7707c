"""qtts_lib.bench: rows from runs, the schema check, the weight count, a child process; the streaming, quality and
overlap harnesses run on tiny. No timing asserted: a benchmark's numbers are its result, never a test."""
import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.bench import child, loop, machine, overlap, quality, results, stream, workload


def fake_runs(frames=10, talker=0.1, predictor=0.2, codec=0.3):
    return [{"frames": frames, "load_s": 1.0, "prefill_s": 0.05, "talker_s": talker, "predictor_s": predictor,
             "codec_s": codec, "peak_rss_gb": 1.5}]


def test_row_is_per_frame_medians_with_the_floor():
    r = loop.row("ncnn", 2, fake_runs() * 3, floor_ms=20.0)
    assert r["ms_per_frame"] == {"talker": 10.0, "predictor": 20.0, "codec": 30.0, "total": 60.0}
    assert r["floor_ratio"] == 1.5  # (talker + predictor) / floor
    assert r["rtf"] == pytest.approx(0.6 / (10 / 12.5), abs=1e-3)
    assert r["repeats"] == 3
    assert "codec_warm_ms_per_frame" not in r  # runs without a second decode: no warm column
    results.check_schema({"machine": {}, "checkpoint": "x", "frames": 10, "rows": [r]})
    warm = [dict(run, codec_warm_s=0.2) for run in fake_runs() * 3]
    assert loop.row("ncnn", 2, warm, floor_ms=20.0)["codec_warm_ms_per_frame"] == 20.0


def test_each_run_is_held_against_its_own_bandwidth():
    """Runs that measured the bandwidth around themselves get their own floors; the row reports the medians."""
    runs = [dict(r, read_bandwidth_gbs=bw) for r, bw in zip(fake_runs() * 3, ([10, 10], [20, 20], [40, 40]))]
    weight = 0.3e9  # bytes per frame: floors 30, 15 and 7.5 ms per frame; the loop takes 30 ms per frame every time
    r = loop.row("ncnn", 1, runs, floor_ms=1.0, weight_bytes=weight)
    assert r["floor_ms_per_frame"] == 15.0 and r["floor_ratio"] == 2.0   # medians of (30, 15, 7.5) and (1, 2, 4)
    assert loop.row("ncnn", 1, fake_runs() * 3, floor_ms=20.0, weight_bytes=weight)["floor_ratio"] == 1.5  # no probes


def test_schema_check_refuses_what_tools_cannot_read():
    r = loop.row("ncnn", 1, fake_runs(), 10.0)
    with pytest.raises(ValueError, match="no 'rows'"):
        results.check_schema({"machine": {}, "checkpoint": "x", "frames": 1})
    with pytest.raises(ValueError, match="lacks"):
        results.check_schema({"machine": {}, "checkpoint": "x", "frames": 1, "rows": [{k: v for k, v in r.items()
                                                                                    if k != "rtf"}]})


def test_weight_bytes_per_frame_counts_15_predictor_steps(tts):
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    d = paths.ncnn_dir("tiny-base")
    size = lambda n: (d / f"{n}.bin").stat().st_size  # noqa: E731
    want = size("talker_decoder") + size("talker_codec_head") + 15 * size("predictor_decoder") + size("predictor_heads")
    assert workload.weight_bytes_per_frame(d) == pytest.approx(want, abs=16)


def test_read_bandwidth_is_positive():
    assert machine.read_bandwidth_gbs(1, gib=0.05, repeats=2) > 0.1


def test_cpu_identity_names_the_generation():
    """'AMD EPYC' names Zen 3, 4 and 5 alike: the family, model and SIMD extensions tell them apart."""
    zen3 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nstepping\t: 1\n"
            "flags\t\t: fpu sse2 avx fma avx2 f16c\n\nprocessor\t: 1\nflags\t\t: avx512f\n")
    got = machine.cpu_identity(zen3)
    assert {k: got[k] for k in ("vendor", "family", "model", "stepping", "simd")} == {
        "vendor": "AuthenticAMD", "family": 25, "model": 1, "stepping": 1, "simd": ["avx2", "fma", "f16c"]}
    assert machine.cpu_identity("flags\t: avx512f avx512_vnni amx_int8\n")["simd"] == ["avx512f", "avx512_vnni",
                                                                                    "amx_int8"]
    assert "cache_mib" not in got  # another machine's text: this machine's caches are not its
    assert {"cpu", "family", "simd"} <= set(machine.describe([1]))


def test_gpu_rows_have_no_floor():
    r = loop.row("ncnn", 1, fake_runs() * 3, floor_ms=None, device="vulkan")
    assert r["device"] == "vulkan" and r["floor_ms_per_frame"] is None and r["floor_ratio"] is None
    results.check_schema({"machine": {}, "checkpoint": "x", "frames": 10, "rows": [r]})


def test_a_child_returns_what_its_function_returned_and_reports_failures():
    assert child.run("machine", "read_bandwidth_gbs", 1, threads=1, gib=0.01, repeats=1) > 0
    with pytest.raises(RuntimeError, match="workload.no_such_function failed"):
        child.run("workload", "no_such_function", 1)


def test_stream_rounds_reports_first_audio_and_whole_streams(tts):
    """The streaming harness runs on tiny (no timing asserted)."""
    from qtts_lib import export

    export.ensure(tts, "tiny-base")
    out = stream.stream_rounds(str(paths.model_dir("tiny-base")), frames=3, threads=1, repeats=1, chunks=(1, 2))
    assert [t["chunk_frames"] for t in out["ttfa"]] == [1, 2] and all(t["ttfa_ms"] > 0 for t in out["ttfa"])
    assert set(out["ms_per_frame"]) == {"synthesize", "stream_1", "stream_2", "stream_4", "codec_whole",
                                        "codec_pieces_of_1", "codec_pieces_of_4"}
    assert all(len(v) == 1 for v in out["rounds_ms_per_frame"].values())
    assert set(out["gapless_from_ms"]) == {"1", "2", "4"} and all(v > 0 for v in out["gapless_from_ms"].values())
    assert set(out["first_audio_parts_ms"]) == {"prompt", "prefill", "first_frame", "first_piece_decode"}


def test_gapless_playback_starts_once_no_piece_comes_after_the_audio_in_front_of_it_has_played():
    second = stream.SAMPLE_RATE
    assert stream.gapless_from_ms([(0.1, second), (0.5, second), (0.9, second)]) == pytest.approx(100.0)
    # the second piece comes 0.3 s after the first one's audio has played: playback starts 0.3 s later
    assert stream.gapless_from_ms([(0.1, second), (1.4, second), (1.5, second)]) == pytest.approx(400.0)
    # a stream slower than playback falls behind piece by piece: the start waits for its lag at the end
    late = [(0.1 + 1.2 * k, second) for k in range(5)]
    assert stream.gapless_from_ms(late) == pytest.approx(100.0 + 4 * 200.0)


def test_calls_profile_times_every_loop_graph(tts):
    """The per-call harness on tiny, int8: every graph of the loop is timed (the predictor's heads inside its
    decoder), the int8 projections alone beside them; the report splits a frame into weights, rest and glue."""
    from qtts_lib import export
    from qtts_lib.bench import calls

    export.ensure(tts, "tiny-base")
    model = paths.model_dir("tiny-base")
    run = calls.profile(str(model), frames=4, threads=1, precision="int8")
    assert set(run["calls"]) == {"talker_decoder", "talker_codec_head", "predictor_decoder"}
    assert run["calls"]["predictor_decoder"]["calls_per_frame"] == 15
    assert set(run["projections_ms_per_call"]) == {"talker_decoder", "predictor_decoder"}
    rep = calls.report([run], calls.weight_bytes_per_call(model / "ncnn", "int8"))
    assert rep["graphs"]["predictor_decoder"]["projections_ms_per_call"] is not None
    assert abs(rep["frame_ms"] - rep["weights_ms"] - rep["rest_ms"]) < 0.11
    # the frame and its calls are means over the same frames: the calls fit in it (a median frame left them 1 ms over)
    assert rep["glue_ms"] >= 0 and rep["calls_ms"] <= rep["frame_ms"] + 0.05


def test_weight_bytes_shrink_with_the_tier(exported):
    sizes = [workload.weight_bytes_per_frame(exported / "ncnn", precision=t) for t in ("fp32", "fp16", "int8")]
    assert sizes[0] > sizes[1] > sizes[2] > 0


def test_quality_harness_on_tiny(exported):
    r = quality.measure(exported, ("fp32", "int8"), frames=6, progress=False)
    assert r["frames"] == 6 and r["codebooks"] == 16
    assert r["tiers"]["fp32"]["agreement"] == [1.0] * 16           # teacher forcing reproduces greedy exactly
    assert r["tiers"]["fp32"]["first_divergent_frame"] is None
    int8 = r["tiers"]["int8"]
    assert len(int8["agreement"]) == 16 and all(0 <= a <= 1 for a in int8["agreement"])
    errs = int8["layer_errors"]["talker_decoder"]
    assert errs["worst_rel"] > 0 and len(errs["rel"]) == len(errs["labels"]) > 10


def test_first_divergence():
    a = np.zeros((5, 16), int)
    b = a.copy()
    assert quality.first_divergence(a, b) is None
    b[3, 7] = 1
    assert quality.first_divergence(a, b) == 3
    assert quality.first_divergence(a, a[:4]) == 4


def test_overlap_study_runs(exported):
    r = overlap.measure(exported, "int8", cores=2, frames=8, repeats=1)
    assert set(r["ms_per_frame"]) == {"sequential", "split", "oversubscribed", "pipeline"}
    assert r["ms_per_frame"]["pipeline"]["per_frame"] > 0 and "machine" in r
    seq = r["ms_per_frame"]["sequential"]
    assert seq["per_frame"] == round(seq["generate"] + seq["codec"], 1) and seq["generate"] > 0
    for name in ("split", "oversubscribed"):   # the codec really ran while the loop generated
        assert r["ms_per_frame"][name]["codec"] > 0


def test_the_loop_harness_runs_both_runtimes_on_tiny(exported):
    r = loop.benchmark(exported, frames=3, thread_counts=[1], repeats=1, progress=False)
    assert {(row["runtime"], row["device"]) for row in r["rows"]} == {("pytorch", "cpu"), ("ncnn", "cpu")}
    assert all(row["ms_per_frame"]["total"] > 0 and row["floor_ratio"] > 0 for row in r["rows"])



def test_a_child_asks_for_huge_pages_only_when_told_and_keeps_other_glibc_tunables(monkeypatch):
    from qtts_lib.runtime.app import hugepages

    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=0:glibc.cpu.x86_rep_movsb_threshold=4096")
    assert child._env(1, huge_pages=True)["GLIBC_TUNABLES"] == \
        "glibc.cpu.x86_rep_movsb_threshold=4096:" + hugepages.TUNABLE
    assert child._env(1)["GLIBC_TUNABLES"] == "glibc.cpu.x86_rep_movsb_threshold=4096"
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert "GLIBC_TUNABLES" not in child._env(1)
    assert child._env(1, huge_pages=True)["GLIBC_TUNABLES"] == hugepages.TUNABLE


def test_the_loop_harness_runs_with_and_without_huge_pages_on_tiny(exported):
    r = loop.benchmark(exported, frames=3, thread_counts=[1], repeats=1, runtimes=("ncnn",), progress=False,
                       huge_pages=(False, True))
    assert [row["huge_pages"] for row in r["rows"]] == [False, True]
    assert [run["huge_pages"] for run in r["raw"]] == [False, True]
    assert all(row["ms_per_frame"]["total"] > 0 for row in r["rows"])


def test_the_loop_harness_times_codec_tiers_on_tiny(exported):
    """The ncnn CPU rows' extra axis: the codec's tier, a row each."""
    r = loop.benchmark(exported, frames=3, thread_counts=[2], repeats=1, runtimes=("ncnn",), precisions=("int8",),
                       codecs=("fp32", "bf16"), progress=False)
    assert sorted(row["codec_precision"] for row in r["rows"]) == ["bf16", "fp32"]
    assert all(row["ms_per_frame"]["codec"] > 0 and row["floor_ratio"] > 0 for row in r["rows"])


def test_the_cores_bench_times_each_spin_alone_in_pairs_and_beside_a_neighbour(exported):
    """`bench cores` on tiny, one setting, no server: every run a fresh `qtts say` that spoke; a pair's two walls and
    the ratios from the same repeat's rows."""
    from qtts_lib.bench import cores

    result = cores.benchmark(paths.model_dir("tiny-base"), settings=((3000, 1),), frames=8, repeats=1, server=False)
    (row,) = result["rows"]
    assert (row["gomp_spincount"], row["threads"]) == (3000, 1) and len(row["runs"]["pair"]) == 2
    assert row["audio_s"] > 0 and row["alone_over_first_alone"] == 1.0
    assert row["pair_over_alone"] == round(row["pair_s"] / row["alone_s"], 2)
    assert "GOMP_SPINCOUNT" in cores.table(result)

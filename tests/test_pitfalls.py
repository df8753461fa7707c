"""The pitfall runners of appendices A and B: child processes, their signals and outputs, two real reproductions."""
import numpy as np
import pytest

from qtts_lib.export import export_module, pitfalls


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGFPE"])
def test_isolated_reports_the_signal(name):
    res = pitfalls.run_isolated(pitfalls.kill_self, name)
    assert res.signal == name
    assert res.status.startswith(f"killed by {name}")
    assert res.result is None


def test_isolated_needs_a_module_level_function():
    def local():
        pass

    with pytest.raises(ValueError, match="module-level"):
        pitfalls.run_isolated(local)


def test_forward_returns_outputs(tmp_path):
    param, binf = pitfalls.write_graph(tmp_path, "relu", pitfalls.RELU_PARAM)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    res = pitfalls.ncnn_isolated(param, binf, [x], in_axes=[233], out_axes=[233], threads=1)
    assert res.returncode == 0 and res.result == {"rets": {"out0": 0}, "empty": []}
    np.testing.assert_array_equal(res.outputs["out0"], np.maximum(x, 0))


def test_borrowed_mat_into_inplace_first_layer_segfaults(tmp_path):
    relu = pitfalls.write_graph(tmp_path, "relu", pitfalls.RELU_PARAM)
    assert pitfalls.run_isolated(pitfalls.inplace_first_layer, *relu, "borrowed").signal == "SIGSEGV"
    fixed = pitfalls.run_isolated(pitfalls.inplace_first_layer, *relu, "to_mat")
    assert fixed.returncode == 0 and fixed.result == {"ret": 0, "max_abs": 0.0}


def test_hf_repeat_kv_does_not_load(tmp_path):
    attn = pitfalls.Attention(pitfalls.HF_REPEAT).eval()
    info = export_module(attn, "attn", pitfalls.attn_inputs(7, 0), pitfalls.attn_inputs(11, 1), tmp_path)
    res = pitfalls.run_isolated(pitfalls.load_graph, *pitfalls.graph(tmp_path, info))
    assert res.returncode == 0
    assert res.result["load_param"] == -1


def test_table_has_one_row_per_finding():
    rows = [pitfalls.Finding("a", "A", "pnnx 1", True, "boom", "do B"),
            pitfalls.Finding("c", "C", "pnnx 1", False, "fine", "none")]
    df = pitfalls.table(rows)
    assert list(df.columns) == ["pitfall", "symptom", "fix", "reproduces on pnnx 1?"]
    assert list(df["reproduces on pnnx 1?"]) == ["yes", "no"]

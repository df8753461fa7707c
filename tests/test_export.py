"""The .param tools (reading, leftover check, rope-widening and KV-cache rewrites) and the Mat helpers."""
import gc

import numpy as np
import pytest

from qtts_lib import export
from qtts_lib.export import kvcache
from qtts_lib.runtime.binding.net import from_mat, make_net, to_mat

SMALL = """7767517
5 7
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
pnnx.Expression          pnnx_expr_0              1 1 in0 2 expr=mul(@0,2)
Tensor.expand            expand_0                 1 1 2 3 sizes=(1,2,3)
BinaryOp                 add_0                    2 1 3 in1 out0 0=0
"""

ATTN = """7767517
10 16
Input                    in0                      0 1 in0
Input                    in1                      0 1 in1
Input                    in2                      0 1 in2
Split                    splitncnn_2              1 2 in2 9 10
Input                    in3                      0 1 in3
Split                    splitncnn_3              1 2 in3 11 12
Concat                   cat_0                    2 1 9 10 13 0=0
Concat                   cat_1                    2 1 11 12 14 0=0
RotaryEmbed              rope_0                   3 1 in0 13 14 15 0=0
SDPA                     sdpa_0                   4 1 15 15 15 in1 out0 5=1 6=0
"""


def test_parse_and_leftovers():
    info = export.parse_param(SMALL)
    assert [layer.type for layer in info.layers][:2] == ["Input", "Input"]
    assert info.input_blobs == ["in0", "in1"]
    assert [layer.type for layer in info.leftovers] == ["pnnx.Expression", "Tensor.expand"]
    assert not export.parse_param(ATTN).leftovers


def test_format_recomputes_counts():
    info = export.parse_param(SMALL)
    text = export.format_param(info.magic, info.layers[:2] + info.layers[4:])
    assert text.splitlines()[1] == "3 4"  # in0, in1, 3, out0


def test_drop_rope_widening():
    text, changed = export.drop_rope_widening(ATTN)
    info = export.parse_param(text)
    assert changed == ["in2", "in3"]
    assert info.counts["Concat"] == 0
    rope = next(layer for layer in info.layers if layer.type == "RotaryEmbed")
    producers = {b: layer for layer in info.layers for b in layer.outputs}
    assert [producers[b].inputs[0] for b in rope.inputs[1:]] == ["in2", "in3"]
    n_blobs = len({b for layer in info.layers for b in layer.inputs + layer.outputs})
    assert text.splitlines()[1] == f"{len(info.layers)} {n_blobs}"


def test_add_kv_cache():
    text = kvcache.add_kv_cache(ATTN)
    info = export.parse_param(text)
    sdpa = next(layer for layer in info.layers if layer.type == "SDPA")
    assert sdpa.inputs[-2:] == ["cache_k_in_0", "cache_v_in_0"]
    assert sdpa.outputs == ["out0", "cache_k_out_0", "cache_v_out_0"]
    assert sdpa.params[-1] == "7=1"
    cache_input = next(layer for layer in info.layers if layer.name == "kv_cache_in")
    assert cache_input.type == "Input" and cache_input.outputs == ["cache_k_in_0", "cache_v_in_0"]
    assert kvcache.count_caches(text) == 1 and kvcache.count_caches(ATTN) == 0
    with pytest.raises(ValueError, match="already cached"):
        kvcache.add_kv_cache(text)
    with pytest.raises(ValueError, match="no SDPA"):
        kvcache.add_kv_cache(SMALL)


def test_to_mat_owns_its_memory():
    """A Mat from a temporary (non-contiguous -> copied) array stays right after the temporary is gone."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.standard_normal((300, 64)).astype(np.float32)
        mat = to_mat(x.T)  # the transpose forces a temporary contiguous copy inside to_mat
        expected = x.T.copy()
        del x
        gc.collect()
        _ = [np.ones(64 * 300, np.float32) for _ in range(4)]  # reuse freed memory
        np.testing.assert_array_equal(from_mat(mat), expected)


def test_from_mat_reads_padded_channels():
    """A 3-D or 4-D Mat's channels start at a 16-byte step (cstep > h*w when h*w*4 is not a multiple of 16): the
    copy holds the values, not the padding between channels."""
    rng = np.random.default_rng(1)
    for shape in [(3, 5), (2, 3, 5), (4, 2, 3, 5), (3, 1, 128)]:
        x = rng.standard_normal(shape).astype(np.float32)
        mat = to_mat(x)
        y = from_mat(mat)
        assert y.flags.c_contiguous and y.dtype == np.float32
        np.testing.assert_array_equal(y, x)
    assert to_mat(np.ones((2, 3, 5), np.float32)).cstep == 16  # the case above that pads


def test_to_mat_dtypes_and_batch_axis():
    ids = np.arange(6, dtype=np.int64)
    np.testing.assert_array_equal(np.asarray(to_mat(ids).numpy()).view(np.int32), ids.astype(np.int32))
    x = np.ones((1, 5, 3), np.float32)
    m = to_mat(x, batch_axis=0)
    assert (m.h, m.w) == (5, 3)
    assert from_mat(m, 0).shape == (1, 5, 3)
    with pytest.raises(ValueError, match="batch axis"):
        to_mat(np.ones((2, 5, 3), np.float32), batch_axis=0)
    with pytest.raises(TypeError):
        to_mat(np.ones(3, np.complex64))


def test_net_with_an_inplace_first_layer(tmp_path):
    """Input -> ReLU (in place): crashes with a borrowed Mat (appendix A), fine with to_mat."""
    (tmp_path / "relu.param").write_text("7767517\n2 2\nInput in0 0 1 in0\nReLU relu 1 1 in0 out0\n")
    (tmp_path / "relu.bin").write_bytes(b"")
    net = make_net(tmp_path / "relu.param", tmp_path / "relu.bin", threads=1)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    ex = net.create_extractor()
    ex.input("in0", to_mat(x))
    _, out = ex.extract("out0")
    np.testing.assert_array_equal(from_mat(out), np.maximum(x, 0))

"""The .param rewrites of runtime.vulkan (chapter 10), on small hand-written graphs."""
from qtts_lib.runtime.rewrites import gpu as vulkan

KV = """7767517
5 9
Input                    in0                      0 1 in0
Input                    kv_cache_in              0 4 cache_k_in_0 cache_v_in_0 cache_k_in_1 cache_v_in_1
SDPA sdpa_0 6 3 in0 in0 in0 in0 cache_k_in_0 cache_v_in_0 a cache_k_out_0 cache_v_out_0 7=1
SDPA sdpa_1 6 3 a a a in0 cache_k_in_1 cache_v_in_1 out0 cache_k_out_1 cache_v_out_1 7=1
Noop                     n                        0 0
"""


def header(text):
    return [int(x) for x in text.splitlines()[1].split()]


def test_packed_cache_prefill_keeps_inputs_and_concats_outputs():
    prefill, _ = vulkan.packed_cache_params(KV)
    last = prefill.splitlines()[-1].split()
    assert last[:4] == ["Concat", "cache_concat", "4", "1"]
    assert last[4:9] == ["cache_k_out_0", "cache_v_out_0", "cache_k_out_1", "cache_v_out_1", "cache_all_out"]
    assert "kv_cache_in" in prefill
    assert header(prefill) == [6, 12]


def test_packed_cache_step_slices_one_input():
    _, step = vulkan.packed_cache_params(KV)
    lines = [line.split() for line in step.splitlines()[2:]]
    assert "kv_cache_in" not in step
    assert lines[1] == ["Input", "cache_all_in", "0", "1", "cache_all_in"]
    assert lines[2][:5] == ["Slice", "cache_slice", "1", "4", "cache_all_in"]
    assert lines[2][-2:] == ["-23300=4,-233,-233,-233,-233", "1=0"]
    assert header(step) == [7, 13]


HEADS = """7767517
4 5
Input                    in0                      0 1 in0
Split                    splitncnn_0              1 2 in0 1 2
Gemm                     gemm_0                   1 1 1 out0 8=4 9=2
Gemm                     gemm_1                   1 1 2 out1 8=4 9=2
"""
DEC = """7767517
2 2
Input                    in0                      0 1 in0
RMSNorm                  rmsn                     1 1 in0 out0 0=2
"""


def test_fused_predictor_feeds_decoder_output_to_heads():
    text = vulkan.fused_predictor_param(DEC, HEADS)
    lines = [line.split() for line in text.splitlines()[2:]]
    assert [f[0] for f in lines] == ["Input", "RMSNorm", "Split", "Split", "Gemm", "Gemm"]
    assert lines[1][-2] == "dec_out"
    assert lines[2][4:] == ["dec_out", "out0", "out0_0"]
    assert lines[3][4:7] == ["out0_0", "h_1", "h_2"]
    assert lines[4][4:6] == ["h_1", "logits_0"] and lines[5][4:6] == ["h_2", "logits_1"]
    assert header(text) == [6, 8]

"""Fewer round trips on a GPU: the generation loop's graphs rewritten for Vulkan. Introduced in 10.

The pip binding has no VkMat: every `extract` is one blocking submission plus a download, and
every CPU Mat given to `input` is an upload. The CPU loop (chapters 05-07) extracts the output
and then each layer's K and V cache separately (2·layers + 1 submissions per decoder call) and
calls three graphs per predictor step. On a GPU that is per-call overhead, not arithmetic.
Two `.param` rewrites, neither touching the weights, cut it down:

- `packed_cache_params`: one `Concat` gathers every layer's K/V cache into one output blob and,
  for steps, one `Slice` splits an input blob back into the per-layer caches: a decoder step is
  one forward + two downloads (hidden, caches) instead of 2·layers + 1 submissions.
- `fused_predictor_param`: the code predictor's decoder (no cache) and its 15 heads in one
  graph. The predictor's sequence is at most 17 positions, so recomputing it each step costs the
  GPU microseconds and removes the cache traffic: one upload + one extract per codebook.

(The third saving needs no rewrite: the embedding tables are read once into numpy, on every device, so a lookup is
an index, not a graph call: `pipeline.embeddings`.) `rewrites.gpu_layers` goes further (fewer layers, GEMV steps,
one upload and one download per call) and uses `fused_predictor_param`; `pipeline.loop` runs its forms on a GPU
(`GpuDecoder`, `GemvCodePredictor`). `packed_cache_params` stays for chapter 10's comparison.
"""
from __future__ import annotations

from ..binding.param import ParamLayer, format_param, parse_param


def packed_cache_params(kv_text: str) -> tuple[str, str]:
    """A `<name>_kv.param` -> (prefill, step) params whose caches travel as one blob.

    Both end in `Concat(cache_k_out_0, cache_v_out_0, ...) -> cache_all_out` along axis 0 (heads).
    The step param replaces the caches' `Input` by `Input cache_all_in` + an equal `Slice` along
    axis 0. Prefill keeps the per-layer empty cache inputs (a Slice of an empty Mat is not defined)."""
    info = parse_param(kv_text)
    layers = info.layers
    cache_input = next(lyr for lyr in layers if lyr.type == "Input" and lyr.outputs[0].startswith("cache_k_in_"))
    ins = cache_input.outputs
    outs = [name.replace("_in_", "_out_") for name in ins]
    concat = ParamLayer("Concat", "cache_concat", outs, ["cache_all_out"], ["0=0"])
    prefill = format_param(info.magic, layers + [concat])
    split = ParamLayer("Slice", "cache_slice", ["cache_all_in"], list(ins),
                       [f"-23300={len(ins)}," + ",".join(["-233"] * len(ins)), "1=0"])
    at = layers.index(cache_input)
    packed_input = ParamLayer("Input", "cache_all_in", [], ["cache_all_in"], [])
    step_layers = layers[:at] + [packed_input, split] + layers[at + 1 :]
    return prefill, format_param(info.magic, step_layers + [concat])


def fused_predictor_param(decoder_text: str, heads_text: str) -> str:
    """predictor_decoder.param (no cache) + predictor_heads.param -> one graph.

    The heads' input is the decoder's `out0` (every position: a head on 17 rows costs nothing);
    the heads' blobs are prefixed `h_`, their outputs renamed `logits_0` .. `logits_14`. Weights
    are read in layer order, so the merged .bin is the decoder's followed by the heads'."""
    info = parse_param(decoder_text)
    dec = info.layers
    heads = parse_param(heads_text).layers
    head_in = next(lyr for lyr in heads if lyr.type == "Input").outputs[0]
    rename = {head_in: "out0"}
    merged = []
    for lyr in heads:
        if lyr.type == "Input":
            continue
        for b in lyr.inputs + lyr.outputs:
            if b not in rename:
                rename[b] = f"logits_{b[3:]}" if b.startswith("out") else f"h_{b}"
        merged.append(ParamLayer(lyr.type, f"h_{lyr.name}", [rename[b] for b in lyr.inputs],
                                 [rename[b] for b in lyr.outputs], list(lyr.params)))
    # out0 now feeds the heads and is extracted too: route it through a Split
    producer = next(lyr for lyr in dec if "out0" in lyr.outputs)
    producer.outputs = ["dec_out" if b == "out0" else b for b in producer.outputs]
    consumers = sum(lyr.inputs.count("out0") for lyr in merged)
    split = ParamLayer("Split", "split_dec_out", ["dec_out"], ["out0"] + [f"out0_{i}" for i in range(consumers)], [])
    k = 0
    for lyr in merged:
        for j, b in enumerate(lyr.inputs):
            if b == "out0":
                lyr.inputs[j], k = f"out0_{k}", k + 1
    return format_param(info.magic, dec + [split] + merged)

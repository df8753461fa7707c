"""Several sequences through one cached decoder call: sequences folded into the attention's head axis. Introduced
in 17.

A cached decoder (`rewrites.kv_cache`) takes rows (R, hidden); everything but attention treats rows independently,
so B sequences of L positions each are simply R = B*L rows, sequence-major, and every projection reads its weights
once for all of them (the loop is memory-bound: that is the point). Attention is the one place rows meet. pnnx's
graph computes it over heads: q (heads, R, head_dim), k and v (kv_heads, R, head_dim), and SDPA lets every row see
every cached row. The rewrite makes each sequence its own group of heads instead:

    q (heads, B*L, d) -> Reshape (heads, B, L, d) -> Permute -> (B, heads, L, d) -> Reshape (B*heads, L, d)

(k and v the same with kv_heads), SDPA over B*heads heads, and the inverse on its output, back to (B*L, hidden)
rows. Head h of sequence b is head b*heads + h; with grouped-query attention its key/value head is
(b*heads + h) // (heads/kv_heads) = b*kv_heads + h // (heads/kv_heads): sequence b's own. Each sequence's cache is
its kv_heads channels of the cache blobs (B*kv_heads, past, d), so a sequence joins or leaves a batch by adding or
removing channels (`binding.cached.KvCache`: `merge`, `keep`).

Every sequence of a call has the same number of cached positions (the blobs are one array). Sequences of different
lengths are left-padded; the mask, per head (B*heads, L, past+L), hides each sequence's padding from it. At B = 1
the reshapes are the identity and the graph computes what the exported one does.

L is read from the mask's height (`1h` in the Reshape's shape expression, the mask as its second input), so one
graph serves a prefill (B = 1, L = prompt), the talker's steps (B sequences, L = 1) and the code predictor's
(B sequences, L = 2, then L = 1).

The other arrangement, every sequence in one shared cache with a block-diagonal mask, needs no rewrite, but each
row then attends over all B sequences' positions: B times the attention work and a cache that keeps a finished
sequence's rows until it is rebuilt. Chapter 17 measures both.
"""
from __future__ import annotations

from ..binding.graph import Graph, params_dict
from ..binding.param import ParamLayer


def fold_batch(text: str, heads: int) -> str:
    """A cached decoder's `.param` (`rewrites.kv_cache.add_kv_cache`) with sequences folded into the head axis of
    every SDPA layer (module docstring). `heads`: the query heads of one sequence (the config's
    num_attention_heads). Raises ValueError when the graph is not the pattern pnnx writes."""
    g = Graph(text)
    sdpas = [lyr for lyr in g.layers if lyr.type == "SDPA"]
    if not sdpas:
        raise ValueError("no SDPA layer in this .param")
    for sdpa in sdpas:
        if len(sdpa.inputs) != 6 or params_dict(sdpa).get("5") != "1":
            raise ValueError(f"{sdpa.name}: expected a cached SDPA with a mask (6 inputs, 5=1)")
        q, k, v, mask = sdpa.inputs[:4]
        out = sdpa.outputs[0]
        # the output's way back to rows: Permute (heads, R, d) -> (R, heads, d), then Reshape to (R, hidden)
        (permute,) = g.consumers(out)
        (reshape,) = g.consumers(permute.outputs[0])
        if permute.type != "Permute" or params_dict(permute).get("0") != "2" or reshape.type != "Reshape":
            raise ValueError(f"{sdpa.name}: its output does not go back to rows through Permute(0=2) -> Reshape")
        rows = reshape.outputs[0]

        at = g.layers.index(sdpa)
        split_outs = [g.fresh(f"{mask}_fold") for _ in range(4)]
        new = [ParamLayer("Split", g.fresh("fold_split"), [mask], split_outs, [])]
        folded = []
        for blob, shape_from in zip((q, k, v), split_outs[1:]):
            a, b, c = g.fresh(f"{blob}_seq"), g.fresh(f"{blob}_swap"), g.fresh(f"{blob}_fold")
            new += [
                # (heads, B*L, d) -> (heads, B, L, d): L is the mask's height
                ParamLayer("Reshape", g.fresh("fold_split_rows"), [blob, shape_from], [a], ['6="0w,1h,//(0h,1h),0c"']),
                ParamLayer("Permute", g.fresh("fold_swap"), [a], [b], ["0=6"]),  # WHCD: swap c and d
                ParamLayer("Reshape", g.fresh("fold_heads"), [b], [c], ['6="0w,0h,*(0d,0c)"']),
            ]
            folded.append(c)
        sdpa.inputs = folded + [split_outs[0]] + sdpa.inputs[4:]
        g.layers[at:at] = new

        # SDPA's (B*heads, L, d) -> (B, heads, L, d) -> (B, L, heads, d) -> rows (B*L, heads*d)
        a, b = g.fresh(f"{out}_seq"), g.fresh(f"{out}_swap")
        back = [
            ParamLayer("Reshape", g.fresh("unfold_heads"), [out], [a], [f'6="0w,0h,{heads},//(0c,{heads})"']),
            ParamLayer("Permute", g.fresh("unfold_swap"), [a], [b], ["0=2"]),  # WDHC: swap d and h
            ParamLayer("Reshape", g.fresh("unfold_rows"), [b], [rows], ['6="*(0w,0h),*(0d,0c)"']),
        ]
        at = g.layers.index(permute)
        g.layers.remove(permute)
        g.layers.remove(reshape)
        g.layers[at:at] = back
    return g.text()

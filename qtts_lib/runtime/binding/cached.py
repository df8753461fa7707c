"""Run a cache-enabled decoder: prefill once, then one position per step. Introduced in 05.

Contract of a `<name>_kv.param` (written by `rewrites.kv_cache.add_kv_cache`, chapter 05):
  inputs  in0 embeds (1, L, hidden), in1 mask (L, past+L), in2/in3 cos/sin (L, head_dim/2),
          cache_k_in_i / cache_v_in_i for every SDPA layer i;
  outputs out0 hidden (1, L, hidden), cache_k_out_i / cache_v_out_i.
Prefill feeds empty caches and a causal mask; a step feeds the caches of the previous call
untouched, a zero mask (1, past+1) and the rope rows of the absolute position.

The caches never leave ncnn: they are extracted with `type=1` into Mats we keep and feed back.
A numpy round trip, or the tuple form `ret, m = ex.extract(name)` (which clones), loses the
backend's private layout and spare capacity (see chapter 05). Where the layer appends in place (the CPU's SDPA,
into a cache with room: `KvCache.appends_in_place`), a step extracts only its output and the Mats fed in are the
caches out, each one position longer.

The cache of one sequence is a `KvCache`, held by whoever runs the sequence (the generation loop keeps one per
utterance), so one `KvCacheNet` serves any number of sequences. A cache is the set of blobs to feed next time,
whatever their layout: one pair per layer, or on a GPU all layers in one blob (`rewrites.gpu.packed_cache_params`).

Several sequences decoded together (chapter 17) share one `KvCache`: the graph is `rewrites.batch.fold_batch`'s,
each sequence its own group of kv_heads channels of every cache blob, all with the same number of positions
(`past`); a shorter one is left-padded and `lengths` says how many positions are each sequence's own. The inputs
then are B·L rows (sequence-major), cos/sin rows at each sequence's own positions, and a per-head mask
(B·heads, L, past+L) that hides each sequence's padding. `KvCache.join` and `KvCache.keep` move sequences in and
out, reading and writing the SDPA layer's private layout (`binding.cache_layout`), in place: the batch's Mats keep
memory for every sequence it may hold (`reserve`), a joining sequence writes only its own channels, one that leaves
hands its channels to the last sequence, and the padding all share goes by whole tiles. `merge` is the plain way
(every blob through numpy into new Mats), what the Vulkan layout, which keeps no room, uses.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import ncnn
import numpy as np

from ..errors import BatchError
from . import cache_layout, rope
from .net import run, to_mat

POSITIONS_KEPT = 64  # `KvCacheNet.position_inputs`: enough for the code predictor's 17 positions, bounded for a talker
ROOM_STEP = 256      # positions a reserved cache grows by when it runs out (one copy of the batch every 256 frames)
TRIM_POSITIONS = 64  # shared padding a batch drops once it is this long (the drop moves every position held)


def cache_blob_names(i: int) -> tuple[str, str, str, str]:
    """The four blobs of SDPA layer i's cache: K and V in, K and V out."""
    return f"cache_k_in_{i}", f"cache_v_in_{i}", f"cache_k_out_{i}", f"cache_v_out_{i}"


def layer_cache_outputs(layers: int) -> list[str]:
    """Every layer's K and V cache outputs, in order."""
    return [b for i in range(layers) for b in cache_blob_names(i)[2:]]


class KvCache:
    """The Mats to feed next time (blob name -> Mat) and the positions they hold: `past` in the blobs, of which
    `lengths[b]` are sequence b's own (one sequence: `lengths == [past]`; module docstring)."""

    def __init__(self, layers: int, sequences: int = 1, device: str = "cpu"):
        self.blobs = {b: ncnn.Mat() for i in range(layers) for b in cache_blob_names(i)[:2]}
        self.past = 0
        self.lengths = [0] * sequences
        self.device = device  # whose SDPA layer wrote the blobs: their layout (`cache_layout.probe`)
        self.slots = 0        # sequences the blobs have memory for, once `reserve`d (0: the layer's own Mats)

    @property
    def blobs(self) -> dict[str, ncnn.Mat]:
        return self._blobs

    @blobs.setter
    def blobs(self, mats: dict[str, ncnn.Mat]) -> None:
        self._blobs = mats
        self._room: int | None = None  # the least capacity of these Mats (`appends_in_place`), read when first asked

    @property
    def sequences(self) -> int:
        return len(self.lengths)

    @property
    def padding(self) -> list[int]:
        """Per sequence, the positions at the front that are not its own."""
        return [self.past - n for n in self.lengths]

    @property
    def layout(self) -> cache_layout.CacheLayout:
        return cache_layout.probe(self.device)

    @property
    def in_place(self) -> bool:
        """Whether sequences join and leave this cache in place (the CPU's layout, which keeps room to spare); a
        Vulkan download has none, and every join or leave builds new Mats through numpy."""
        return self.layout.spare

    def grow(self, outputs: Sequence[str], mats: Sequence[ncnn.Mat], positions: int) -> None:
        """Take a call's cache outputs (`cache_*_out*`) as the next call's inputs."""
        self.blobs = {name.replace("_out", "_in"): m for name, m in zip(outputs, mats)}
        self.past += positions
        self.lengths = [n + positions for n in self.lengths]

    def appends_in_place(self, positions: int) -> bool:
        """Whether a call of `positions` new positions writes them into these very Mats: this build's layer appends
        in place (`cache_layout.CacheLayout.appends`) and every Mat has room for them. Such a call need not hand
        its caches back (`extended` says they grew): fewer extracts a step, the same numbers."""
        if not self.past:
            return False
        try:
            layout = self.layout
        except BatchError:  # a layout qtts cannot read: the caches come back from every call
            return False
        if self._room is None:  # a Mat's capacity changes only with the Mat: asked every step, read once
            self._room = min(layout.capacity(m) for m in self.blobs.values())
        return layout.appends and self._room >= self.past + positions

    def extended(self, positions: int) -> None:
        """After a call that appended `positions` positions in place (`appends_in_place`): the Mats hold them."""
        for m in self.blobs.values():
            m.h += positions
        self.past += positions
        self.lengths = [n + positions for n in self.lengths]

    def arrays(self) -> dict[str, np.ndarray]:
        """Every blob as numpy (channels, past, head_dim), read from the SDPA layer's layout."""
        layout = self.layout
        return {name: layout.read(m, _kind(name)) for name, m in self.blobs.items()}

    def copy(self) -> KvCache:
        """An independent copy (same layout, same room): the Mats' memory copied tile by tile. (`Mat.clone` would
        keep only the positions held, which the SDPA layer then reads with the wrong stride.)"""
        out = KvCache(0, device=self.device)
        layout = self.layout
        if self.in_place:
            out.blobs = {n: layout.resized(m, layout.capacity(m)) for n, m in self.blobs.items()}
        else:  # a Vulkan download (maybe packed): through numpy
            out.blobs = {n: layout.write(a, _kind(n)) for n, a in self.arrays().items()}
        out.past, out.lengths = self.past, list(self.lengths)
        return out

    # ------------------------------------------------------------ sequences joining and leaving
    def reserve(self, sequences: int, positions: int) -> None:
        """Memory for `sequences` sequences of `positions` positions in every blob (copied once, tile by tile), so
        that sequences join by writing their own channels (`join`) and every step appends in place. The layer
        would otherwise allocate Mats that fit exactly the channels in use."""
        layout = self.layout
        kv = self._kv_heads()
        self.blobs = {n: layout.resized(m, positions, sequences * kv) for n, m in self.blobs.items()}
        self.slots = sequences

    def ensure(self, length: int) -> None:
        """Before a call of `length` new positions: room for them, so that the SDPA layer appends in place and
        the memory kept for joining sequences stays (a reserved cache only; ROOM_STEP more at a time)."""
        if self.slots and self.past + length > min(self.layout.capacity(m) for m in self.blobs.values()):
            self.reserve(self.slots, self.past + length + ROOM_STEP)

    def join(self, other: KvCache, slots: int) -> None:
        """Append `other`'s sequences after this cache's, each left-padded to the common past. In place: this
        cache's sequences stay where they are (moved later by whole tiles only when `other` holds more
        positions), `other`'s channels are written into memory kept for `slots` sequences (`reserve`), so a join
        costs about one copy of the joining sequence, not of the batch. Through numpy (`merge`) where the layout
        keeps no room (a Vulkan download)."""
        if other.device != self.device:
            raise ValueError("caches of different devices cannot be merged")
        if other.past == 0 or self.past == 0:
            raise ValueError("only prefilled caches can be merged")
        if not self.in_place:
            merged = merge([self, other])
            self.blobs, self.past, self.lengths = merged.blobs, merged.past, merged.lengths
            return
        layout = self.layout
        kv = self._kv_heads()
        tiles = -(-max(0, other.past - self.past) // layout.tile)
        past = self.past + tiles * layout.tile
        sequences = self.sequences + other.sequences
        if self.slots < sequences or min(layout.capacity(m) for m in self.blobs.values()) < past + 1:
            self.reserve(max(sequences, slots), past + ROOM_STEP)
        planes = other.arrays()
        for name, m in self.blobs.items():
            if tiles:
                layout.shift(m, tiles)
            at = m.c
            m.c = at + other.sequences * kv
            layout.place(m, _kind(name), at, planes[name], past - other.past)
            m.h = past
        self.past = past
        self.lengths = self.lengths + list(other.lengths)

    def keep(self, indices: Sequence[int]) -> None:
        """Keep only the sequences at `indices` (in that order), and drop the padding they all share (in place:
        only the channels that change places move; the shared padding goes by whole tiles once it reaches
        TRIM_POSITIONS, so that dropping it is rare)."""
        if not indices:
            raise ValueError("a cache keeps at least one sequence")
        if not self.in_place:
            return self._rebuild(indices)
        layout = self.layout
        kv = self._kv_heads()
        moves = [(j, i) for j, i in enumerate(indices) if i != j]
        lengths = [self.lengths[i] for i in indices]
        tiles = (self.past - max(lengths)) // layout.tile
        tiles = tiles if tiles * layout.tile >= TRIM_POSITIONS or len(indices) == 1 else 0
        for m in self.blobs.values():
            if moves:
                layout.move(m, moves, kv)
            m.c = len(indices) * kv
            if tiles:
                layout.shift(m, -tiles)
        self.lengths = lengths
        self.past -= tiles * layout.tile

    def _rebuild(self, indices: Sequence[int]) -> None:
        past = max(self.lengths[i] for i in indices)
        arrays, kv = self.arrays(), self._kv_heads()
        layout = self.layout
        self.blobs = {name: layout.write(np.concatenate([a[i * kv:(i + 1) * kv, self.past - past:] for i in indices]),
                                         _kind(name)) for name, a in arrays.items()}
        self.lengths = [self.lengths[i] for i in indices]
        self.past = past

    def _kv_heads(self) -> int:
        mat = next(iter(self.blobs.values()))
        channels = mat.c * mat.elempack  # a Vulkan download may come packed
        if channels % self.sequences:
            raise ValueError(f"{channels} cache channels do not split into {self.sequences} sequences")
        return channels // self.sequences


def survivors(stopped: Sequence[bool]) -> list[int]:
    """The order a batch keeps its sequences in when those `stopped` leave: each one that stays keeps its place,
    except that the last ones fill the holes (so a leave moves one sequence's channels, not every later one's)."""
    alive = [i for i, s in enumerate(stopped) if not s]
    tail = [i for i in alive if i >= len(alive)]
    return [j if not stopped[j] else tail.pop(0) for j in range(len(alive))]


def _kind(blob: str) -> str:
    return "k" if blob.startswith("cache_k") else "v"


def merge(caches: Sequence[KvCache]) -> KvCache:
    """One cache holding the sequences of `caches` in order, each left-padded to the longest (module docstring):
    every blob read into numpy and written back (new Mats; `KvCache.join` is the in-place way)."""
    if any(c.past == 0 for c in caches):
        raise ValueError("only prefilled caches can be merged")
    past = max(c.past for c in caches)
    if len({c.device for c in caches}) != 1:
        raise ValueError("caches of different devices cannot be merged")
    layout = cache_layout.probe(caches[0].device)
    arrays = [c.arrays() for c in caches]
    out = KvCache(0, device=caches[0].device)
    blobs = {}
    for name in caches[0].blobs:
        parts = []
        for c, a in zip(caches, arrays):
            x = a[name]
            parts.append(np.pad(x, ((0, 0), (past - c.past, 0), (0, 0))) if c.past < past else x)
        blobs[name] = layout.write(np.concatenate(parts), _kind(name))
    out.blobs = blobs
    out.past = past
    out.lengths = [n for c in caches for n in c.lengths]
    return out


def batch_mask(cache: KvCache, length: int, heads: int) -> np.ndarray:
    """The attention mask of `length` new positions per sequence after `cache`: causal (length, past+length) when
    no sequence is padded, else per head (sequences·heads, length, past+length) with each sequence's padding hidden."""
    causal = rope.causal_mask(length, cache.past)
    padding = cache.padding
    if not any(padding):
        return causal
    mask = np.repeat(np.broadcast_to(causal, (cache.sequences,) + causal.shape).copy(), heads, axis=0)
    for b, pad in enumerate(padding):
        mask[b * heads:(b + 1) * heads, :, :pad] = -np.inf
    return mask


class KvCacheNet:
    """A cached decoder: `forward(embeds, cache)` runs L new positions after the cache's and grows the cache.

    `prefill` is the graph of one sequence for any number of positions; `step`, where given, a faster form of the
    same graph over the same weights for one position after the first call (`pipeline.precision` picks both per
    tier). `packed`: the graphs take and give every layer's cache as one blob (Vulkan: one download instead of
    2·layers). `batched` makes the graph that takes several sequences at once (`rewrites.batch`, the sequences
    folded into the attention heads; `heads`: the query heads of one sequence): it is loaded the first time a call
    has several sequences, or a padded one (`prepare_batches` loads it ahead), and one sequence alone keeps running
    the graph without the fold, whose reshapes and permutes it does not need (about 2 ms of a full-size talker step).
    The two graphs give one sequence the same numbers and caches of the same layout. `device` is where the nets run
    (their caches' layout); `logits`: the graph also has heads (outputs logits_0, logits_1, ...: `forward(output=)`)."""

    def __init__(self, prefill: ncnn.Net, layers: int, head_dim: int, theta: float, step: ncnn.Net | None = None,
                 packed: bool = False, name: str = "decoder", heads: int | None = None, device: str = "cpu",
                 logits: bool = False, batched: Callable[[], ncnn.Net] | None = None):
        self.prefill_net, self.step_net, self.layers, self.device = prefill, step, layers, device
        self.logits = logits
        self._make_batched, self._batched = batched, None
        self.head_dim, self.theta, self.name, self.heads = head_dim, theta, name, heads
        self.cache_outputs = ["cache_all_out"] if packed else layer_cache_outputs(layers)
        self._positions: dict[tuple[int, int], dict[str, ncnn.Mat]] = {}

    def position_inputs(self, past: int, length: int) -> dict[str, ncnn.Mat]:
        """One sequence's mask, cos and sin for `length` positions after `past`, as Mats, kept for the positions
        that come back: the code predictor runs positions 0..16 again every frame (building them costs about
        0.1 ms a call, a tenth of the glue of a frame). At most `POSITIONS_KEPT` are kept, the oldest dropped.
        Sharing a Mat between calls is safe: ncnn copies a shared input before a layer works on it in place."""
        key = (past, length)
        mats = self._positions.get(key)
        if mats is None:
            cos, sin = rope.tables(self.head_dim, self.theta, past, length)
            mats = {"in1": to_mat(rope.causal_mask(length, past)), "in2": to_mat(cos), "in3": to_mat(sin)}
            if len(self._positions) >= POSITIONS_KEPT:
                del self._positions[next(iter(self._positions))]
            self._positions[key] = mats
        return mats

    @property
    def batches(self) -> bool:
        """Whether one call can take several sequences."""
        return self.heads is not None and self._make_batched is not None

    @property
    def batched_net(self) -> ncnn.Net:
        """The graph for several sequences (loaded on first use)."""
        if self._batched is None:
            if not self.batches:
                raise ValueError(f"{self.name}: this graph takes one unpadded sequence at a time")
            self._batched = self._make_batched()
        return self._batched

    def prepare_batches(self) -> None:
        """Load the graph for several sequences now (a server, before its first batch: not between two frames)."""
        if self.batches:
            self.batched_net  # noqa: B018

    def new_cache(self, sequences: int = 1) -> KvCache:
        return KvCache(self.layers, sequences, self.device)

    def forward(self, embeds: np.ndarray, cache: KvCache, output: str = "out0") -> np.ndarray:
        """embeds (B, L, hidden), L new positions for each of the cache's B sequences -> hidden (B, L, hidden), or
        another per-position output of the graph (`output`: a head's `logits_s` where the graph has them,
        (B, L, vocab)); the cache grows by L."""
        sequences, length = embeds.shape[:2]
        if sequences != cache.sequences:
            raise ValueError(f"{self.name}: {sequences} sequences of embeddings for a cache of {cache.sequences}")
        if (sequences > 1 or cache.lengths[0] != cache.past) and not self.batches:
            raise ValueError(f"{self.name}: this graph takes one unpadded sequence at a time")
        cache.ensure(length)
        if sequences == 1 and cache.lengths[0] == cache.past:
            positions = self.position_inputs(cache.past, length)
            net = self.step_net if self.step_net is not None and length == 1 and cache.past > 0 else self.prefill_net
        else:
            tables = [rope.tables(self.head_dim, self.theta, n, length) for n in cache.lengths]
            cos, sin = (np.concatenate(t) for t in zip(*tables))
            positions = {"in1": batch_mask(cache, length, self.heads), "in2": cos, "in3": sin}
            net = self.batched_net
        rows = embeds.reshape(1, sequences * length, embeds.shape[2])
        inputs = {"in0": rows} | positions | cache.blobs
        if cache.appends_in_place(length):  # the caches grow where they are: only the output comes back
            (out,) = run(net, inputs, [output], axes={"in0": 0, "out0": 0}, name=self.name)
            cache.extended(length)
        else:
            out, *mats = run(net, inputs, [output, *self.cache_outputs],
                             axes={"in0": 0, "out0": 0}, raw=self.cache_outputs, name=self.name)
            cache.grow(self.cache_outputs, mats, length)
        return out.reshape(sequences, length, -1)

    def prefill(self, embeds: np.ndarray, output: str = "out0") -> tuple[np.ndarray, KvCache]:
        """embeds (B, L, hidden) from an empty cache -> (hidden (B, L, hidden) or `output`, the cache of B
        sequences)."""
        cache = self.new_cache(embeds.shape[0])
        return self.forward(embeds, cache, output), cache

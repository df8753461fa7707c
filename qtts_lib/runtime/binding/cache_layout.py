"""The SDPA layer's private KV-cache layout, found by probing, so that caches can be read and written. Introduced
in 17.

A cache Mat extracted with `type=1` (chapter 05) says (c=kv_heads, h=positions, w=head_dim), but its memory is the
x86 SDPA kernel's own: positions come in tiles of `t` (16 on an AVX-512 build), with capacity to spare in `cstep`:

    K: per channel (capacity/t, head_dim, t)          K[j, d] at (j // t)·t·head_dim + d·t + j % t
    V: per channel (capacity/t, head_dim/t, t, t)     V[j, d] at (j // t)·t·head_dim + (d // t)·t² + (j % t)·t + d % t

A plain (c, h, w) Mat fed back is read in that layout: wrong attention, no error (chapter 05 shows it). Batching
has to move caches between sequences (a sequence joins a batch; one leaves), so `probe()` runs one SDPA layer on
numbered inputs, finds `t` and checks every element against the formulas above. If this ncnn build keeps its
cache any other way, `probe` says so and batching is refused (one sequence at a time still works: its cache never
leaves ncnn). On a Vulkan device the cache comes back downloaded, plain (c, h, w) with no spare capacity: `t` = 1,
which the same formulas describe; `probe(device)` finds it the same way.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import ncnn
import numpy as np
from numpy.lib.stride_tricks import as_strided

from ..errors import BatchError
from .net import net_from_text, to_mat

_PROBE = """7767517
5 8
Input q_input 0 1 q
Input k_input 0 1 k
Input v_input 0 1 v
Input cache_input 0 2 past_k past_v
SDPA sdpa 5 3 q k v past_k past_v out out_k out_v 7=1
"""


def _channel_memory(mat: ncnn.Mat) -> np.ndarray:
    """A view of a 3-D Mat's whole channels, capacity included: (c, cstep). A plain fp32 Mat whose channel step
    is whole rows is read through the binding's buffer, its height set to the capacity for the moment (a fifth of
    the cost of `Mat.numpy()`, whose format numpy parses in Python: a stream's first audio copies 56 of them)."""
    if mat.elemsize == 4 and mat.elempack == 1 and mat.w and mat.cstep % mat.w == 0:
        held = mat.h
        mat.h = mat.cstep // mat.w
        try:
            view = np.asarray(mat)
        finally:
            mat.h = held
        return view.reshape(mat.c, mat.cstep)
    view = mat.numpy()
    return as_strided(view, shape=(mat.c, mat.cstep), strides=(mat.cstep * mat.elemsize, mat.elemsize))


@dataclass(frozen=True)
class CacheLayout:
    """How this ncnn build's SDPA lays out a cache: positions in tiles of `tile` (module docstring); `spare`:
    whether its caches keep room for more positions (a Vulkan download has none, and a Mat with room to spare
    breaks its upload); `appends`: whether the layer writes new positions into the very memory of a cache fed with
    room for them, so that the Mat fed in, one position longer, is the cache out (the CPU's: `probe` checks it)."""
    tile: int
    spare: bool = True
    appends: bool = False

    def key_index(self, positions: int, dim: int) -> np.ndarray:
        j, d = np.arange(positions)[:, None], np.arange(dim)[None, :]
        t = self.tile
        return (j // t) * t * dim + d * t + j % t

    def value_index(self, positions: int, dim: int) -> np.ndarray:
        j, d = np.arange(positions)[:, None], np.arange(dim)[None, :]
        t = self.tile
        return (j // t) * t * dim + (d // t) * t * t + (j % t) * t + d % t

    def tiles(self, mat: ncnn.Mat, kind: str) -> np.ndarray:
        """A writable view of every allocated channel of `mat` as plain positions: (c, capacity, head_dim) for a
        tile of 1, else (c, capacity/t, t, head_dim/t, t) for V and (c, capacity/t, t, head_dim) for K with the
        positions' axes first (a transposed view: reshaping it copies). `read` and `write` are built on it, and it
        is the formulas above written as numpy strides (the probe checks them element by element)."""
        t, dim = self.tile, mat.w
        blocks = _channel_memory(mat)[:, : mat.cstep // (t * dim) * t * dim]
        if kind == "k":  # per block (dim, t) -> (t, dim)
            return blocks.reshape(mat.c, -1, dim, t).transpose(0, 1, 3, 2)
        return blocks.reshape(mat.c, -1, dim // t, t, t).transpose(0, 1, 3, 2, 4)  # (D, j, d) -> (j, D, d)

    def read(self, mat: ncnn.Mat, kind: str) -> np.ndarray:
        """A cache Mat as numpy (c, positions, head_dim); `kind` "k" or "v". A Vulkan download may come packed
        (channels in groups of 4 or 8, `elempack`): the plain layout is unpacked first."""
        if mat.dims == 3 and mat.elempack > 1 and self.tile == 1 and mat.elemsize == 4 * mat.elempack:
            mat = ncnn.convert_packing(mat, 1)
        if mat.dims != 3 or mat.elemsize != 4 or mat.elempack != 1:
            raise BatchError(f"a cache Mat of dims {mat.dims}, elemsize {mat.elemsize}, elempack {mat.elempack}: "
                               "only fp32 caches can be moved between sequences")
        blocks = -(-mat.h // self.tile)
        return self.tiles(mat, kind)[:, :blocks].reshape(mat.c, blocks * self.tile, mat.w)[:, : mat.h]

    def write(self, array: np.ndarray, kind: str, spare: int = 64, channels: int | None = None) -> ncnn.Mat:
        """numpy (c, positions, head_dim) as a cache Mat the SDPA layer reads, with room for `spare` more
        positions (appended in place, as the layer's own caches are) and, with `channels`, memory for that many
        channels of which the first c are in use (`place` writes the others)."""
        c, positions, dim = array.shape
        mat = self.empty(c, positions + (spare if self.spare else 0), dim, channels)
        mat.h = positions  # the positions held; the capacity stays in cstep
        self.place(mat, kind, 0, array, 0)
        return mat

    def empty(self, c: int, capacity: int, dim: int, channels: int | None = None) -> ncnn.Mat:
        """A cache Mat with room for `capacity` positions (rounded up to whole tiles) in each of `channels`
        channels (default c), c of them in use and none of its positions held yet (h = 0). Its memory is not
        cleared: the layer reads only the positions held, and `place` writes zeros in front of a sequence."""
        capacity = max(-(-capacity // self.tile) * self.tile, self.tile)
        mat = ncnn.Mat(dim, capacity, max(channels or c, c))  # owns its memory; cstep = capacity * dim
        if mat.cstep != capacity * dim:
            raise BatchError(f"a cache Mat of {capacity} x {dim} got cstep {mat.cstep}")
        mat.c, mat.h = c, 0
        return mat

    def place(self, mat: ncnn.Mat, kind: str, channel: int, array: np.ndarray, at: int) -> None:
        """Write numpy (n, positions, head_dim) into channels [channel, channel + n) of `mat` at positions
        [at, at + positions), and zeros before `at` (a left-padded sequence: what the mask hides must still be
        finite numbers). Only the tiles those positions touch are written."""
        n, positions, dim = array.shape
        t = self.tile
        blocks = -(-(at + positions) // t)
        plain = np.zeros((n, blocks * t, dim), np.float32)
        plain[:, at : at + positions] = array
        view = self.tiles(mat, kind)[channel : channel + n, :blocks]
        view[...] = plain.reshape(view.shape[:2] + ((t, dim) if kind == "k" else (t, dim // t, t)))

    def capacity(self, mat: ncnn.Mat) -> int:
        """Positions `mat` has room for in each channel."""
        return mat.cstep // mat.w if mat.w else 0

    def resized(self, mat: ncnn.Mat, capacity: int, channels: int | None = None) -> ncnn.Mat:
        """A copy of `mat` (same channels in use, same positions held) with room for `capacity` positions and
        memory for `channels` channels: whole tiles copied, nothing re-laid out (a tile holds the same positions
        whatever the capacity)."""
        out = self.empty(mat.c, max(capacity, mat.h), mat.w, channels)
        n = -(-mat.h // self.tile) * self.tile * mat.w
        _channel_memory(out)[: mat.c, :n] = _channel_memory(mat)[:, :n]
        out.h = mat.h
        return out

    def shift(self, mat: ncnn.Mat, tiles: int) -> None:
        """Move every channel's positions `tiles` whole tiles later (more padding in front, zeros) or, negative,
        earlier (the first positions dropped), in place; `mat.h` follows. The room must be there."""
        size = self.tile * mat.w
        held = -(-mat.h // self.tile) * size
        memory = _channel_memory(mat)[: mat.c]
        if tiles > 0:
            if held + tiles * size > mat.cstep:
                raise BatchError("a cache shift past its capacity")
            memory[:, tiles * size : tiles * size + held] = memory[:, :held].copy()
            memory[:, : tiles * size] = 0
        elif tiles < 0:
            cut = -tiles * size
            memory[:, : held - cut] = memory[:, cut:held].copy()
            memory[:, held - cut : held] = 0
        mat.h = mat.h + tiles * self.tile

    def move(self, mat: ncnn.Mat, moves: list[tuple[int, int]], channels: int) -> None:
        """Copy groups of `channels` channels within `mat`: (to, from) group indices; every source is read
        before any is written, so the moves may overlap."""
        memory = _channel_memory(mat)
        n = -(-mat.h // self.tile) * self.tile * mat.w
        sources = [memory[f * channels : (f + 1) * channels, :n].copy() for _, f in moves]
        for (to, _), data in zip(moves, sources):
            memory[to * channels : (to + 1) * channels, :n] = data


@cache
def probe(device: str = "cpu") -> CacheLayout:
    """This build's layout on `device`, found on one SDPA layer (cached for the process). Raises BatchError if it
    is none of the tiled layouts the module docstring describes."""
    heads, kv_heads, dim, positions = 4, 2, 64, 37
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal((n, positions, dim)).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.bin"
        empty.write_bytes(b"\0" * 4)
        net = net_from_text(_PROBE, empty, threads=1, device=device)
    ex = net.create_extractor()
    held = [to_mat(a) for a in (q, k, v)]
    for name, m in zip("qkv", held):
        ex.input(name, m)
    ex.input("past_k", ncnn.Mat())
    ex.input("past_v", ncnn.Mat())
    out_k, out_v = ncnn.Mat(), ncnn.Mat()
    if ex.extract("out_k", out_k, 1) != 0 or ex.extract("out_v", out_v, 1) != 0:
        raise BatchError("the SDPA probe failed to run")
    for tile in (16, 8, 4, 1):
        layout = CacheLayout(tile, spare=out_k.cstep > positions * dim)
        if out_k.cstep % (tile * dim) or out_v.cstep % (tile * dim):
            continue
        try:
            if np.array_equal(layout.read(out_k, "k"), k) and np.array_equal(layout.read(out_v, "v"), v) and (
                    out_k.elempack > 1 or _formulas_hold(layout, out_k, out_v, k, v)):
                return replace(layout, appends=layout.spare and _appends(net, layout, out_k, out_v, k, v, rng))
        except (IndexError, ValueError):
            continue
    raise BatchError(f"this ncnn build ({ncnn.__version__}) keeps the SDPA cache on {device} in a layout qtts does "
                     "not know: sequences cannot be batched here (one at a time still works)")


def _appends(net, layout: CacheLayout, past_k: ncnn.Mat, past_v: ncnn.Mat, k: np.ndarray, v: np.ndarray,
             rng: np.random.Generator) -> bool:
    """Whether one more position, fed after caches with room for it, lands in their own memory: the caches out share
    the Mats' memory, hold one position more, and read back as the old positions and the new one."""
    heads, kv_heads, dim = 4, k.shape[0], k.shape[2]
    q1, k1, v1 = (rng.standard_normal((n, 1, dim)).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    ex = net.create_extractor()
    held = [to_mat(a) for a in (q1, k1, v1)]
    for name, m in zip("qkv", held):
        ex.input(name, m)
    ex.input("past_k", past_k)
    ex.input("past_v", past_v)
    out_k, out_v = ncnn.Mat(), ncnn.Mat()
    if ex.extract("out_k", out_k, 1) != 0 or ex.extract("out_v", out_v, 1) != 0:
        return False
    same = all(_address(a) == _address(b) for a, b in ((out_k, past_k), (out_v, past_v)))
    return bool(same and out_k.h == past_k.h + 1 and out_v.h == past_v.h + 1
                and np.array_equal(layout.read(out_k, "k"), np.concatenate([k, k1], axis=1))
                and np.array_equal(layout.read(out_v, "v"), np.concatenate([v, v1], axis=1)))


def _address(mat: ncnn.Mat) -> int:
    return _channel_memory(mat).__array_interface__["data"][0]


def _formulas_hold(layout: CacheLayout, out_k: ncnn.Mat, out_v: ncnn.Mat, k: np.ndarray, v: np.ndarray) -> bool:
    """The module docstring's formulas, element by element, against what `read` (numpy strides) found."""
    positions, dim = k.shape[1:]
    return bool(np.array_equal(_channel_memory(out_k)[:, layout.key_index(positions, dim)], k)
                and np.array_equal(_channel_memory(out_v)[:, layout.value_index(positions, dim)], v))

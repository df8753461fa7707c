"""The generation loop: codebook 0 from the talker, codebooks 1..15 from the code predictor, frame by frame.
Introduced in 07.

This is `Qwen3TTSForConditionalGeneration.generate` and the talker's `forward`, re-expressed over the exported
graphs (chapters 04-05), with numpy for everything between them; the order of operations is the reference's, step
for step. Per frame:

1. the talker's hidden state at the last position goes through the codec head; the logits give codebook 0
   (`Sampler.first`): EOS ends the sequence;
2. the code predictor prefills [talker hidden, embed(c0)] and reads head 0 for codebook 1, then takes 14 cached
   steps, embedding codebook s with table s-1 and reading head s for codebook s+1 (`CodePredictor.frame`);
3. the frame is complete only then, so the talker's next input, embed(c0) + Σ tables(c1..c15) + the next row of
   trailing text (`Prompt.text_at`), is one step late: the talker steps once and the next frame begins. The frame
   is handed out before that step (the sequence keeps the row, `Sequence.pending`, and the step opens its next
   frame): a stream's first audio does not wait for a talker step whose result only the second frame needs.

Everything one utterance carries from step to step lives in its `Sequence` (its prompt, sampler, hidden state,
codes so far), so the loop itself holds only the graphs: one `Loop` serves any number of sequences, and `frames`
is a generator every consumer shares (`synthesize` decodes at the end, `stream` as frames come, the server's engine
thread and long texts one segment at a time).

Several sequences advance together in a `Batch` (chapter 17): each graph call then takes one row per sequence, so
the weights, which every step reads once, are read once for all of them. `Loop.step(seq)` is a batch of one: both
run `Loop.advance`, the loop's one frame-making path. A sequence joins a batch after its own prefill (`Batch.add`)
and leaves it the frame it ends (continuous batching).
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..binding import rope
from ..binding.cached import KvCache, KvCacheNet, survivors
from ..binding.net import Net, net_from_text, nets_from_bins, parse_device, run
from ..errors import BatchError
from ..rewrites.gpu import fused_predictor_param
from ..rewrites.gpu_layers import ensure_gpu_decoder, gemv_heads, one_blob_io
from . import precision
from .config import ModelConfig
from .embeddings import Embeddings
from .prompt import Prompt
from .sampling import Sampler


@dataclass
class Frame:
    """One frame: its codes (groups,) and its embedding (the codec table at c0 plus the acoustic tables at
    c1..c15: what the talker is fed next, before the text)."""
    codes: np.ndarray
    embed: np.ndarray


@dataclass
class Sequence:
    """One utterance in the loop: what it was asked (prompt, sampler, frame cap) and where it is."""
    prompt: Prompt
    sampler: Sampler
    max_frames: int
    cache: KvCache | None = None              # its talker cache while it runs alone (a `Batch` holds one for all)
    hidden: np.ndarray | None = None          # the talker's last hidden state (H,)
    pending: np.ndarray | None = None         # the talker's next input row, fed when its next frame begins
    waiting: np.ndarray | None = None         # a frame's embedding whose text row has not come yet (`Loop.resume`)
    prefilled: int = 0                        # prompt positions in its cache so far (`Loop.prefill`)
    tokens: list[int] = field(default_factory=list)       # every codebook-0 token sampled, EOS included
    codes: list[np.ndarray] = field(default_factory=list)  # the frames so far, (groups,) each
    stopped: str | None = None                # "eos" or "cap" once it has ended
    seconds: dict = field(default_factory=lambda: {"prefill": 0.0, "talker": 0.0, "predictor": 0.0})


class CodePredictor:
    """Codebooks 1..15 of a frame on the CPU: a cached decoder, its 15 heads and the acoustic tables. The heads are
    in the decoder's graph where the tier allows (`precision.predictor_with_heads`: `heads` None), so a step is one
    graph call; else a graph of their own, called after each decoder call."""

    def __init__(self, decoder: KvCacheNet, heads: Net | None, embeddings: Embeddings):
        if heads is None and not decoder.logits:
            raise ValueError("a code predictor needs heads: in its decoder's graph or a graph of their own")
        self.decoder, self.heads, self.embed = decoder, heads, embeddings

    @property
    def batches(self) -> bool:
        return self.decoder.batches

    def frames(self, hidden: np.ndarray, c0: list[int], samplers: list[Sampler]) -> list[Frame]:
        """The frames of B sequences at once: hidden (B, H) talker states and their codebook-0 codes. A 2-position
        prefill per sequence, then 14 steps (table s-1, head s), one graph call for all B; each code is looked up
        once."""
        groups = self.embed.groups
        codes = np.zeros((len(c0), groups), np.int64)  # filled a codebook a step
        codes[:, 0] = c0
        embed = self.embed.codec(c0)
        fused = self.heads is None
        out, cache = self.decoder.prefill(np.stack([hidden, embed], axis=1).astype(np.float32),
                                          "logits_0" if fused else "out0")
        out = out[:, -1]
        for s in range(groups - 1):
            logits = out if fused else self.heads.run([out], [s])[0]
            for b, sampler in enumerate(samplers):
                codes[b, s + 1] = sampler.code(logits[b], codes[b, 1:s + 1], s)
            e = self.embed.acoustic(s, codes[:, s + 1])  # (B, hidden) float32, as the table
            embed = embed + e
            if s < groups - 2:
                out = self.decoder.forward(e[:, None], cache, f"logits_{s + 1}" if fused else "out0")[:, -1]
        return [Frame(c, x) for c, x in zip(codes, embed)]

    def frame(self, hidden: np.ndarray, c0: int, sampler: Sampler) -> Frame:
        """One sequence's frame (`frames` of one)."""
        return self.frames(hidden[None], [c0], [sampler])[0]


class GemvCodePredictor:
    """`CodePredictor` for a GPU (chapter 10): every position one call of the one-position GEMV form of the
    predictor fused with its heads (`rewrites.gpu_layers.gemv_step`, `rewrites.gpu.fused_predictor_param`), the caches
    of its layers one flat blob, the row, cos and sin one blob, and logits + caches one download
    (`rewrites.gpu_layers.one_blob_io`). Per frame: position 0 (the talker's hidden state) builds the cache, then
    codebooks 1..15 one call each (head s on the embedding of codebook s-1): 16 calls, 16 uploads, 16 downloads."""

    batches = False  # one sequence per call

    def __init__(self, first, step, head_dim: int, theta: float, vocab: int, layers: int, embeddings: Embeddings):
        self.first, self.step, self.layers = first, step, layers
        self.head_dim, self.theta, self.vocab, self.embed = head_dim, theta, vocab, embeddings

    def start(self, hidden: np.ndarray) -> np.ndarray:
        """The flat cache after position 0 (the talker's hidden state)."""
        cos, sin = rope.tables(self.head_dim, self.theta, 0, 1)
        inputs = {"in0": hidden[None].astype(np.float32), "in1": rope.causal_mask(1), "in2": cos, "in3": sin}
        inputs |= {b: m for b, m in KvCache(self.layers).blobs.items()}
        return run(self.first, inputs, ["cache_all_out"], name="GEMV predictor")[0]

    def logits(self, x: np.ndarray, cache: np.ndarray, past: int, s: int, last: bool = False):
        """Head s's logits after row x at position `past`, and the grown flat cache (None when `last`)."""
        cos, sin = rope.tables(self.head_dim, self.theta, past, 1)
        row = np.concatenate([x.astype(np.float32).ravel(), cos.ravel(), sin.ravel()])
        name = f"logits_{s}" if last else f"all_logits_{s}"
        out = run(self.step, {"x": row, "cache_all_in": cache}, [name], name="GEMV predictor")[0]
        return (out, None) if last else (out[:self.vocab], out[self.vocab:])

    def frames(self, hidden: np.ndarray, c0: list[int], samplers: list[Sampler]) -> list[Frame]:
        return [self.frame(h, c, s) for h, c, s in zip(hidden, c0, samplers)]

    def frame(self, hidden: np.ndarray, c0: int, sampler: Sampler) -> Frame:
        cache = self.start(hidden)
        codes, embed = [c0], self.embed.codec([c0])[0]
        x = embed
        groups = self.embed.groups
        for s in range(groups - 1):
            logits, cache = self.logits(x, cache, s + 1, s, last=s == groups - 2)
            codes.append(sampler.code(logits, codes[1:], s))
            x = self.embed.acoustic(s, codes[-1])
            embed = embed + x
        return Frame(np.array(codes, np.int64), embed)


class GpuDecoder:
    """The talker on a GPU (chapter 10): the prompt prefilled by its GPU form with caches (`rewrites.gpu_layers`),
    then one-position GEMV steps (one upload, one download: `one_blob_io`) while the cache holds fewer than
    `max_cached` positions; past that, every call is the full sequence without a cache (the caches' trip through host
    memory grows with them, a full forward's cost hardly does: data/bench/gpu/h200-vulkan-forms.json). The interface of
    `KvCacheNet` for one sequence; its `KvCache` holds the flat cache (`flat`) and the rows fed so far (`rows`)."""

    batches = False
    heads = None

    def __init__(self, prefill, step, full, layers: int, head_dim: int, theta: float, max_cached: int,
                 name: str = "talker_decoder"):
        self.prefill_net, self.step_net, self.full = prefill, step, full
        self.layers, self.head_dim, self.theta, self.max_cached, self.name = layers, head_dim, theta, max_cached, name

    def new_cache(self, sequences: int = 1) -> KvCache:
        if sequences != 1:
            raise ValueError(f"{self.name}: the GPU form takes one sequence at a time")
        cache = KvCache(self.layers)
        cache.flat, cache.rows = None, np.zeros((0, 0), np.float32)
        return cache

    def forward(self, embeds: np.ndarray, cache: KvCache) -> np.ndarray:
        if embeds.shape[0] != 1:
            raise ValueError(f"{self.name}: the GPU form takes one sequence at a time")
        rows = embeds[0].astype(np.float32)
        first = cache.rows.size == 0
        cache.rows = rows if first else np.concatenate([cache.rows, rows])
        length, past = len(rows), cache.past
        if past + length <= self.max_cached and (first or (cache.flat is not None and length == 1)):
            cos, sin = rope.tables(self.head_dim, self.theta, past, length)
            if first:
                inputs = {"in0": rows[None], "in1": rope.causal_mask(length), "in2": cos, "in3": sin} | cache.blobs
                out, cache.flat = run(self.prefill_net, inputs, ["out0", "cache_all_out"], axes={"in0": 0, "out0": 0},
                                      name=self.name)
            else:
                x = np.concatenate([rows.ravel(), cos.ravel(), sin.ravel()])
                both = run(self.step_net, {"x": x, "cache_all_in": cache.flat}, ["all_out0"], name=self.name)[0]
                out, cache.flat = both[None, None, :rows.shape[1]], both[rows.shape[1]:]
            cache.past = cache.lengths[0] = past + length
            return out.reshape(1, length, -1)
        cache.flat = None  # from here on the full sequence every call: no cache crosses the bus
        total = len(cache.rows)
        cos, sin = rope.tables(self.head_dim, self.theta, 0, total)
        inputs = {"in0": cache.rows[None], "in1": rope.causal_mask(total), "in2": cos, "in3": sin}
        out = run(self.full, inputs, ["out0"], axes={"in0": 0, "out0": 0}, name=self.name)[0]
        cache.past = cache.lengths[0] = total
        return out[:, total - length:]

    def prefill(self, embeds: np.ndarray) -> tuple[np.ndarray, KvCache]:
        cache = self.new_cache(embeds.shape[0])
        return self.forward(embeds, cache), cache


# positions: past it the talker runs the full sequence on a GPU. On the H200 a cached step costs 20 / 28 / 48 ms at
# 32 / 64 / 128 cached positions (the flat cache up and down: 7 / 14 / 28 MB), the full sequence 29 / 29 / 33 ms
# (data/bench/gpu/h200-vulkan-forms.json)
TALKER_MAX_CACHED = 64


class Loop:
    """The graphs of the generation loop, and the loop over them (module docstring)."""

    def __init__(self, talker: KvCacheNet | GpuDecoder, head: Net, predictor: CodePredictor | GemvCodePredictor):
        self.talker, self.head, self.predictor = talker, head, predictor

    @classmethod
    def load(cls, cfg: ModelConfig, embeddings: Embeddings, threads: int = 2, device: str = "cpu",
             precision_tier: str = "fp32", gpu_forms: bool = True, log=None) -> Loop:
        """The loop as the runtime runs it on `device` in `precision_tier`. On a GPU, `gpu_forms` (default) runs the
        GPU forms of `rewrites.gpu_layers` (fewer layers, GEMV steps, one upload and one download per call:
        `GpuDecoder`, `GemvCodePredictor`; chapter 10); False keeps the CPU's graphs there too (the chapter's
        comparison, and `Synthesizer(gpu_batches=True)`)."""
        d, t, p = cfg.ncnn_dir, cfg.talker, cfg.predictor
        head = Net(d, "talker_codec_head", threads, device)
        if parse_device(device) is not None and gpu_forms:
            return cls(gpu_talker(d, t, threads, device, log), head,
                       gemv_predictor(d, p, t["hidden_size"], threads, device, embeddings, log))
        talker = precision.decoder(d, "talker_decoder", t["head_dim"], t["rope_theta"], threads, device,
                                   precision_tier, log=log, heads=t["num_attention_heads"])
        decoder = precision.predictor_with_heads(d, p["head_dim"], p["rope_theta"], threads, device, precision_tier,
                                                 log=log, heads=p["num_attention_heads"])
        heads = None
        if decoder is None:
            decoder = precision.decoder(d, "predictor_decoder", p["head_dim"], p["rope_theta"], threads, device,
                                        precision_tier, log=log, heads=p["num_attention_heads"])
            heads = precision.head(d, "predictor_heads", threads, device, precision_tier, log=log)
        return cls(talker, head, CodePredictor(decoder, heads, embeddings))

    @property
    def batches(self) -> bool:
        """Whether sequences can share graph calls (the CPU's graphs, on any device; the GPU forms take one)."""
        return self.talker.batches and self.predictor.batches

    def prepare_batches(self) -> None:
        """Load the graphs for several sequences at once now (`binding.cached.KvCacheNet.batched_net`), before a
        scheduler that may batch makes its first frame."""
        for decoder in (self.talker, getattr(self.predictor, "decoder", None)):
            if isinstance(decoder, KvCacheNet):
                decoder.prepare_batches()

    @property
    def copies_caches(self) -> bool:
        """Whether a sequence can start from a copy of another's talker cache (`start(prefix=)`): the cached graphs
        (`KvCacheNet`), not the GPU form, whose cache is one flat blob and the rows fed so far."""
        return isinstance(self.talker, KvCacheNet)

    # ------------------------------------------------------------ sequences
    def start(self, prompt: Prompt, sampler: Sampler, max_frames: int, positions: int | None = None,
              prefix: KvCache | None = None) -> Sequence:
        """A new sequence, its prompt prefilled (alone: a prefill has as many rows as the prompt). With
        `positions`, only that many now: `prefill` does the rest, a piece at a time (so that a sequence can join
        a running batch without stopping it for its whole prompt). `prefix`: the cache of the prompt's first
        positions, made before for an equal prompt start (a prompt's head: `scheduler.Prefixes`), copied here."""
        if max_frames < 1:
            raise ValueError(f"max_frames must be at least 1, not {max_frames}")
        seq = Sequence(prompt, sampler, max_frames)
        if prefix is not None:
            seq.cache, seq.prefilled = prefix.copy(), prefix.past
        self.prefill(seq, positions)
        return seq

    def prefill(self, seq: Sequence, positions: int | None = None) -> bool:
        """Prefill up to `positions` more of the sequence's prompt (all of it: None); whether it is all in now.
        Pieces of a prompt give its cache and last hidden state to float rounding (the rows of a call are
        computed alike whatever their number; the attention sums over the positions in another grouping)."""
        rows = seq.prompt.embeds[seq.prefilled:] if positions is None else \
            seq.prompt.embeds[seq.prefilled:seq.prefilled + positions]
        if len(rows):
            t0 = time.perf_counter()
            if seq.cache is None:
                hidden, seq.cache = self.talker.prefill(rows[None])
            else:
                hidden = self.talker.forward(rows[None], seq.cache)
            seq.hidden = hidden[0, -1]
            seq.prefilled += len(rows)
            seq.seconds["prefill"] += time.perf_counter() - t0
        return seq.prefilled >= len(seq.prompt.embeds)

    def step(self, seq: Sequence) -> Frame | None:
        """The sequence's next frame, or None when it has ended (EOS, or `max_frames` frames made)."""
        if seq.stopped:
            return None
        frame = self.advance([seq], seq.cache)[0]
        if seq.stopped:
            seq.cache = None
        return frame

    def advance(self, seqs: list[Sequence], cache: KvCache) -> list[Frame | None]:
        """One frame for each of `seqs`, whose talker cache is `cache` (one sequence's, or a batch's: the same
        order); None for a sequence that ended instead (EOS). Afterwards `cache` holds only the sequences that go
        on (those not `stopped`), in the order `binding.cached.survivors` gives. Every graph call takes all the
        sequences it concerns at once:

        1. the talker step of the last frame's rows (`feed`; none before a sequence's first frame);
        2. the codec head on every hidden state: codebook 0 of each (EOS ends that sequence);
        3. the code predictor for the others, together (`CodePredictor.frames`); the row each that goes on feeds
           the talker next is kept (a sequence that reached its frame cap needs no next state)."""
        t0 = time.perf_counter()
        self.feed(seqs, cache)
        logits = self.head(np.stack([s.hidden for s in seqs]))[0]
        live = []
        for seq, row in zip(seqs, logits):
            token = seq.sampler.first(row, seq.tokens)
            seq.tokens.append(token)
            if token == seq.sampler.eos_id:
                seq.stopped = "eos"
            else:
                live.append(seq)
        t1 = time.perf_counter()
        made = self.predictor.frames(np.stack([s.hidden for s in live]), [s.tokens[-1] for s in live],
                                     [s.sampler for s in live]) if live else []
        t2 = time.perf_counter()
        frames = dict(zip(map(id, live), made))
        going = []
        for seq in live:
            frame = frames[id(seq)]
            seq.codes.append(frame.codes)
            if len(seq.codes) >= seq.max_frames:
                seq.stopped = "cap"  # no talker step for a frame that will not come
            else:
                row = seq.prompt.text_at(len(seq.codes) - 1)
                if row is None:  # an open prompt (`PromptBuilder.open_prompt`) whose next token has not come
                    seq.waiting = frame.embed
                else:
                    seq.pending = frame.embed + row
                going.append(seq)
        if len(going) < len(seqs) and going:
            cache.keep(survivors([bool(s.stopped) for s in seqs]))
        for seq in seqs:  # each sequence waited for the whole of every call it took part in
            seq.seconds["talker"] += t1 - t0
            seq.seconds["predictor"] += (t2 - t1) if id(seq) in frames else 0.0
        return [frames.get(id(s)) for s in seqs]

    def resume(self, seq: Sequence) -> bool:
        """Whether the sequence can make its next frame: a frame whose text row had not come (`Sequence.waiting`)
        gets it now if it has come; the row fed is the same whenever it comes."""
        if seq.waiting is not None:
            row = seq.prompt.text_at(len(seq.codes) - 1)
            if row is None:
                return False
            seq.pending, seq.waiting = seq.waiting + row, None
        return True

    def feed(self, seqs: list[Sequence], cache: KvCache) -> bool:
        """The talker step of `seqs`' pending rows (`Sequence.pending`), all in one call: every sequence of a cache
        has a row pending, or none has (a `Batch` feeds its sequences before another joins). Whether it stepped."""
        pending = [s.pending is not None for s in seqs]
        if not any(pending):
            return False
        if not all(pending):
            raise BatchError("some sequences of this cache have a talker step pending and others not")
        x = np.stack([s.pending for s in seqs])
        hidden = self.talker.forward(x[:, None].astype(np.float32), cache)[:, -1]
        for seq, h in zip(seqs, hidden):
            seq.hidden, seq.pending = h, None
        return True

    def frames(self, prompt: Prompt, sampler: Sampler, max_frames: int) -> Iterator[Frame]:
        """Every frame of one sequence as it is made; the generator's return value is the ended `Sequence`.
        Closing the generator early stops the sequence there."""
        seq = self.start(prompt, sampler, max_frames)
        while (frame := self.step(seq)) is not None:
            yield frame
        return seq

    def run(self, prompt: Prompt, sampler: Sampler, max_frames: int) -> Sequence:
        """One sequence to its end (no audio): what the parity checks compare."""
        seq = self.start(prompt, sampler, max_frames)
        while self.step(seq) is not None:
            pass
        return seq


class Batch:
    """Sequences that advance together, one talker cache for all (continuous batching; module docstring).

        batch = Batch(loop, max_batch=4)
        a = batch.add(prompt_a, sampler_a, 200)      # prefilled alone, then joins
        while batch:
            for seq, frame in batch.step():          # one frame of every sequence; None: it ended now
                ...
            if waiting and batch.room: batch.add(...) # a new one joins between frames

    A sequence that ends leaves at once (its cache channels handed to another), so the next frame's calls are
    narrower. `add` is `Loop.start` and `join`: a sequence may also be prefilled a piece at a time beside the batch
    (`Loop.prefill` between two steps) and join when it is done. The cache keeps memory for `max_batch` sequences
    once a second one joins (`binding.cached.KvCache.reserve`), so joining and leaving move only the sequence
    concerned."""

    def __init__(self, loop: Loop, max_batch: int = 4):
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise BatchError(f"max_batch must be a whole number, at least 1, not {max_batch!r}")
        if max_batch > 1 and not loop.batches:
            raise BatchError("this loop takes one sequence per call (the GPU forms; load the Synthesizer with "
                             "gpu_batches=True for graphs that batch): use max_batch=1")
        self.loop, self.max_batch = loop, max_batch
        self.sequences: list[Sequence] = []
        self.cache: KvCache | None = None

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def room(self) -> int:
        return self.max_batch - len(self.sequences)

    def add(self, prompt: Prompt, sampler: Sampler, max_frames: int) -> Sequence:
        """Prefill a new sequence and join it to the batch (its cache merged into the batch's)."""
        if not self.room:
            raise BatchError(f"the batch is full ({self.max_batch} sequences)")
        seq = self.loop.start(prompt, sampler, max_frames)
        self.join(seq)
        return seq

    def join(self, seq: Sequence) -> None:
        """A prefilled sequence (`Loop.start`, then `Loop.prefill` until it says so) joins between two frames."""
        if not self.room:
            raise BatchError(f"the batch is full ({self.max_batch} sequences)")
        if seq.cache is None or seq.prefilled < len(seq.prompt.embeds):
            raise BatchError("only a sequence whose prompt is all prefilled can join")
        if self.cache is None:
            t0 = time.perf_counter()
            self.cache = seq.cache
        else:
            t0 = time.perf_counter()
            if self.loop.feed(self.sequences, self.cache):  # the batch's pending step first: its cache in step
                for other in self.sequences:
                    other.seconds["talker"] += time.perf_counter() - t0
            t0 = time.perf_counter()
            self.cache.join(seq.cache, self.max_batch)
        seq.cache = None
        seq.seconds["prefill"] += time.perf_counter() - t0
        self.sequences.append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take a running sequence out of the batch (cancelled): it makes no more frames."""
        if len(self.sequences) == 1:
            self.sequences, self.cache = [], None
            return
        seq.pending = None
        order = survivors([s is seq for s in self.sequences])
        self.cache.keep(order)
        self.sequences = [self.sequences[i] for i in order]

    def park(self, seq: Sequence) -> None:
        """Take a sequence that waits for its text (`Sequence.waiting`) out of the batch with its own cache (a copy
        of the batch's, keeping its rows), so the others go on; it comes back with `unpark` once its text has come."""
        if len(self.sequences) == 1:
            seq.cache, self.sequences, self.cache = self.cache, [], None
            return
        index = next(i for i, s in enumerate(self.sequences) if s is seq)
        seq.cache = self.cache.copy()
        seq.cache.keep([index])
        order = survivors([s is seq for s in self.sequences])
        self.cache.keep(order)
        self.sequences = [self.sequences[i] for i in order]

    def unpark(self, seq: Sequence) -> None:
        """A parked sequence whose text row has come (`Loop.resume`) steps that row on its own cache, then joins."""
        self.loop.feed([seq], seq.cache)
        self.join(seq)

    def step(self) -> list[tuple[Sequence, Frame | None]]:
        """One frame of every sequence in the batch (None for one that ended at EOS); those that ended leave."""
        if not self.sequences:
            return []
        seqs = list(self.sequences)
        frames = self.loop.advance(seqs, self.cache)
        self.sequences = [seqs[i] for i in survivors([bool(s.stopped) for s in seqs])]
        if not self.sequences:
            self.cache = None
        return list(zip(seqs, frames))


def gpu_talker(ncnn_dir: Path, cfg: dict, threads: int, device: str, log=None,
                max_cached: int = TALKER_MAX_CACHED) -> GpuDecoder:
    """The talker's GPU forms (`rewrites.gpu_layers.ensure_gpu_decoder`, `one_blob_io`) as `GpuDecoder` runs them.
    The flat caches are the SDPA layer's cache Mats reshaped: `device`'s caches must be plain (c, h, w), as a Vulkan
    device's are (`binding.cache_layout`); on the CPU only `max_cached=0` (the full sequence every call) is valid."""
    _plain_caches(device, max_cached)
    forms = ensure_gpu_decoder(ncnn_dir, "talker_decoder", log=log)
    hd, kvh = cfg["head_dim"], cfg["num_key_value_heads"]
    prefill = one_blob_io(forms["kv"].read_text(), hd, kvh, step=False)
    step = one_blob_io(forms["step"].read_text(), hd, kvh, ("out0",), row=cfg["hidden_size"])
    nets = [net_from_text(text, forms["bin"], threads, device) for text in (prefill, step, forms["full"].read_text())]
    return GpuDecoder(*nets, precision.cached_layers(ncnn_dir, "talker_decoder"), hd, cfg["rope_theta"], max_cached)


def gemv_predictor(ncnn_dir: Path, cfg: dict, row: int, threads: int, device: str, embeddings: Embeddings,
                    log=None) -> GemvCodePredictor:
    """The predictor's GEMV step form fused with its heads (as InnerProducts), its first position and its steps
    (`GemvCodePredictor`); the weights the two `.bin` files one after the other (`binding.net.nets_from_bins`)."""
    _plain_caches(device)
    forms = ensure_gpu_decoder(ncnn_dir, "predictor_decoder", log=log)
    heads = gemv_heads((ncnn_dir / "predictor_heads.param").read_text())
    fused = fused_predictor_param(forms["step"].read_text(), heads)
    hd, kvh = cfg["head_dim"], cfg["num_key_value_heads"]
    groups = cfg["num_code_groups"]
    first = one_blob_io(fused, hd, kvh, step=False)
    step = one_blob_io(fused, hd, kvh, tuple(f"logits_{s}" for s in range(groups - 1)), row=row)
    nets = nets_from_bins([first, step], [forms["bin"], ncnn_dir / "predictor_heads.bin"], threads, device)
    return GemvCodePredictor(*nets, hd, cfg["rope_theta"], cfg["vocab_size"],
                             precision.cached_layers(ncnn_dir, "predictor_decoder"), embeddings)


def _plain_caches(device: str, max_cached: int = 1) -> None:
    from ..binding import cache_layout

    if max_cached and cache_layout.probe(device) != cache_layout.CacheLayout(1, spare=False):
        raise ValueError(f"the GPU forms' flat caches need plain cache Mats; {device}'s SDPA keeps its own layout")

"""Text to speech with ncnn alone: voice, prompt, talker loop, code predictor, codec. Introduced in 06.

This is the generation loop of `Qwen3TTSForConditionalGeneration.generate` and the talker's
`forward`, re-expressed over the exported graphs (chapters 04-05), with numpy for everything
between them. The order of operations is the reference's, step for step.

The prompt is two tracks summed position by position (see `build_prompt`):

    text track   role prefix   tts_pad … tts_pad   tts_bos     first text token
    codec track  -             codec tags, speaker row, codec_pad   codec_bos

The rest of the text, then tts_eos, is "trailing text", added one position per frame, then
tts_pad forever. Per frame, the talker's logits give codebook 0; the code predictor prefills
[talker hidden, embed(c0)] and reads head 0 for codebook 1, then takes 14 cached steps
(table s-1, head s) for codebooks 2..15. The frame is complete only then, so the talker's next
input, embed(c0) + Σ predictor tables(c1..c15) + trailing text, is one step late. Generation
stops when codebook 0 is EOS or after `max_new_tokens` samples of codebook 0.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import rope
from .audio import FRAME_RATE, SAMPLES_PER_FRAME
from .codec import Codec
from .kvcache import KvCacheNet
from .net import MissingArtifact, Net, parse_device

GRAPHS = ["talker_text_embed", "talker_codec_embed", "talker_decoder", "talker_codec_head",
          "predictor_decoder", "predictor_embeds", "predictor_heads", "codec_decoder"]
CACHED_GRAPHS = ["talker_decoder", "predictor_decoder"]

# The chat template the reference wraps the text in. Tokenized as one string, its fixed parts
# take ROLE_TOKENS ids in front ("<|im_start|>assistant\n") and END_TOKENS at the end
# ("<|im_end|>\n<|im_start|>assistant\n"); the voice clip's transcript ends after VOICE_END_TOKENS
# ("<|im_end|>\n"). The counts are checked against the tokenizer when a Synthesizer is built.
ROLE_PREFIX = "<|im_start|>assistant\n"
TEXT_END = "<|im_end|>\n<|im_start|>assistant\n"
VOICE_TEXT_END = "<|im_end|>\n"
ROLE_TOKENS, END_TOKENS, VOICE_END_TOKENS = 3, 5, 2


class InputError(ValueError):
    """Bad user input (text, language, voice): the message says what is valid."""


@dataclass
class Voice:
    """Who speaks. `speaker_row` fills the prompt's speaker slot: an x-vector from a voice clip,
    or a built-in speaker's row of the codec embedding (`speaker` names it). ICL cloning adds the
    clip's `codes` (T, 16) and its transcript `text`."""
    speaker_row: np.ndarray
    speaker: str | None = None
    codes: np.ndarray | None = None
    text: str | None = None

    @property
    def mode(self) -> str:
        return "speaker" if self.speaker else ("icl" if self.codes is not None else "xvector")


@dataclass
class Prompt:
    """What the talker is fed: prompt embeddings (P, H), trailing text (M, H), tts_pad (H,)."""
    embeds: np.ndarray
    trailing: np.ndarray
    tts_pad: np.ndarray
    text_ids: list[int] = field(default_factory=list)


@dataclass
class Result:
    codes: np.ndarray            # (T, 16) int64
    sequence: list[int]          # every sampled codebook-0 token, EOS included if it came
    eos_step: int                # index of EOS in `sequence`, -1 if it never came
    wav: np.ndarray | None = None
    seconds: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    chosen: np.ndarray | None = None  # teacher forcing: the model's own pick at every fed code (T, 16)


@dataclass
class Frame:
    """One frame from the code predictor: the 16 codes fed on, the frame's embedding (talker table at c0 +
    predictor tables at c1..c15, what the talker is fed next), and under teacher forcing the model's own
    picks at codebooks 1..15."""
    codes: np.ndarray            # (16,) int64
    embed: np.ndarray            # (H,)
    picks: np.ndarray | None = None


class Synthesizer:
    """The deployable pipeline over a checkpoint directory and its `ncnn/` exports."""

    def __init__(self, model_dir: str | Path, threads: int = 2, device: str = "cpu", gpu_rewrites: bool = True,
                 precision: str = "fp32", log: Callable[[str], None] | None = None, codec_process: bool = False):
        """`device` cpu, vulkan or vulkan:N. On a GPU, `gpu_rewrites` (default) runs the loop over the
        rewritten graphs of `runtime.vulkan` (fewer round trips; chapter 08); False keeps the landed loop.
        `precision` fp32 (default, the parity tier), fp16 or int8: the talker's and the code predictor's
        weights (chapter 10, `runtime.precision`); `log` hears about one-time work (writing a tier).
        `codec_process`: decode in a second process on one more core while this one generates on `threads`
        (`runtime.pipeline`; CPU only; `close()` stops it). `synthesize` and `stream` then overlap the two."""
        from . import precision as tiers
        from .bpe import Tokenizer
        from .sampler import SamplerConfig

        self.model_dir = Path(model_dir)
        self.precision = tiers.check_tier(precision, device)
        if codec_process and parse_device(device) is not None:
            raise InputError("codec_process runs the codec on the CPU: it cannot be used with a GPU device")
        ncnn_dir = self.model_dir / "ncnn"
        if not (self.model_dir / "config.json").is_file():
            raise MissingArtifact(f"{self.model_dir} has no config.json; run notebooks/00_get_checkpoint.py")
        missing_graphs(ncnn_dir, raise_error=True)
        self.config = json.loads((self.model_dir / "config.json").read_text())
        self.gen_config = json.loads((self.model_dir / "generation_config.json").read_text())
        st_config = json.loads((self.model_dir / "speech_tokenizer" / "config.json").read_text())
        self.talker_cfg = talker = self.config["talker_config"]
        self.pred_cfg = pred = talker["code_predictor_config"]
        self.mimi_cfg = st_config["encoder_config"]
        self.groups, self.codebook = talker["num_code_groups"], pred["vocab_size"]
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        for fixed, n in ((ROLE_PREFIX, ROLE_TOKENS), (TEXT_END, END_TOKENS), (VOICE_TEXT_END, VOICE_END_TOKENS)):
            if len(self.tokenizer.encode(fixed)) != n:
                raise MissingArtifact(f"this tokenizer splits {fixed!r} into other than {n} tokens")

        def net(name: str) -> Net | None:
            return Net(ncnn_dir, name, threads, device) if (ncnn_dir / f"{name}.param").is_file() else None

        self.text_embed_net, self.codec_embed_net = net("talker_text_embed"), net("talker_codec_embed")
        self.codec_head, self.pred_heads, self.pred_embeds = (
            net("talker_codec_head"), net("predictor_heads"), net("predictor_embeds"))
        self.speaker_encoder = net("speaker_encoder")
        self.mimi = net("mimi_encoder") if (ncnn_dir / "mimi_rvq.npz").is_file() else None
        self.rvq_tables = dict(np.load(ncnn_dir / "mimi_rvq.npz")) if self.mimi is not None else None
        self.fused = None
        if gpu_rewrites and parse_device(device) is not None:
            from . import vulkan

            self.talker = vulkan.PackedKvCacheNet(ncnn_dir, "talker_decoder", talker["head_dim"], talker["rope_theta"],
                                                  threads, device)
            self.fused = vulkan.FusedPredictor(ncnn_dir, pred["head_dim"], pred["rope_theta"], threads, device)
            self.tables = (vulkan.embed_table(ncnn_dir, "talker_codec_embed", talker["vocab_size"], threads),
                           vulkan.embed_table(ncnn_dir, "predictor_embeds", (self.groups - 1) * self.codebook, threads))
        else:
            self.talker = KvCacheNet(ncnn_dir, "talker_decoder", talker["head_dim"], talker["rope_theta"], threads,
                                     device, precision=self.precision, log=log)
        self.predictor = KvCacheNet(ncnn_dir, "predictor_decoder", pred["head_dim"], pred["rope_theta"], threads,
                                    device, precision=self.precision, log=log)
        self.codec_process = None
        if codec_process:
            from .pipeline import CodecProcess

            self.codec_process = CodecProcess(ncnn_dir, st_config["decoder_config"], threads=1)
            self.codec = self.codec_process  # decode_with_voice, in the child
        else:
            self.codec = Codec(ncnn_dir, st_config["decoder_config"], threads, device)
        self.SamplerConfig = SamplerConfig

    def close(self) -> None:
        """Stop the codec process, if there is one (nothing else needs closing)."""
        if self.codec_process is not None:
            self.codec_process.close()

    # ------------------------------------------------------------ vocabulary
    @property
    def languages(self) -> list[str]:
        return ["auto"] + sorted(k for k in self.talker_cfg["codec_language_id"] if "dialect" not in k)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.talker_cfg.get("spk_id") or {})

    @property
    def kind(self) -> str:
        """"base" (clones a voice clip) or "custom_voice" (built-in speakers)."""
        return self.config.get("tts_model_type", "base")

    def text_embed(self, ids) -> np.ndarray:
        return self.text_embed_net(np.asarray(ids, np.int32))[0]

    def codec_embed(self, ids) -> np.ndarray:
        return self.codec_embed_net(np.asarray(ids, np.int32))[0]

    def frame_embeds(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> (T, H): talker table at codebook 0 plus predictor tables at 1..15."""
        codes = np.asarray(codes, np.int64)
        ids = (codes[:, 1:] + np.arange(self.groups - 1) * self.codebook).reshape(-1)
        acoustic = self.pred_embeds(ids.astype(np.int32))[0].reshape(len(codes), self.groups - 1, -1)
        return self.codec_embed(codes[:, 0]) + acoustic.sum(1)

    # ------------------------------------------------------------ voice
    def xvector(self, wav: np.ndarray) -> np.ndarray:
        """The speaker embedding of a 24 kHz mono wav: numpy mel frontend + the exported ECAPA encoder."""
        from .mel import mel_spectrogram

        if self.speaker_encoder is None:
            raise InputError("this checkpoint has no speaker encoder (CustomVoice): use a built-in speaker instead"
                             + (f" ({', '.join(self.speakers)})" if self.speakers else ""))
        return self.speaker_encoder(mel_spectrogram(np.asarray(wav, np.float32)))[0].reshape(-1)

    def encode_voice(self, wav: np.ndarray) -> np.ndarray:
        """Codes (T, 16) of a 24 kHz voice clip: the exported Mimi encoder + the numpy split RVQ.

        The graph takes whole frames, so a wav is zero-padded to a multiple of 1920 samples; the
        reference pads inside every strided conv instead, which can change the last frame's codes
        (chapter 07 measures it)."""
        from .rvq import split_rvq_encode

        if self.mimi is None:
            raise InputError("this checkpoint's ncnn exports have no Mimi encoder; run notebooks/04_export_align.py")
        wav = np.asarray(wav, np.float32).reshape(-1)
        wav = np.pad(wav, (0, -len(wav) % SAMPLES_PER_FRAME))
        steps = len(wav) // (SAMPLES_PER_FRAME // 2)  # the encoder transformer runs at 25 Hz
        cos, sin = rope.tables(self.mimi_cfg["head_dim"], self.mimi_cfg["rope_theta"], 0, steps)
        latent = self.mimi(wav[None, None], rope.causal_mask(steps), cos, sin)[0][0]  # (D, T)
        return split_rvq_encode(latent, self.rvq_tables).T                               # (T, 16)

    def voice(self, wav: np.ndarray | None = None, text: str | None = None, speaker: str | None = None,
              xvector: np.ndarray | None = None) -> Voice:
        """A `Voice` from a voice clip (x-vector; ICL with its transcript `text`), a built-in
        `speaker`, or a precomputed `xvector`. Compute it once and reuse it for many texts."""
        if sum(x is not None for x in (wav, speaker, xvector)) != 1:
            options = (f"a built-in speaker ({', '.join(self.speakers)})" if self.kind == "custom_voice"
                       else "a voice clip to clone (x-vector; add its transcript for ICL)")
            raise InputError(f"give exactly one voice: {options}")
        if text is not None and wav is None:
            raise InputError("a voice transcript needs the voice clip it transcribes")
        if text is not None and not text.strip():
            raise InputError("the voice transcript is empty")
        if speaker is not None:
            spk_id = self.talker_cfg.get("spk_id") or {}
            if speaker.lower() not in spk_id:
                valid = ", ".join(self.speakers) or "(none in this checkpoint)"
                raise InputError(f"unknown speaker {speaker!r}; valid: {valid}")
            return Voice(self.codec_embed([spk_id[speaker.lower()]])[0], speaker=speaker.lower())
        if xvector is not None:
            return Voice(np.asarray(xvector, np.float32).reshape(-1))
        return Voice(self.xvector(wav), codes=self.encode_voice(wav) if text is not None else None, text=text)

    # ------------------------------------------------------------ prompt
    def _codec_tags(self, language: str, speaker: str | None) -> list[int]:
        """think/no-think, think_bos, [language], think_eos; a dialect speaker switches the language."""
        c = self.talker_cfg
        lang = language.lower()
        if lang not in self.languages:
            raise InputError(f"unknown language {language!r}; valid: {', '.join(self.languages)}")
        dialect = (c.get("spk_is_dialect") or {}).get(speaker) if speaker else None
        if dialect and lang in ("chinese", "auto"):
            lang = dialect
        if lang == "auto":
            return [c["codec_nothink_id"], c["codec_think_bos_id"], c["codec_think_eos_id"]]
        return [c["codec_think_id"], c["codec_think_bos_id"], c["codec_language_id"][lang], c["codec_think_eos_id"]]

    def build_prompt(self, text: str, language: str, voice: Voice, non_streaming: bool | None = None) -> Prompt:
        """The reference's prompt, piece by piece (see module docstring). `non_streaming` defaults
        like the reference's entry points: False when cloning, True for built-in speakers."""
        if not text or not text.strip():
            raise InputError("the text is empty")
        non_streaming = (voice.speaker is not None) if non_streaming is None else non_streaming
        c = self.talker_cfg
        ids = self.tokenizer.encode(ROLE_PREFIX + text + TEXT_END)
        role_ids, text_ids = ids[:ROLE_TOKENS], ids[ROLE_TOKENS:-END_TOKENS]
        tts_bos, tts_eos, tts_pad = self.text_embed(
            [self.config["tts_bos_token_id"], self.config["tts_eos_token_id"], self.config["tts_pad_token_id"]])
        codec_pad, codec_bos = self.codec_embed([c["codec_pad_id"], c["codec_bos_id"]])

        # 1. role prefix, then the codec tags, the speaker row and codec_pad under tts_pad … tts_bos
        codec_track = np.concatenate([self.codec_embed(self._codec_tags(language, voice.speaker)),
                                      voice.speaker_row[None], codec_pad[None]])
        text_track = np.concatenate([np.repeat(tts_pad[None], len(codec_track) - 1, 0), tts_bos[None]])
        head = [self.text_embed(role_ids), text_track + codec_track]
        # 2. the text: beside the voice clip's codes (ICL), or on its own
        if voice.codes is not None:
            tail, trailing = self._icl_tail(text_ids, voice, codec_bos, codec_pad, tts_eos, tts_pad, non_streaming)
        elif non_streaming:  # the whole text over codec_pad, then tts_pad + codec_bos
            tail = [np.concatenate([self.text_embed(text_ids), tts_eos[None]]) + codec_pad, (tts_pad + codec_bos)[None]]
            trailing = tts_pad[None]
        else:  # the first text token rides on codec_bos; the rest trails, one per frame
            tail = [self.text_embed(text_ids[:1]) + codec_bos]
            rest = self.text_embed(text_ids[1:]) if len(text_ids) > 1 else np.zeros((0, len(tts_pad)), np.float32)
            trailing = np.concatenate([rest, tts_eos[None]])
        embeds = np.concatenate(head + tail)
        return Prompt(embeds.astype(np.float32), trailing.astype(np.float32), tts_pad.astype(np.float32), ids)

    def _icl_tail(self, text_ids, voice: Voice, codec_bos, codec_pad, tts_eos, tts_pad, non_streaming: bool):
        """ICL: transcript + text + tts_eos beside codec_bos + one row per frame of the clip's codes."""
        voice_ids = self.tokenizer.encode(ROLE_PREFIX + voice.text + VOICE_TEXT_END)[ROLE_TOKENS:-VOICE_END_TOKENS]
        text_rows = np.concatenate([self.text_embed(voice_ids + text_ids), tts_eos[None]])
        code_rows = np.concatenate([codec_bos[None], self.frame_embeds(voice.codes)])
        if non_streaming:
            return [text_rows + codec_pad, code_rows + tts_pad], tts_pad[None]
        if len(text_rows) > len(code_rows):
            return [text_rows[: len(code_rows)] + code_rows], text_rows[len(code_rows):]
        padded = np.concatenate([text_rows, np.repeat(tts_pad[None], len(code_rows) - len(text_rows), 0)])
        return [padded + code_rows], tts_pad[None]

    # ------------------------------------------------------------ loop
    def generate(self, prompt: Prompt, max_new_tokens: int, greedy: bool = True, seed: int = 0,
                 eos_id: int | None = None, on_frame: Callable[[int], None] | None = None,
                 teacher: np.ndarray | None = None) -> Result:
        """Codebook 0 from the talker, 1..15 from the code predictor, until EOS or max_new_tokens samples.

        `teacher` (T, 16): teacher forcing (chapter 10). Every code the model picks is recorded in
        `Result.chosen` but the teacher's code is fed on, for T frames; `Result.codes` is the teacher's."""
        from .sampler import sample

        if teacher is not None and self.fused is not None:
            raise ValueError("teacher forcing runs the CPU loop (gpu_rewrites=False)")
        rng = np.random.default_rng(seed)
        talker_sc = self.SamplerConfig.talker(self.gen_config, self.talker_cfg, greedy=greedy, eos_token_id=eos_id)
        pred_sc = self.SamplerConfig.subtalker(self.gen_config, self.talker_cfg, greedy=greedy)
        timing = {"talker": 0.0, "predictor": 0.0}

        t0 = time.perf_counter()
        hidden = self.talker.prefill(prompt.embeds[None])[0, -1]          # (H,)
        timing["prefill"] = time.perf_counter() - t0
        sequence: list[int] = []
        frames: list[np.ndarray] = []
        chosen: list[np.ndarray] = []
        while True:
            t0 = time.perf_counter()
            logits = self.codec_head(hidden[None])[0][0]
            token = sample(logits, sequence, len(sequence), talker_sc, rng)
            if teacher is not None:
                pick, token = token, int(teacher[len(sequence), 0])
            sequence.append(token)
            timing["talker"] += time.perf_counter() - t0
            if token == talker_sc.eos_id or len(sequence) >= max_new_tokens:
                break
            t0 = time.perf_counter()
            forced = None if teacher is None else teacher[len(frames)]
            frame = self._predict_frame(hidden, token, pred_sc, rng, forced)
            timing["predictor"] += time.perf_counter() - t0
            if teacher is not None:
                chosen.append(np.concatenate([[pick], frame.picks]))
            frames.append(frame.codes)
            if on_frame:
                on_frame(len(frames))
            if teacher is not None and len(frames) == len(teacher):
                break
            t0 = time.perf_counter()
            step = len(frames) - 1
            x = frame.embed + (prompt.trailing[step] if step < len(prompt.trailing) else prompt.tts_pad)
            hidden = self.talker.step(x[None, None].astype(np.float32))[0, -1]
            timing["talker"] += time.perf_counter() - t0
        codes = np.stack(frames) if frames else np.zeros((0, self.groups), np.int64)
        eos_step = len(sequence) - 1 if sequence and sequence[-1] == talker_sc.eos_id else -1
        result = Result(codes.astype(np.int64), sequence, eos_step, seconds=timing)
        if teacher is not None:
            result.chosen = np.stack(chosen).astype(np.int64) if chosen else np.zeros((0, self.groups), np.int64)
        return result

    def _predict_frame(self, hidden: np.ndarray, c0: int, sc, rng, forced: np.ndarray | None = None) -> Frame:
        """Codebooks 1..15 of one frame: 2-position prefill, then 14 steps (table s-1, head s).

        Returns the 16 codes and the frame's embedding (talker table at c0 + predictor tables at
        c1..c15), each code looked up once: the loop feeds that sum to the talker next. With
        `forced` (16,) codes (teacher forcing) those are fed on and the model's picks are kept beside them."""
        from .sampler import sample

        if self.fused is not None:
            return self._predict_frame_fused(hidden, c0, sc, rng)
        codes, picks = [c0], []
        embed = self.codec_embed([c0])[0]
        h = self.predictor.prefill(np.stack([hidden, embed])[None].astype(np.float32))[0, -1]
        for s in range(self.groups - 1):
            logits = self.pred_heads.run([h[None]], [s])[0][0]
            code = sample(logits, codes[1:], s, sc, rng)
            if forced is not None:
                picks.append(code)
                code = int(forced[s + 1])
            codes.append(code)
            e = self.pred_embeds(np.array([s * self.codebook + code], np.int32))[0][0]  # (H,)
            embed = embed + e
            if s < self.groups - 2:
                h = self.predictor.step(e[None, None].astype(np.float32))[0, -1]
        return Frame(np.array(codes, np.int64), embed, None if forced is None else np.array(picks, np.int64))

    def _predict_frame_fused(self, hidden: np.ndarray, c0: int, sc, rng) -> Frame:
        """`_predict_frame` over `runtime.vulkan`'s graphs: table lookups in numpy and one fused graph call
        (decoder over the whole sequence, no cache, then head s) per codebook."""
        from .sampler import sample

        codec_table, pred_table = self.tables
        codes, embed, seq = [c0], codec_table[c0], [hidden, codec_table[c0]]
        for s in range(self.groups - 1):
            code = sample(self.fused.logits(np.stack(seq), s), codes[1:], s, sc, rng)
            codes.append(code)
            seq.append(pred_table[s * self.codebook + code])
            embed = embed + seq[-1]
        return Frame(np.array(codes, np.int64), embed)

    # ------------------------------------------------------------ all of it
    def synthesize(self, text: str, language: str, voice: Voice, max_new_tokens: int = 2048, greedy: bool = True,
                   seed: int = 0, non_streaming: bool | None = None, on_frame: Callable[[int], None] | None = None,
                   on_warning: Callable[[str], None] | None = None) -> Result:
        """Prompt, loop, decode: the product's one pipeline (the CLI runs exactly this).

        `on_frame(n)` after each generated frame (progress bars); `on_warning(message)` as soon as
        a problem is known (e.g. text longer than the frame cap), also kept in `Result.warnings`."""
        if self.codec_process is not None:  # decoded in the child while the loop runs: a stream, drained
            return self._synthesize_pipelined(text, language, voice, max_new_tokens, greedy=greedy, seed=seed,
                                              non_streaming=non_streaming, on_frame=on_frame, on_warning=on_warning)
        prompt = self.build_prompt(text, language, voice, non_streaming)
        warnings = []
        frames = max_new_tokens - 1
        if len(prompt.trailing) > frames:
            warnings.append(f"the text has {len(prompt.text_ids) - ROLE_TOKENS - END_TOKENS} tokens but at most "
                            f"{frames} frames ({frames / FRAME_RATE:.0f} s) will be generated: "
                            "the end of the text will not be spoken")
        for w in warnings:
            if on_warning:
                on_warning(w)
        result = self.generate(prompt, max_new_tokens, greedy=greedy, seed=seed, on_frame=on_frame)
        result.warnings = warnings
        t0 = time.perf_counter()
        result.wav = self.codec.decode_with_voice(result.codes, voice.codes)
        result.seconds["codec"] = time.perf_counter() - t0
        return result

    def _synthesize_pipelined(self, text, language, voice, max_new_tokens, on_frame=None, **kwargs) -> Result:
        """`synthesize` with a codec process: the stream (prompt, warnings and loop on the tap), drained."""
        from .stream import drain, stream_synthesis

        pieces, ended = [], []
        stream = stream_synthesis(self, text, language, voice, chunk_frames=0,  # 0: the child decodes when free
                                  max_new_tokens=max_new_tokens, **kwargs,
                                  on_frame=lambda n: (ended.append(time.perf_counter()), on_frame and on_frame(n)))
        result = drain(stream, pieces.append)
        result.wav = np.concatenate(pieces).astype(np.float32) if pieces else np.zeros(0, np.float32)
        result.seconds["codec"] = time.perf_counter() - ended[-1] if ended else 0.0  # what the loop did not hide
        return result

    def stream(self, text: str, language: str, voice: Voice, max_new_tokens: int = 2048, chunk_frames: int = 4,
               context_frames: int | None = None, **kwargs):
        """`synthesize`, streamed: yields 24 kHz float32 pieces of `chunk_frames` frames as they are generated;
        concatenated they are `synthesize(...)`'s wav (`stream.StreamDecoder` says how exactly). Returns
        the `Result` (wav None) when exhausted; kwargs as `synthesize`'s. Introduced in 11."""
        from .stream import stream_synthesis

        if chunk_frames < 1:
            raise ValueError(f"chunk_frames must be at least 1, not {chunk_frames}")
        return stream_synthesis(self, text, language, voice, chunk_frames=chunk_frames,
                                context_frames=context_frames, max_new_tokens=max_new_tokens, **kwargs)


def missing_graphs(ncnn_dir: Path, raise_error: bool = False) -> list[str]:
    """The exported graphs the synthesizer needs that `ncnn_dir` lacks (with the chapter to run)."""
    missing = [g for g in GRAPHS if not (ncnn_dir / f"{g}.param").is_file()]
    missing += [f"{g}_kv" for g in CACHED_GRAPHS if not (ncnn_dir / f"{g}_kv.param").is_file()]
    if missing and raise_error:
        first = "04_export_align" if any(not m.endswith("_kv") for m in missing) else "05_inject_kv_cache"
        raise MissingArtifact(f"missing ncnn graphs in {ncnn_dir}: {', '.join(missing)}; run notebooks/{first}.py"
                              " (and the chapters after it)")
    return missing

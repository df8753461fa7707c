"""Text to speech with ncnn alone: prompt, talker loop, code predictor, codec. Introduced in 06.

This is the generation loop of `Qwen3TTSForConditionalGeneration.generate` and the talker's
`forward`, re-expressed over the exported graphs (chapters 04-05), with numpy for everything
between them. The order of operations is the reference's, step for step:

prompt (x-vector mode, streaming text):
    text track   role(3 ids)   tts_pad × (k+1)        tts_bos        text[0]
    codec track  -             think…lang…think_eos, spk, codec_pad   codec_bos
  the two tracks are summed position by position; the rest of the text, then tts_eos, is
  "trailing text", added one position per frame, then tts_pad forever.
loop:
    prefill -> logits of codebook 0 -> sample c0
    per step: code predictor on [talker hidden, embed(c0)] -> c1 (head 0), then 14 steps
      (table s-1, head s) -> c2..c15; the frame (c0..c15) is complete one step late;
      next talker input = embed(c0) + Σ predictor tables(c1..c15) + trailing text (or tts_pad)
    stop when c0 is EOS (only codebook 0 is checked) or after max_new_tokens samples
codec: the reference decodes in chunks of 300 frames with 25 frames of left context; so do we.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from . import rope
from .kvcache import KvCacheNet
from .net import MissingArtifact, Net

GRAPHS = ["talker_text_embed", "talker_codec_embed", "talker_decoder", "talker_codec_head",
          "predictor_decoder", "predictor_embeds", "predictor_heads", "codec_decoder"]
CHUNK, LEFT_CONTEXT = 300, 25  # the reference's chunked_decode defaults
SAMPLES_PER_FRAME = 1920


class InputError(ValueError):
    """Bad user input (text, language, voice): the message says what is valid."""


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


class Synthesizer:
    """The deployable pipeline over `models/<ckpt>/` and its `ncnn/` exports."""

    def __init__(self, model_dir: str | Path, threads: int = 2, vulkan: bool = False):
        from .bpe import Tokenizer
        from .sampler import SamplerConfig

        self.model_dir = Path(model_dir)
        ncnn_dir = self.model_dir / "ncnn"
        if not (self.model_dir / "config.json").is_file():
            raise MissingArtifact(f"{self.model_dir} has no config.json; run notebooks/00_get_checkpoint.py")
        self.config = json.loads((self.model_dir / "config.json").read_text())
        self.gen_config = json.loads((self.model_dir / "generation_config.json").read_text())
        self.talker_cfg = self.config["talker_config"]
        self.pred_cfg = self.talker_cfg["code_predictor_config"]
        missing = [g for g in GRAPHS if not (ncnn_dir / f"{g}.param").is_file()]
        missing += [f"{g}_kv" for g in ("talker_decoder", "predictor_decoder") if not (ncnn_dir / f"{g}_kv.param").is_file()]
        if missing:
            first = "04_export_align" if any(not m.endswith("_kv") for m in missing) else "05_inject_kv_cache"
            raise MissingArtifact(f"missing ncnn graphs in {ncnn_dir}: {', '.join(missing)}; run notebooks/{first}.py"
                                  " (and the chapters after it)")
        self.tokenizer = Tokenizer.from_dir(self.model_dir)
        self.text_embed_net = Net(ncnn_dir, "talker_text_embed", threads, vulkan)
        self.codec_embed_net = Net(ncnn_dir, "talker_codec_embed", threads, vulkan)
        self.codec_head = Net(ncnn_dir, "talker_codec_head", threads, vulkan)
        self.pred_embeds = Net(ncnn_dir, "predictor_embeds", threads, vulkan)
        self.pred_heads = Net(ncnn_dir, "predictor_heads", threads, vulkan)
        self.codec = Net(ncnn_dir, "codec_decoder", threads, vulkan)
        has = lambda n: (ncnn_dir / n).is_file()  # noqa: E731
        self.speaker_encoder = Net(ncnn_dir, "speaker_encoder", threads, vulkan) if has("speaker_encoder.param") else None
        self.mimi = Net(ncnn_dir, "mimi_encoder", threads, vulkan) if has("mimi_encoder.param") and has("mimi_rvq.npz") else None
        self.rvq_tables = dict(np.load(ncnn_dir / "mimi_rvq.npz")) if self.mimi is not None else None
        self.mimi_cfg = json.loads((self.model_dir / "speech_tokenizer" / "config.json").read_text())["encoder_config"]
        self.talker = KvCacheNet(ncnn_dir, "talker_decoder", self.talker_cfg["head_dim"], self.talker_cfg["rope_theta"], threads, vulkan)
        self.predictor = KvCacheNet(ncnn_dir, "predictor_decoder", self.pred_cfg["head_dim"], self.pred_cfg["rope_theta"], threads, vulkan)
        codec_cfg = json.loads((self.model_dir / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
        self.codec_cfg = codec_cfg
        self.groups = self.talker_cfg["num_code_groups"]
        self.codebook = self.pred_cfg["vocab_size"]
        self.SamplerConfig = SamplerConfig

    # ------------------------------------------------------------ vocabulary
    @property
    def languages(self) -> list[str]:
        return ["auto"] + sorted(k for k in self.talker_cfg["codec_language_id"] if "dialect" not in k)

    @property
    def speakers(self) -> list[str]:
        return sorted(self.talker_cfg.get("spk_id") or {})

    def text_embed(self, ids) -> np.ndarray:
        return self.text_embed_net(np.asarray(ids, np.int32))[0]

    def codec_embed(self, ids) -> np.ndarray:
        return self.codec_embed_net(np.asarray(ids, np.int32))[0]

    def xvector(self, wav: np.ndarray) -> np.ndarray:
        """The speaker embedding of a 24 kHz mono wav: numpy mel frontend + the exported ECAPA encoder."""
        from .mel import mel_spectrogram

        if self.speaker_encoder is None:
            raise InputError("this checkpoint has no speaker encoder (CustomVoice): use a built-in speaker instead"
                             + (f" ({', '.join(self.speakers)})" if self.speakers else ""))
        return self.speaker_encoder(mel_spectrogram(np.asarray(wav, np.float32)))[0].reshape(-1)

    def encode_voice(self, wav: np.ndarray) -> np.ndarray:
        """Reference codes (T, 16) of a 24 kHz wav: the exported Mimi encoder + the numpy split RVQ.

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

    def frame_embeds(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> (T, H): talker table at codebook 0 plus predictor tables at 1..15."""
        codes = np.asarray(codes, np.int64)
        ids = (codes[:, 1:] + np.arange(self.groups - 1) * self.codebook).reshape(-1)
        acoustic = self.pred_embeds(ids.astype(np.int32))[0].reshape(len(codes), self.groups - 1, -1)
        return self.codec_embed(codes[:, 0]) + acoustic.sum(1)

    # ------------------------------------------------------------ prompt
    def build_prompt(self, text: str, language: str, xvector: np.ndarray | None = None, speaker: str | None = None,
                     voice_codes: np.ndarray | None = None, voice_text: str | None = None,
                     non_streaming: bool | None = None) -> Prompt:
        """The reference's prompt (see module docstring). x-vector or built-in `speaker` for the
        speaker row; `voice_codes` + `voice_text` for ICL. `non_streaming` defaults like the reference's
        entry points: False when cloning, True for built-in speakers."""
        if not text or not text.strip():
            raise InputError("the text is empty")
        if (voice_codes is None) != (voice_text is None):
            raise InputError("ICL needs both the reference codes and the reference text")
        if voice_text is not None and not voice_text.strip():
            raise InputError("the reference text is empty")
        t, c = self.config, self.talker_cfg
        lang = language.lower()
        if lang not in self.languages:
            raise InputError(f"unknown language {language!r}; valid: {', '.join(self.languages)}")
        non_streaming = (speaker is not None) if non_streaming is None else non_streaming
        spk = None
        if speaker is not None:
            if speaker.lower() not in (c.get("spk_id") or {}):
                raise InputError(f"unknown speaker {speaker!r}; valid: {', '.join(self.speakers) or '(none in this checkpoint)'}")
            spk = self.codec_embed([c["spk_id"][speaker.lower()]])[0]
            dialect = (c.get("spk_is_dialect") or {}).get(speaker.lower())
            if lang in ("chinese", "auto") and dialect:
                lang = dialect
        elif xvector is not None:
            spk = np.asarray(xvector, np.float32).reshape(-1)
        ids = self.tokenizer.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
        bos, eos, pad = self.text_embed([t["tts_bos_token_id"], t["tts_eos_token_id"], t["tts_pad_token_id"]])
        if lang == "auto":
            tags = [c["codec_nothink_id"], c["codec_think_bos_id"], c["codec_think_eos_id"]]
        else:
            tags = [c["codec_think_id"], c["codec_think_bos_id"], c["codec_language_id"][lang], c["codec_think_eos_id"]]
        codec = [self.codec_embed(tags)] + ([spk[None]] if spk is not None else []) + [self.codec_embed([c["codec_pad_id"], c["codec_bos_id"]])]
        codec = np.concatenate(codec)                                        # (k, H), ends with codec_bos
        text_track = np.concatenate([np.repeat(pad[None], len(codec) - 2, 0), bos[None]])
        head = np.concatenate([self.text_embed(ids[:3]), text_track + codec[:-1]])  # role, then tags/spk/pad
        codec_pad, codec_bos = self.codec_embed([c["codec_pad_id"]])[0], codec[-1]
        body = ids[3:-5]                                                     # the text between the role and <|im_end|>
        if voice_codes is not None:
            ref_ids = self.tokenizer.encode(f"<|im_start|>assistant\n{voice_text}<|im_end|>\n")[3:-2]
            text_e = np.concatenate([self.text_embed(ref_ids + body), eos[None]])
            codec_e = np.concatenate([codec_bos[None], self.frame_embeds(voice_codes)])
            if non_streaming:
                tail = [text_e + codec_pad, codec_e + pad]
                trailing = pad[None]
            elif len(text_e) > len(codec_e):
                tail, trailing = [text_e[: len(codec_e)] + codec_e], text_e[len(codec_e):]
            else:
                tail = [np.concatenate([text_e, np.repeat(pad[None], len(codec_e) - len(text_e), 0)]) + codec_e]
                trailing = pad[None]
        elif non_streaming:
            tail = [np.concatenate([self.text_embed(body), eos[None]]) + codec_pad, (pad + codec_bos)[None]]
            trailing = pad[None]
        else:
            tail = [self.text_embed(ids[3:4]) + codec_bos]                    # first text token rides on codec_bos
            trailing = np.concatenate([self.text_embed(ids[4:-5]), eos[None]]) if len(ids) > 9 else eos[None]
        embeds = np.concatenate([head] + tail)
        return Prompt(embeds.astype(np.float32), trailing.astype(np.float32), pad.astype(np.float32), ids)

    # ------------------------------------------------------------ loop
    def generate(self, prompt: Prompt, max_new_tokens: int, greedy: bool = True, seed: int = 0,
                 eos_id: int | None = None, on_frame: Callable[[int], None] | None = None) -> Result:
        """Codebook 0 from the talker, 1..15 from the code predictor, until EOS or max_new_tokens samples."""
        from .sampler import sample

        rng = np.random.default_rng(seed)
        talker_sc = self.SamplerConfig.talker(self.gen_config, self.talker_cfg, greedy=greedy, eos_token_id=eos_id)
        pred_sc = self.SamplerConfig.subtalker(self.gen_config, self.talker_cfg, greedy=greedy)
        timing = {"talker": 0.0, "predictor": 0.0}

        t0 = time.perf_counter()
        hidden = self.talker.prefill(prompt.embeds[None])[0, -1]          # (H,)
        timing["talker"] += time.perf_counter() - t0
        sequence: list[int] = []
        frames: list[np.ndarray] = []
        eos = talker_sc.eos_id
        while True:
            t0 = time.perf_counter()
            logits = self.codec_head(hidden[None])[0][0]
            token = sample(logits, sequence, len(sequence), talker_sc, rng)
            sequence.append(token)
            timing["talker"] += time.perf_counter() - t0
            if token == eos or len(sequence) >= max_new_tokens:
                break
            t0 = time.perf_counter()
            frame = self._predict_frame(hidden, token, pred_sc, rng)
            timing["predictor"] += time.perf_counter() - t0
            frames.append(frame)
            if on_frame:
                on_frame(len(frames))
            t0 = time.perf_counter()
            step = len(frames) - 1
            x = self.frame_embeds(frame[None])[0]
            x = x + (prompt.trailing[step] if step < len(prompt.trailing) else prompt.tts_pad)
            hidden = self.talker.step(x[None, None].astype(np.float32))[0, -1]
            timing["talker"] += time.perf_counter() - t0
        codes = np.stack(frames) if frames else np.zeros((0, self.groups), np.int64)
        eos_step = len(sequence) - 1 if sequence and sequence[-1] == eos else -1
        return Result(codes.astype(np.int64), sequence, eos_step, seconds=timing)

    def _predict_frame(self, hidden: np.ndarray, c0: int, sc, rng) -> np.ndarray:
        """Codebooks 1..15 of one frame: 2-position prefill, then 14 steps (table s-1, head s)."""
        from .sampler import sample

        codes = [c0]
        x = np.stack([hidden, self.codec_embed([c0])[0]])[None]               # (1, 2, H)
        h = self.predictor.prefill(x.astype(np.float32))[0, -1]
        for s in range(self.groups - 1):
            logits = self.pred_heads.run([h[None]], [s])[0][0]
            code = sample(logits, codes[1:], s, sc, rng)
            codes.append(code)
            if s == self.groups - 2:
                break
            e = self.pred_embeds(np.array([s * self.codebook + code], np.int32))[0]
            h = self.predictor.step(e[None].astype(np.float32))[0, -1]
        return np.array(codes, np.int64)

    # ------------------------------------------------------------ codec
    def decode(self, codes: np.ndarray) -> np.ndarray:
        """codes (T, 16) -> wav (1920·T,), chunked exactly as the reference's chunked_decode."""
        if len(codes) == 0:
            return np.zeros(0, np.float32)
        parts, start, T = [], 0, len(codes)
        while start < T:
            end = min(start + CHUNK, T)
            ctx = LEFT_CONTEXT if start - LEFT_CONTEXT > 0 else start
            wav = self._decode_once(codes[start - ctx : end])
            parts.append(wav[ctx * SAMPLES_PER_FRAME :])
            start = end
        return np.concatenate(parts)

    def _decode_once(self, codes: np.ndarray) -> np.ndarray:
        T = len(codes)
        c = self.codec_cfg
        semantic = codes[:, 0][None].astype(np.int32)                           # (1, T)
        offsets = np.arange(self.groups - 1)[:, None] * c["codebook_size"]
        acoustic = (codes[:, 1:].T + offsets).reshape(-1).astype(np.int32)       # (15·T,) group-major
        mask = rope.causal_mask(T, window=c["sliding_window"])
        cos, sin = rope.tables(c["head_dim"], c["rope_theta"], 0, T)
        return self.codec(semantic, acoustic, mask, cos, sin)[0].reshape(-1)

    # ------------------------------------------------------------ all of it
    def synthesize(self, text: str, language: str, xvector: np.ndarray | None = None, speaker: str | None = None,
                   voice_wav: np.ndarray | None = None, voice_text: str | None = None, max_new_tokens: int = 2048,
                   greedy: bool = True, seed: int = 0, on_frame: Callable[[int], None] | None = None) -> Result:
        """Everything: voice (x-vector from `voice_wav`, ICL when `voice_text` too, or a built-in speaker),
        prompt, loop, decode. For ICL the reference codes are decoded with the generated ones and
        the reference part is cut off by frame ratio, as the reference does."""
        voice_codes = None
        if voice_wav is not None:
            xvector = self.xvector(voice_wav) if xvector is None else xvector
            voice_codes = self.encode_voice(voice_wav) if voice_text is not None else None
        prompt = self.build_prompt(text, language, xvector=xvector, speaker=speaker, voice_codes=voice_codes, voice_text=voice_text)
        result = self.generate(prompt, max_new_tokens, greedy=greedy, seed=seed, on_frame=on_frame)
        t0 = time.perf_counter()
        result.wav = self.decode_with_voice(result.codes, voice_codes)
        result.seconds["codec"] = time.perf_counter() - t0
        return result

    def decode_with_voice(self, codes: np.ndarray, voice_codes: np.ndarray | None = None) -> np.ndarray:
        """Decode; with reference codes, decode them in front and cut their share of the samples."""
        if voice_codes is None or len(voice_codes) == 0:
            return self.decode(codes)
        total = np.concatenate([voice_codes, codes])
        wav = self.decode(total)
        cut = int(len(voice_codes) / max(len(total), 1) * len(wav))
        return wav[cut:]

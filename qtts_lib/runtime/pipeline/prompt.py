"""The prompt: who speaks (`Voice`) and what the talker is fed (`Prompt`). Introduced in 07.

The prompt is two tracks summed position by position (`PromptBuilder.build`):

    text track   [instruction]   role prefix   tts_pad … tts_pad   tts_bos     first text token
    codec track  -               -             codec tags, speaker row, codec_pad   codec_bos

An instruction (`Voice.instruct`: a style for a built-in speaker, or the voice itself on a VoiceDesign checkpoint)
comes first, text-only, as the reference wraps it: `<|im_start|>user\n{instruct}<|im_end|>\n`, tokenized on its own.
A VoiceDesign voice has no speaker row.

The rest of the text, then tts_eos, is "trailing text", added one position per frame, then tts_pad forever. With
`non_streaming` (the reference's default for built-in speakers) the whole text goes into the prompt instead, over
codec_pad, and the trailing text is tts_pad alone. ICL cloning puts the voice clip's transcript in front of the
text and the clip's codes on the codec track (`PromptBuilder.icl_tail`). An x-vector prompt can be built before its
text is complete (`open_prompt`, then `extend_prompt`): its trailing text is read a token a frame, so frame t needs only
the text's token t.

How long a text may speak is decided here too (`frame_cap`): speech takes about 2.5-5 frames per text token in the
checkpoint's languages (English read at 150 words a minute is ~3.3 tokens/s, i.e. ~3.8 frames/token; Chinese at
~4 characters/s is ~4.3; Japanese and Russian, with shorter tokens, less); FRAMES_PER_TOKEN = 8 is twice a slow
narrator's rate, and MARGIN_FRAMES (2 s) covers the leading and trailing silence and one-token texts. A generation
that reaches its cap has run away (random weights always do): it costs at most about twice its natural length.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError, MissingArtifact
from ..text.bpe import Tokenizer
from .config import ModelConfig
from .embeddings import Embeddings

# The chat template the reference wraps the text in. Tokenized as one string, its fixed parts
# take ROLE_TOKENS ids in front ("<|im_start|>assistant\n") and END_TOKENS at the end
# ("<|im_end|>\n<|im_start|>assistant\n"); the voice clip's transcript ends after VOICE_END_TOKENS
# ("<|im_end|>\n"). The counts are checked against the tokenizer when a PromptBuilder is made.
# What people type (the text, the voice clip's transcript, an instruction) fills a `{}`: `Tokenizer.encode_template`
# reads it as text, so a `<|im_end|>` in it is spoken, not obeyed (the reference would end the turn there).
ROLE_PREFIX = "<|im_start|>assistant\n"
INSTRUCT = "<|im_start|>user\n{}<|im_end|>\n"  # qwen_tts `_build_instruct_text`
TEXT_END = "<|im_end|>\n<|im_start|>assistant\n"
VOICE_TEXT_END = "<|im_end|>\n"
TEXT = ROLE_PREFIX + "{}" + TEXT_END
VOICE_TEXT = ROLE_PREFIX + "{}" + VOICE_TEXT_END
ROLE_TOKENS, END_TOKENS, VOICE_END_TOKENS = 3, 5, 2

FRAMES_PER_TOKEN = 8        # the frame cap's slope (see the module docstring)
MARGIN_FRAMES = 25          # ... and its intercept, 2 s


def frame_cap(tokens: int, max_frames: int | None = None, frames_per_token: float = FRAMES_PER_TOKEN,
              margin: int = MARGIN_FRAMES) -> int:
    """Frames a text of `tokens` text tokens may generate: scaled by its length, never above `max_frames`."""
    cap = int(np.ceil(frames_per_token * tokens)) + margin
    return max(1, min(cap, max_frames) if max_frames else cap)


@dataclass
class Voice:
    """Who speaks, and how. `speaker_row` fills the prompt's speaker slot: an x-vector from a voice clip, or a
    built-in speaker's row of the codec embedding (`speaker` names it); None on a VoiceDesign checkpoint, where
    `instruct` describes the voice. ICL cloning adds the clip's `codes` (T, 16) and its transcript `text`. `instruct`
    is an instruction in words (a style for a built-in speaker). Build one with `Synthesizer.voice` and reuse it."""
    speaker_row: np.ndarray | None
    speaker: str | None = None
    codes: np.ndarray | None = None
    text: str | None = None
    instruct: str | None = None

    @property
    def mode(self) -> str:
        """"xvector" or "icl" (a clone), "speaker" (a built-in speaker), "design" (a described voice)."""
        if self.speaker_row is None:
            return "design"
        return "speaker" if self.speaker else ("icl" if self.codes is not None else "xvector")


@dataclass
class Prompt:
    """What the talker is fed: prompt embeddings (P, H), trailing text (M, H), tts_pad (H,); the text's token ids.
    `head`: how many of the first positions depend on the voice, the language and the instruction alone, not on the
    text (fewer than P): utterances with the same head can share its cache (`pipeline.scheduler.Prefixes`)."""
    embeds: np.ndarray
    trailing: np.ndarray
    tts_pad: np.ndarray
    text_ids: list[int] = field(default_factory=list)
    head: int = 0
    open: bool = False      # its text is still coming (`PromptBuilder.open_prompt`): trailing rows may follow


    @property
    def text_tokens(self) -> int:
        """The text's own tokens (the chat template's fixed tokens left out)."""
        return len(self.text_ids) - ROLE_TOKENS - END_TOKENS

    def text_at(self, step: int) -> np.ndarray | None:
        """The text row added to the talker's input after frame `step`: trailing text, then tts_pad; None while the
        prompt is open and that row has not come yet."""
        if step < len(self.trailing):
            return self.trailing[step]
        return None if self.open else self.tts_pad


class PromptBuilder:
    """The reference's prompt, piece by piece, over the checkpoint's tokenizer and embeddings."""

    def __init__(self, cfg: ModelConfig, tokenizer: Tokenizer, embeddings: Embeddings):
        self.cfg, self.tokenizer, self.embed = cfg, tokenizer, embeddings
        for fixed, n in ((ROLE_PREFIX, ROLE_TOKENS), (TEXT_END, END_TOKENS), (VOICE_TEXT_END, VOICE_END_TOKENS)):
            if len(tokenizer.encode(fixed)) != n:
                raise MissingArtifact(f"this tokenizer splits {fixed!r} into other than {n} tokens")

    def text_tokens(self, text: str) -> int:
        """How many tokens the model reads for `text` (what `frame_cap` scales with)."""
        return len(self.tokenizer.encode(text, added_tokens=False))

    def codec_tags(self, language: str, speaker: str | None) -> list[int]:
        """think/no-think, think_bos, [language], think_eos; a dialect speaker switches the language."""
        c = self.cfg.talker
        lang = language.lower()
        if lang not in self.cfg.languages:
            raise InputError(f"unknown language {language!r}; valid: {', '.join(self.cfg.languages)}")
        dialect = (c.get("spk_is_dialect") or {}).get(speaker) if speaker else None
        if dialect and lang in ("chinese", "auto"):
            lang = dialect
        if lang == "auto":
            return [c["codec_nothink_id"], c["codec_think_bos_id"], c["codec_think_eos_id"]]
        return [c["codec_think_id"], c["codec_think_bos_id"], c["codec_language_id"][lang], c["codec_think_eos_id"]]

    def build(self, text: str, language: str, voice: Voice, non_streaming: bool | None = None) -> Prompt:
        """The prompt for `text` in `language` spoken by `voice` (see module docstring). `non_streaming` defaults
        like the reference's entry points: False when cloning, True for built-in speakers and designed voices. An
        instruction reaches the prompt only where the checkpoint follows one (`ModelConfig.follows_instructions`;
        the synthesizer warns when it does not)."""
        if not isinstance(text, str) or not text.strip():
            raise InputError("the text is empty")
        non_streaming = (voice.mode in ("speaker", "design")) if non_streaming is None else non_streaming
        embed = self.embed
        ids = self.tokenizer.encode_template(TEXT, text)
        role_ids, text_ids = ids[:ROLE_TOKENS], ids[ROLE_TOKENS:-END_TOKENS]
        tts_eos, tts_pad, codec_pad, codec_bos = self._specials()
        head = self._head(role_ids, language, voice)
        # 2. the text: beside the voice clip's codes (ICL), or on its own
        if voice.codes is not None:
            tail, trailing = self.icl_tail(text_ids, voice, codec_bos, codec_pad, tts_eos, tts_pad, non_streaming)
        elif non_streaming:  # the whole text over codec_pad, then tts_pad + codec_bos
            tail = [np.concatenate([embed.text(text_ids), tts_eos[None]]) + codec_pad, (tts_pad + codec_bos)[None]]
            trailing = tts_pad[None]
        else:  # the first text token rides on codec_bos; the rest trails, one per frame
            tail = [embed.text(text_ids[:1]) + codec_bos]
            rest = embed.text(text_ids[1:]) if len(text_ids) > 1 else np.zeros((0, len(tts_pad)), np.float32)
            trailing = np.concatenate([rest, tts_eos[None]])
        embeds = np.concatenate(head + tail)
        return Prompt(embeds.astype(np.float32), trailing.astype(np.float32), tts_pad.astype(np.float32), ids,
                      head=sum(len(rows) for rows in head))

    def _specials(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """tts_eos, tts_pad, codec_pad, codec_bos rows."""
        cfg, c = self.cfg.config, self.cfg.talker
        tts_eos, tts_pad = self.embed.text([cfg["tts_eos_token_id"], cfg["tts_pad_token_id"]])
        codec_pad, codec_bos = self.embed.codec([c["codec_pad_id"], c["codec_bos_id"]])
        return tts_eos, tts_pad, codec_pad, codec_bos

    def _head(self, role_ids: list[int], language: str, voice: Voice) -> list[np.ndarray]:
        """1. [the instruction, text only], the role prefix, then the codec tags, the speaker row (if any) and
        codec_pad under tts_pad … tts_bos."""
        cfg, c, embed = self.cfg.config, self.cfg.talker, self.embed
        tts_bos, tts_pad = embed.text([cfg["tts_bos_token_id"], cfg["tts_pad_token_id"]])
        codec_pad = embed.codec([c["codec_pad_id"]])[0]
        speaker_row = [] if voice.speaker_row is None else [voice.speaker_row[None]]
        codec_track = np.concatenate([embed.codec(self.codec_tags(language, voice.speaker)), *speaker_row,
                                      codec_pad[None]])
        text_track = np.concatenate([np.repeat(tts_pad[None], len(codec_track) - 1, 0), tts_bos[None]])
        head = [embed.text(role_ids), text_track + codec_track]
        if voice.instruct and self.cfg.follows_instructions:
            head.insert(0, embed.text(self.tokenizer.encode_template(INSTRUCT, voice.instruct)))
        return head

    def open_prompt(self, text_ids: list[int], language: str, voice: Voice) -> Prompt:
        """`build`'s x-vector prompt for a text of which only the first ids are known (at least one: it rides on
        codec_bos), the rest to come (`extend_prompt`): the text track is read one token a frame, so the talker needs
        token t only at frame t (`Prompt.text_at` says None until it has come). Introduced in 19."""
        if voice.mode != "xvector" or not text_ids:
            raise InputError("only an x-vector voice reads its text a token a frame, and the text needs a token")
        role_ids = self.tokenizer.encode(ROLE_PREFIX)
        _, tts_pad, _, codec_bos = self._specials()
        head = self._head(role_ids, language, voice)
        embeds = np.concatenate(head + [self.embed.text(text_ids[:1]) + codec_bos])
        trailing = self.embed.text(text_ids[1:]) if len(text_ids) > 1 else np.zeros((0, len(tts_pad)), np.float32)
        return Prompt(embeds.astype(np.float32), trailing.astype(np.float32), tts_pad.astype(np.float32),
                      role_ids + list(text_ids), head=sum(len(rows) for rows in head), open=True)

    def extend_prompt(self, prompt: Prompt, text_ids: list[int], last: bool) -> None:
        """More of an open prompt's text (`open_prompt`); `last`: the text is complete (tts_eos follows it, and the
        chat template's end joins `text_ids`, as `build` has them)."""
        rows = [self.embed.text(text_ids)] if text_ids else []
        if last:
            rows.append(self._specials()[0][None])
        if rows:
            prompt.trailing = np.concatenate([prompt.trailing, *rows]).astype(np.float32)
        prompt.text_ids = prompt.text_ids + list(text_ids) + (self.tokenizer.encode(TEXT_END) if last else [])
        prompt.open = not last

    def icl_tail(self, text_ids, voice: Voice, codec_bos, codec_pad, tts_eos, tts_pad, non_streaming: bool):
        """ICL: transcript + text + tts_eos beside codec_bos + one row per frame of the clip's codes."""
        voice_ids = self.tokenizer.encode_template(VOICE_TEXT, voice.text)[ROLE_TOKENS:-VOICE_END_TOKENS]
        text_rows = np.concatenate([self.embed.text(voice_ids + text_ids), tts_eos[None]])
        code_rows = np.concatenate([codec_bos[None], self.embed.frame(voice.codes)])
        if non_streaming:
            return [text_rows + codec_pad, code_rows + tts_pad], tts_pad[None]
        if len(text_rows) > len(code_rows):
            return [text_rows[: len(code_rows)] + code_rows], text_rows[len(code_rows):]
        padded = np.concatenate([text_rows, np.repeat(tts_pad[None], len(code_rows) - len(text_rows), 0)])
        return [padded + code_rows], tts_pad[None]

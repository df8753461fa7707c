"""What a checkpoint directory says about itself: its config files, read once. Introduced in 07.

Everything the runtime needs to know about a model (widths, ids, languages, speakers, sampling defaults, the
codec's shape) comes from the checkpoint's own files, never from a size name: a tiny random checkpoint, the
full-size one and a real one from the hub go down the same code.

    config.json                      the talker, its code predictor, the special ids, speakers and languages
    generation_config.json           the sampling defaults (`pipeline.sampling.Sampling.from_generation_config`)
    speech_tokenizer/config.json     the codec decoder (`decoder_config`) and the Mimi encoder (`encoder_config`)
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from ..errors import MissingArtifact


@dataclass(frozen=True)
class ModelConfig:
    directory: Path
    config: dict
    generation: dict
    speech_tokenizer: dict

    @classmethod
    def load(cls, model_dir: str | Path) -> ModelConfig:
        d = Path(model_dir)
        files = [d / "config.json", d / "generation_config.json", d / "speech_tokenizer" / "config.json"]
        missing = [str(f.relative_to(d)) for f in files if not f.is_file()]
        if missing:
            raise MissingArtifact(f"{d} is not a checkpoint directory (no {', '.join(missing)}); pass one, or run "
                                  "notebooks/00_get_checkpoint.py")
        return cls(d, *(json.loads(f.read_text()) for f in files))

    @property
    def ncnn_dir(self) -> Path:
        return self.directory / "ncnn"

    @property
    def talker(self) -> dict:
        return self.config["talker_config"]

    @property
    def predictor(self) -> dict:
        return self.talker["code_predictor_config"]

    @property
    def codec(self) -> dict:
        """The codec decoder's config (`decoder_config`)."""
        return self.speech_tokenizer["decoder_config"]

    @property
    def mimi(self) -> dict:
        """The Mimi encoder's config (`encoder_config`)."""
        return self.speech_tokenizer["encoder_config"]

    @property
    def kind(self) -> str:
        """"base" (clones a voice clip), "custom_voice" (built-in speakers) or "voice_design" (voices described in
        words)."""
        return self.config.get("tts_model_type", "base")

    @property
    def follows_instructions(self) -> bool:
        """Whether an instruction reaches the prompt: VoiceDesign always (it is the voice), CustomVoice except at
        0.6B, where the reference drops it (qwen_tts's own test of `tts_model_size`, qwen3_tts_model.py:799); Base
        never (a clone takes none)."""
        size = self.config.get("tts_model_size") or ""
        return self.kind == "voice_design" or (self.kind == "custom_voice" and size not in "0b6")

    @property
    def groups(self) -> int:
        """Codebooks per frame (16): codebook 0 from the talker, the rest from the code predictor."""
        return int(self.talker["num_code_groups"])

    @property
    def codebook(self) -> int:
        """Codes per acoustic codebook (2048)."""
        return int(self.predictor["vocab_size"])

    @cached_property
    def languages(self) -> list[str]:
        return ["auto"] + sorted(k for k in self.talker["codec_language_id"] if "dialect" not in k)

    @cached_property
    def speakers(self) -> list[str]:
        return sorted(self.talker.get("spk_id") or {})

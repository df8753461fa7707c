"""Voices from voice clips: the x-vector (speaker encoder) and the clip's codes (Mimi encoder). Introduced in 08.

A Base checkpoint clones a 24 kHz voice clip: its x-vector, from the numpy mel frontend and the exported ECAPA
speaker encoder, fills the prompt's speaker slot; ICL cloning adds the clip's own codes, from the exported Mimi
encoder and the numpy split RVQ, and its transcript. CustomVoice checkpoints have neither encoder: they speak with
built-in speakers, rows of the codec table.
"""
from __future__ import annotations

import numpy as np

from ..audio.mel import mel_spectrogram
from ..audio.rvq import split_rvq_encode
from ..audio.wav import SAMPLES_PER_FRAME
from ..binding import rope
from ..binding.net import Net
from ..errors import InputError
from .config import ModelConfig


class VoiceEncoder:
    def __init__(self, cfg: ModelConfig, threads: int = 2, device: str = "cpu"):
        d = cfg.ncnn_dir
        self.cfg = cfg
        self.speaker_encoder = Net(d, "speaker_encoder", threads, device) if (d / "speaker_encoder.param").is_file() \
            else None
        self.mimi = Net(d, "mimi_encoder", threads, device) if (d / "mimi_rvq.npz").is_file() else None
        self.rvq_tables = dict(np.load(d / "mimi_rvq.npz")) if self.mimi is not None else None

    def xvector(self, wav: np.ndarray) -> np.ndarray:
        """The speaker embedding of a 24 kHz mono wav: numpy mel frontend + the exported ECAPA encoder."""
        if self.speaker_encoder is None:
            raise InputError("this checkpoint has no speaker encoder (CustomVoice): use a built-in speaker instead"
                             + (f" ({', '.join(self.cfg.speakers)})" if self.cfg.speakers else ""))
        return self.speaker_encoder(mel_spectrogram(np.asarray(wav, np.float32)))[0].reshape(-1)

    def codes(self, wav: np.ndarray) -> np.ndarray:
        """Codes (T, 16) of a 24 kHz voice clip: the exported Mimi encoder + the numpy split RVQ.

        The graph takes whole frames, so a wav is zero-padded to a multiple of 1920 samples; the
        reference pads inside every strided conv instead, which can change the last frame's codes
        (chapter 08 measures it)."""
        if self.mimi is None:
            raise InputError("this checkpoint's ncnn exports have no Mimi encoder; run notebooks/04_export_align.py")
        mimi = self.cfg.mimi
        wav = np.asarray(wav, np.float32).reshape(-1)
        wav = np.pad(wav, (0, -len(wav) % SAMPLES_PER_FRAME))
        steps = len(wav) // (SAMPLES_PER_FRAME // 2)  # the encoder transformer runs at 25 Hz
        cos, sin = rope.tables(mimi["head_dim"], mimi["rope_theta"], 0, steps)
        latent = self.mimi(wav[None, None], rope.causal_mask(steps), cos, sin)[0][0]  # (D, T)
        return split_rvq_encode(latent, self.rvq_tables).T                             # (T, 16)

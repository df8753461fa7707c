"""speaker_encoder: log-mel (frames, 128) -> x-vector (enc_dim,), the ECAPA-TDNN of Qwen3-TTS Base. Introduced in 02.

Graph input  mel (frames, 128) float32, the layout `extract_speaker_embedding` feeds (without batch)
Graph output xvector (enc_dim,)
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..runtime.audio import mel as mel_recipe
from . import ModuleSpec, common, register

# The arguments `Qwen3TTSForConditionalGeneration.extract_speaker_embedding` passes to mel_spectrogram,
# from the runtime's mel recipe (one home for the constants).
MEL_ARGS = dict(n_fft=mel_recipe.N_FFT, num_mels=mel_recipe.N_MELS, sampling_rate=mel_recipe.SAMPLE_RATE,
                hop_size=mel_recipe.HOP_SIZE, win_size=mel_recipe.WIN_SIZE, fmin=mel_recipe.FMIN, fmax=mel_recipe.FMAX)


def mel_from_wav(wav: np.ndarray) -> torch.Tensor:
    """Introduced in 02. 24 kHz mono float wav -> (frames, 128) log-mel, exactly as extract_speaker_embedding."""
    from ..reference import import_qwen_tts

    import_qwen_tts()  # first: it shields qwen_tts/__init__ from the 25 Hz tokenizer's imports
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    y = torch.from_numpy(np.ascontiguousarray(wav, dtype=np.float32)).unsqueeze(0)
    return mel_spectrogram(y, **MEL_ARGS).transpose(1, 2)[0]


class TDNN(nn.Module):
    """Conv1d(padding='same', padding_mode='reflect') + ReLU with the reflect pad spelled out as F.pad."""

    def __init__(self, src: nn.Module, relu: bool = True):
        super().__init__()
        conv = src.conv if relu else src
        k, d = conv.kernel_size[0], conv.dilation[0]
        total = d * (k - 1)
        self.pad = (total // 2, total - total // 2)  # torch's 'same' split: extra element on the right
        self.conv = nn.Conv1d(conv.in_channels, conv.out_channels, k, dilation=d, groups=conv.groups)
        self.conv.load_state_dict(conv.state_dict())
        self.relu = relu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad[0] or self.pad[1]:
            x = F.pad(x, self.pad, mode="reflect")
        x = self.conv(x)
        return F.relu(x) if self.relu else x


class SERes2Net(nn.Module):
    def __init__(self, src: nn.Module):
        super().__init__()
        self.tdnn1, self.tdnn2 = TDNN(src.tdnn1), TDNN(src.tdnn2)
        self.blocks = nn.ModuleList(TDNN(b) for b in src.res2net_block.blocks)
        self.scale = src.res2net_block.scale
        self.se1, self.se2 = TDNN(src.se_block.conv1, relu=False), TDNN(src.se_block.conv2, relu=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tdnn1(x)
        c = h.shape[1] // self.scale
        # static channel slices instead of torch.chunk: plain Slice/Crop in ncnn
        parts = [h[:, :c]]
        y = h[:, :c]
        for i in range(1, self.scale):
            p = h[:, i * c : (i + 1) * c]
            y = self.blocks[i - 1](p if i == 1 else p + y)
            parts.append(y)
        h = self.tdnn2(torch.cat(parts, dim=1))
        s = torch.sigmoid(self.se2(F.relu(self.se1(h.mean(dim=2, keepdim=True)))))
        return h * s + x


class SpeakerEncoder(nn.Module):
    """Introduced in 02. Qwen3TTSSpeakerEncoder for one unpadded utterance."""

    def __init__(self, src: nn.Module):
        super().__init__()
        self.tdnn0 = TDNN(src.blocks[0])
        self.blocks = nn.ModuleList(SERes2Net(b) for b in src.blocks[1:])
        self.mfa = TDNN(src.mfa)
        self.asp_tdnn = TDNN(src.asp.tdnn)
        self.asp_conv = TDNN(src.asp.conv, relu=False)
        self.fc = TDNN(src.fc, relu=False)
        self.eps = src.asp.eps

    def _stats(self, x: torch.Tensor, w: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        # w None = uniform weights 1/T, i.e. the original's all-ones length mask divided by its sum
        mean = x.mean(dim=2, keepdim=True) if w is None else (w * x).sum(dim=2, keepdim=True)
        d = (x - mean) * (x - mean)
        var = d.mean(dim=2, keepdim=True) if w is None else (w * d).sum(dim=2, keepdim=True)
        return mean, torch.sqrt(var.clamp(min=self.eps))

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        h = self.tdnn0(mel.transpose(0, 1).unsqueeze(0))
        outs = []
        for b in self.blocks:
            h = b(h)
            outs.append(h)
        h = self.mfa(torch.cat(outs, dim=1))
        mean, std = self._stats(h, None)
        zero = h * 0.0  # broadcasting instead of repeat/expand_as, which do not convert
        att = torch.cat([h, zero + mean, zero + std], dim=1)
        att = torch.softmax(self.asp_conv(torch.tanh(self.asp_tdnn(att))), dim=2)
        mean, std = self._stats(h, att)
        return self.fc(torch.cat([mean, std], dim=1)).reshape(-1)


# ---------------------------------------------------------------- registry
def build(tts) -> nn.Module:
    return SpeakerEncoder(tts.model.speaker_encoder).eval()


def inputs(tts, length: int, seed: int = 0) -> dict[str, torch.Tensor]:
    # `length` mel frames from seeded noise, via the real mel front end (hop 256, no centering)
    n = (length - 1) * MEL_ARGS["hop_size"] + MEL_ARGS["n_fft"] - 2 * ((MEL_ARGS["n_fft"] - MEL_ARGS["hop_size"]) // 2)
    wav = 0.1 * torch.randn(n, generator=common.seeded(seed))
    mel = mel_from_wav(wav.numpy())
    assert mel.shape[0] == length, mel.shape
    return {"mel": mel}


@torch.no_grad()
def run_original(tts, inp: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {"xvector": tts.model.speaker_encoder(inp["mel"][None])[0]}


SPEC = register(
    ModuleSpec(
        name="speaker_encoder",
        build=build,
        inputs=inputs,
        metric="cos",
        tolerance=0.99999,
        run_original=run_original,
        lengths=(159, 301),
        summary="ECAPA-TDNN: log-mel (frames, 128) -> speaker x-vector (enc_dim,)",
        rewrites=[
            "Attentive statistics pooling without its length mask: for one unpadded utterance the mask is all "
            "ones, and building it needs arange/compare/masked_fill, which do not convert.",
            "mean/std repeated over time by broadcasting (h*0 + mean) instead of repeat/expand_as.",
            "Conv1d(padding='same', padding_mode='reflect') split into explicit F.pad(reflect) + unpadded conv; "
            "Res2Net torch.chunk as static channel slices.",
        ],
    )
)

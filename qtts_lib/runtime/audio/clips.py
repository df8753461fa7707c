"""Voice clips people bring: checked, and trimmed when too long. Introduced in 16.

A clip the model cannot use (NaN/Inf, not mono samples, too short, silent) is an `AudioError` with one line that
says why and what works; one it can use but should not (clipped) gives a warning; one longer than MAX_VOICE_SECONDS
is cut at a quiet point near the limit, with a note, or refused when a transcript comes with it (ICL). Each threshold
below says where it comes from.

This is the one home of those rules, for every way a clip comes in: `read_voice_clip` takes a file or the bytes of an
upload (any rate or channel count is converted, with a note), `prepare_voice_clip` samples already read. Each front
end names its own way to keep a long clip (`keep_long_option`: `qtts say`'s is `--keep-long-voice`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import AudioError
from .wav import SAMPLE_RATE, SAMPLES_PER_FRAME, read_audio

MIN_VOICE_SECONDS = 1.0    # below this the x-vector averages too few frames and ICL has ~12 frames to copy
MAX_VOICE_SECONDS = 15.0   # ICL needs a few seconds (the reference advertises 3-second cloning); 15 s is a
#                            188-frame prompt, while 2 minutes would be 1,500 frames of prompt (slow, large)
TRIM_SEARCH_SECONDS = 3.0  # a long clip is cut at the quietest point of its last 3 s before the maximum
TRIM_WINDOW_SECONDS = 0.05  # ... measured as the RMS of 50 ms windows (a pause between words is >= 100 ms)
SILENCE_RMS = 1e-3         # -60 dBFS: speech at a usable level is -30..-15 dBFS RMS (voice.wav: -21 dBFS)
CLIP_LEVEL = 0.999         # a sample this close to full scale was (almost surely) clipped
CLIP_FRACTION = 1e-3       # more than 0.1% of samples at full scale: audibly distorted speech
MAX_UPLOAD_SECONDS = 60.0  # the longest clip a server decodes (a voice keeps 15 s, a consent statement takes a
#                            few): past it an upload is refused, from its container's stated length before any
#                            sample is decoded, else as soon as the decode goes past it (`wav.read_audio`)
KEEP_LONG_OPTION = "--keep-long-voice"  # how `qtts say` keeps a long clip whole (None: a front end offers no way)


@dataclass(frozen=True)
class VoiceClip:
    """A clip fit for `Synthesizer.voice`: float32 mono samples at 24 kHz, and what the checks said about it
    ("warning: ..." for a usable but poor clip, "note: ..." for what was changed: converted, trimmed)."""

    wav: np.ndarray
    messages: tuple[str, ...] = ()

    @property
    def seconds(self) -> float:
        return len(self.wav) / SAMPLE_RATE

    @property
    def warnings(self) -> list[str]:
        return [m.removeprefix("warning: ") for m in self.messages if m.startswith("warning: ")]


def dbfs(x: float) -> float:
    return 20 * np.log10(max(x, 1e-12))


def check_voice_clip(wav: np.ndarray, sr: int = SAMPLE_RATE) -> list[str]:
    """Raise `AudioError` for a clip the model cannot use (NaN/Inf, shorter than MIN_VOICE_SECONDS,
    silent); return warnings for one it can but should not (clipped). Length above the maximum is
    `trim_voice_clip`'s business. Introduced in 16."""
    wav = _samples(wav)
    bad = ~np.isfinite(wav)
    if bad.any():
        raise AudioError(f"the voice clip has {int(bad.sum())} NaN or infinite samples (the first at "
                         f"{np.argmax(bad) / sr:.2f} s): it is not audio; re-export it from your editor")
    seconds = len(wav) / sr
    if seconds < MIN_VOICE_SECONDS:
        raise AudioError(f"the voice clip is {seconds:.2f} s long; it must be at least {MIN_VOICE_SECONDS:.0f} s "
                         f"(3-{MAX_VOICE_SECONDS:.0f} s of clear speech works best)")
    rms = float(np.sqrt(np.mean(np.square(wav, dtype=np.float64))))
    if rms < SILENCE_RMS:
        raise AudioError(f"the voice clip is silent: its RMS level is {dbfs(rms):.0f} dBFS, below the "
                         f"{dbfs(SILENCE_RMS):.0f} dBFS floor; give a clip of someone speaking")
    warnings = []
    clipped = float(np.mean(np.abs(wav) >= CLIP_LEVEL))
    if clipped > CLIP_FRACTION:
        warnings.append(f"the voice clip is clipped: {clipped:.1%} of its samples are at full scale "
                        f"(|x| >= {CLIP_LEVEL}; more than {CLIP_FRACTION:.1%} distorts the voice that is copied); "
                        "record it again at a lower level if you can")
    return warnings


def quiet_point(wav: np.ndarray, limit: int, sr: int = SAMPLE_RATE) -> int:
    """The sample index to cut a clip at: the middle of the quietest TRIM_WINDOW_SECONDS window that
    fits in the last TRIM_SEARCH_SECONDS before `limit` samples. Introduced in 16."""
    win = int(TRIM_WINDOW_SECONDS * sr)
    start = max(0, limit - int(TRIM_SEARCH_SECONDS * sr))
    energy = np.square(np.asarray(wav[start:limit], np.float64))
    if len(energy) < win:
        return limit
    sums = np.convolve(energy, np.ones(win), mode="valid")      # energy of every window in the search range
    return start + int(np.argmin(sums)) + win // 2


def trim_voice_clip(wav: np.ndarray, max_seconds: float = MAX_VOICE_SECONDS, sr: int = SAMPLE_RATE,
                    keep_long_option: str | None = KEEP_LONG_OPTION) -> tuple[np.ndarray, str | None]:
    """A clip longer than `max_seconds`, cut at its quiet point before the limit, with a note
    saying so (None when it was short enough). Introduced in 16."""
    limit = int(max_seconds * sr)
    if len(wav) <= limit:
        return wav, None
    cut = quiet_point(wav, limit, sr)
    keep = f"; {keep_long_option} keeps it all" if keep_long_option else ""
    return wav[:cut], (f"the voice clip is {len(wav) / sr:.1f} s; kept its first {cut / sr:.2f} s, cut at the "
                       f"quietest point before {max_seconds:.0f} s (a voice needs a few seconds{keep})")


def prepare_voice_clip(wav: np.ndarray, transcript: str | None = None, keep_long: bool = False,
                       keep_long_option: str | None = KEEP_LONG_OPTION) -> tuple[np.ndarray, list[str]]:
    """`check_voice_clip`, then `trim_voice_clip` unless `keep_long`: the clip to use (float32 mono) and the
    messages to show ("warning: ..." or "note: ..."). A long clip with a transcript (ICL) is
    refused rather than trimmed: the transcript would then say more than the clip. `keep_long_option` is how the
    caller's front end keeps a long clip, named in the messages. Introduced in 16."""
    wav = _samples(wav)
    messages = [f"warning: {w}" for w in check_voice_clip(wav)]
    seconds = len(wav) / SAMPLE_RATE
    if seconds <= MAX_VOICE_SECONDS:
        return wav, messages
    if keep_long:
        frames = int(np.ceil(len(wav) / SAMPLES_PER_FRAME))
        return wav, messages + [f"note: kept the whole {seconds:.1f} s voice clip" +
                                (f" (an ICL prompt of {frames} frames)" if transcript else "")]
    if transcript is not None:
        cut = quiet_point(wav, int(MAX_VOICE_SECONDS * SAMPLE_RATE))
        ways = (f", drop the transcript to clone from the x-vector alone, or pass {keep_long_option}"
                if keep_long_option else " or drop the transcript to clone from the x-vector alone")
        raise AudioError(f"the voice clip is {seconds:.1f} s and comes with a transcript; ICL needs at most "
                         f"{MAX_VOICE_SECONDS:.0f} s whose transcript matches it: cut the clip (a quiet point is at "
                         f"{cut / SAMPLE_RATE:.2f} s) and transcribe that part{ways}")
    wav, note = trim_voice_clip(wav, keep_long_option=keep_long_option)
    return wav, messages + [f"note: {note}"]


def read_voice_clip(source: str | Path | bytes, transcript: str | None = None, keep_long: bool = False,
                    strict: bool = False, name: str | None = None,
                    keep_long_option: str | None = KEEP_LONG_OPTION, max_seconds: float | None = None) -> VoiceClip:
    """A voice clip from a file or the bytes of one (an upload: wav, flac, ogg or mp3), read by `wav.read_audio`
    (another rate or channel count converted with a note, or refused when `strict`; `name` calls it in messages),
    then `prepare_voice_clip`: an `AudioError` saying why it cannot be used, or the clip with its messages.
    `max_seconds` (a server's uploads: MAX_UPLOAD_SECONDS) refuses a longer clip before decoding it whole.
    Introduced in 16."""
    wav, notes = read_audio(source, strict, name, max_seconds=max_seconds)
    wav, messages = prepare_voice_clip(wav, transcript, keep_long, keep_long_option)
    return VoiceClip(wav, tuple(f"note: {n}" for n in notes) + tuple(messages))


def _samples(wav) -> np.ndarray:
    """A clip as float32 mono samples (n,), or an `AudioError` (not numbers, several channels, nothing)."""
    try:
        wav = np.asarray(wav, dtype=np.float32)
    except (TypeError, ValueError):
        raise AudioError(f"a voice clip is an array of samples, not {type(wav).__name__}") from None
    if wav.ndim == 2 and 1 in wav.shape:
        wav = wav.reshape(-1)
    if wav.ndim != 1:
        raise AudioError(f"a voice clip is mono samples, shape (n,), not {wav.shape}: average the channels "
                         "(`load_wav` does) or pass one of them")
    return wav

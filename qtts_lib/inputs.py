"""The committed inputs under data/inputs/, and the script that made them. Introduced in 00.

The reference voice is espeak-ng speech resampled by sox to 24 kHz mono 16-bit:
native 24 kHz, so no chapter ever needs a resampler it cannot reproduce; padded with
silence to a whole number of 1920-sample codec frames, because the reference's Mimi
encoder pads inside every strided conv while a fixed graph can only pad up front
(chapter 08 measures the difference on a wav that is not padded).
Run `python -m qtts_lib.inputs` to remake it (needs espeak-ng and sox).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from . import paths
from .runtime.audio.wav import SAMPLE_RATE, SAMPLES_PER_FRAME

VOICE_TEXT = "Good morning. This short sentence is the reference voice for the qtts tutorial."
TARGET_TEXT = "Hello from ncnn. Every token of this sentence is checked against PyTorch."
LANGUAGE = "english"
# 45 new tokens = 44 frames x 16 codes = 704 tokens to match, as in the original write-up.
GOLDEN_MAX_NEW_TOKENS = 45
# A voice agent's answer, as a language model writes it (chapters 19 and 20): abbreviations, a decimal, an ellipsis,
# a question and a URL, so that each rule of the sentence segmenter has something to wait for.
ANSWER_TEXT = ("Sure, here is the plan for tomorrow. Dr. Lee arrives at 9.30 a.m. on the early train from the city, "
               "and she asks that someone meets her at the station with the notes. The meeting starts at ten in the "
               "small room on the second floor, the one with the long table and the old map of the harbour on the "
               "wall. Bring the printed slides... and the laptop too! Are the figures on page 3 up to date? If not, "
               "the latest ones are at https://example.com/q3.html before noon. After lunch the team walks down to "
               "the river, and anyone who would rather stay behind can finish the report in the library.")


def words(text: str, n: int = 1) -> list[str]:
    """`text` in deltas of n words, each with the space after it, as a language model writes it."""
    parts = text.split(" ")
    return [" ".join(parts[i:i + n]) + (" " if i + n < len(parts) else "") for i in range(0, len(parts), n)]


def make_voice_wav(out: Path | None = None) -> Path:
    out = out or paths.voice_wav()
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"{tool} is needed to remake {out} (apt-get install espeak-ng sox)")
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(["espeak-ng", "-v", "en-us", "-s", "150", "-w", str(raw), VOICE_TEXT], check=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        frames = Path(tmp) / "24k.wav"
        subprocess.run(["sox", str(raw), "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(frames), "rate", "-v"],
                       check=True)
        n = int(subprocess.run(["soxi", "-s", str(frames)], check=True, capture_output=True, text=True).stdout)
        pad = -n % SAMPLES_PER_FRAME
        subprocess.run(["sox", str(frames), str(out), "pad", "0", f"{pad}s"], check=True)
    (out.with_suffix(".txt")).write_text(VOICE_TEXT + "\n")
    return out


if __name__ == "__main__":
    print(make_voice_wav())

"""`qtts export CHECKPOINT_DIR`: chapters 04-05 in one command, for a checkpoint a user brings. Introduced in 04.

    qtts export models/Qwen3-TTS-12Hz-1.7B-Base              # every graph, the KV caches, the int8 tier
    qtts say --checkpoint models/Qwen3-TTS-12Hz-1.7B-Base --voice clip.wav --text "Hello." -o out.wav

The same code the chapters run (`qtts_lib.export.ensure`, `runtime.pipeline.precision.ensure_int8`): the reference is
loaded with qwen-tts, each module is traced and converted with pnnx into `<dir>/ncnn/` (current exports are kept),
the decoders get their `_kv.param`, and the runtime is loaded once on the result to prove it runs. Needs the `port`
extra (`pip install 'qtts[port]'` and `pip install --no-deps qwen-tts==0.1.1`); the runtime afterwards does not.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path


def run(directory: Path, threads: int = 2, int8: bool = True) -> int:
    from .. import reference
    from ..runtime import Synthesizer
    from ..runtime.pipeline.precision import ensure_int8_tier
    from . import ensure

    directory = directory.resolve()
    t0 = time.perf_counter()
    print(f"qtts export: loading {directory.name} with qwen-tts ...", file=sys.stderr)
    tts = reference.load(directory, threads=threads)
    done = ensure(tts, directory)
    del tts
    if int8:
        ensure_int8_tier(directory / "ncnn", log=lambda m: print(f"qtts export: {m}", file=sys.stderr))
    synth = Synthesizer(directory, threads=threads)
    minutes = (time.perf_counter() - t0) / 60
    print(f"qtts export: {len(done)} graphs in {directory / 'ncnn'} ({minutes:.1f} min); the runtime loads them "
          f"({synth.kind}, {len(synth.speakers)} speakers, instructions: {synth.follows_instructions}).")
    example = {"base": "--voice CLIP.wav", "custom_voice": f"--speaker {(synth.speakers or ['NAME'])[0]}",
               "voice_design": '--instruct "A calm, low female voice"'}[synth.kind]
    print(f"next: qtts say --checkpoint {directory} {example} --text 'Hello.' -o out.wav")
    return 0

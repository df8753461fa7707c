"""ncnn through its Python binding: Mats, nets, extractors, the `.param` and `.bin` formats, cached decoders.

Before any module here imports ncnn, the spin of GNU OpenMP's idle workers is set short (GOMP_SPINCOUNT, SPIN_COUNT
unless the environment sets it): ncnn's wheel bundles libgomp, which reads it once, when it loads. Between two
layers a worker spins, waiting for the next one; spinning long is what makes two threads fast on a quiet machine,
and what makes two processes on the same cores slow each other several times over (each one's workers spin on the
cores the other needs). On a 2-core Intel Xeon VM, `qtts say` on full-base int8 (120 frames, 2 threads): alone
13.99 s with libgomp's default spin and 14.10 s with 3000 (medians of 5, interleaved); two at once 85-158 s each
with the default and 36-38 s with 3000.
"""
import os

SPIN_COUNT = 3000
os.environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))

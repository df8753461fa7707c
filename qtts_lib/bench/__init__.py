"""The benchmark harness: what each measurement is, on which machine, with which prompt. Introduced in 11.

    python -m qtts_lib.bench loop     PyTorch vs ncnn end to end, any device and tier (`loop`; `make bench`)
    python -m qtts_lib.bench codec    the codec alone, both runtimes in one process, against the FLOP peak (`codec`)
    python -m qtts_lib.bench stream   time to first audio, a stream against synthesize (`stream`)
    python -m qtts_lib.bench quality  what a precision tier costs against fp32 (`quality`; `make quality`)
    python -m qtts_lib.bench overlap  decoding on one core while the other generates (`overlap`)
    python -m qtts_lib.bench zeros | profile | merge     for a GPU host and for combining results (`gpu`, `results`)

One machine description (`machine`), one prompt (`workload`), one way to run a measurement in a fresh process
(`child`), one schema and writer (`results`). Benchmarks are never tests: a test asserts what holds on every run.
"""

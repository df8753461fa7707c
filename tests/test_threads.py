"""runtime.binding.net.release_threads: handing ncnn work to another thread after this one ran it (the server's engine
thread does). GNU OpenMP keeps each
thread's pool of workers; with more workers than CPUs it stops spinning and parks them in the kernel between
parallel regions, so a second thread's ncnn calls wake sleeping workers all the time (2x slower steps at full size
on two cores). Counted here as voluntary context switches of the worker thread's calls, not timed."""
import json
import os
import resource
import threading

import numpy as np
import pytest

from qtts_lib import paths
from qtts_lib.runtime.binding.net import release_threads
from qtts_lib.runtime.pipeline import precision

CKPT = "tiny-base"


@pytest.fixture(scope="module")
def decoder(tts):
    from qtts_lib import export

    export.ensure(tts, CKPT)
    cfg = json.loads((paths.model_dir(CKPT) / "config.json").read_text())["talker_config"]
    threads = os.cpu_count() or 1
    if threads < 2:
        pytest.skip("one CPU: ncnn runs no OpenMP workers, so there is no pool to release")
    return precision.decoder(paths.ncnn_dir(CKPT), "talker_decoder", cfg["head_dim"], cfg["rope_theta"], threads), cfg


def _switches_in_a_worker(net, cfg, release: bool) -> int:
    rng = np.random.default_rng(0)
    _, cache = net.prefill(rng.standard_normal((1, 8, cfg["hidden_size"])).astype(np.float32))  # this thread's pool
    if release:
        assert release_threads()
    counted = {}

    def work():
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        for _ in range(60):
            net.forward(rng.standard_normal((1, 1, cfg["hidden_size"])).astype(np.float32), cache)
        counted["n"] = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - before

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    return counted["n"]


def test_released_pool_lets_another_thread_run_ncnn_without_parking_its_workers(decoder):
    net, cfg = decoder
    kept = _switches_in_a_worker(net, cfg, release=False)
    released = _switches_in_a_worker(net, cfg, release=True)
    assert kept > 4 * max(released, 10), (kept, released)

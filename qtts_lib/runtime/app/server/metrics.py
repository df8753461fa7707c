"""`qtts serve`'s metrics, in Prometheus's text format at /metrics (prometheus_client). Introduced in 18.

What an operator watches: requests by path and status, audio streams that failed or whose client left, the queue,
the batch now and whether the engine runs (read at scrape time from the engine), the batch size of every step, and
per spoken request the time to first audio (request received -> first audio bytes handed to the server) and the
real-time factor (wall time from request to last byte over the audio's duration: under 1 is faster than real
time). A registry per app, not prometheus_client's global one, so two servers in one process (the tests) count
apart.
"""
from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .engine import Status

TTFA_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0)
RTF_BUCKETS = (0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
PATHS = ("/v1/audio/speech", "/v1/models", "/health", "/metrics", "/openapi.json", "/")  # others: "other"


class Metrics:
    """The server's instruments; the engine's `status` is read when scraped (waiting, speaking, refused, the batch,
    its health)."""

    def __init__(self, status: Callable[[], Status], max_batch: int):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("qtts_requests", "HTTP requests answered, by path and status", ["path", "status"],
                                registry=r)
        self.streams = Counter("qtts_speech_streams", "Audio streams by how they ended (done, abandoned: the client "
                               "left, error)", ["format", "outcome"], registry=r)
        self.audio_seconds = Counter("qtts_audio_seconds", "Seconds of audio streamed", registry=r)
        self.time_to_first_audio = Histogram("qtts_time_to_first_audio_seconds", "Request received to first audio "
                                             "bytes sent", buckets=TTFA_BUCKETS, registry=r)
        self.real_time_factor = Histogram("qtts_real_time_factor", "Wall seconds per second of audio, per finished "
                                          "request (request to last byte)", buckets=RTF_BUCKETS, registry=r)
        self.batch_size = Histogram("qtts_batch_size", "Utterances decoded together, per step of the scheduler that "
                                    "makes frames", buckets=tuple(range(1, max_batch + 1)), registry=r)
        Gauge("qtts_queue_depth", "Requests that hold a place and wait for the batch", registry=r).set_function(
            lambda: status().waiting)
        Gauge("qtts_requests_speaking", "Requests the batch has admitted", registry=r).set_function(
            lambda: status().speaking)
        Gauge("qtts_requests_refused", "Requests answered 503 for want of a place, since the start (a gauge read "
              "from the engine)", registry=r).set_function(lambda: status().refused)
        Gauge("qtts_batch_utterances", "Utterances in the batch now", registry=r).set_function(lambda: status().batch)
        Gauge("qtts_max_batch", "The batch's width (--max-batch)", registry=r).set(max_batch)
        Gauge("qtts_engine_up", "1 while the engine runs, 0 once it has stopped (/health answers 503)",
              registry=r).set_function(lambda: float(status().healthy))

    def answered(self, path: str, status: int) -> None:
        self.requests.labels(path if path in PATHS else "other", str(status)).inc()

    def scrape(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

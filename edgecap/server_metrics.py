"""What ``edgecap serve`` counts, in Prometheus' multi-process mode: the HTTP processes and the inference worker are
separate processes, so each writes its samples to files in one folder and ``/metrics`` adds them up."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client reads it at import: set before importing this

# An answer's status, as the cause a deployer filters rejects by.
REJECT_CAUSES = {400: "bad_request", 404: "not_found", 405: "bad_method", 413: "too_large", 503: "busy",
                 504: "deadline"}
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class WorkerMetrics:
    """The scheduler's side, recorded per answered caption: where its time went and how full the batches were."""

    def __init__(self):
        from prometheus_client import Counter, Gauge, Histogram

        stage = "Seconds a caption spent {}"
        self.queue = Histogram("edgecap_queue_seconds", stage.format("waiting to join the step batch"),
                               buckets=SECONDS_BUCKETS)
        self.encoder = Histogram("edgecap_encoder_seconds", stage.format("in its encoder call"),
                                 buckets=SECONDS_BUCKETS)
        self.steps = Histogram("edgecap_step_seconds", stage.format("in step calls"), buckets=SECONDS_BUCKETS)
        self.search = Histogram("edgecap_search_seconds", stage.format("in its host-side beam updates"),
                                buckets=SECONDS_BUCKETS)
        self.decode = Histogram("edgecap_image_decode_seconds", stage.format("decoding and resizing its image"),
                                buckets=SECONDS_BUCKETS)
        self.batch = Histogram("edgecap_encoder_batch_size", "Photos encoded in the call a caption's photo was in",
                               buckets=(1, 2, 4, 8, 16, 32, 64))
        self.captions = Counter("edgecap_captions", "Captions answered (rate() of it: captions per second)")
        self.rows = Gauge("edgecap_rows_in_flight", "Step rows (images x beam) in the running batch",
                          multiprocess_mode="livesum")
        self.waiting = Gauge("edgecap_waiting_requests", "Requests queued to be encoded",
                             multiprocess_mode="livesum")

    def record(self, times, decode_s: float, rows_in_flight: int, waiting: int) -> None:
        """One answered caption's ``StageTimes``, and the scheduler's fill when it was answered."""
        self.queue.observe(times.queue_s)
        self.encoder.observe(times.encoder_s)
        self.steps.observe(times.steps_s)
        self.search.observe(times.search_s)
        self.decode.observe(decode_s)
        self.batch.observe(times.encoder_batch)
        self.captions.inc()
        self.rows.set(rows_in_flight)
        self.waiting.set(waiting)


class HttpMetrics:
    """The HTTP side: every answer by status, rejects by cause, and whole-request time."""

    def __init__(self):
        from prometheus_client import Counter, Histogram

        self.answers = Counter("edgecap_http_answers", "HTTP answers by path and status", ["path", "status"])
        self.rejects = Counter("edgecap_rejects", "Requests answered with an error, by cause", ["cause"])
        self.seconds = Histogram("edgecap_request_seconds", "Seconds from a caption request's arrival to its answer",
                                 buckets=SECONDS_BUCKETS)

    def record(self, path: str, status: int, seconds: float) -> None:
        self.answers.labels(path, str(status)).inc()
        if status >= 400:
            self.rejects.labels(REJECT_CAUSES.get(status, "server_error" if status >= 500 else "client_error")).inc()
        elif path == "/caption":
            self.seconds.observe(seconds)


@functools.cache
def http_metrics() -> HttpMetrics:
    """The HTTP process's one set (a second would register the same names twice)."""
    return HttpMetrics()


def exposition() -> tuple[bytes, str]:
    """The text ``/metrics`` answers (every process's samples summed) and its content type."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=os.environ[METRICS_DIR_ENV])
    return generate_latest(registry), CONTENT_TYPE_LATEST


@contextlib.contextmanager
def metrics_dir() -> Iterator[Path]:
    """A fresh folder for every process the server starts to write its samples to, removed when the server stops:
    an earlier run's files would add its counts, and a folder left behind per run would pile up in the temp dir."""
    folder = Path(tempfile.mkdtemp(prefix="edgecap-serve-"))
    os.environ[METRICS_DIR_ENV] = str(folder)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)

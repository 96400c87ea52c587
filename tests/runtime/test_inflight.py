"""In-flight batching: photos join and leave one running step batch, and each gets the caption it would get alone."""

import threading
import time
from dataclasses import replace

import numpy as np
import pytest

from edgecap.errors import EdgecapError
from edgecap.runtime.inflight import Busy, InflightScheduler, SchedulerOptions, StaticScheduler
from edgecap.runtime.pipeline import Captioner
from edgecap.runtime.search import SearchOptions

MIXED = (SearchOptions(beam_size=2, max_length=8), SearchOptions(beam_size=1, max_length=8),
         SearchOptions(beam_size=3, max_length=6, length_penalty=0.5, block_trigrams=True),
         SearchOptions(beam_size=3, max_length=8, n_best=2), SearchOptions(beam_size=3, max_length=8, groups=3),
         SearchOptions(beam_size=2, max_length=3))


@pytest.fixture(scope="module")
def captioner(tiny_export):
    return Captioner.from_dir(tiny_export / "exp")


def _photos(captioner, count):
    size = captioner.prep.image_size
    return np.random.default_rng(1).random((count, 3, size, size), dtype=np.float32)


def _alone(captioner, pixels, options):
    return [(h.tokens, h.logprob) for h in captioner.search_n(pixels[None], options)[0]]


@pytest.mark.slow
@pytest.mark.parametrize("positional", [False, True], ids=["one cohort", "a cohort per admission"])
def test_every_request_gets_the_caption_it_gets_alone(captioner, positional):
    photos = _photos(captioner, 12)
    jobs = [(p, MIXED[i % len(MIXED)]) for i, p in enumerate(photos)]
    scheduler = InflightScheduler(captioner, SchedulerOptions(max_rows=8, max_batch=3))
    scheduler.positional = positional  # the Transformers' path: requests step with those that joined with them
    answers = [None] * len(jobs)

    def client(indices):
        for i in indices:
            answers[i] = scheduler.submit(*jobs[i]).result()
            time.sleep(0.001 * (i % 3))

    threads = [threading.Thread(target=client, args=(range(k, len(jobs), 4),)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    scheduler.close()
    for answer, (pixels, options) in zip(answers, jobs, strict=True):
        best, *others = _alone(captioner, pixels, options)[: options.n_best]
        assert answer.caption.hypothesis.tokens == best[0]
        np.testing.assert_allclose(answer.caption.logprob, best[1], atol=1e-4)
        assert len(answer.caption.alternatives) == len(others)
        assert answer.times.steps >= 1 and answer.times.encoder_s > 0 and answer.times.queue_s >= 0


def test_static_batching_gives_the_same_captions(captioner):
    photos = _photos(captioner, 6)
    options = SearchOptions(beam_size=2, max_length=8)
    scheduler = StaticScheduler(captioner, SchedulerOptions(max_batch=4, max_delay_ms=20))
    futures = [scheduler.submit(p, options if i % 2 else replace(options, beam_size=1)) for i, p in enumerate(photos)]
    answers = [f.result() for f in futures]
    scheduler.close()
    for i, (answer, pixels) in enumerate(zip(answers, photos, strict=True)):
        expected = _alone(captioner, pixels, options if i % 2 else replace(options, beam_size=1))[0]
        assert answer.caption.hypothesis.tokens == expected[0]


class _Stalled:
    """A backend whose encoder waits until released: the loop is busy, so requests pile up in the queue."""

    def __init__(self, backend):
        self.backend, self.release = backend, threading.Event()
        self.step, self.binding_device = backend.step, None

    def encode(self, pixels):
        self.release.wait(10)
        return self.backend.encode(pixels)


def test_a_full_queue_answers_busy_at_once_and_close_finishes_what_was_taken(captioner):
    stalled = _Stalled(captioner.backend)
    scheduler = InflightScheduler(Captioner(stalled, captioner.manifest), SchedulerOptions(queue=2, max_delay_ms=0))
    photos, options = _photos(captioner, 4), SearchOptions(beam_size=2, max_length=5)
    first = scheduler.submit(photos[0], options)
    deadline = time.time() + 5
    while not scheduler.waiting.empty() and time.time() < deadline:  # the loop takes it and stalls in the encoder
        time.sleep(0.01)
    queued = [scheduler.submit(p, options) for p in photos[1:3]]
    started = time.perf_counter()
    with pytest.raises(Busy, match="2 requests are already waiting"):
        scheduler.submit(photos[3], options)
    assert time.perf_counter() - started < 0.5  # refused at once, not after a wait
    closing = threading.Thread(target=scheduler.close)
    closing.start()
    time.sleep(0.05)
    with pytest.raises(Busy, match="shutting down"):
        scheduler.submit(photos[3], options)
    stalled.release.set()
    closing.join(10)
    assert not closing.is_alive()
    assert all(f.result(0).caption.text for f in [first, *queued])


def test_requests_the_scheduler_cannot_run_are_refused_before_they_queue(captioner):
    scheduler = InflightScheduler(captioner, SchedulerOptions(max_rows=4))
    photo = _photos(captioner, 1)[0]
    for options, named in ((SearchOptions(sample=True), "sampling"), (SearchOptions(beam_size=5), "max_rows 4"),
                           (SearchOptions(ban_words=("zebraz",)), "zebraz")):
        with pytest.raises(EdgecapError, match=named):
            scheduler.submit(photo, options)
    assert scheduler.waiting.empty()
    scheduler.close()

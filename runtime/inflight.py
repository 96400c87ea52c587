"""In-flight batching: one step loop that many captions join and leave at step boundaries.

A server that batches whole requests (encode, decode to the end, answer) makes a photo that arrives during a decode
wait for it, and keeps rows of finished captions in the batch until the longest one ends. Here one scheduler owns
the step graph: waiting photos are encoded together and join the running step batch at the next step boundary,
finished captions leave it, and every request keeps its own beam and decoding options. Each request is one
:class:`~edgecap.runtime.search.BeamSearch` over its own rows, so its caption is the one ``Captioner`` gives.

The step graph gathers its state by ``reorder`` itself; when rows join or leave, the state and memory of the rows
that stay are gathered on the host instead (an exact copy) and the graph is fed the identity. A graph whose step
reads its position (the static KV cache of the Transformers) steps each position's requests in a call of their own;
the LSTM graphs ignore the position, so all their requests share every call.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from edgecap import spec
from edgecap.errors import EdgecapError
from edgecap.runtime.backends.ort import OrtStepSession
from edgecap.runtime.decoding import meeting, required_ids, word_rules
from edgecap.runtime.pipeline import Caption, Captioner, caption_of, check_options
from edgecap.runtime.search import BeamSearch, SearchOptions


class Busy(EdgecapError):
    """The queue is full: the request was not taken; retry later."""


@dataclass(frozen=True)
class SchedulerOptions:
    max_rows: int = 96  # step rows in flight (images x beam); a request joins once its rows fit
    max_batch: int = 32  # most photos encoded in one call
    max_delay_ms: float = 5.0  # how long an idle scheduler waits for a second photo before encoding the first
    queue: int = 256  # requests waiting to join; one more is refused with Busy

    def __post_init__(self):
        if self.max_rows < 1 or self.max_batch < 1 or self.queue < 1 or self.max_delay_ms < 0:
            raise EdgecapError(f"scheduler: need max_rows, max_batch, queue >= 1 and max_delay_ms >= 0, got {self}")


@dataclass
class StageTimes:
    """Seconds one request spent waiting to join, in its encoder call, in the step calls it took part in and in its
    own host-side beam updates between them; the photos encoded beside it and the step calls it took."""

    queue_s: float = 0.0
    encoder_s: float = 0.0
    steps_s: float = 0.0
    search_s: float = 0.0
    encoder_batch: int = 0
    steps: int = 0


@dataclass
class _Request:
    pixels: np.ndarray  # float32 (3, H, W)
    options: SearchOptions
    rules: tuple[frozenset[int], frozenset[int]]  # the options' (bad-ending, banned-word) ids, from word_rules
    required: frozenset[int]  # the ids of its require_words, which choose among its finished hypotheses
    future: Future
    submitted: float
    times: StageTimes = field(default_factory=StageTimes)
    search: BeamSearch | None = None
    memory: dict[str, np.ndarray] | None = None  # its rows, tiled by the beam, until it joins a cohort
    state: dict[str, np.ndarray] | None = None

    @property
    def rows(self) -> int:
        return self.options.beam_size


@dataclass(frozen=True)
class Answer:
    caption: Caption
    times: StageTimes


class _Cohort:
    """Requests that step together in one call, their rows in order; their memory and state held combined."""

    def __init__(self):
        self.requests: list[_Request] = []
        self.memory: dict[str, np.ndarray] = {}
        self.state: dict[str, np.ndarray] = {}
        self.starts: list[int] = []  # first row of each request, set with the requests
        self.gathered = True  # state is already in this step's row order: feed the identity reorder

    def rebuild(self, staying: list[_Request], joining: list[_Request]) -> None:
        """Rows of the requests that stay (their state gathered by their back-pointers) then the joining ones."""
        starts = {id(r): s for r, s in zip(self.requests, self.starts, strict=True)}
        parts = {name: [] for name in (*self.memory, *self.state)} if self.requests else {}
        for request in staying:
            start = starts[id(request)]
            # a cohort rebuilt since its last step holds its state in this step's order already
            rows = start + (np.arange(request.rows) if self.gathered else request.search.reorder)
            for name, value in self.state.items():
                parts[name].append(value[rows])
            for name, value in self.memory.items():
                parts[name].append(value[start:start + request.rows])
        for request in joining:
            for name, value in (*request.memory.items(), *request.state.items()):
                parts.setdefault(name, []).append(value)
            request.memory = request.state = None
        combined = {name: np.concatenate(values) for name, values in parts.items()}
        self.memory = {n: v for n, v in combined.items() if spec.role_of(n) == spec.ROLE_MEMORY}
        self.state = {n: v for n, v in combined.items() if spec.role_of(n) == spec.ROLE_STATE}
        self.requests = [*staying, *joining]
        self.starts = np.cumsum([0] + [r.rows for r in self.requests[:-1]]).tolist()
        self.gathered = True

    def step(self, session: OrtStepSession) -> list[_Request]:
        """One step call for every request; the requests whose search is done."""
        tokens = np.concatenate([r.search.tokens for r in self.requests])
        if self.gathered:
            reorder = np.arange(len(tokens), dtype=np.int64)
        else:
            reorder = np.concatenate([start + r.search.reorder for r, start in zip(self.requests, self.starts,
                                                                                     strict=True)])
        session.memory, session.state = self.memory, self.state
        start = time.perf_counter()
        logprobs, ids, attention = session.step(tokens, reorder, self.requests[0].search.position)
        seconds = time.perf_counter() - start
        self.state, self.gathered = session.state, False
        finished, row = [], 0
        for request in self.requests:
            rows = slice(row, row + request.rows)
            advanced = time.perf_counter()
            request.search.advance(logprobs[rows], ids[rows], attention[rows])
            request.times.search_s += time.perf_counter() - advanced
            request.times.steps_s += seconds
            request.times.steps += 1
            row += request.rows
            if request.search.done:
                finished.append(request)
        return finished


class _Scheduler:
    """A bounded queue of requests and the one thread that answers them."""

    rows_in_flight = 0  # step rows (images x beam) of the requests being decoded, where the scheduler counts them

    def __init__(self, captioner: Captioner, options: SchedulerOptions):
        self.captioner, self.options = captioner, options
        self.waiting: queue.Queue[_Request] = queue.Queue(maxsize=options.queue)
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"edgecap-{type(self).__name__}", daemon=True)
        self.threads = [self.thread]  # every thread of its own, joined by close

    def submit(self, pixels: np.ndarray, options: SearchOptions) -> Future:
        """Caption one preprocessed photo (3, H, W) with ``options``; a Future of its Answer."""
        if self.closing.is_set():
            raise Busy("the scheduler is shutting down")
        if options.sample:
            raise EdgecapError("in-flight batching runs beam search: sampling is for `edgecap caption`")
        if options.beam_size > self.options.max_rows:
            raise EdgecapError(f"beam {options.beam_size} needs more rows than the scheduler's max_rows "
                               f"{self.options.max_rows}")
        check_options(self.captioner.manifest, options)
        vocab = self.captioner.vocab  # unknown words are refused here, not in the loop
        request = _Request(np.asarray(pixels, dtype=np.float32), options, word_rules(vocab, options),
                           required_ids(vocab, options), Future(), time.perf_counter())
        request.future.set_running_or_notify_cancel()  # taken: a caller's cancel() cannot break the loop's answer
        try:
            self.waiting.put_nowait(request)
        except queue.Full:
            raise Busy(f"{self.options.queue} requests are already waiting; retry later") from None
        return request.future

    def caption(self, pixels: np.ndarray, options: SearchOptions) -> Answer:
        return self.submit(pixels, options).result()

    def close(self) -> None:
        """Refuse new requests, answer every one in flight or waiting, then stop the threads."""
        self.closing.set()
        for thread in self.threads:
            thread.join()

    def _loop(self) -> None:
        raise NotImplementedError


class InflightScheduler(_Scheduler):
    """Captions photos submitted from any thread. Two threads of its own: one encodes waiting photos in batches, the
    other runs every step call, so on a CPU the encoder of the next photos runs on one core while the captions in
    flight step on another (ONNX Runtime releases the GIL while it runs).

    ``submit`` returns at once with a Future of an :class:`Answer`, or raises :class:`Busy` when ``queue`` requests
    already wait. ``close`` finishes what is in flight and queued, then stops; a closed scheduler refuses requests.
    """

    def __init__(self, captioner: Captioner, options: SchedulerOptions = SchedulerOptions()):
        step_graph = getattr(captioner.backend, "step", None)
        if not hasattr(step_graph, "run") or getattr(captioner.backend, "binding_device", None) is not None:
            raise EdgecapError("in-flight batching runs the ort (CPU) and openvino backends, whose state is host "
                               "arrays it can gather; use --backend ort or openvino")
        super().__init__(captioner, options)
        self.session = OrtStepSession(step_graph, captioner.manifest, {}, binding_device=None)  # fed each cohort
        self.positional = "max_positions" in captioner.manifest.model_config  # the KV cache reads `step`
        self.cohorts: list[_Cohort] = []
        self.rows_in_flight = 0
        self.ready: queue.Queue[_Request] = queue.Queue(maxsize=options.max_batch)  # encoded, waiting to join
        self.held: _Request | None = None  # encoded, but its rows did not fit yet: it joins first
        self.encoded_all = threading.Event()  # set once closing and every accepted photo is encoded
        self.encoder = threading.Thread(target=self._encode_loop, name="edgecap-inflight-encoder", daemon=True)
        self.threads.insert(0, self.encoder)
        self.encoder.start()
        self.thread.start()

    # ---- the encoder thread --------------------------------------------------------------------------------------

    def _encode_loop(self) -> None:
        while True:
            batch = self._take_waiting()
            if batch:
                self._encode(batch)
            elif self.closing.is_set() and self.waiting.empty():
                self.encoded_all.set()
                return

    def _take_waiting(self) -> list[_Request]:
        """Up to ``max_batch`` waiting photos: the first within 50 ms, the others until ``max_delay_ms`` after it."""
        try:
            taken = [self.waiting.get(timeout=0.05)]
        except queue.Empty:
            return []
        deadline = time.perf_counter() + self.options.max_delay_ms / 1e3
        while len(taken) < self.options.max_batch:
            try:
                taken.append(self.waiting.get(timeout=max(0.0, deadline - time.perf_counter())))
            except queue.Empty:
                break
        return taken

    def _encode(self, batch: list[_Request]) -> None:
        start = time.perf_counter()
        try:
            session = self.captioner.backend.encode(np.stack([r.pixels for r in batch]))
        except Exception as err:  # a backend failure answers these requests, and the scheduler keeps serving
            for request in batch:
                request.future.set_exception(err)
            return
        seconds = time.perf_counter() - start
        for index, request in enumerate(batch):
            request.times.encoder_s, request.times.encoder_batch = seconds, len(batch)
            beam = request.options.beam_size
            request.memory = {n: np.repeat(v[index:index + 1], beam, axis=0) for n, v in session.memory.items()}
            request.state = {n: np.repeat(v[index:index + 1], beam, axis=0) for n, v in session.state.items()}
            endings, banned = request.rules
            request.search = BeamSearch(1, request.options, bad_ending_ids=endings, banned_ids=banned)
            self.ready.put(request)  # blocks while the step loop is max_batch photos behind: backpressure

    # ---- the step loop, on the scheduler's thread ----------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            idle = not self.cohorts
            joining = self._take_ready(wait=idle)
            if joining:
                self._join(joining)
            elif idle and self.encoded_all.is_set() and self.ready.empty() and self.held is None:
                return
            for cohort in list(self.cohorts):
                self._step(cohort)

    def _take_ready(self, *, wait: bool) -> list[_Request]:
        """Encoded photos whose rows fit beside those in flight, in order; an idle loop waits for the first."""
        taken, rows = [], self.rows_in_flight
        while True:
            if self.held is not None:
                request, self.held = self.held, None
            else:
                try:
                    request = self.ready.get(timeout=0.05) if wait and not taken else self.ready.get_nowait()
                except queue.Empty:
                    return taken
            if rows + request.rows > self.options.max_rows and (taken or self.rows_in_flight):
                self.held = request
                return taken
            taken.append(request)
            rows += request.rows

    def _join(self, joining: list[_Request]) -> None:
        now = time.perf_counter()
        for request in joining:
            request.times.queue_s = now - request.submitted - request.times.encoder_s
            self.rows_in_flight += request.rows
        if self.positional or not self.cohorts:
            cohort = _Cohort()
            cohort.rebuild([], joining)
            self.cohorts.append(cohort)
        else:
            cohort = self.cohorts[0]
            cohort.rebuild(cohort.requests, joining)

    def _step(self, cohort: _Cohort) -> None:
        try:
            finished = cohort.step(self.session)
        except Exception as err:  # answer every request of the cohort, drop it, keep serving the others
            for request in cohort.requests:
                request.future.set_exception(err)
            self.rows_in_flight -= sum(r.rows for r in cohort.requests)
            self.cohorts.remove(cohort)
            return
        if not finished:
            return
        for request in finished:
            found = meeting(request.search.result()[0], request.required)[: request.options.n_best]
            caption = caption_of(None, found, self.captioner.vocab, request.options.require_words)
            request.future.set_result(Answer(caption, request.times))
            self.rows_in_flight -= request.rows
        staying = [r for r in cohort.requests if not r.search.done]
        if staying:
            cohort.rebuild(staying, [])
        else:
            self.cohorts.remove(cohort)


class StaticScheduler(_Scheduler):
    """The baseline in-flight batching is measured against: wait for up to ``max_batch`` photos (``max_delay_ms``
    after the first), caption them as one batch to the end, answer, repeat. Same interface as InflightScheduler;
    photos with other decoding options than the batch's first wait for a batch of their own."""

    def __init__(self, captioner: Captioner, options: SchedulerOptions = SchedulerOptions()):
        super().__init__(captioner, options)
        self.held: list[_Request] = []  # taken but of other options than the running batch
        self.thread.start()

    def _loop(self) -> None:
        while True:
            batch = self._batch()
            if not batch:
                if self.closing.is_set() and self.waiting.empty() and not self.held:
                    return
                continue
            start = time.perf_counter()
            try:
                pixels = np.stack([r.pixels for r in batch])
                found = self.captioner.search_n(pixels, batch[0].options)
            except Exception as err:  # answer the batch, keep serving
                for request in batch:
                    request.future.set_exception(err)
                continue
            seconds = time.perf_counter() - start
            for request, hypotheses in zip(batch, found, strict=True):
                request.times.queue_s, request.times.steps_s = start - request.submitted, seconds
                request.times.encoder_batch = len(batch)
                caption = caption_of(None, hypotheses, self.captioner.vocab, request.options.require_words)
                request.future.set_result(Answer(caption, request.times))

    def _batch(self) -> list[_Request]:
        pending, self.held = self.held, []
        try:
            if not pending:
                pending.append(self.waiting.get(timeout=0.05))
            deadline = time.perf_counter() + self.options.max_delay_ms / 1e3
            while len(pending) < self.options.max_batch and time.perf_counter() < deadline:
                pending.append(self.waiting.get(timeout=max(0.0, deadline - time.perf_counter())))
        except queue.Empty:
            pass
        first = pending[0].options if pending else None
        batch = [r for r in pending if r.options == first][: self.options.max_batch]
        chosen = {id(r) for r in batch}
        self.held = [r for r in pending if id(r) not in chosen]
        return batch

"""``edgecap serve``: an HTTP captioning service on LitServe, one in-flight scheduler behind it.

LitServe (FastAPI and uvicorn) answers HTTP, health and request-size limits in processes of its own; the one
inference worker runs the export and an ``InflightScheduler`` whose step loop every request joins as it comes
(an async ``predict`` per request, so requests never wait for each other's batch). Why not Triton through PyTriton:
docs/serving.md, "Why LitServe".

Every bad request gets a client error with a one-line reason and the server keeps serving: 400 for an image or
option edgecap cannot use, 413 for a body over the limit, 503 with Retry-After when the queue is full or the server
drains, 504 past the request's deadline. SIGTERM drains: new captions are refused, those in flight are answered,
then the processes stop.
"""

# No `from __future__ import annotations`: LitServe reads decode_request's annotation as the request body's type.
import asyncio
import base64
import binascii
import json
import multiprocessing as mp
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import litserve as ls
from fastapi import HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from edgecap.errors import EdgecapError
from edgecap.preprocess import load_image_bytes
from edgecap.runtime.inflight import Busy, InflightScheduler, SchedulerOptions, StaticScheduler
from edgecap.runtime.pipeline import Captioner
from edgecap.runtime.search import SearchOptions
from edgecap.server_metrics import WorkerMetrics, exposition, http_metrics, metrics_dir

SCHEDULERS = {"inflight": InflightScheduler, "static": StaticScheduler}
RETRY_AFTER_S = 1  # what a busy answer suggests: about one caption's time at load on a small CPU


@dataclass(frozen=True)
class ServeOptions:
    export: Path
    backend: str = "ort"
    precision: str | None = None  # None: the export's own default (what --target chose)
    host: str = "127.0.0.1"
    port: int = 8000
    batching: str = "inflight"  # or "static": whole requests batched, the baseline
    scheduler: SchedulerOptions = field(default_factory=SchedulerOptions)
    timeout_s: float = 30.0  # a request's deadline unless it sets deadline_s
    max_body_mb: float = 20.0  # the JSON body, base64 image included
    grace_s: float = 30.0  # how long SIGTERM waits for the captions in flight


class CaptionRequest(BaseModel):
    """The body of ``POST /caption``; a field it does not name is refused, not ignored."""

    model_config = ConfigDict(extra="forbid")

    image: str = Field(description="the image file's bytes (JPEG, PNG, WebP...), base64")
    beam: int = 3
    max_length: int = 20
    length_penalty: float = 0.0
    block_trigrams: bool = False
    n_best: int = 1
    ban_words: list[str] = Field(default_factory=list)
    require_words: list[str] = Field(default_factory=list)
    deadline_s: float | None = Field(None, gt=0, le=3600)


def search_options(request: CaptionRequest) -> SearchOptions:
    try:
        return SearchOptions(beam_size=request.beam, max_length=request.max_length,
                             length_penalty=request.length_penalty, block_trigrams=request.block_trigrams,
                             n_best=request.n_best, ban_words=tuple(request.ban_words),
                             require_words=tuple(request.require_words))
    except (TypeError, ValueError) as err:
        raise HTTPException(400, str(err).replace("SearchOptions.beam_size", "beam")) from None


def image_bytes(encoded: str) -> bytes:
    try:
        return base64.b64decode("".join(encoded.split()), validate=True)  # line-wrapped base64 is fine too
    except (binascii.Error, ValueError):
        raise HTTPException(400, "image: not base64; send the file's bytes base64-encoded (base64 -w0 photo.jpg)"
                            ) from None


def answer_json(answer, decode_s: float, total_s: float) -> dict:
    times = answer.times
    caption = answer.caption
    return {"caption": caption.text, "logprob": round(float(caption.hypothesis.logprob), 4),
            "alternatives": list(caption.alternatives), "unmet_words": list(caption.unmet_words),
            "encoder_batch": times.encoder_batch, "steps": times.steps,
            "times_ms": {name: round(seconds * 1e3, 2) for name, seconds in (
                ("decode", decode_s), ("queue", times.queue_s), ("encoder", times.encoder_s),
                ("steps", times.steps_s), ("search", times.search_s), ("total", total_s))}}


class CaptionAPI(ls.LitAPI):
    """Runs in the inference worker: decodes each request's image, submits it and awaits its caption."""

    def __init__(self, options: ServeOptions):
        super().__init__(api_path="/caption", enable_async=True)
        self.options = options

    def setup(self, device: str) -> None:
        captioner = Captioner.from_dir(self.options.export, backend=self.options.backend,
                                       precision=self.options.precision)
        self.scheduler = SCHEDULERS[self.options.batching](captioner, self.options.scheduler)
        self.metrics = WorkerMetrics()
        # systemd and `timeout` signal the whole process group: the worker then drains too, never drops captions
        signal.signal(signal.SIGTERM, lambda signum, frame: threading.Thread(target=self._exit_when_done).start())

    def _exit_when_done(self) -> None:
        """Refuse new photos, answer every one taken, give the answers time to reach the HTTP process, exit."""
        self.scheduler.close()
        time.sleep(0.5)
        os._exit(0)

    async def decode_request(self, request: CaptionRequest) -> CaptionRequest:
        return request

    async def predict(self, request: CaptionRequest) -> dict:
        arrived = time.perf_counter()
        deadline = request.deadline_s or self.options.timeout_s
        options, data = search_options(request), image_bytes(request.image)
        try:
            pixels = await asyncio.to_thread(load_image_bytes, data, "image", self.scheduler.captioner.prep)
            decode_s = time.perf_counter() - arrived
            future = self.scheduler.submit(pixels, options)
        except Busy as err:
            raise HTTPException(503, str(err)) from None
        except EdgecapError as err:  # ImageError, or options the export cannot run
            raise HTTPException(400, str(err).replace("--search ", "")) from None
        try:  # shielded: a missed deadline answers 504 and leaves the scheduler's Future alone
            answer = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), deadline - decode_s)
        except TimeoutError:
            raise HTTPException(504, f"no caption within the deadline of {deadline:g} s; raise deadline_s or send "
                                     "fewer requests at once") from None
        self.metrics.record(answer.times, decode_s, self.scheduler.rows_in_flight, self.scheduler.waiting.qsize())
        return answer_json(answer, decode_s, time.perf_counter() - arrived)

    async def encode_response(self, output: dict) -> dict:
        return output


class Gate:
    """ASGI middleware in each HTTP process: refuses new captions while the server drains, counts the captions in
    flight for the drain, adds Retry-After to busy answers, and records every answer's status and time."""

    def __init__(self, app, *, draining, in_flight, max_body: int):
        self.app, self.draining, self.in_flight, self.max_body = app, draining, in_flight, max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path, start, status = scope["path"], time.perf_counter(), [500]

        async def answer(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if status[0] == 503:
                    message["headers"] = [*message.get("headers", []), (b"retry-after", str(RETRY_AFTER_S).encode())]
            await send(message)

        if path == "/caption":  # the body is JSON whatever its Content-Type says (curl -d sends a form's)
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k != b"content-type"]
                     + [(b"content-type", b"application/json")]}
        length = dict(scope["headers"]).get(b"content-length", b"")
        declared = int(length) if length.isdigit() else 0  # uvicorn refuses a malformed length itself
        if path == "/caption" and self.draining.is_set():
            refusal = JSONResponse({"detail": "the server is shutting down; retry on another instance"}, 503)
            await refusal(scope, receive, answer)
        elif declared > self.max_body:
            await _discard_body(receive, 4 * self.max_body)  # read, so the client finishes sending and reads this
            refusal = JSONResponse({"detail": f"the body's {declared} bytes are over the server's limit of "
                                              f"{self.max_body} (--max-body-mb); send a smaller image"}, 413)
            await refusal(scope, receive, answer)
        elif path != "/caption":
            await self.app(scope, receive, answer)
        else:
            with self.in_flight.get_lock():
                self.in_flight.value += 1
            try:
                await self.app(scope, self._counted(receive), answer)
            finally:
                with self.in_flight.get_lock():
                    self.in_flight.value -= 1
        http_metrics().record(path, status[0], time.perf_counter() - start)  # made in the HTTP process

    def _counted(self, receive):
        """``receive`` that stops a body sent without a length once it passes the limit."""
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_body:
                raise HTTPException(413, f"the body is over the server's limit of {self.max_body} bytes "
                                         "(--max-body-mb); send a smaller image")
            return message

        return counted


async def _discard_body(receive, most: int) -> None:
    """Read and drop a request's body, up to ``most`` bytes (a longer one is cut off when the connection closes)."""
    seen = 0
    while seen <= most:
        message = await receive()
        seen += len(message.get("body", b""))
        if not message.get("more_body"):
            return


async def _invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
    """FastAPI's 422 list as a 400 with one line: the first field at fault and what it needs."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in first.get("loc", ()) if part != "body") or "body"
    if first.get("type") == "extra_forbidden":
        known = ", ".join(CaptionRequest.model_fields)
        reason = f"unknown option {where!r}; the options are {known}"
    elif first.get("type") == "json_invalid" or where == "body":
        reason = "the body is not a JSON object; send {\"image\": \"<base64 of the file>\", ...}"
    else:
        reason = f"{where}: {first.get('msg', 'invalid')}"
    return JSONResponse({"detail": reason}, 400)


async def _metrics(request: Request) -> Response:
    body, content_type = exposition()
    return Response(body, media_type=content_type)


class _LitServer(ls.LitServer):
    """LitServe's server, with its queue manager deaf to SIGTERM: systemd (and `pkill`, `timeout`) signal every
    process of the service at once, and a manager that died then would take the answers in flight with it. It stops
    when LitServe shuts it down, after the drain."""

    def _init_manager(self, num_api_servers: int):
        handler = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the manager process is forked here
        try:
            return super()._init_manager(num_api_servers)
        finally:
            signal.signal(signal.SIGTERM, handler)


def build_server(options: ServeOptions, draining, in_flight) -> ls.LitServer:
    max_body = int(options.max_body_mb * 2**20)
    server = _LitServer(CaptionAPI(options), accelerator="cpu", devices=1, workers_per_device=1, timeout=False,
                          middlewares=[(Gate, {"draining": draining, "in_flight": in_flight, "max_body": max_body})])
    server.app.add_exception_handler(RequestValidationError, _invalid_request)
    server.app.add_api_route("/metrics", _metrics, methods=["GET"])
    return server


def serve(options: ServeOptions) -> None:
    """Serve until SIGTERM (drains first) or Ctrl-C."""
    if options.batching not in SCHEDULERS:
        raise EdgecapError(f"--batching {options.batching}: choose one of {', '.join(SCHEDULERS)}")
    Captioner.from_dir(options.export, backend=options.backend, precision=options.precision)  # refuse here, in 1 line
    fork = mp.get_context("fork")  # the HTTP processes are forked from this one and share these two
    draining, in_flight = fork.Event(), fork.Value("i", 0)

    main = os.getpid()

    def drain(signum, frame) -> None:
        if os.getpid() != main:  # an HTTP process inherits this by fork; uvicorn re-raises the signal once it has
            return  # stopped serving, and the process then ends on its own (an exception here would race its loop)
        draining.set()
        stop = time.monotonic() + options.grace_s
        while in_flight.value > 0 and time.monotonic() < stop:
            time.sleep(0.05)
        raise KeyboardInterrupt  # LitServe's own shutdown: stop the HTTP processes, then the worker

    with metrics_dir():
        server = build_server(options, draining, in_flight)
        signal.signal(signal.SIGTERM, drain)
        print(json.dumps({"serving": f"http://{options.host}:{options.port}/caption", "export": str(options.export),
                          "batching": options.batching}), flush=True)
        try:
            server.run(host=options.host, port=options.port, num_api_servers=1, generate_client_file=False,
                       log_level="warning")
        except KeyboardInterrupt:  # a second Ctrl-C, or SIGTERM during LitServe's own shutdown: already stopping
            pass

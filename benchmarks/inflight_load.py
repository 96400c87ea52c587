"""In-flight against static batching under load, in one process: closed-loop clients, then Poisson arrivals.

Each client thread sends a photo, waits for its caption, and sends the next (``--clients``), for ``--seconds``; then
requests arrive at random at ``--rate`` per second whatever the answers (Poisson). Both schedulers run the same
export, photos and options, one after the other. Reports captions per second and latency p50/p99 per row, and
checks every caption against the export's own batch-1 caption of the same photo.

    python benchmarks/inflight_load.py EXPORT [--precision int8] [--clients 1,4,16,64] [--rate 20] [--seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

from edgecap.errors import EdgecapError
from edgecap.preprocess import SAMPLE_IMAGES, load_images
from edgecap.runtime.inflight import Busy, InflightScheduler, SchedulerOptions, StaticScheduler
from edgecap.runtime.pipeline import Captioner
from edgecap.runtime.search import SearchOptions

SCHEDULERS = {"in-flight": InflightScheduler, "static": StaticScheduler}


def closed_loop(scheduler, photos, options, clients: int, seconds: float) -> tuple[list[float], list[tuple], int]:
    """(latencies, (photo, tokens) answered, busy refusals) of ``clients`` threads each sending one at a time."""
    latencies, answered, busy = [], [], [0]
    lock = threading.Lock()
    stop = time.perf_counter() + seconds

    def client(number: int) -> None:
        i = number
        while time.perf_counter() < stop:
            photo = i % len(photos)
            start = time.perf_counter()
            try:
                answer = scheduler.submit(photos[photo], options).result()
            except Busy:
                with lock:
                    busy[0] += 1
                time.sleep(0.01)
                continue
            with lock:
                latencies.append(time.perf_counter() - start)
                answered.append((photo, answer.caption.hypothesis.tokens))
            i += clients

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return latencies, answered, busy[0]


def poisson(scheduler, photos, options, rate: float, seconds: float) -> tuple[list[float], list[tuple], int]:
    """The same for requests sent at exponential intervals of mean 1 / ``rate`` seconds, not waiting for answers."""
    rng = np.random.default_rng(0)
    sent, busy, done_at = [], 0, {}
    stop = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < stop:
        photo = i % len(photos)
        start = time.perf_counter()
        try:
            future = scheduler.submit(photos[photo], options)
            sent.append((photo, start, future))
            future.add_done_callback(lambda f: done_at.setdefault(id(f), time.perf_counter()))
        except Busy:
            busy += 1
        i += 1
        time.sleep(rng.exponential(1 / rate))
    latencies, answered = [], []
    for photo, start, future in sent:
        answered.append((photo, future.result().caption.hypothesis.tokens))
        latencies.append(done_at[id(future)] - start)
    return latencies, answered, busy


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--precision", default=None, help="default: the export's --target choice, else fp32")
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--rate", type=float, default=0.0, help="Poisson requests per second (0: skip)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--beam", type=int, default=3)
    args = parser.parse_args(argv)
    captioner = Captioner.from_dir(args.export, precision=args.precision)
    photos = load_images(sorted(SAMPLE_IMAGES.glob("*.jpg")), captioner.prep)
    options = SearchOptions(beam_size=args.beam)
    alone = [captioner.search(p[None], options)[0].tokens for p in photos]
    print(f"{args.export} ({captioner.manifest.model_id}), {len(photos)} sample photos, beam {args.beam}, "
          f"{args.seconds:.0f} s per row\n")
    print("| load | scheduler | captions/s | p50 ms | p99 ms | answered | busy | captions as alone |")
    print("|---|---|---|---|---|---|---|---|")
    loads = [(f"{n} clients", closed_loop, n) for n in (int(c) for c in args.clients.split(",") if c)]
    if args.rate:
        loads.append((f"Poisson {args.rate:g}/s", poisson, args.rate))
    for name, run, load in loads:
        for label, kind in SCHEDULERS.items():
            scheduler = kind(captioner, SchedulerOptions())
            started = time.perf_counter()
            latencies, answered, busy = run(scheduler, photos, options, load, args.seconds)
            elapsed = time.perf_counter() - started
            scheduler.close()
            same = sum(tokens == alone[photo] for photo, tokens in answered)
            p50, p99 = (np.percentile(latencies, [50, 99]) * 1e3) if latencies else (float("nan"),) * 2
            print(f"| {name} | {label} | {len(answered) / elapsed:.1f} | {p50:.0f} | {p99:.0f} | {len(answered)} | "
                  f"{busy} | {same} of {len(answered)} |", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except EdgecapError as err:
        sys.exit(f"error: {err}")

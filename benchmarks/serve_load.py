"""`edgecap serve` under load on 127.0.0.1: in-flight against static batching, closed-loop clients and Poisson
arrivals, then (``--soak``) a long run at the saturating load and a burst of 4x the queue.

For each scheduler a server process is started (``edgecap serve --batching inflight|static``), loaded, and stopped
by SIGTERM. Closed-loop clients each send a photo, wait for its caption and send the next (``--clients``); Poisson
arrivals come at ``--rate`` per second from a bounded pool of sender threads whatever the answers. Every row reports
captions per second, latency p50/p99, busy answers, and every caption checked against ``edgecap caption``'s for the
same photo; the soak counts every request (caption, busy or error: none may be lost) and the server's memory.

    python benchmarks/serve_load.py EXPORT [--clients 1,4,16,64] [--rate 20] [--seconds 20] [--soak 600]
        [--batching inflight,static] [--triton-url http://127.0.0.1:8000]

``--triton-url`` loads a Triton server serving ``edgecap export EXPORT --triton``'s repository the same way (its
dynamic batcher batches whole requests: the static batching users get from Triton).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from edgecap.cli_options import parse_list
from edgecap.client import Client, ServerBusy, ServerError, ServerUnreachable, TritonClient
from edgecap.errors import EdgecapError
from edgecap.preprocess import SAMPLE_IMAGES
from edgecap.runtime.pipeline import Captioner
from edgecap.runtime.search import SearchOptions

QUEUE = 256  # the server's --queue (its default)


class Server:
    """One ``edgecap serve`` process for the length of a ``with`` block."""

    def __init__(self, export: Path, batching: str, port: int):
        self.command = [sys.executable, "-m", "edgecap", "serve", str(export), "--batching", batching,
                        "--port", str(port), "--queue", str(QUEUE)]
        self.client = Client(f"http://127.0.0.1:{port}", timeout=120)

    def __enter__(self) -> Server:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        while not self.client.health():
            if self.process.poll() is not None:
                raise EdgecapError(f"edgecap serve exited: {self.process.stderr.read()}")
            time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        self.process.terminate()
        self.process.wait(timeout=120)

    def rss_mb(self) -> float:
        """Resident memory of the server and every process under it (Linux /proc)."""
        children: dict[int, list[int]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        total, todo = 0, [self.process.pid]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            try:
                status = Path(f"/proc/{pid}/status").read_text()
            except OSError:
                continue
            total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS")), 0)
        return total / 1024


class Tally:
    """Every request's outcome, from any thread."""

    def __init__(self, expected: dict[int, str]):
        self.expected, self.lock = expected, threading.Lock()
        self.latencies, self.same, self.captions, self.busy, self.errors = [], 0, 0, 0, []

    def ask(self, client: Client, photo: int, data: bytes, beam: int) -> bool:
        """Send one request and count its outcome; False when it was refused as busy."""
        start = time.perf_counter()
        try:
            answer = client.caption(data, beam=beam)
        except ServerBusy:
            with self.lock:
                self.busy += 1
            return False
        except (ServerError, ServerUnreachable) as err:
            with self.lock:
                self.errors.append(str(err))
            return True
        with self.lock:
            self.latencies.append(time.perf_counter() - start)
            self.captions += 1
            self.same += answer["caption"] == self.expected[photo]
        return True

    def row(self, name: str, label: str, elapsed: float) -> str:
        p50, p99 = (np.percentile(self.latencies, [50, 99]) * 1e3) if self.latencies else (float("nan"),) * 2
        return (f"| {name} | {label} | {self.captions / elapsed:.1f} | {p50:.0f} | {p99:.0f} | {self.captions} | "
                f"{self.busy} | {len(self.errors)} | {self.same} of {self.captions} |")


def closed_loop(client, photos, tally, beam, clients: int, seconds: float) -> None:
    stop = time.perf_counter() + seconds

    def run(number: int) -> None:
        i = number
        while time.perf_counter() < stop:
            if not tally.ask(client, i % len(photos), photos[i % len(photos)], beam):
                time.sleep(0.01)
                continue
            i += clients

    threads = [threading.Thread(target=run, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def poisson(client, photos, tally, beam, rate: float, seconds: float) -> None:
    rng, stop, i = np.random.default_rng(0), time.perf_counter() + seconds, 0
    with ThreadPoolExecutor(max_workers=256) as senders:  # bounded: past 256 in flight, arrivals wait here
        while time.perf_counter() < stop:
            senders.submit(tally.ask, client, i % len(photos), photos[i % len(photos)], beam)
            i += 1
            time.sleep(rng.exponential(1 / rate))


def soak(export: Path, port: int, photos, expected, beam: int, clients: int, seconds: float) -> dict:
    """``clients`` closed-loop clients for ``seconds``, memory sampled every 10 s, then a burst of 4x the queue."""
    tally = Tally(expected)
    with Server(export, "inflight", port) as server:
        rss = [server.rss_mb()]
        runner = threading.Thread(target=closed_loop, args=(server.client, photos, tally, beam, clients, seconds))
        runner.start()
        while runner.is_alive():
            runner.join(timeout=10)
            rss.append(server.rss_mb())
        burst = Tally(expected)
        with ThreadPoolExecutor(max_workers=4 * QUEUE) as senders:
            for i in range(4 * QUEUE):
                senders.submit(burst.ask, server.client, i % len(photos), photos[i % len(photos)], beam)
        after_burst = server.rss_mb()
    return {"seconds": seconds, "clients": clients, "captions": tally.captions, "busy": tally.busy,
            "errors": len(tally.errors), "same_as_cli": tally.same, "burst_sent": 4 * QUEUE,
            "burst_captions": burst.captions, "burst_busy": burst.busy, "burst_errors": len(burst.errors),
            "burst_lost": 4 * QUEUE - burst.captions - burst.busy - len(burst.errors),
            "rss_mb_idle": round(rss[0], 1), "rss_mb_soak_10s": round(rss[min(1, len(rss) - 1)], 1),
            "rss_mb_soak_end": round(rss[-1], 1), "rss_mb_soak_max": round(max(rss), 1),
            "rss_mb_after_burst": round(after_burst, 1)}


def rows(client, label: str, loads, photos, expected, args) -> None:
    """One table row per load on one server."""
    for name, run, load in loads:
        tally = Tally(expected)
        started = time.perf_counter()
        run(client, photos, tally, args.beam, load, args.seconds)
        print(tally.row(name, label, time.perf_counter() - started), flush=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--clients", default="1,4,16,64")
    parser.add_argument("--rate", type=float, default=0.0, help="Poisson requests per second (0: skip)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of soak at 16 clients, then the burst")
    parser.add_argument("--beam", type=int, default=3)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--batching", default="inflight,static", help="edgecap serve's schedulers to load ('': none)")
    parser.add_argument("--triton-url", help="also load a running tritonserver serving `export --triton`'s repository")
    args = parser.parse_args(argv)
    files = sorted(SAMPLE_IMAGES.glob("*.jpg"))
    photos = [f.read_bytes() for f in files]
    captioner = Captioner.from_dir(args.export)
    expected = dict(enumerate(c.text for c in captioner.caption(files, SearchOptions(beam_size=args.beam))))
    del captioner
    print(f"{args.export}, its default precision, {len(photos)} sample photos, beam {args.beam}, "
          f"{args.seconds:.0f} s per row, {os.cpu_count()} CPUs shared by server and load generator\n")
    print("| load | batching | captions/s | p50 ms | p99 ms | captions | busy | errors | captions as the CLI's |")
    print("|---|---|---|---|---|---|---|---|---|")
    loads = [(f"{n} clients", closed_loop, n) for n in (int(c) for c in args.clients.split(",") if c)]
    if args.rate:
        loads.append((f"Poisson {args.rate:g}/s", poisson, args.rate))
    for batching in parse_list(args.batching, ("inflight", "static"), "--batching") if args.batching else ():
        with Server(args.export, batching, args.port) as server:
            rows(server.client, batching, loads, photos, expected, args)
    if args.triton_url:
        client = TritonClient(args.triton_url, timeout=120)
        if not client.health():
            raise EdgecapError(f"--triton-url {args.triton_url}: no ready Triton server with the edgecap model there")
        rows(client, "Triton dynamic batching", loads, photos, expected, args)
    if args.soak:
        print("\nsoak:", json.dumps(soak(args.export, args.port, photos, expected, args.beam, 16, args.soak)))


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except EdgecapError as err:
        sys.exit(f"error: {err}")

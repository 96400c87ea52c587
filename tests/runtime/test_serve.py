"""`edgecap serve` as a client meets it: the shipped export served over HTTP in a process of its own, captions equal
to the CLI's alone and under load, every bad request a client error with one line while the server keeps serving,
busy answers instead of waits, metrics, and a SIGTERM that drains. Runs without torch (scripts/test_runtime_only.sh)."""

import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from pathlib import Path

import pytest

pytest.importorskip("litserve", reason="edgecap serve needs litserve (pip install 'edgecap[serve]')")

from edgecap.client import Client, ServerBusy, ServerError, ServerUnreachable  # noqa: E402
from edgecap.config import DEFAULT_EXPORT  # noqa: E402
from edgecap.preprocess import SAMPLE_IMAGES  # noqa: E402
from edgecap.runtime.pipeline import Captioner  # noqa: E402
from edgecap.runtime.search import SearchOptions  # noqa: E402

PHOTOS = sorted(SAMPLE_IMAGES.glob("*.jpg"))
QUEUE = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """An ``edgecap serve`` process on a free port, healthy before the tests use it."""

    def __init__(self, *flags: str):
        self.port = _free_port()
        self.temp = Path(tempfile.mkdtemp())  # its own temp dir, to see what it leaves there
        self.process = subprocess.Popen([sys.executable, "-m", "edgecap", "serve", "--port", str(self.port), *flags],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env={**os.environ, "TMPDIR": str(self.temp)},
                                        start_new_session=True)  # a group of its own, as a service manager gives
        self.client = Client(f"http://127.0.0.1:{self.port}", timeout=60)
        stop = time.monotonic() + 120
        while not self.client.health():
            if self.process.poll() is not None or time.monotonic() > stop:
                self.process.kill()
                raise AssertionError(f"edgecap serve did not become healthy: {self.process.communicate()[1]}")
            time.sleep(0.2)

    def close(self) -> str:
        """Stop it by SIGTERM, as a service manager does; its stderr."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.communicate(timeout=60)[1]

    def left_behind(self) -> list[str]:
        """edgecap's folders the stopped server left in its temp dir (its metrics folder is to be gone; ONNX Runtime
        keeps one small file there, overwritten, not added to), the dir then removed."""
        left = sorted(path.name for path in self.temp.glob("edgecap-*"))
        shutil.rmtree(self.temp)
        return left


@pytest.fixture(scope="module")
def served():
    server = Served("--queue", str(QUEUE), "--max-body-mb", "1")
    yield server
    stderr = server.close()
    assert "Traceback" not in stderr, stderr
    assert not server.left_behind()


@pytest.fixture(scope="module")
def expected():
    """What ``edgecap caption`` says of each sample photo with the same export and options."""
    captions = Captioner.from_dir(DEFAULT_EXPORT).caption(PHOTOS, SearchOptions(beam_size=3))
    return {photo.name: (c.text, round(float(c.hypothesis.logprob), 4))
            for photo, c in zip(PHOTOS, captions, strict=True)}


def _png_bomb(width: int, height: int) -> bytes:
    """A 1-bit PNG of ``width`` x ``height`` black pixels: a few hundred kB that would decode to gigabytes."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    row, packer = b"\x00" * (1 + (width + 7) // 8), zlib.compressobj(9)
    pixels = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _post(port: int, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/caption", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())["detail"]


def test_captions_equal_the_cli_s(served, expected):
    for photo in PHOTOS:
        answer = served.client.caption(photo.read_bytes(), beam=3)
        assert (answer["caption"], answer["logprob"]) == expected[photo.name], photo.name
        assert set(answer["times_ms"]) == {"decode", "queue", "encoder", "steps", "search", "total"}


@pytest.mark.slow
def test_captions_equal_the_cli_s_under_load(served, expected):
    """16 clients at once (4x the queue): every request is answered, a caption equal to the CLI's or a busy answer
    the client retries; none is lost."""
    answers, lock = [], threading.Lock()

    def client(number: int) -> None:
        for photo in PHOTOS[number % 3:][:4]:
            while True:
                try:
                    answer = served.client.caption(photo.read_bytes(), beam=3)
                    break
                except ServerBusy as busy:
                    assert busy.retry_after > 0
                    time.sleep(0.05)
            with lock:
                answers.append((photo.name, answer["caption"], answer["logprob"]))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(answers) == 16 * 4
    assert all((caption, logprob) == expected[name] for name, caption, logprob in answers)


BAD_REQUESTS = {
    "empty image": ({"image": ""}, "empty image"),
    "not an image": ({"image": base64.b64encode(b"hello, world").decode()}, "not an image"),
    "truncated jpeg": ({"image": base64.b64encode(PHOTOS[0].read_bytes()[:3000]).decode()}, "truncated"),
    "30000x30000 png": ({"image": base64.b64encode(_png_bomb(30000, 30000)).decode()}, "too large to decode"),
    "not base64": ({"image": "%%%not base64%%%"}, "not base64"),
    "unknown option": ({"image": "", "beems": 3}, "unknown option 'beems'"),
    "option of the wrong type": ({"image": "", "beam": "three"}, "beam: "),
    "option out of range": ({"image": base64.b64encode(PHOTOS[0].read_bytes()).decode(), "beam": 0}, "beam must"),
    "word not in the vocabulary": ({"image": base64.b64encode(PHOTOS[0].read_bytes()).decode(),
                                    "ban_words": ["qwertyuiop"]}, "qwertyuiop"),
}


@pytest.mark.parametrize("body, reason", BAD_REQUESTS.values(), ids=BAD_REQUESTS)
def test_a_bad_request_is_a_client_error_and_the_server_keeps_serving(served, expected, body, reason):
    status, detail = _post(served.port, json.dumps(body).encode())
    assert status == 400 and reason in detail and "\n" not in detail, (status, detail)
    assert served.client.caption(PHOTOS[0].read_bytes())["caption"] == expected[PHOTOS[0].name][0]


def test_a_json_body_is_read_as_json_whatever_its_content_type(served, expected):
    body = json.dumps({"image": base64.b64encode(PHOTOS[0].read_bytes()).decode()}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{served.port}/caption", data=body)  # curl -d's form type
    with urllib.request.urlopen(request, timeout=60) as response:
        assert json.loads(response.read())["caption"] == expected[PHOTOS[0].name][0]


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]"], ids=["empty body", "not json", "not an object"])
def test_a_body_that_is_not_a_json_object_is_a_client_error(served, body):
    status, detail = _post(served.port, body)
    assert status == 400 and "JSON object" in detail, (status, detail)


def test_an_oversized_body_is_refused_before_it_is_read(served, expected):
    status, detail = _post(served.port, json.dumps({"image": "A" * 2 * 2**20}).encode())
    assert status == 413 and "--max-body-mb" in detail
    assert served.client.caption(PHOTOS[1].read_bytes())["caption"] == expected[PHOTOS[1].name][0]


def test_a_client_that_disconnects_mid_request_leaves_the_server_serving(served, expected):
    with socket.create_connection(("127.0.0.1", served.port)) as s:
        s.sendall(b"POST /caption HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{\"image\": \"/9j/4AAQ")
    assert served.client.caption(PHOTOS[2].read_bytes())["caption"] == expected[PHOTOS[2].name][0]


def test_a_missed_deadline_is_a_504(served):
    with pytest.raises(ServerError, match="deadline of 0.001 s") as err:
        served.client.caption(PHOTOS[0].read_bytes(), deadline_s=0.001)
    assert err.value.status == 504


def test_a_burst_past_the_queue_gets_busy_answers_at_once(served):
    """4x the queue at once: each request gets a caption or an immediate 503 with Retry-After, none waits long."""
    outcomes, lock = [], threading.Lock()

    def send() -> None:
        start = time.perf_counter()
        try:
            served.client.caption(PHOTOS[3].read_bytes())
            outcome = "caption"
        except ServerBusy as busy:
            outcome = f"busy {busy.retry_after:g}"
        with lock:
            outcomes.append((outcome, time.perf_counter() - start))

    threads = [threading.Thread(target=send) for _ in range(4 * QUEUE)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(outcomes) == 4 * QUEUE
    busy = [seconds for outcome, seconds in outcomes if outcome.startswith("busy")]
    assert busy and {o for o, _ in outcomes} <= {"caption", "busy 1"}
    assert max(busy) < 10


def test_metrics_count_captions_stages_and_rejects(served):
    served.client.caption(PHOTOS[0].read_bytes())
    _post(served.port, b"not json")
    text = served.client.metrics()
    for name in ("edgecap_captions_total", "edgecap_queue_seconds_count", "edgecap_encoder_seconds_count",
                 "edgecap_step_seconds_count", "edgecap_search_seconds_count", "edgecap_encoder_batch_size_count",
                 "edgecap_rows_in_flight", 'edgecap_rejects_total{cause="bad_request"}', "edgecap_request_seconds"):
        assert name in text, name


@pytest.mark.slow
@pytest.mark.parametrize("whole_group", [False, True], ids=["main process (docker stop)", "every process (systemd)"])
def test_sigterm_answers_the_captions_in_flight_and_refuses_new_ones(whole_group):
    """Every request gets a caption or a refusal, captions still finish after the signal, and the server exits
    cleanly, whether SIGTERM reaches the main process alone or every process of the service. Signalled itself, the
    HTTP process stops listening at once, so a request that had not connected yet is refused by the socket instead
    of a "shutting down" 503."""
    server = Served("--queue", "64")
    outcomes, lock = [], threading.Lock()

    def send() -> None:
        try:
            outcome = server.client.caption(PHOTOS[4].read_bytes())["caption"]
        except ServerBusy as busy:
            outcome = busy.reason
        except ServerUnreachable as unreachable:
            outcome = f"shutting down ({unreachable})" if whole_group else str(unreachable)
        with lock:
            outcomes.append((outcome, time.monotonic()))

    threads = [threading.Thread(target=send) for _ in range(16)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # the first requests are in flight
    signalled = time.monotonic()
    if whole_group:
        os.killpg(server.process.pid, signal.SIGTERM)
    else:
        server.process.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join()
    stderr = server.process.communicate(timeout=60)[1]
    assert server.process.returncode == 0 and "Traceback" not in stderr, stderr
    assert len(outcomes) == 16
    captions = [at for outcome, at in outcomes if "shutting down" not in outcome]
    assert all(outcome.startswith("a ") or "shutting down" in outcome for outcome, _ in outcomes), outcomes
    assert captions and max(captions) > signalled, "no caption in flight was answered after SIGTERM"
    assert not server.client.health()
    assert not server.left_behind()


def test_serve_refuses_a_missing_export_in_one_line(tmp_path):
    result = subprocess.run([sys.executable, "-m", "edgecap", "serve", str(tmp_path / "nowhere")],
                            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode != 0
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


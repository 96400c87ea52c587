"""A small client of ``edgecap serve``, standard library only, so any Python can call a captioning service.

    from edgecap.client import Client
    Client("http://127.0.0.1:8000").caption(open("photo.jpg", "rb").read(), beam=3)["caption"]
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from pathlib import Path


class ServerError(Exception):
    """The server refused or failed a request: ``status`` is the HTTP status, ``reason`` the server's one line."""

    def __init__(self, status: int, reason: str):
        super().__init__(f"HTTP {status}: {reason}")
        self.status, self.reason = status, reason


class ServerBusy(ServerError):
    """The server's queue is full or it is shutting down (503): retry after ``retry_after`` seconds."""

    def __init__(self, status: int, reason: str, retry_after: float):
        super().__init__(status, reason)
        self.retry_after = retry_after


class ServerUnreachable(ConnectionError):
    """No HTTP answer came: the server is not running there, or it closed the connection."""


class Client:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 60.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def caption(self, image: bytes | str | Path, **options) -> dict:
        """The caption of an image's encoded bytes (or a path to its file) with decoding ``options`` (beam,
        max_length, length_penalty, block_trigrams, n_best, ban_words, require_words, deadline_s): a dict with
        ``caption``, ``logprob``, ``alternatives``, ``unmet_words`` and per-stage ``times_ms``."""
        data = Path(image).read_bytes() if isinstance(image, (str, Path)) else image
        body = json.dumps({"image": base64.b64encode(data).decode("ascii"), **options}).encode()
        return json.loads(self._call("/caption", body))

    def health(self) -> bool:
        """True once the server's worker has loaded the export and takes requests."""
        try:
            self._call("/health")
        except (ServerError, ServerUnreachable):
            return False
        return True

    def metrics(self) -> str:
        """The server's Prometheus metrics, as text."""
        return self._call("/metrics").decode()

    def _call(self, path: str, body: bytes | None = None) -> bytes:
        request = urllib.request.Request(self.url + path, data=body,
                                         headers={"Content-Type": "application/json"} if body is not None else {})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            reason = _reason(err.read())
            if err.code == 503:
                raise ServerBusy(err.code, reason, float(err.headers.get("Retry-After") or 1)) from None
            raise ServerError(err.code, reason) from None
        except OSError as err:  # refused, reset, timed out: urllib's URLError or the socket's own
            raise ServerUnreachable(f"no answer from {self.url}{path}: {getattr(err, 'reason', err)}") from None


def _reason(body: bytes) -> str:
    try:
        detail = json.loads(body).get("detail", body.decode(errors="replace"))
    except (ValueError, AttributeError):
        return body.decode(errors="replace").strip() or "no reason given"
    return detail if isinstance(detail, str) else json.dumps(detail)

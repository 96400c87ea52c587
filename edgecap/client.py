"""Small clients of ``edgecap serve`` and of the Triton repository ``edgecap export --triton`` writes, standard
library only, so any Python can call a captioning service.

    from edgecap.client import Client, TritonClient
    Client("http://127.0.0.1:8000").caption(open("photo.jpg", "rb").read(), beam=3)["caption"]
    TritonClient("http://127.0.0.1:8000").caption(open("photo.jpg", "rb").read(), beam=3)["caption"]
"""

from __future__ import annotations

import base64
import json
import struct
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


class _Http:
    def __init__(self, url: str = "http://127.0.0.1:8000", timeout: float = 60.0):
        self.url, self.timeout = url.rstrip("/"), timeout

    def _call(self, path: str, body: bytes | None = None, headers: dict | None = None) -> bytes:
        return self._exchange(path, body, headers)[0]

    def _exchange(self, path: str, body: bytes | None = None, headers: dict | None = None) -> tuple[bytes, dict]:
        """(the answer's body, its headers); a refusal raises ServerError or ServerBusy, no answer ServerUnreachable."""
        headers = headers if headers is not None else {"Content-Type": "application/json"} if body is not None else {}
        request = urllib.request.Request(self.url + path, data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read(), dict(response.headers)
        except urllib.error.HTTPError as err:
            reason = _reason(err.read())
            if err.code == 503:
                raise ServerBusy(err.code, reason, float(err.headers.get("Retry-After") or 1)) from None
            raise ServerError(err.code, reason) from None
        except OSError as err:  # refused, reset, timed out: urllib's URLError or the socket's own
            raise ServerUnreachable(f"no answer from {self.url}{path}: {getattr(err, 'reason', err)}") from None


class Client(_Http):
    """A client of ``edgecap serve``."""

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



class TritonClient(_Http):
    """A client of the ``edgecap`` model of a Triton server serving ``edgecap export --triton``'s repository, over
    KServe v2 HTTP with binary tensors (Triton's port 8000 by default; its gRPC port serves the same model)."""

    OUTPUTS = ("CAPTION", "LOGPROB", "ALTERNATIVES")

    def __init__(self, url: str = "http://127.0.0.1:8000", model: str = "edgecap", timeout: float = 60.0):
        super().__init__(url, timeout)
        self.model = model

    def caption(self, image: bytes | str | Path, **options) -> dict:
        """The caption of an image's encoded bytes (or a path to its file) with decoding ``options`` (any field of
        ``edgecap.runtime.SearchOptions``; ``beam`` for beam_size): a dict with ``caption``, ``logprob`` and
        ``alternatives``."""
        data = Path(image).read_bytes() if isinstance(image, (str, Path)) else image
        values = {"IMAGE": data, **({"OPTIONS": json.dumps(options).encode()} if options else {})}
        tensors = {name: struct.pack("<I", len(value)) + value for name, value in values.items()}  # one BYTES value
        header = json.dumps({
            "inputs": [{"name": name, "shape": [1, 1], "datatype": "BYTES",
                        "parameters": {"binary_data_size": len(value)}} for name, value in tensors.items()],
            "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in self.OUTPUTS]}).encode()
        body, headers = self._exchange(f"/v2/models/{self.model}/infer", header + b"".join(tensors.values()), {
            "Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))})
        outputs = _binary_outputs(body, headers)
        return {"caption": outputs["CAPTION"][4:].decode(), "logprob": struct.unpack("<f", outputs["LOGPROB"])[0],
                "alternatives": json.loads(outputs["ALTERNATIVES"][4:])}  # a BYTES value: its length, then itself

    def health(self) -> bool:
        """True once the server is ready and so is the caption model."""
        try:
            self._call("/v2/health/ready")
            self._call(f"/v2/models/{self.model}/ready")
        except (ServerError, ServerUnreachable):
            return False
        return True


def _binary_outputs(body: bytes, headers: dict) -> dict[str, bytes]:
    """Each output's bytes from a KServe v2 answer whose JSON header is followed by the binary tensors in order."""
    length = int({k.lower(): v for k, v in headers.items()}.get("inference-header-content-length", len(body)))
    offset, outputs = length, {}
    for output in json.loads(body[:length])["outputs"]:
        size = output["parameters"]["binary_data_size"]
        outputs[output["name"]] = body[offset:offset + size]
        offset += size
    return outputs


def _reason(body: bytes) -> str:
    try:
        answer = json.loads(body)
        detail = answer.get("detail", answer.get("error", body.decode(errors="replace")))  # serve's, Triton's
    except (ValueError, AttributeError):
        return body.decode(errors="replace").strip() or "no reason given"
    return detail if isinstance(detail, str) else json.dumps(detail)

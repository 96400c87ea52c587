"""A Triton Inference Server for the tests of edgecap's Triton repository: the ``tritonserver`` binary that the
``nvidia-pytriton`` wheel bundles (Python backend only), started on free ports with the environment its Python stub
needs, and stopped with the test."""

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The server's Python models run in this environment's interpreter: numpy 1 (Triton 2.51's stub garbles every
# tensor under numpy 2), edgecap's runtime, the nvidia-pytriton wheel whose server binary the tests start, and
# Triton's own gRPC client.
TRITON_VENV = Path(os.environ.get("EDGECAP_TRITON_VENV", REPO_ROOT / ".venv-triton"))


def _packages() -> Path | None:
    return next(iter(sorted(TRITON_VENV.glob("lib/python3.*/site-packages/pytriton"))), None)


def missing() -> str | None:
    """Why these tests cannot start a server here, or None."""
    if _packages() is None:
        return (f"needs {TRITON_VENV} with nvidia-pytriton, numpy<2, tritonclient[grpc] and edgecap[runtime] "
                "(scripts/test.sh makes it)")
    return None


def _interpreter(expression: str) -> str:
    return subprocess.run([str(TRITON_VENV / "bin" / "python"), "-c", f"import sys, sysconfig; print({expression})"],
                          capture_output=True, text=True, check=True).stdout.strip()


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def _ready(url: str) -> bool:
    """Triton's readiness: the server is up and every model of the repository loaded."""
    try:
        with urllib.request.urlopen(f"{url}/v2/health/ready", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


@dataclass(frozen=True)
class Endpoints:
    http: str  # base URL
    grpc: str  # host:port


def grpc_captions(grpc: str, photos: list[Path]) -> list[str]:
    """The captions of ``photos`` asked over gRPC (KServe v2) with Triton's own client, from the Triton environment,
    which has it (``tritonclient[grpc]``)."""
    script = """
import json, sys
import numpy as np
import tritonclient.grpc as grpc
client, captions = grpc.InferenceServerClient(sys.argv[1]), []
for path in sys.argv[2:]:
    image = grpc.InferInput("IMAGE", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([[open(path, "rb").read()]], dtype=object))
    captions.append(client.infer("edgecap", [image]).as_numpy("CAPTION").reshape(-1)[0].decode())
print(json.dumps(captions))
"""
    done = subprocess.run([str(TRITON_VENV / "bin" / "python"), "-c", script, grpc, *map(str, photos)],
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


@contextmanager
def triton_server(repository: Path, workdir: Path, *, timeout: float = 120.0):
    """Serve ``repository``; yields its endpoints once every model is ready."""
    package = _packages()
    dist = workdir / "tritonserver"
    shutil.copytree(package / "tritonserver", dist, ignore=shutil.ignore_patterns("python_backend_stubs"))
    version = _interpreter("f'{sys.version_info.major}.{sys.version_info.minor}'")
    shutil.copy(package / "tritonserver" / "python_backend_stubs" / version / "triton_python_backend_stub",
                dist / "backends" / "python")
    libpython = _interpreter("sysconfig.get_config_var('LIBDIR')")  # the stub links the environment's libpython,
    # not the system's other 3.11 build; and its interpreter is the first python3 on PATH
    env = {**os.environ, "LD_LIBRARY_PATH": f"{libpython}:{package.parent / 'nvidia_pytriton.libs'}",
           "PATH": f"{TRITON_VENV / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    http, grpc, metrics = _free_ports(3)
    log = (workdir / "tritonserver.log").open("w")
    process = subprocess.Popen(
        [str(dist / "bin" / "tritonserver"), f"--model-repository={repository}",
         f"--backend-directory={dist / 'backends'}", f"--cache-directory={dist / 'caches'}",
         f"--http-port={http}", f"--grpc-port={grpc}", f"--metrics-port={metrics}", "--http-address=127.0.0.1",
         "--grpc-address=127.0.0.1", "--exit-timeout-secs=5"],
        env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{http}"
    try:
        deadline = time.monotonic() + timeout
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"tritonserver did not become ready:\n{(workdir / 'tritonserver.log').read_text()}")
            time.sleep(0.5)
        yield Endpoints(url, f"127.0.0.1:{grpc}")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()

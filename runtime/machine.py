"""The machine a figure was measured on, torch-free: every report carries it, so figures from different machines
are never mixed, and the memory bandwidth that gives a memory-bound step its floor."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def peak_rss_mb() -> float | None:
    """Peak resident set size of this process so far, in MiB (None where the OS does not say).

    Linux: ``VmHWM``, the high-water mark of this process's own memory. ``ru_maxrss`` is only the fallback: it
    survives ``exec``, so a spawned worker would report its parent's size at fork time when that is larger.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**10  # kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


CPU_FEATURES = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "asimd", "asimddp")
"""The instruction sets INT8 and fp16 kernels care about: VNNI (x86) and the dot-product extension (Arm) are what
make INT8 pay on a CPU."""


def cpu_features() -> list[str]:
    """Which of ``CPU_FEATURES`` this CPU reports (Linux ``/proc/cpuinfo``; [] where it cannot be read)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = {flag for line in text.splitlines() if line.lower().startswith(("flags", "features"))
             for flag in line.split(":", 1)[1].split()}
    return [feature for feature in CPU_FEATURES if feature in flags]


def gpu_names() -> list[str]:
    """Name, driver and compute capability of each NVIDIA GPU that nvidia-smi lists; [] when there is none."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []


def jetpack() -> str | None:
    """The L4T release line of a Jetson (``/etc/nv_tegra_release``); None elsewhere."""
    try:
        return Path("/etc/nv_tegra_release").read_text().splitlines()[0].strip()
    except (OSError, IndexError):
        return None


def library_versions() -> dict[str, str]:
    """numpy, the runtime libraries installed and (only when this process already imported it) torch: never imports
    torch."""
    versions = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in ("edgecap", "onnxruntime", "onnxruntime-gpu", "onnx", "openvino", "tensorrt", "cuda-python"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        versions["torch"] = str(torch.__version__)
    return versions


def machine_info() -> dict:
    """What a reader needs to know before comparing figures: CPU, cores, GPU, OS, library versions, load."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cpu_features": cpu_features(),
        "jetpack": jetpack(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "gpu": gpu_names() or None,
        "platform": platform.platform(),
        "versions": library_versions(),
        "load_average": [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


def memcopy_bandwidth_gb_s(*, megabytes: int = 256, repeats: int = 5) -> float:
    """Best-of-``repeats`` bandwidth of one numpy copy between two ``megabytes`` arrays, one thread.

    Counts bytes read plus bytes written (the STREAM "copy" convention), on random data. The arrays are far
    larger than any CPU cache, so this is main-memory bandwidth; a step whose weights stay in cache can beat
    the floor derived from it.
    """
    count = megabytes * 2**20 // 8
    source = np.random.default_rng(0).random(count)
    target = np.empty_like(source)
    np.copyto(target, source)  # fault the pages in before timing
    best = min(_timed(lambda: np.copyto(target, source)) for _ in range(repeats))
    return 2 * source.nbytes / best / 1e9


def gemm_peak_gflops(*, size: int = 1024, repeats: int = 5) -> float:
    """Best-of-``repeats`` float32 GFLOP/s of one ``size`` x ``size`` matrix product in numpy's BLAS.

    A large square GEMM is the most fused-multiply-add-dense work a CPU runs, so this is the practical compute peak
    of the threads BLAS was given (the bench pins them to its thread count before numpy loads).
    """
    rng = np.random.default_rng(0)
    a, b = (rng.random((size, size), dtype=np.float32) for _ in range(2))
    out = np.empty_like(a)
    np.matmul(a, b, out=out)  # warm the BLAS threads and caches up
    best = min(_timed(lambda: np.matmul(a, b, out=out)) for _ in range(repeats))
    return 2 * size**3 / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start

"""What the TensorRT backend and engine builder need from CUDA, through cuda-python's runtime bindings.

``require_tensorrt`` is the one place that imports tensorrt and ``cuda.bindings``; without them, or without a GPU,
it raises one line naming what is missing and how to get it. The rest is small: device identity for the engine
cache, device and pinned host allocations that live as long as the backend, asynchronous copies on one stream
(including a row repeat done on the device), and CUDA graphs replaying a captured TensorRT launch.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from edgecap.errors import BackendUnavailableError
from edgecap.runtime.engines import DeviceInfo

INSTALL_HINT = "pip install edgecap[trt] on a machine with an NVIDIA GPU (on Jetson, TensorRT comes with JetPack)"
MIN_TENSORRT = (10, 3)  # strongly typed networks and the name-based I/O API; JetPack 6 ships 10.3


def require_tensorrt():
    """(tensorrt, cudart) modules; a BackendUnavailableError naming every missing piece otherwise."""
    missing = []
    try:
        import tensorrt as trt
    except (ImportError, OSError):  # OSError: the Python package is there but libnvinfer is not
        trt = None
        missing.append("TensorRT (`import tensorrt` failed)")
    try:
        from cuda.bindings import runtime as cudart
    except (ImportError, OSError):
        cudart = None
        missing.append("cuda-python >= 12.6 (`from cuda.bindings import runtime` failed)")
    if missing:
        raise BackendUnavailableError(f"the TensorRT backend needs {' and '.join(missing)}; {INSTALL_HINT}")
    version = tuple(int(p) for p in trt.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_TENSORRT:
        raise BackendUnavailableError(f"TensorRT {trt.__version__} is too old: edgecap builds strongly typed engines "
                                      f"with TensorRT >= {'.'.join(map(str, MIN_TENSORRT))}; {INSTALL_HINT}")
    err, count = cudart.cudaGetDeviceCount()
    if err != cudart.cudaError_t.cudaSuccess or count == 0:
        reason = _error_name(cudart, err) if err != cudart.cudaError_t.cudaSuccess else "0 devices"
        raise BackendUnavailableError(f"no CUDA GPU is visible ({reason}); TensorRT needs an NVIDIA GPU and its "
                                      f"driver: {INSTALL_HINT}")
    return trt, cudart


def _error_name(cudart, err) -> str:
    status, name = cudart.cudaGetErrorName(err)
    return name.decode() if isinstance(name, bytes) else str(err)


def call(cudart, result):
    """The value(s) of a cuda-python call, which returns (error, *values); raises on any error."""
    err, *values = result
    if err != cudart.cudaError_t.cudaSuccess:
        raise RuntimeError(f"CUDA call failed: {_error_name(cudart, err)}")
    return values[0] if len(values) == 1 else tuple(values)


def current_device(trt, cudart) -> DeviceInfo:
    """GPU name, compute capability and TensorRT version: what an engine is tied to."""
    props = call(cudart, cudart.cudaGetDeviceProperties(call(cudart, cudart.cudaGetDevice())))
    name = props.name if isinstance(props.name, bytes) else bytes(props.name)
    return DeviceInfo(name.split(b"\0")[0].decode(errors="replace").strip(), f"{props.major}.{props.minor}",
                      trt.__version__)


class Cuda:
    """One stream and the allocations of one backend, freed together by ``close``.

    Buffers are allocated once, at their largest size, so their addresses never change: TensorRT's tensor
    addresses and captured CUDA graphs stay valid for the backend's whole life.
    """

    def __init__(self, cudart):
        self.rt = cudart
        self.stream = call(cudart, cudart.cudaStreamCreate())
        self.handle = int(self.stream)  # what TensorRT's execute_async_v3 takes
        self.device: list[int] = []
        self.pinned: list[int] = []
        self.graphs: dict[object, object] = {}  # key -> cudaGraphExec_t
        self.warm: set = set()

    def malloc(self, nbytes: int) -> int:
        pointer = int(call(self.rt, self.rt.cudaMalloc(max(nbytes, 1))))
        self.device.append(pointer)
        return pointer

    def host(self, nbytes: int) -> np.ndarray:
        """Page-locked host bytes (uint8), so copies to and from the device are truly asynchronous."""
        pointer = int(call(self.rt, self.rt.cudaMallocHost(max(nbytes, 1))))
        self.pinned.append(pointer)
        return np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(pointer))

    def to_device(self, pointer: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        kind = self.rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        call(self.rt, self.rt.cudaMemcpyAsync(pointer, array.ctypes.data, array.nbytes, kind, self.stream))

    def to_host(self, array: np.ndarray, pointer: int) -> None:
        """Queue a copy into ``array`` (contiguous, ideally a view of ``host``); valid after ``synchronize``."""
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        call(self.rt, self.rt.cudaMemcpyAsync(array.ctypes.data, pointer, array.nbytes, kind, self.stream))

    def repeat_rows(self, target: int, source: int, *, rows: int, row_bytes: int, times: int) -> None:
        """target row r * times + j = source row r for every j < times (``np.repeat`` on axis 0), on the device:
        one strided copy per j, whose destination pitch skips the other beams' rows."""
        kind = self.rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        for j in range(times):
            call(self.rt, self.rt.cudaMemcpy2DAsync(target + j * row_bytes, times * row_bytes, source, row_bytes,
                                                    row_bytes, rows, kind, self.stream))

    def synchronize(self) -> None:
        call(self.rt, self.rt.cudaStreamSynchronize(self.stream))

    def launch(self, key, enqueue: Callable[[], None]) -> None:
        """Run ``enqueue`` (a TensorRT launch) through a CUDA graph captured per ``key``.

        The first launch of a key runs directly: TensorRT settles shape-dependent work on it and must not be
        captured then. The second is captured (thread-local mode, so other threads' CUDA calls cannot break it)
        and every later one replays the graph, skipping TensorRT's per-launch host work. The graph bakes in the
        tensor addresses and shapes, so the key must name them (here: rows and the ping-pong side).
        """
        graph = self.graphs.get(key)
        if graph is None and key not in self.warm:
            enqueue()
            self.warm.add(key)
            return
        if graph is None:
            mode = self.rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
            call(self.rt, self.rt.cudaStreamBeginCapture(self.stream, mode))
            try:
                enqueue()
            finally:
                captured = call(self.rt, self.rt.cudaStreamEndCapture(self.stream))
            graph = call(self.rt, self.rt.cudaGraphInstantiate(captured, 0))
            call(self.rt, self.rt.cudaGraphDestroy(captured))
            self.graphs[key] = graph
        call(self.rt, self.rt.cudaGraphLaunch(graph, self.stream))

    def close(self) -> None:
        self.synchronize()
        for graph in self.graphs.values():
            call(self.rt, self.rt.cudaGraphExecDestroy(graph))
        for pointer in self.device:
            call(self.rt, self.rt.cudaFree(pointer))
        for pointer in self.pinned:
            call(self.rt, self.rt.cudaFreeHost(pointer))
        call(self.rt, self.rt.cudaStreamDestroy(self.stream))
        self.graphs, self.device, self.pinned = {}, [], []

"""A host-memory stand-in for ``tensorrt`` and ``cuda.bindings.runtime``, for tests only.

Its builder records every call edgecap's engine build makes (network flags, builder flags, profile shapes, timing
cache) and writes a plan its runtime can run; its engine inspector reports a layer INT8 when its weights reach it
through a DequantizeLinear in the ONNX file, as TensorRT's does for an explicitly quantised graph it honours
(``FLOAT_ONLY`` makes it report every layer float, as a build that silently dropped INT8 would).

It proves nothing about TensorRT itself; it runs the TensorRT backend's own host logic on a machine without a GPU:
which address each tensor is bound to, the ping-pong of state buffers, the row repeat of ``tile``, the staging of
inputs and outputs, and CUDA-graph capture and replay. "Device" memory is host memory, copies are ``memmove``,
a "plan" names an ONNX file, and an engine runs it with ONNX Runtime reading and writing the bound addresses,
so a wrong address, a missed swap or a stale shape changes the captions. A captured graph keeps the addresses and
shapes bound at capture, as a real CUDA graph does.
"""

from __future__ import annotations

import ctypes
import json
import types
from pathlib import Path

import numpy as np

from edgecap.runtime.backends.ort import FP32_PRESERVING

VERSION = "10.3.0"
GPU = "Simulated GPU"
CAPABILITY = (8, 7)
_ORT_TYPES = {"tensor(float)": np.dtype(np.float32), "tensor(int64)": np.dtype(np.int64)}


class _Cudart:
    def __init__(self):
        self.cudaError_t = types.SimpleNamespace(cudaSuccess=0)
        self.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2,
                                                    cudaMemcpyDeviceToDevice=3)
        self.cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeThreadLocal=1)
        self.buffers: dict[int, ctypes.Array] = {}
        self.capturing: list | None = None  # launches recorded while the (only) stream captures
        self.launches = {"direct": 0, "captured": 0, "replayed": 0}

    def cudaGetDeviceCount(self):
        return 0, 1

    def cudaGetDevice(self):
        return 0, 0

    def cudaGetDeviceProperties(self, device):
        return 0, types.SimpleNamespace(name=GPU.encode(), major=CAPABILITY[0], minor=CAPABILITY[1])

    def cudaGetErrorName(self, err):
        return 0, b"cudaErrorSimulated"

    def cudaStreamCreate(self):
        return 0, 7

    def _alloc(self, nbytes):
        buffer = ctypes.create_string_buffer(nbytes)
        self.buffers[ctypes.addressof(buffer)] = buffer
        return 0, ctypes.addressof(buffer)

    cudaMalloc = cudaMallocHost = _alloc

    def cudaFree(self, pointer):
        del self.buffers[pointer]
        return (0,)

    cudaFreeHost = cudaFree

    def cudaMemcpyAsync(self, dst, src, count, kind, stream):
        ctypes.memmove(dst, src, count)
        return (0,)

    def cudaMemcpy2DAsync(self, dst, dpitch, src, spitch, width, height, kind, stream):
        assert width <= dpitch and width <= spitch
        for row in range(height):
            ctypes.memmove(dst + row * dpitch, src + row * spitch, width)
        return (0,)

    def cudaStreamSynchronize(self, stream):
        return (0,)

    def cudaStreamDestroy(self, stream):
        return (0,)

    def cudaStreamBeginCapture(self, stream, mode):
        assert self.capturing is None
        self.capturing = []
        return (0,)

    def cudaStreamEndCapture(self, stream):
        graph, self.capturing = self.capturing, None
        return 0, graph

    def cudaGraphInstantiate(self, graph, flags):
        return 0, list(graph)

    def cudaGraphDestroy(self, graph):
        return (0,)

    cudaGraphExecDestroy = cudaGraphDestroy

    def cudaGraphLaunch(self, graph, stream):
        for launch in graph:
            launch()
            self.launches["replayed"] += 1
        return (0,)


class _Engine:
    def __init__(self, cudart: _Cudart, plan: dict):
        import onnxruntime as ort

        self.cudart, self.max_rows, self.plan_onnx = cudart, plan["max_rows"], plan["onnx"]
        self.session = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"], **FP32_PRESERVING)
        self.io = {t.name: t for t in [*self.session.get_inputs(), *self.session.get_outputs()]}
        self.inputs = [t.name for t in self.session.get_inputs()]
        self.num_io_tensors = len(self.io)

    def get_tensor_name(self, index):
        return list(self.io)[index]

    def get_tensor_mode(self, name):
        return 0 if name in self.inputs else 1

    def get_tensor_dtype(self, name):
        return _ORT_TYPES[self.io[name].type]

    def get_tensor_shape(self, name):
        return tuple(d if isinstance(d, int) else -1 for d in self.io[name].shape)

    def get_tensor_profile_shape(self, name, profile):
        rest = self.get_tensor_shape(name)[1:]
        return [(1, *rest), (1, *rest), (self.max_rows, *rest)]

    def create_execution_context(self):
        return _Context(self)

    def create_engine_inspector(self):
        return _Inspector(self.plan_onnx)


class _Inspector:
    """Per-layer precisions of a plan, from its ONNX file (``get_engine_information`` in TensorRT's JSON format)."""

    def __init__(self, onnx_file: str):
        self.onnx_file, self.execution_context = onnx_file, None

    def get_engine_information(self, fmt):
        import onnx

        assert self.execution_context is not None, "formats are only shown with an execution context set"
        graph = onnx.load(self.onnx_file, load_external_data=False).graph
        dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
        kinds = {"Conv": "CaskConvolution", "Gemm": "CaskGemm", "MatMul": "MatrixMultiply"}
        layers = [{"Name": n.name, "LayerType": kinds[n.op_type],
                   "Inputs": [{"Name": n.input[0], "Format/Datatype": "Row major linear Int8"
                               if len(n.input) > 1 and n.input[1] in dequantized and not BUILDER.float_only
                               else "Row major linear FP32"}]}
                  for n in graph.node if n.op_type in kinds]
        return json.dumps({"Layers": layers})


class _Builder:
    """Records what edgecap asks of a TensorRT builder; one instance per test (``BUILDER``)."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.float_only = False  # the inspector reports every layer float

    def reset(self):
        self.calls.clear()
        self.float_only = False


BUILDER = _Builder()


class _Network:
    def __init__(self, flags):
        BUILDER.calls.append(("create_network", flags))
        self.inputs: list[str] = []

    @property
    def num_inputs(self):
        return len(self.inputs)

    def get_input(self, index):
        return types.SimpleNamespace(name=self.inputs[index])


class _Parser:
    def __init__(self, network, logger):
        self.network, self.errors = network, []

    def parse_from_file(self, path):
        import onnx

        model = onnx.load(path, load_external_data=False)
        constants = {i.name for i in model.graph.initializer}
        self.network.inputs = [i.name for i in model.graph.input if i.name not in constants]
        self.network.onnx = path
        BUILDER.calls.append(("parse", Path(path).name))
        return True

    @property
    def num_errors(self):
        return len(self.errors)


class _Config:
    def __init__(self):
        self.profiles, self.cleared, self.profiling_verbosity, self.cache = [], [], None, None

    def clear_flag(self, flag):
        self.cleared.append(flag)

    def create_timing_cache(self, data):
        return types.SimpleNamespace(data=bytes(data), serialize=lambda: bytes(data) + b"+timings")

    def set_timing_cache(self, cache, ignore_mismatch):
        self.cache = cache
        BUILDER.calls.append(("timing_cache", cache.data))
        return True

    def get_timing_cache(self):
        return self.cache

    def add_optimization_profile(self, profile):
        self.profiles.append(profile)


class _TrtBuilder:
    def __init__(self, logger):
        pass

    def create_network(self, flags):
        return _Network(flags)

    def create_builder_config(self):
        return _Config()

    def create_optimization_profile(self):
        return _Profile()

    def build_serialized_network(self, network, config):
        [profile] = config.profiles
        BUILDER.calls.append(("build", Path(network.onnx).name, tuple(config.cleared), config.profiling_verbosity))
        maximum = max(high[0] for _, _, high in profile.shapes.values())
        return json.dumps({"onnx": network.onnx, "max_rows": maximum}).encode()


class _Profile:
    def __init__(self):
        self.shapes: dict[str, tuple] = {}

    def set_shape(self, name, low, opt, high):
        self.shapes[name] = (tuple(low), tuple(opt), tuple(high))
        BUILDER.calls.append(("shape", name, *self.shapes[name]))


class _Context:
    def __init__(self, engine: _Engine):
        self.engine, self.shapes, self.addresses = engine, {}, {}

    def set_input_shape(self, name, shape):
        assert shape[0] <= self.engine.max_rows
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, pointer):
        self.addresses[name] = pointer
        return True

    def execute_async_v3(self, stream):
        engine, shapes, addresses = self.engine, dict(self.shapes), dict(self.addresses)  # what a graph bakes in

        def launch():
            feed = {}
            for name in engine.inputs:
                shape = shapes.get(name, engine.get_tensor_shape(name))
                dtype = engine.get_tensor_dtype(name)
                nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                feed[name] = np.frombuffer(ctypes.string_at(addresses[name], nbytes), dtype).reshape(shape)
            names = [n for n in engine.io if n not in engine.inputs]
            for name, value in zip(names, engine.session.run(names, feed), strict=True):
                value = np.ascontiguousarray(value, dtype=engine.get_tensor_dtype(name))
                ctypes.memmove(addresses[name], value.ctypes.data, value.nbytes)

        if engine.cudart.capturing is not None:
            engine.cudart.capturing.append(launch)
            engine.cudart.launches["captured"] += 1
        else:
            launch()
            engine.cudart.launches["direct"] += 1
        return True


def modules() -> dict[str, types.ModuleType]:
    """sys.modules entries that make ``import tensorrt`` and ``from cuda.bindings import runtime`` find these."""
    cudart = _Cudart()
    runtime = types.ModuleType("cuda.bindings.runtime")
    for name in dir(cudart):
        if name.startswith("cuda"):
            setattr(runtime, name, getattr(cudart, name))
    runtime.simulator = cudart
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    trt = types.ModuleType("tensorrt")
    trt.__version__ = VERSION
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, severity=2: None})
    trt.Runtime = type("Runtime", (), {"__init__": lambda self, logger: None,
                                       "deserialize_cuda_engine": lambda self, data: _Engine(cudart, json.loads(data))})
    trt.TensorIOMode = types.SimpleNamespace(INPUT=0, OUTPUT=1)
    trt.nptype = np.dtype
    trt.Builder, trt.OnnxParser = _TrtBuilder, _Parser
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=5)
    trt.BuilderFlag = types.SimpleNamespace(TF32="TF32")
    trt.ProfilingVerbosity = types.SimpleNamespace(DETAILED="DETAILED")
    trt.LayerInformationFormat = types.SimpleNamespace(JSON="JSON")
    BUILDER.reset()
    return {"tensorrt": trt, "cuda": cuda, "cuda.bindings": bindings, "cuda.bindings.runtime": runtime}


def write_plan(path: Path, onnx_file: Path, max_rows: int) -> None:
    """A simulated plan: the ONNX file its engine runs and the most rows its profile accepts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"onnx": str(onnx_file), "max_rows": max_rows}))

"""ONNX Runtime backend: the exported encoder and step graphs behind the search's StepSession.

State tensors come back from each step under their ``.next`` names and are fed
to the next step as they are; the step graph gathers them by ``reorder`` itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap import spec
from edgecap.errors import ModelError
from edgecap.runtime.manifest import Manifest

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}
# Since 1.21, ONNX Runtime's WeightBiasQuantization pass quantises, per tensor and at load time, the float weights of
# every Conv / Gemm that reads a DequantizeLinear output: the very layers an INT8 export keeps fp32 on purpose.
FP32_PRESERVING = {"disabled_optimizers": ["WeightBiasQuantization"]}


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError:
        raise ModelError("onnxruntime is not installed; pip install edgecap[runtime]") from None
    return onnxruntime


def cpu_session(path: Path, *, threads: int = 1):
    """An ONNX Runtime CPU session with ``threads`` intra-op threads and one inter-op thread.

    For the tools that run single graphs directly (export validation, calibration): pinned threads keep their
    timings and results independent of how busy a small machine is.
    """
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=[PROVIDERS["cpu"]], **FP32_PRESERVING)


class OrtStepSession:
    """Memory and state for N rows; implements ``edgecap.runtime.search.StepSession``.

    With IO binding (GPU providers) memory and state live as OrtValues on the device that computed them and only
    the top-k candidates and attention cross to the host; without it they are numpy arrays fed each step.
    """

    def __init__(self, session, manifest: Manifest, encoded: dict[str, np.ndarray], *, binding_device: str | None):
        self.session = session
        self.pairs = manifest.state_pairs
        self.binding_device = binding_device
        self.memory = {n: self._place(v) for n, v in encoded.items() if spec.role_of(n) == spec.ROLE_MEMORY}
        self.state = {n: self._place(v) for n, v in encoded.items() if spec.role_of(n) == spec.ROLE_STATE}

    def _place(self, array: np.ndarray):
        if self.binding_device is None:
            return array
        return import_onnxruntime().OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), self.binding_device, 0)

    @staticmethod
    def _inputs(tokens: np.ndarray, reorder: np.ndarray, position: int) -> dict[str, np.ndarray]:
        return {spec.TOKENS: tokens.astype(np.int64), spec.STEP: np.array(position, dtype=np.int64),
                spec.REORDER: reorder.astype(np.int64)}

    def feed(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> dict[str, np.ndarray]:
        """Every step-graph input of the step ``step(tokens, reorder, position)`` would run, as host arrays.

        For INT8 calibration, which records what the real search feeds the graph; the arrays are the session's own
        (or host copies with IO binding): read them, do not write to them.
        """
        held = {n: self._host(v) for n, v in {**self.state, **self.memory}.items()}
        return {**self._inputs(tokens, reorder, position), **held}

    def _run(self, tokens: np.ndarray, reorder: np.ndarray, position: int, host_outputs: list[str]) -> list:
        inputs = self._inputs(tokens, reorder, position)
        if self.binding_device is None:
            *host, new_state = self._split(self.session.run([*host_outputs, *self.pairs.values()],
                                                            {**inputs, **self.state, **self.memory}), host_outputs)
        else:
            binding = self.session.io_binding()
            for name, value in inputs.items():
                binding.bind_cpu_input(name, value)
            for name, value in {**self.state, **self.memory}.items():
                binding.bind_ortvalue_input(name, value)
            for name in host_outputs:
                binding.bind_output(name, "cpu")
            for name in self.pairs.values():
                binding.bind_output(name, self.binding_device, 0)
            self.session.run_with_iobinding(binding)
            *host, new_state = self._split(binding.get_outputs(), host_outputs)
            host = [value.numpy() for value in host]
        self.state = dict(zip(self.pairs, new_state, strict=True))
        return host

    @staticmethod
    def _split(outputs: list, host_outputs: list[str]) -> list:
        return [*outputs[:len(host_outputs)], outputs[len(host_outputs):]]

    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        topk_logprobs, topk_ids, attention = self._run(tokens, reorder, position,
                                                       [spec.TOPK_LOGPROBS, spec.TOPK_IDS, spec.ATTENTION])
        return topk_logprobs, topk_ids, attention

    def step_logprobs(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> np.ndarray:
        """Full log-probs float32 (N, V) of one step, for parity's teacher-forced check."""
        return self._run(tokens, reorder, position, [spec.LOGPROBS])[0]

    def tile(self, beam_size: int) -> None:
        if beam_size == 1:  # greedy: the encoder's rows already are the search's rows, and a copy costs time
            return
        self.memory, self.state = ({n: self._place(np.repeat(self._host(v), beam_size, axis=0)) for n, v in d.items()}
                                   for d in (self.memory, self.state))

    @staticmethod
    def _host(value) -> np.ndarray:
        return value if isinstance(value, np.ndarray) else value.numpy()


def _check_signature(session, specs, file: Path) -> None:
    """The graph's inputs and outputs are the manifest's, name by name, with the same fixed dimensions: a graph
    that returns fewer candidates or another vocabulary than the manifest says is refused, not searched."""
    graph = {t.name: tuple(t.shape) for t in [*session.get_inputs(), *session.get_outputs()]}
    for tensor in specs:
        shape = graph.get(tensor.name)
        fixed = [(want, got) for want, got in zip(tensor.shape, shape or (), strict=False)
                 if isinstance(want, int) and isinstance(got, int)]  # a symbolic dimension proves nothing
        if shape is None or len(shape) != len(tensor.shape) or any(want != got for want, got in fixed):
            raise ModelError(f"{file}: its {tensor.name} is {shape or 'missing'}, the manifest says {tensor.shape}; "
                             "the graph and the manifest come from different exports: re-run `edgecap export`")


class OrtBackend:
    """Sessions for one precision of an export directory."""

    def __init__(self, directory: Path, manifest: Manifest, *, precision: str = "fp32", device: str = "cpu",
                 threads: int = 1, io_binding: bool | None = None, files: tuple[Path, Path] | None = None):
        """``files`` (encoder, step) runs graphs the manifest does not list, INT8 calibration's trial graphs."""
        if device not in PROVIDERS:
            raise ModelError(f"device {device!r}: ONNX Runtime runs on {', '.join(PROVIDERS)}")
        ort = import_onnxruntime()
        encoder_file, step_file = files or manifest.graph_files(directory, precision)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        providers = [PROVIDERS[device], PROVIDERS["cpu"]] if device != "cpu" else [PROVIDERS["cpu"]]
        if PROVIDERS[device] not in ort.get_available_providers():
            raise ModelError(f"this onnxruntime has no {device} provider (it has {ort.get_available_providers()}); "
                             "install onnxruntime-gpu on a machine with an NVIDIA GPU, or use --device cpu")
        try:
            self.encoder = ort.InferenceSession(str(encoder_file), options, providers=providers, **FP32_PRESERVING)
            self.step = ort.InferenceSession(str(step_file), options, providers=providers, **FP32_PRESERVING)
        except Exception as err:  # onnxruntime raises its own exception types for bad files
            raise ModelError(f"{directory}: ONNX Runtime cannot load the {precision} graphs "
                             f"({str(err).splitlines()[0][:160]}); re-run `edgecap export`") from None
        _check_signature(self.encoder, manifest.encoder_inputs + manifest.encoder_outputs, encoder_file)
        _check_signature(self.step, manifest.step_inputs + manifest.step_outputs, step_file)
        if PROVIDERS[device] not in self.step.get_providers():  # onnxruntime-gpu lists CUDA even without a GPU
            raise ModelError(f"ONNX Runtime has no {device} provider here (active: {self.step.get_providers()}); "
                             "install onnxruntime-gpu on a machine with an NVIDIA GPU, or use --device cpu")
        self.manifest = manifest
        # State stays on the GPU between steps; on the CPU binding buys nothing, so it is opt-in there.
        use_binding = device != "cpu" if io_binding is None else io_binding
        self.binding_device = ("cpu" if device == "cpu" else "cuda") if use_binding else None

    def encode(self, pixels: np.ndarray) -> OrtStepSession:
        """pixels float32 (N, 3, H, W) -> a session holding their memory and initial state."""
        return encode_with(self.encoder, self.step, self.manifest, pixels, binding_device=self.binding_device)


def encode_with(encoder, step, manifest: Manifest, pixels: np.ndarray, *,
                binding_device: str | None = None) -> OrtStepSession:
    """The step session of ``pixels`` (float32 (N, 3, H, W)) for any pair of graphs with ONNX Runtime's
    ``run(output_names, feeds)`` call: ONNX Runtime's sessions, OpenVINO's compiled graphs, Triton's models."""
    names = [t.name for t in manifest.encoder_outputs]
    outputs = encoder.run(names, {spec.PIXELS: pixels.astype(np.float32)})
    return OrtStepSession(step, manifest, dict(zip(names, outputs, strict=True)), binding_device=binding_device)

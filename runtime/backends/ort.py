"""ONNX Runtime backend: the exported encoder and step graphs behind the search's StepSession.

State tensors come back from each step under their ``.next`` names and are fed
to the next step as they are; the step graph gathers them by ``reorder`` itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from edgecap.runtime.manifest import Manifest

from edgecap import spec
from edgecap.errors import ModelError

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider", "tensorrt": "TensorrtExecutionProvider"}


def _import_ort():
    try:
        import onnxruntime
    except ImportError:
        raise ModelError("onnxruntime is not installed; pip install edgecap[runtime]") from None
    return onnxruntime


class OrtStepSession:
    """Memory and state for N rows as numpy arrays; implements ``edgecap.runtime.search.StepSession``."""

    def __init__(self, session, manifest: Manifest, encoded: dict[str, np.ndarray]):
        self.session = session
        self.memory = {n: v for n, v in encoded.items() if spec.role_of(n) == spec.ROLE_MEMORY}
        self.state = {n: v for n, v in encoded.items() if spec.role_of(n) == spec.ROLE_STATE}
        self.pairs = manifest.state_pairs
        self.fetch = [spec.TOPK_LOGPROBS, spec.TOPK_IDS, spec.ATTENTION, *self.pairs.values()]

    def step(self, tokens: np.ndarray, reorder: np.ndarray, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        feed = {spec.TOKENS: tokens.astype(np.int64), spec.STEP: np.array(position, dtype=np.int64),
                spec.REORDER: reorder.astype(np.int64), **self.state, **self.memory}
        topk_logprobs, topk_ids, attention, *new_state = self.session.run(self.fetch, feed)
        self.state = dict(zip(self.pairs, new_state, strict=True))
        return topk_logprobs, topk_ids, attention

    def tile_memory(self, beam_size: int) -> None:
        self.memory = {n: np.repeat(v, beam_size, axis=0) for n, v in self.memory.items()}


class OrtBackend:
    """Sessions for one precision of an export directory."""

    def __init__(self, directory: Path, manifest: Manifest, *, precision: str = "fp32", device: str = "cpu",
                 threads: int = 1):
        ort = _import_ort()
        encoder_file, step_file = manifest.graph_files(directory, precision)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        providers = [PROVIDERS[device], PROVIDERS["cpu"]] if device != "cpu" else [PROVIDERS["cpu"]]
        try:
            self.encoder = ort.InferenceSession(str(encoder_file), options, providers=providers)
            self.step = ort.InferenceSession(str(step_file), options, providers=providers)
        except Exception as err:  # onnxruntime raises its own exception types for bad files
            raise ModelError(f"{directory}: ONNX Runtime cannot load the {precision} graphs "
                             f"({str(err).splitlines()[0][:160]}); re-run `edgecap export`") from None
        if device != "cpu" and PROVIDERS[device] not in self.step.get_providers():
            raise ModelError(f"ONNX Runtime has no {device} provider here (active: {self.step.get_providers()}); "
                             "install onnxruntime-gpu on a machine with an NVIDIA GPU, or use --device cpu")
        self.manifest = manifest
        self.output_names = [t.name for t in manifest.encoder_outputs]

    def encode(self, pixels: np.ndarray) -> OrtStepSession:
        """pixels float32 (N, 3, H, W) -> a session holding their memory and initial state."""
        outputs = self.encoder.run(self.output_names, {spec.PIXELS: pixels.astype(np.float32)})
        return OrtStepSession(self.step, self.manifest, dict(zip(self.output_names, outputs, strict=True)))

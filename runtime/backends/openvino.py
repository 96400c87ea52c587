"""OpenVINO backend: the very ONNX graphs ONNX Runtime runs, compiled by OpenVINO, behind the search's StepSession.

OpenVINO reads an export's ONNX files directly (no conversion step, no second set of files), so its captions can be
compared with ONNX Runtime's graph for graph. Each compiled graph is wrapped in ONNX Runtime's ``run(names, feeds)``
call, and the step session is :class:`OrtStepSession` itself: state and memory stay host arrays, fed each step.
fp32 graphs run with an f32 inference precision hint, so a CPU with bf16 units does not quietly run them in bf16;
INT8 Q/DQ graphs run OpenVINO's own INT8 kernels.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgecap.errors import ModelError
from edgecap.runtime.backends.ort import OrtStepSession, encode_with
from edgecap.runtime.manifest import Manifest

OPENVINO_DEVICES = ("CPU", "GPU", "NPU", "AUTO")


def import_openvino():
    try:
        import openvino
    except ImportError:
        raise ModelError("openvino is not installed; pip install edgecap[openvino]") from None
    return openvino


class _CompiledGraph:
    """One compiled graph with ONNX Runtime's ``run(output_names, feeds) -> list of arrays`` call."""

    def __init__(self, compiled):
        self.request = compiled.create_infer_request()
        self.outputs = {port.get_any_name(): port for port in compiled.outputs}

    def run(self, output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        # share_outputs=False: the search keeps state arrays across calls, so they must not alias the request's
        results = self.request.infer(feeds, share_inputs=False, share_outputs=False)
        return [results[self.outputs[name]] for name in output_names]


class OpenvinoBackend:
    """Compiled encoder and step graphs of one precision of an export directory."""

    def __init__(self, directory: Path, manifest: Manifest, *, precision: str = "fp32", device: str = "CPU",
                 threads: int = 1):
        if device not in OPENVINO_DEVICES:
            raise ModelError(f"OpenVINO device {device!r}: use one of {', '.join(OPENVINO_DEVICES)}")
        ov = import_openvino()
        core = ov.Core()
        if device != "AUTO" and device not in core.available_devices:
            raise ModelError(f"OpenVINO has no {device} device here (it has {', '.join(core.available_devices)}); "
                             "use --device CPU")
        config = {"PERFORMANCE_HINT": "LATENCY"}
        if device == "CPU":
            config["INFERENCE_NUM_THREADS"] = threads
            if precision == "fp32":
                config["INFERENCE_PRECISION_HINT"] = "f32"
        encoder_file, step_file = manifest.graph_files(directory, precision)
        try:
            self.encoder, self.step = (_CompiledGraph(core.compile_model(str(file), device, config))
                                       for file in (encoder_file, step_file))
        except RuntimeError as err:
            raise ModelError(f"{directory}: OpenVINO cannot compile the {precision} graphs "
                             f"({str(err).strip().splitlines()[0][:160]})") from None
        self.manifest = manifest

    def encode(self, pixels: np.ndarray) -> OrtStepSession:
        """pixels float32 (N, 3, H, W) -> a session holding their memory and initial state."""
        return encode_with(self.encoder, self.step, self.manifest, pixels)

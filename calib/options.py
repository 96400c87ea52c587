"""What ``edgecap export --precision int8`` is asked for: the photos, the ranges, the scheme and the search."""

from __future__ import annotations

from dataclasses import dataclass

from edgecap.calib.quantize import SCHEMES
from edgecap.calib.ranges import METHODS
from edgecap.runtime.engines import GRAPHS


@dataclass(frozen=True)
class Int8Options:
    data: str  # dataset spec: its train split gives the calibration photos
    images: int = 200  # calibration photos the ranges come from
    heldout: int = 300  # other photos on which ΔCIDEr against fp32 is measured
    heldout_split: str = "dev"  # the split they come from; parity --precision int8 leaves them out
    method: str = "max"  # range selection: one of METHODS
    max_delta: float = 1.0  # |ΔCIDEr| allowed before the most sensitive layers are kept fp32, one by one
    scheme: str = "tensorrt"  # tensorrt: symmetric, what TensorRT builds; ort-cpu: uint8 activations, fast on x86
    graphs: tuple[str, ...] = GRAPHS  # graphs quantised; one left out joins the int8 set as its fp16 (or fp32) file
    bias_correction: bool = False  # take each layer's mean INT8 error out of its bias after the search
    max_layers: int = 12  # layers the search may keep fp32
    beam: int = 3  # the beam the held-out captions and recorded step trajectories are decoded with
    step_rows: int = 256  # recorded step rows the step's ranges come from
    seed: int = 0  # the photo draw and the step-row sample

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"calibration method {self.method!r}: expected one of {', '.join(METHODS)}")
        if self.scheme not in SCHEMES:
            raise ValueError(f"INT8 scheme {self.scheme!r}: expected one of {', '.join(SCHEMES)}")
        if not self.graphs or set(self.graphs) - set(GRAPHS):
            raise ValueError(f"graphs to quantise {list(self.graphs)!r}: expected one or both of {', '.join(GRAPHS)}")

"""What the search and the reports need from a backend: image pixels in, a step session out.

ONNX Runtime (``ort``), the eager PyTorch reference (``edgecap.torch_backend``,
outside the runtime because it needs torch) and TensorRT engines all fit here,
so parity and bench drive them with the same code.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from edgecap.runtime.search import StepSession


class Backend(Protocol):
    def encode(self, pixels: np.ndarray) -> StepSession:
        """pixels float32 (N, 3, H, W) -> a session holding their memory and initial state for N rows."""

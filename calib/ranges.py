"""INT8 range selection (``max`` / ``entropy`` / ``percentile``) over saved feeds, by onnxruntime's calibrators.

The calibrators run a copy of the graph with every float tensor exposed and reduce what they see to one range
per tensor (``TensorsData``). Feeds go in one batch at a time, so memory stays bounded whatever the number of
images (histograms and min/max are merged batch by batch). Ranges are cached as JSON in onnxruntime's own format
(``save_tensors_data``) under a name that hashes the graph, the feeds and the op types, so a rebuild from the
same files reuses them and a changed graph or feed set can never pick up stale ones.

Only the tensors of the op types being quantised are collected, as ``quantize_static`` itself calibrates: the
other tensors get no Q/DQ, and some hold -inf (a decoder's attention mask), which the histogram methods cannot bin.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

METHODS = ("max", "entropy", "percentile")


def calibration_method(method: str):
    """onnxruntime's ``CalibrationMethod`` for one of :data:`METHODS`."""
    from onnxruntime.quantization import CalibrationMethod

    by_name = {"max": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    if method not in by_name:
        raise ValueError(f"calibration method {method!r}: expected one of {', '.join(METHODS)}")
    return by_name[method]


def cache_path(directory: Path, graph: str, method: str, sources: Sequence[Path],
               op_types: Sequence[str] | None = None) -> Path:
    """``DIR/GRAPH.METHOD.HASH.json``: the hash covers the bytes of ``sources`` (the graph and its feeds) and the
    op types calibrated (``None``: all)."""
    digest = hashlib.sha256(method.encode())
    if op_types:
        digest.update(",".join(op_types).encode())
    for source in sources:
        digest.update(Path(source).read_bytes())
    return directory / f"{graph}.{method}.{digest.hexdigest()[:12]}.json"


class _OneFeed:
    """onnxruntime's CalibrationDataReader protocol over a single feed."""

    def __init__(self, feed: dict[str, np.ndarray]):
        self.feed: dict[str, np.ndarray] | None = feed

    def get_next(self) -> dict[str, np.ndarray] | None:
        feed, self.feed = self.feed, None
        return feed


def compute_ranges(model: Path, feeds: Iterable[dict[str, np.ndarray]], *, method: str = "entropy",
                   op_types: Sequence[str] | None = None, cache: Path | None = None):
    """Per-tensor ranges (``onnxruntime.quantization.TensorsData``) of ``model`` over ``feeds``, for the inputs and
    outputs of ``op_types`` nodes (``None``: every float tensor).

    Loaded from ``cache`` when it exists, else computed and written there. Ranges are the raw ones the method
    selects; the quantizer makes them symmetric.
    """
    from onnxruntime.quantization import create_calibrator, load_tensors_data, save_tensors_data

    if cache is not None and cache.is_file():
        return load_tensors_data(cache)
    with tempfile.TemporaryDirectory(prefix="edgecap-calib-") as tmp:
        calibrator = create_calibrator(Path(model), op_types_to_calibrate=list(op_types) if op_types else None,
                                       augmented_model_path=str(Path(tmp) / "augmented.onnx"),
                                       calibrate_method=calibration_method(method))
        collected = 0
        with contextlib.redirect_stdout(io.StringIO()):  # the histogram calibrators print progress per batch
            for feed in feeds:
                calibrator.collect_data(_OneFeed(feed))
                collected += 1
            if not collected:
                raise ValueError(f"{model}: no calibration feeds to compute ranges from")
            ranges = calibrator.compute_data()
    if cache is not None:
        save_tensors_data(ranges, cache)
        cache.chmod(0o644)  # written through mkstemp (0600); the export directory's files are world-readable
    return ranges

"""``add_int8``: calibrate, quantise, keep the layers INT8 hurts in fp32, and record what it costs and buys.

Order of work: record feeds from real photos (``calib/*.npz``), compute ranges once per graph, write the Q/DQ
graphs (``encoder.int8.onnx``, ``step.int8.onnx``), search for sensitive layers against held-out photos, then
time fp32 against INT8 on ONNX Runtime CPU with one intra-op thread (encoder at batch 1, step at N = 3 rows, one
image's beam). The timing is recorded, not acted on: the ``int8`` entry of the manifest always names the Q/DQ
graphs, so ``edgecap parity --precision int8`` checks the very graphs a TensorRT engine is built from. A graph
left out of INT8 (``quantize``) enters that entry as its fp16 (or fp32) file, and is checked and built as such.

Two schemes, because the targets disagree. ``tensorrt`` (the default; DESIGN.md §7) writes symmetric INT8 that
TensorRT builds, and it is not faster on ONNX Runtime CPU (measured on EfficientNet-Lite0 + SAT, x86 with
AVX-512 VNNI: encoder 0.96x, step 0.82x). Its x86 kernels want uint8 activations; onnxruntime converts int8 Q/DQ
pairs to uint8 only where a quantized tensor has a single consumer, so convs and Gemms at fan-out points
(residual branches, the LSTM's h read by three layers) stay float and dequantize their weights at every run, and
every ReLU6 stays a float Clip between a DequantizeLinear and a QuantizeLinear (symmetric int8 cannot fold a clip
at 0). The ``ort-cpu`` scheme (asymmetric uint8 activations; TensorRT rejects it) folds the clips and fuses every
layer: about 2.2x (encoder) and 1.5x (step) faster there. Quantising only Conv/MatMul/Gemm does not help the
``tensorrt`` scheme and costs accuracy: with Clip among the quantised types onnxruntime gives a conv's output the
range of the ReLU6 after it ([-6, 6]) instead of the raw conv range (up to +-175 here), so the encoder's default
is every op type.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgecap.calib.bias_correction import correct_biases
from edgecap.calib.feeds import CALIB_DIR, load_encoder_feeds, load_step_feeds, record_feeds
from edgecap.calib.quantize import SCHEMES, QdqGraph, always_fp32_rules
from edgecap.calib.ranges import METHODS, cache_path, compute_ranges
from edgecap.calib.sensitivity import CaptionScorer, compare, keep_sensitive_layers
from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError
from edgecap.runtime.backends.ort import cpu_session
from edgecap.runtime.engines import GRAPHS
from edgecap.runtime.manifest import Manifest

# The step quantises only its weighted layers: Gather, TopK, Softmax and the elementwise cell would otherwise put
# the beam's state, the attention output and the log-probs ranked by TopK through int8.
DEFAULT_OP_TYPES: dict[str, tuple[str, ...] | None] = {"encoder": None, "step": ("Gemm", "MatMul")}
TIMING_ROWS = {"encoder": 1, "step": 3}  # batch 1 image; N = 3 step rows: one image's beam of 3
PROXY_FEEDS = 4  # calibration batches the layer-ranking proxy runs
CORRECTION_FEEDS = 8  # calibration batches bias correction measures each layer on


def compare_ms(fp32: Path, int8: Path, feed: dict[str, np.ndarray], *, rounds: int = 5,
               budget_s: float = 0.5) -> tuple[float, float]:
    """Median ms per run of two graphs on one feed, timed in alternating blocks so drift hits both alike."""
    sessions = [cpu_session(fp32), cpu_session(int8)]
    start = time.perf_counter()
    for session in sessions:
        session.run(None, feed)  # warm-up, also sizes the blocks
    per_run = (time.perf_counter() - start) / 2
    runs = max(5, int(budget_s / rounds / max(per_run, 1e-5)))
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for session, out in zip(sessions, times, strict=True):
            for _ in range(runs):
                tick = time.perf_counter()
                session.run(None, feed)
                out.append(time.perf_counter() - tick)
    return float(np.median(times[0]) * 1e3), float(np.median(times[1]) * 1e3)


def _rows(feed: dict[str, np.ndarray], n: int, batched: Sequence[str]) -> dict[str, np.ndarray]:
    out = {name: value[:n] if name in batched else value for name, value in feed.items()}
    if "reorder" in out:
        out["reorder"] = np.arange(n, dtype=np.int64)
    return out


def split_records(records: Sequence[ImageRecord], calibration: int, heldout: int,
                  seed: int) -> tuple[list[ImageRecord], list[ImageRecord]]:
    """Disjoint calibration and held-out records drawn at random (``seed``); shares kept when records are few."""
    if len(records) < 2:
        raise ValueError(f"INT8 calibration needs at least 2 records (calibration + held out), got {len(records)}")
    if calibration + heldout > len(records):
        heldout = max(1, len(records) * heldout // (calibration + heldout))
        calibration = len(records) - heldout
    order = np.random.default_rng(seed).permutation(len(records))
    return [records[i] for i in order[:calibration]], [records[i] for i in order[calibration:calibration + heldout]]


def require_calibration_splits(dataset: CaptionDataset, heldout_split: str) -> None:
    """A DataError naming the fix when ``dataset`` lacks the train split or the held-out split."""
    if not dataset.splits.get("train"):
        raise DataError(f"{dataset.source}: no 'train' split to calibrate INT8 on; pass --calib-data with a "
                        "dataset that has one")
    if not dataset.splits.get(heldout_split):
        raise DataError(f"{dataset.source}: no '{heldout_split}' split for INT8's held-out photos; pass "
                        "--calib-heldout-split with a split the model did not train on, or train (photos the model "
                        "may have learnt: a weaker estimate)")


def calibration_draw(dataset: CaptionDataset, calibration: int, heldout: int, heldout_split: str = "dev",
                     seed: int = 0) -> tuple[list[ImageRecord], list[ImageRecord]]:
    """Calibration photos from the train split and held-out photos from ``heldout_split``, drawn at random.

    Held-out photos from another split than train are what the sensitivity search should see: a captioner has
    learnt its training photos' captions (a Flickr8k SAT scored CIDEr-D 131 on them against 53 on dev), so
    ΔCIDEr measured there says little about the photos a deployed model meets. With ``heldout_split="train"``
    the two draws come from the train split and stay disjoint.
    """
    require_calibration_splits(dataset, heldout_split)
    train = dataset.split("train")
    if heldout_split == "train":
        return split_records(train, calibration, heldout, seed)
    others = dataset.split(heldout_split)
    rng = np.random.default_rng(seed)
    return ([train[i] for i in rng.permutation(len(train))[:calibration]],
            [others[i] for i in rng.permutation(len(others))[:heldout]])


def add_int8(directory: Path, manifest: Manifest, dataset: CaptionDataset, *, method: str = "max",
             threshold: float = 1.0, calibration_images: int = 200, heldout_images: int = 300,
             heldout_split: str = "dev", scheme: str = "tensorrt",
             op_types: Mapping[str, Sequence[str] | None] | None = None,
             max_layers: int = 12, beam_size: int = 3, step_rows: int = 256, seed: int = 0,
             quantize: Sequence[str] = GRAPHS, bias_correction: bool = False, progress: bool = True) -> Manifest:
    """Add INT8 graphs to an export directory holding fp32 graphs; returns the manifest written there.

    ``dataset``'s train split gives ``calibration_images`` photos for ranges, its ``heldout_split`` gives
    ``heldout_images`` for ΔCIDEr (``calibration_draw``). ``method``: max / entropy / percentile. ``threshold``:
    |ΔCIDEr| (0-100 scale) allowed before layers are kept fp32, at most ``max_layers`` of them. ``scheme``:
    ``tensorrt`` (symmetric, zero point 0) or ``ort-cpu``.
    ``quantize``: the graphs made INT8; a graph left out enters the ``int8`` set as its fp16 file when the export
    has one (the precision TensorRT would otherwise build it at), else as its fp32 file; an INT8 step alone kept
    the widest margin on every Flickr8k model measured. ``bias_correction``: after the search,
    correct the biases of the graphs as written (:mod:`edgecap.calib.bias_correction`) and score them again.
    """
    if method not in METHODS:
        raise ValueError(f"calibration method {method!r}: expected one of {', '.join(METHODS)}")
    if scheme not in SCHEMES:
        raise ValueError(f"INT8 scheme {scheme!r}: expected one of {', '.join(SCHEMES)}")
    if not quantize or set(quantize) - set(GRAPHS):
        raise ValueError(f"graphs to quantise {list(quantize)!r}: expected one or both of {', '.join(GRAPHS)}")
    began = time.perf_counter()
    calibration, heldout = calibration_draw(dataset, calibration_images, heldout_images, heldout_split, seed)
    encoder_npz, step_npz = record_feeds(directory, manifest, calibration, beam_size=beam_size, max_rows=step_rows,
                                         seed=seed, progress=progress)
    feeds = {"encoder": load_encoder_feeds(encoder_npz), "step": load_step_feeds(step_npz)}
    sources = dict(zip(GRAPHS, manifest.graph_files(directory, "fp32"), strict=True))
    stand_in = dict(zip(GRAPHS, manifest.graph_files(directory, "fp16" if "fp16" in manifest.graphs else "fp32"),
                        strict=True))
    fixed = {name: stand_in[name] for name in GRAPHS if name not in quantize}
    chosen_ops = {**DEFAULT_OP_TYPES, **(op_types or {})}
    graphs, fp32_rules = {}, {}
    for name, npz in (("encoder", encoder_npz), ("step", step_npz)):
        if name in fixed:
            continue
        ops = tuple(chosen_ops[name]) if chosen_ops[name] else None
        cache = cache_path(directory / CALIB_DIR, name, method, [sources[name], npz], ops)
        ranges = compute_ranges(sources[name], feeds[name], method=method, op_types=ops, cache=cache)
        fp32_rules[name] = always_fp32_rules(sources[name], ops)
        graphs[name] = QdqGraph(name, sources[name], directory / f"{name}.int8.onnx", ranges, ops, scheme,
                                tuple(layer for layers in fp32_rules[name].values() for layer in layers))
    scorer = CaptionScorer(directory, manifest, heldout, beam_size=beam_size)
    proxy = {name: f[::max(1, len(f) // PROXY_FEEDS)][:PROXY_FEEDS] for name, f in feeds.items()}  # spread out
    found = keep_sensitive_layers(graphs, scorer, proxy, fixed=fixed,
                                  threshold=threshold, max_layers=max_layers, progress=progress)
    int8_scores, corrections = found.int8_scores, {}
    if bias_correction:
        with tempfile.TemporaryDirectory(prefix="edgecap-bias-") as tmp:
            for name, graph in graphs.items():
                sample = feeds[name][::max(1, len(feeds[name]) // CORRECTION_FEEDS)][:CORRECTION_FEEDS]
                correct_biases(graph, sample, Path(tmp) / f"{name}.onnx", exclude=found.kept_fp32[name],
                               progress=progress).write(found.kept_fp32[name])
        files = {**fixed, **{name: graph.target for name, graph in graphs.items()}}
        int8_scores = scorer.scores(files["encoder"], files["step"])
        corrections = {"delta_cider_before_bias_correction": round(compare(found.fp32_scores, found.int8_scores)[0], 3)}

    delta, stderr = compare(found.fp32_scores, int8_scores)
    quantization = {
        "scheme": scheme, "method": method, "calibration_images": len(calibration), "delta_cider": round(delta, 3),
        "delta_cider_se": round(stderr, 3), "heldout_images": len(heldout), "heldout_split": heldout_split,
        "calibration_data": dataset.name, "heldout_image_ids": sorted(r.image_id for r in heldout),
        "step_rows": sum(len(feed["tokens"]) for feed in feeds["step"]),
        "fp32_cider": round(float(found.fp32_scores.mean()), 3),
        "int8_cider": round(float(int8_scores.mean()), 3), "bias_correction": bias_correction, **corrections,
        "all_int8_delta_cider": round(compare(found.fp32_scores, found.all_int8_scores)[0], 3),
        "threshold": threshold, "threshold_met": abs(delta) <= threshold if bias_correction else found.threshold_met,
        "layers_tried": found.layers_tried,
        "build_s": round(time.perf_counter() - began, 1),
    }
    batched = {"encoder": ["pixels"], "step": [n for n in feeds["step"][0] if n != "step"]}
    for name, graph in graphs.items():
        feed = _rows(feeds[name][0], TIMING_ROWS[name], batched[name])
        fp32_ms, int8_ms = compare_ms(graph.source, graph.target, feed)
        quantization[name] = {
            "file": graph.target.name, "quantized": True,
            "ort_cpu_fp32_ms": round(fp32_ms, 4), "ort_cpu_int8_ms": round(int8_ms, 4),
            "ort_cpu_speedup": round(fp32_ms / int8_ms, 3),
            "op_types": list(graph.op_types) if graph.op_types else "all", "kept_fp32": found.kept_fp32[name],
            **fp32_rules[name],
        }
    for name, path in fixed.items():
        quantization[name] = {"file": path.name, "quantized": False}
    files = {name: quantization[name]["file"] for name in GRAPHS}
    updated = replace(manifest, graphs={**manifest.graphs, "int8": files}, quantization=quantization)
    updated.write(directory)
    return updated

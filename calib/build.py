"""``add_int8``: the stages of INT8 export, from real photos to Q/DQ graphs and a typed report of what they cost.

Stages, in order: draw calibration and held-out photos; record the feeds the fp32 graphs really see
(``calib/*.npz``); compute ranges once per graph and write the Q/DQ graphs (``encoder.int8.onnx``,
``step.int8.onnx``); keep the layers whose INT8 costs captions in fp32 until ΔCIDEr on the held-out photos is
within the threshold; optionally correct the biases; count what runs INT8; time fp32 against INT8 on ONNX Runtime
CPU. The ``int8`` entry of the manifest always names the Q/DQ graphs, so ``edgecap parity --precision int8``
checks the very graphs a TensorRT engine is built from. A graph left out of INT8 enters that entry as its fp16 (or
fp32) file, and is checked and built as such.

Two schemes, because the targets disagree. ``tensorrt`` (the default) writes symmetric INT8 that TensorRT builds,
and it is not faster on ONNX Runtime CPU: x86 kernels want uint8 activations, onnxruntime converts int8 Q/DQ pairs
to uint8 only where a quantized tensor has a single consumer, so convs and Gemms at fan-out points (residual
branches, the LSTM's h read by three layers) stay float, and every ReLU6 stays a float Clip between a
DequantizeLinear and a QuantizeLinear (symmetric int8 cannot fold a clip at 0). The ``ort-cpu`` scheme (asymmetric
uint8 activations; TensorRT rejects it) folds the clips and fuses every layer. The encoder quantises every op type:
with Clip among the quantised types onnxruntime gives a conv's output the range of the ReLU6 after it instead of the
raw conv range, which quantising only Conv/MatMul/Gemm would lose.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgecap.calib.bias_correction import correct_biases
from edgecap.calib.feeds import CALIB_DIR, load_encoder_feeds, load_step_feeds, record_feeds
from edgecap.calib.options import Int8Options
from edgecap.calib.quantize import QdqGraph, always_fp32_rules, layer_counts
from edgecap.calib.ranges import cache_path, compute_ranges
from edgecap.calib.sensitivity import CaptionScorer, Sensitivity, compare, keep_sensitive_layers
from edgecap.data.records import CaptionDataset, ImageRecord
from edgecap.errors import DataError
from edgecap.runtime.backends.ort import cpu_session
from edgecap.runtime.engines import GRAPHS
from edgecap.runtime.manifest import GraphInt8, Int8Report, Manifest, file_sha256
from edgecap.verdict import judge

# The step quantises only its weighted layers: Gather, TopK, Softmax and the elementwise cell would otherwise put
# the beam's state, the attention output and the log-probs ranked by TopK through int8.
OP_TYPES: dict[str, tuple[str, ...] | None] = {"encoder": None, "step": ("Gemm", "MatMul")}
TIMING_ROWS = {"encoder": 1, "step": 3}  # batch 1 image; N = 3 step rows: one image's beam of 3
PROXY_FEEDS = 4  # calibration batches the layer-ranking proxy runs
CORRECTION_FEEDS = 8  # calibration batches bias correction measures each layer on

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


# -- stage 1: photos --------------------------------------------------------------------------------------------

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


def calibration_draw(dataset: CaptionDataset, options: Int8Options) -> tuple[list[ImageRecord], list[ImageRecord]]:
    """Calibration photos from the train split and held-out photos from ``options.heldout_split``, at random.

    Held-out photos from another split than train are what the sensitivity search should see: a captioner has
    learnt its training photos' captions, so ΔCIDEr measured there says little about the photos a deployed model
    meets. With ``heldout_split="train"`` the two draws come from the train split and stay disjoint.
    """
    require_calibration_splits(dataset, options.heldout_split)
    train = dataset.split("train")
    if options.heldout_split == "train":
        return split_records(train, options.images, options.heldout, options.seed)
    others = dataset.split(options.heldout_split)
    rng = np.random.default_rng(options.seed)
    return ([train[i] for i in rng.permutation(len(train))[:options.images]],
            [others[i] for i in rng.permutation(len(others))[:options.heldout]])


# -- stage 2: ranges and Q/DQ recipes ----------------------------------------------------------------------------

def qdq_recipes(directory: Path, manifest: Manifest, feeds: dict[str, list], npz: dict[str, Path],
                options: Int8Options) -> dict[str, QdqGraph]:
    """One Q/DQ recipe per quantised graph: ranges computed once (cached in ``calib/``) and the always-fp32 rules."""
    sources = dict(zip(GRAPHS, manifest.graph_files(directory, "fp32"), strict=True))
    recipes = {}
    for name in options.graphs:
        ops = OP_TYPES[name]
        cache = cache_path(directory / CALIB_DIR, name, options.method, [sources[name], npz[name]], ops)
        ranges = compute_ranges(sources[name], feeds[name], method=options.method, op_types=ops, cache=cache)
        rules = always_fp32_rules(sources[name], ops)
        recipes[name] = QdqGraph(name, sources[name], directory / f"{name}.int8.onnx", ranges, ops, options.scheme,
                                 rules)
    return recipes


# -- stage 4: bias correction -------------------------------------------------------------------------------------

def corrected(recipes: dict[str, QdqGraph], feeds: dict[str, list], found: Sensitivity, scorer: CaptionScorer,
              stand_ins: dict[str, Path], say: Say) -> np.ndarray:
    """Rewrite each Q/DQ graph from a bias-corrected source and score the int8 set again; the new scores."""
    with tempfile.TemporaryDirectory(prefix="edgecap-bias-") as tmp:
        for name, recipe in recipes.items():
            say(f"int8: correcting the {name}'s biases layer by layer")
            sample = feeds[name][::max(1, len(feeds[name]) // CORRECTION_FEEDS)][:CORRECTION_FEEDS]
            correct_biases(recipe, sample, Path(tmp) / f"{name}.onnx",
                           exclude=found.kept_fp32[name]).write(found.kept_fp32[name])
    files = {**stand_ins, **{name: recipe.target for name, recipe in recipes.items()}}
    say("int8: scoring the corrected graphs on the held-out photos")
    return scorer.scores(files["encoder"], files["step"])


# -- stage 5: what runs INT8, and how fast --------------------------------------------------------------------------

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


def graph_report(recipe: QdqGraph, feed: dict[str, np.ndarray], kept_fp32: Sequence[str]) -> GraphInt8:
    """The layers of a written Q/DQ graph that run INT8, and its speed against fp32 on one intra-op thread."""
    batched = ["pixels"] if recipe.name == "encoder" else [n for n in feed if n != "step"]
    fp32_ms, int8_ms = compare_ms(recipe.source, recipe.target, _rows(feed, TIMING_ROWS[recipe.name], batched))
    layers, int8_layers, qdq_nodes = layer_counts(recipe.target)
    return GraphInt8(file=recipe.target.name, quantized=True, layers=layers, int8_layers=int8_layers,
                     qdq_nodes=qdq_nodes, kept_fp32=tuple(kept_fp32),
                     discrete_choice_fp32=tuple(recipe.rules["discrete_choice_fp32"]),
                     activation_matmuls_fp32=tuple(recipe.rules["activation_matmuls_fp32"]),
                     op_types=recipe.op_types or (), ort_cpu_fp32_ms=round(fp32_ms, 4),
                     ort_cpu_int8_ms=round(int8_ms, 4))


@dataclass(frozen=True)
class _Scored:
    """The search's outcome, with the final int8 scores (bias-corrected when asked)."""

    found: Sensitivity
    int8_scores: np.ndarray


def _report(options: Int8Options, dataset: CaptionDataset, calibration: list, heldout: list, feeds: dict,
            npz: dict[str, Path], scored: _Scored, graphs: dict[str, GraphInt8], began: float) -> Int8Report:
    found = scored.found
    delta, stderr = compare(found.fp32_scores, scored.int8_scores)
    _, ci95, verdict = judge(found.fp32_scores, scored.int8_scores, options.max_delta)
    before = round(compare(found.fp32_scores, found.int8_scores)[0], 3) if options.bias_correction else None
    return Int8Report(
        scheme=options.scheme, method=options.method, calibration_data=dataset.name,
        calibration_images=len(calibration), heldout_split=options.heldout_split,
        heldout_image_ids=tuple(sorted(r.image_id for r in heldout)),
        step_rows=sum(len(feed["tokens"]) for feed in feeds["step"]),
        fp32_cider=round(float(found.fp32_scores.mean()), 3), int8_cider=round(float(scored.int8_scores.mean()), 3),
        delta_cider=round(delta, 3), delta_cider_se=round(stderr, 3),
        all_int8_delta_cider=round(compare(found.fp32_scores, found.all_int8_scores)[0], 3),
        threshold=options.max_delta,
        threshold_met=verdict.outcome == "pass", verdict=verdict.outcome, photos_to_decide=verdict.photos_to_decide,
        delta_cider_ci95=(round(ci95[0], 3), round(ci95[1], 3)),
        layers_tried=found.layers_tried, bias_correction=options.bias_correction,
        delta_cider_before_bias_correction=before, build_s=round(time.perf_counter() - began, 1),
        encoder=graphs["encoder"], step=graphs["step"],
        calibration_files={f"{CALIB_DIR}/{path.name}": file_sha256(path) for path in npz.values()})


def add_int8(directory: Path, manifest: Manifest, dataset: CaptionDataset, options: Int8Options, *,
             say: Say = _quiet, progress: bool = True) -> Manifest:
    """Add INT8 graphs to an export directory holding fp32 graphs; returns the manifest written there.

    ``say`` hears one line as each stage starts; ``progress`` shows the bars of the long ones.
    """
    began = time.perf_counter()
    calibration, heldout = calibration_draw(dataset, options)
    say(f"int8: recording what the fp32 graphs see on {len(calibration)} {dataset.name} training photos")
    npz = dict(zip(GRAPHS, record_feeds(directory, manifest, calibration, beam_size=options.beam,
                                        max_rows=options.step_rows, seed=options.seed, progress=progress),
                   strict=True))
    feeds = {"encoder": load_encoder_feeds(npz["encoder"]), "step": load_step_feeds(npz["step"])}
    say(f"int8: {options.method} ranges and {options.scheme} Q/DQ graphs of the {' and '.join(options.graphs)}")
    recipes = qdq_recipes(directory, manifest, feeds, npz, options)
    stand_in = "fp16" if "fp16" in manifest.graphs else "fp32"
    stand_in_files = dict(zip(GRAPHS, manifest.graph_files(directory, stand_in), strict=True))
    stand_ins = {name: file for name, file in stand_in_files.items() if name not in recipes}
    say(f"int8: ΔCIDEr against fp32 on {len(heldout)} held-out {options.heldout_split} photos; layers stay fp32 "
        f"until its 95% interval clears -{options.max_delta}")
    scorer = CaptionScorer(directory, manifest, heldout, beam_size=options.beam, progress=progress)
    proxy = {name: f[::max(1, len(f) // PROXY_FEEDS)][:PROXY_FEEDS] for name, f in feeds.items()}  # spread out
    found = keep_sensitive_layers(recipes, scorer, proxy, fixed=stand_ins, threshold=options.max_delta,
                                  max_layers=options.max_layers, progress=progress)
    scores = corrected(recipes, feeds, found, scorer, stand_ins, say) if options.bias_correction else found.int8_scores
    say("int8: counting the layers that run INT8 and timing them against fp32 on ONNX Runtime CPU")
    graphs = {name: graph_report(recipe, feeds[name][0], found.kept_fp32[name]) for name, recipe in recipes.items()}
    graphs |= {name: GraphInt8(file=path.name, quantized=False) for name, path in stand_ins.items()}
    report = _report(options, dataset, calibration, heldout, feeds, npz, _Scored(found, scores), graphs, began)
    if report.verdict == "fail":  # an INT8 set the gate would fail is not written; the report says why
        for name in recipes:
            (directory / graphs[name].file).unlink(missing_ok=True)
        return replace(manifest, quantization=report).write(directory)
    files = {name: graphs[name].file for name in GRAPHS}
    return replace(manifest, graphs={**manifest.graphs, "int8": files}, quantization=report).write(directory)

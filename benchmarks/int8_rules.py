"""What each always-fp32 rule of an INT8 export buys: its INT8 graphs written again with the discrete-choice
layers, the MatMuls between two activations, or both quantised too, each scored against fp32 on the export's own
held-out calibration photos (the same draw as ``export``).

Every row rewrites each graph the export quantised from its recorded calibration feeds (``calib/*.npz``) and
ranges (cached beside them), keeping fp32 the layers the export's search kept and the rules' layers not dropped.
Where a graph has integer outputs (GLIED's encoder: the attribute words TopK chooses), a row also says on how many
photos the INT8 graph chose the same set as fp32.

Usage: python benchmarks/int8_rules.py EXPORT_DIR --data SPEC [--images 100]
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
from edgecap.calib.build import heldout_records
from edgecap.calib.feeds import CALIB_DIR, ENCODER_FEEDS, STEP_FEEDS, load_encoder_feeds, load_step_feeds
from edgecap.calib.quantize import QdqGraph
from edgecap.calib.ranges import cache_path, compute_ranges
from edgecap.calib.sensitivity import CaptionScorer, compare
from edgecap.runtime.backends.ort import cpu_session
from edgecap.runtime.engines import GRAPHS
from edgecap.runtime.manifest import Manifest

from edgecap import spec
from edgecap.data import load_dataset

RULES = ("discrete_choice_fp32", "activation_matmuls_fp32")
ROWS = {"as exported (both rules)": (), "discrete-choice layers INT8": ("discrete_choice_fp32",),
        "activation MatMuls INT8": ("activation_matmuls_fp32",), "neither rule": RULES}
FEEDS = {"encoder": (ENCODER_FEEDS, load_encoder_feeds), "step": (STEP_FEEDS, load_step_feeds)}


def recipes(export: Path, manifest: Manifest, target: Path) -> dict[str, QdqGraph]:
    """The Q/DQ recipe of each graph the export quantised, writing into ``target``, ranges read from the cache."""
    q = manifest.quantization
    sources = dict(zip(GRAPHS, manifest.graph_files(export, "fp32"), strict=True))
    out = {}
    for name in GRAPHS:
        if not q[name]["quantized"]:
            continue
        ops = None if q[name]["op_types"] == "all" else tuple(q[name]["op_types"])
        feeds_name, load = FEEDS[name]
        npz = export / CALIB_DIR / feeds_name
        cache = cache_path(export / CALIB_DIR, name, q["method"], [sources[name], npz], ops)
        ranges = compute_ranges(sources[name], load(npz), method=q["method"], op_types=ops, cache=cache)
        out[name] = QdqGraph(name, sources[name], target / f"{name}.int8.onnx", ranges, ops, q["scheme"])
    return out


def integer_outputs(path: Path, pixels: np.ndarray) -> list[np.ndarray]:
    """Each integer output of the encoder at ``path`` over ``pixels``, sorted along its last axis (a set per row)."""
    session = cpu_session(path)
    outputs = [session.run(None, {spec.PIXELS: pixels[i:i + 16]}) for i in range(0, len(pixels), 16)]
    return [np.sort(np.concatenate(o), axis=-1) for o in zip(*outputs, strict=True)
            if np.issubdtype(o[0].dtype, np.integer)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="an export with INT8 graphs (it holds the calibration feeds)")
    parser.add_argument("--data", required=True, help="the dataset spec the export was calibrated on")
    parser.add_argument("--images", type=int, default=100, help="held-out photos to caption (of the export's 300)")
    args = parser.parse_args()

    manifest = Manifest.read(args.export)
    q = manifest.quantization
    heldout = heldout_records(manifest, load_dataset(args.data))
    scorer = CaptionScorer(args.export, manifest, heldout[:args.images])
    fp32 = manifest.graph_files(args.export, "fp32")
    baseline = scorer.scores(*fp32)
    chosen = integer_outputs(fp32[0], scorer.pixels)
    print(f"{args.export.name}: fp32 CIDEr-D {baseline.mean():.2f} on {len(baseline)} held-out photos")
    with tempfile.TemporaryDirectory(prefix="edgecap-rules-") as tmp:
        graphs = recipes(args.export, manifest, Path(tmp))
        for row, dropped in ROWS.items():
            files = dict(zip(GRAPHS, manifest.graph_files(args.export, "int8"), strict=True))
            for name, graph in graphs.items():
                kept = [*q[name]["kept_fp32"], *(n for rule in RULES if rule not in dropped for n in q[name][rule])]
                files[name] = graph.write(kept)
            delta, stderr = compare(baseline, scorer.scores(files["encoder"], files["step"]))
            same = ""
            if chosen and "encoder" in graphs:
                equal = np.all([np.all(a == b, axis=tuple(range(1, a.ndim)))
                                for a, b in zip(integer_outputs(files["encoder"], scorer.pixels), chosen,
                                                strict=True)], axis=0)
                same = f", integer outputs as fp32 on {100 * equal.mean():.0f}% of photos"
            layers = {name: sum(len(q[name][rule]) for rule in dropped) for name in graphs}
            print(f"  {row}: ΔCIDEr {delta:+.2f} ± {stderr:.2f}{same} (layers made INT8: {layers})")


if __name__ == "__main__":
    main()

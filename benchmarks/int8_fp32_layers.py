"""Do the layers an INT8 encoder keeps fp32 run in fp32? Output error of Q/DQ encoders with layers kept fp32, run
by a default ONNX Runtime session and by edgecap's sessions (its WeightBiasQuantization pass off).

Each row quantises the export's fp32 encoder with the export's calibration ranges (``calib/encoder.npz``, method
and scheme from its manifest), keeping the named layers fp32, and reports the relative L2 error of every encoder
output against fp32 on held-out photos. Keeping a layer fp32 can only remove INT8 noise; where a row's error rises
above the all-INT8 row's, the runtime quantised that layer anyway. The last row corrects the all-INT8 graph's
biases as ``--calib-bias-correction`` does (minutes: one quantisation per layer).

Usage: python benchmarks/int8_fp32_layers.py EXPORT_DIR --data SPEC [--images 32] [--layers 3]
"""

import argparse
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort
from edgecap.calib.bias_correction import correct_biases
from edgecap.calib.build import CORRECTION_FEEDS, heldout_records
from edgecap.calib.feeds import CALIB_DIR, ENCODER_FEEDS, load_encoder_feeds
from edgecap.calib.quantize import QdqGraph, quantizable_layers, write_qdq
from edgecap.calib.ranges import cache_path, compute_ranges
from edgecap.runtime.backends.ort import cpu_session
from edgecap.runtime.manifest import Manifest

from edgecap import spec
from edgecap.data import load_dataset
from edgecap.preprocess import Preprocessing, load_images


def default_session(path: Path):
    """ONNX Runtime as a user gets it: every load-time graph pass on, one intra-op thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def weight_names(model: Path) -> dict[str, str]:
    """Node name -> the name of its weight initializer, which says which layer of the model it is."""
    import onnx

    return {n.name: n.input[1] for n in onnx.load(str(model), load_external_data=False).graph.node if len(n.input) > 1}


def mean_errors(path: Path, pixels: np.ndarray, reference: dict[str, np.ndarray]) -> tuple[float, float]:
    """Mean relative L2 error of the graph at ``path``'s outputs named in ``reference``: a default session's, then
    edgecap's."""
    errors = []
    for session in (default_session(path), cpu_session(path)):
        outputs = session.run(list(reference), {spec.PIXELS: pixels})
        errors.append(float(np.mean([np.linalg.norm(o - r) / np.linalg.norm(r)
                                     for o, r in zip(outputs, reference.values(), strict=True)])))
    return errors[0], errors[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", type=Path, help="an export with INT8 graphs (it holds the calibration feeds)")
    parser.add_argument("--data", required=True, help="the dataset spec the export was calibrated on")
    parser.add_argument("--images", type=int, default=32, help="held-out photos the outputs are compared on")
    parser.add_argument("--layers", type=int, default=3, help="the first N weighted layers, each kept fp32 alone")
    args = parser.parse_args()

    manifest = Manifest.read(args.export)
    q = manifest.quantization
    source = manifest.graph_files(args.export, "fp32")[0]
    feeds_file = args.export / CALIB_DIR / ENCODER_FEEDS
    feeds = load_encoder_feeds(feeds_file)
    ranges = compute_ranges(source, feeds, method=q["method"],
                            cache=cache_path(args.export / CALIB_DIR, "encoder", q["method"], [source, feeds_file]))
    heldout = heldout_records(manifest, load_dataset(args.data))
    pixels = load_images([r.path for r in heldout[:args.images]], Preprocessing.from_json(manifest.preprocessing))
    fp32 = cpu_session(source)
    names = [o.name for o in fp32.get_outputs()]
    # Float outputs with something in them: integer ones (GLIED's attribute ids) and a Transformer's empty
    # initial KV cache have no relative error.
    reference = {n: r for n, r in zip(names, fp32.run(None, {spec.PIXELS: pixels}), strict=True)
                 if np.issubdtype(r.dtype, np.floating) and np.any(r)}

    layers = quantizable_layers(source)[:args.layers]
    weights = weight_names(source)
    rows = {"none (every layer INT8)": [], **{f"`{weights[layer]}`": [layer] for layer in layers},
            f"all {len(layers)} above": layers}
    print(f"{args.export.name}: encoder, {q['scheme']} scheme, {q['method']} ranges, {len(pixels)} held-out "
          f"photos; mean relative L2 error over {', '.join(reference)}\n")
    print("| kept fp32 | default ONNX Runtime session | edgecap session |\n|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "encoder.int8.onnx"
        for label, exclude in rows.items():
            write_qdq(source, target, ranges, exclude=exclude, scheme=q["scheme"])
            print("| {} | {:.3f} | {:.3f} |".format(label, *mean_errors(target, pixels, reference)), flush=True)
        graph = QdqGraph("encoder", source, target, ranges, scheme=q["scheme"])
        sample = feeds[::max(1, len(feeds) // CORRECTION_FEEDS)][:CORRECTION_FEEDS]
        correct_biases(graph, sample, Path(tmp) / "corrected.onnx").write()
        print("| none, biases corrected (`--calib-bias-correction`) | {:.3f} | {:.3f} |".format(
            *mean_errors(target, pixels, reference)))


if __name__ == "__main__":
    main()

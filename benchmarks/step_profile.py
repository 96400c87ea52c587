"""Where one decoder step's time goes: ONNX Runtime's own profile of an export's step graph, node by node.

The bench puts the step against its memory floor (weight bytes over copy bandwidth); this says which nodes keep it
from that floor, and how fast each weight-reading node streams its weights. One thread, the rows of one beam search
(``--rows``, batch x beam), real encoder outputs of the sample photos as memory and state.

    python benchmarks/step_profile.py EXPORT_DIR [--precision fp32] [--rows 3] [--runs 500] [--top 10]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from edgecap import spec
from edgecap.preprocess import SAMPLE_IMAGES, Preprocessing, load_images
from edgecap.runtime.manifest import Manifest


def weight_bytes_by_node(path: Path) -> dict[str, int]:
    """Bytes of the constant weights each node reads (through a Cast too), by node name."""
    model = onnx.load(str(path))
    sizes = {t.name: numpy_helper.to_array(t).nbytes for t in model.graph.initializer}
    for node in model.graph.node:  # a compactly stored weight is read at the type it is cast to; an INT8 one as int8
        if node.op_type in ("Cast", "DequantizeLinear") and node.input[0] in sizes:
            sizes[node.output[0]] = sizes[node.input[0]] * (2 if node.op_type == "Cast" else 1)
    return {node.name: sum(sizes.get(name, 0) for name in node.input) for node in model.graph.node}


def step_feeds(directory: Path, manifest: Manifest, precision: str, rows: int) -> dict[str, np.ndarray]:
    encoder_file, _ = manifest.graph_files(directory, precision)
    encoder = ort.InferenceSession(str(encoder_file), providers=["CPUExecutionProvider"])
    photos = sorted(SAMPLE_IMAGES.glob("*.jpg"))
    pixels = load_images([photos[i % len(photos)] for i in range(rows)],
                         Preprocessing.from_json(manifest.preprocessing))
    encoded = dict(zip([o.name for o in encoder.get_outputs()], encoder.run(None, {spec.PIXELS: pixels}),
                       strict=True))
    fixed = {spec.TOKENS: np.full(rows, 4, np.int64), spec.STEP: np.array(2, np.int64),
             spec.REORDER: np.arange(rows, dtype=np.int64)}
    return {t.name: fixed[t.name] if t.name in fixed else encoded[t.name] for t in manifest.step_inputs}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", type=Path)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--rows", type=int, default=3, help="step rows: batch x beam (3: one photo, beam 3)")
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    manifest = Manifest.read(args.export)
    _, step_file = manifest.graph_files(args.export, args.precision)
    feeds = step_feeds(args.export, manifest, args.precision, args.rows)
    fetches = [spec.TOPK_LOGPROBS, spec.TOPK_IDS, *manifest.state_pairs.values()]
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    plain = ort.InferenceSession(str(step_file), options, providers=["CPUExecutionProvider"])
    with tempfile.TemporaryDirectory() as folder:
        options.enable_profiling, options.profile_file_prefix = True, str(Path(folder) / "step")
        session = ort.InferenceSession(str(step_file), options, providers=["CPUExecutionProvider"])
        unprofiled = []
        for _ in range(args.runs):  # the two sessions take turns, so both see the same machine
            session.run(fetches, feeds)
            start = time.perf_counter()
            plain.run(fetches, feeds)
            unprofiled.append(time.perf_counter() - start)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e["dur"] for e in events if e.get("name") == "model_run"][-args.runs:]
    kernels: dict[tuple[str, str], float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            key = (event["args"]["op_name"], event["name"][: -len("_kernel_time")].removeprefix("fused "))
            kernels[key] = kernels.get(key, 0.0) + event["dur"] / len(runs)
    weights = weight_bytes_by_node(step_file)
    run_us, kernel_us = float(np.median(runs)), sum(kernels.values())
    print(f"{step_file.name}, {args.rows} rows, one thread: {1e6 * float(np.median(unprofiled)):.0f} us per run "
          f"unprofiled; profiled {run_us:.0f} us (median of {len(runs)}), {kernel_us:.0f} us in kernels, "
          f"{run_us - kernel_us:.0f} us outside them")
    print("| node | op | us | share of kernels | weights MB | GB/s |")
    print("|---|---|---|---|---|---|")
    for (op, name), us in sorted(kernels.items(), key=lambda kv: -kv[1])[: args.top]:
        mb = weights.get(name, 0) / 1e6
        speed = f"{mb / us * 1e3:.1f}" if mb > 0.01 else "-"
        print(f"| {name} | {op} | {us:.0f} | {100 * us / kernel_us:.0f}% | {mb:.2f} | {speed} |")


if __name__ == "__main__":
    main(sys.argv[1:])

"""``export_run``: a trained run (or the shipped default) to an export directory, every stage in order.

fp32 ONNX graphs validated against PyTorch, then the fp16 graphs, the INT8 graphs calibrated on real photos, the
graphs' lossless compact storage and the TensorRT engines, as ``ExportOptions`` asks. Each stage says one line as
it starts; the long ones show bars. ``build_engines`` alone turns an existing export directory into engines on a
GPU machine, with no torch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from edgecap.calib.options import Int8Options
from edgecap.errors import EdgecapError
from edgecap.runtime.engines import EngineOptions
from edgecap.runtime.manifest import PRECISIONS, Manifest

Say = Callable[[str], None]


@dataclass(frozen=True)
class ExportOptions:
    precisions: tuple[str, ...] = ("fp32",)  # graphs to write; fp32 always is
    beam: int = 3  # largest beam the runtime will use: the step returns 2 * beam candidates
    int8: Int8Options | None = None  # how to calibrate, when "int8" is among the precisions
    engines: EngineOptions | None = None  # also build TensorRT engines of the precisions (NVIDIA GPU)
    target: str | None = None  # cpu: build, gate and time the CPU candidates, keep the fastest passing (target.py)
    target_photos: int = 0  # cpu: held-out photos each INT8 candidate's parity gate is graded on (0: all of them)

    def __post_init__(self):
        if self.target is not None:  # first: a target's own requirements explain the others
            from edgecap.export.target import require_target_inputs

            require_target_inputs(self.target, self.int8)
        unknown = [p for p in self.precisions if p not in PRECISIONS]
        if unknown or not self.precisions:
            raise EdgecapError(f"precision {', '.join(unknown) or '(none)'}: expected some of {', '.join(PRECISIONS)}")
        if "int8" in self.precisions and self.int8 is None:
            raise EdgecapError("--precision int8 needs --calib-data SPEC (real photos to calibrate on), e.g. "
                               "--calib-data flickr8k:DIR")
        if self.beam < 1:
            raise EdgecapError(f"--beam {self.beam}: expected 1 or more")


def export_run(run: Path | None, out: Path, options: ExportOptions, *, say: Say = print) -> Manifest:
    """Export ``run`` (a run directory or checkpoint; None: the shipped default) to ``out``; the manifest written.

    What this machine lacks (TensorRT) and what the calibration data lacks (its splits) is refused before the
    long stages start, not after. The export is written beside ``out`` and takes its place only when complete, so
    a killed export leaves the previous one (or none), never a mix; a second export into ``out`` is refused while
    one runs.
    """
    from edgecap.checkpoint import checkpoint_file, load_model
    from edgecap.locks import writing

    out = Path(out)
    _require_replaceable(out)
    if options.engines:
        from edgecap.runtime.backends.trt_cuda import require_tensorrt

        require_tensorrt()
    with writing(out, "edgecap export"):
        calibration = _calibration_data(options.int8) if options.int8 else None
        loaded = load_model(run)
        say(f"export: {loaded.model_id} from {checkpoint_file(run)} to {out}: encoder and step graphs (fp32), "
            "checked against PyTorch")
        partial = _fresh_partial(out)
        manifest = _write_stages(loaded, partial, options, calibration, say)
        _swap_in(partial, out)
    return manifest


def _write_stages(loaded, directory: Path, options: ExportOptions, calibration, say: Say) -> Manifest:
    from edgecap.export.onnx import export_onnx
    from edgecap.export.precision import add_fp16
    from edgecap.preprocess import SAMPLE_IMAGES, load_images

    pixels = load_images(sorted(SAMPLE_IMAGES.glob("*.jpg")), loaded.prep)
    manifest = export_onnx(loaded, directory, real_pixels=pixels, k=2 * options.beam)
    if "fp16" in options.precisions:
        say("export: mixed-precision fp16 graphs")
        manifest = add_fp16(directory, manifest)
    if options.target == "cpu":
        from edgecap.export.target import choose_for_cpu

        manifest = choose_for_cpu(directory, manifest, calibration, options.int8, photos=options.target_photos,
                                  say=say)
    elif calibration is not None:
        from edgecap.calib.build import add_int8

        manifest = add_int8(directory, manifest, calibration, options.int8, say=say)
    from edgecap.export.compact import compact_graphs
    from edgecap.export.graphs import graph_weights

    manifest, saved = compact_graphs(directory, manifest, graph_weights(loaded.model))
    if saved:
        say(f"export: {saved / 1e6:.1f} MB of fp32 weights stored as fp16, bit-identical once loaded (lossless)")
    if options.engines:  # of the precisions written: a failed INT8 set is not
        written = tuple(p for p in options.precisions if p in manifest.graphs)
        manifest = build_engines(directory, manifest, written, options.engines, say=say)
    if options.target in ("gpu", "jetson"):
        from edgecap.export.target import rule_record

        manifest = replace(manifest, target=rule_record(options.target, options.precisions)).write(directory)
    return manifest


def _require_replaceable(out: Path) -> None:
    """An existing ``out`` is replaced only when it is an export: any other folder is the user's, never touched."""
    from edgecap.runtime.manifest import MANIFEST_NAME

    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MANIFEST_NAME).is_file())):
        raise EdgecapError(f"{out}: exists and is not an export directory, so export will not replace it; pass a "
                           "new or empty --out")


def _fresh_partial(out: Path) -> Path:
    """An empty ``.NAME.partial`` beside ``out`` (a killed export's is removed), with ``out``'s calibration caches
    copied in, so a re-export draws the same ranges without computing them again."""
    partial = out.parent / f".{out.name}.partial"
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    if (out / "calib").is_dir():
        shutil.copytree(out / "calib", partial / "calib")
    return partial


def _swap_in(partial: Path, out: Path) -> None:
    """``partial`` becomes ``out``; the previous export is removed only once the new one is in place."""
    old = out.parent / f".{out.name}.old"
    if old.exists():
        shutil.rmtree(old)
    if out.exists():
        os.replace(out, old)
    os.replace(partial, out)
    if old.exists():
        shutil.rmtree(old)


def _calibration_data(options: Int8Options):
    from edgecap.calib.build import require_calibration_splits
    from edgecap.data import load_dataset

    dataset = load_dataset(options.data)
    require_calibration_splits(dataset, options.heldout_split)
    return dataset


def build_engines(directory: Path, manifest: Manifest, precisions: Sequence[str], options: EngineOptions, *,
                  say: Say = print) -> Manifest:
    """Strongly typed TensorRT engines of ``precisions`` from the graphs of ``directory``; one line per engine."""
    from edgecap.export.trt import build_engines as build
    from edgecap.report import engine_line

    say(f"export: TensorRT engines ({', '.join(precisions)})")
    manifest, built = build(directory, manifest, precisions, options)
    for engine in built:
        say(engine_line(engine))
    return manifest


def add_engines(directory: Path, precisions: Sequence[str], options: EngineOptions, *, say: Say = print) -> Manifest:
    """Engines for an export directory made elsewhere (on a Jetson: no torch), holding its lock while they build."""
    from edgecap.locks import writing

    with writing(Path(directory), "edgecap export --trt"):
        return build_engines(directory, Manifest.read(directory), precisions, options, say=say)

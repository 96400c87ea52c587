"""``edgecap export --target cpu|gpu|jetson``: the precisions, INT8 scheme and graphs for a device, chosen for it.

For ``cpu`` every candidate is built, gated by parity against PyTorch on the calibration data's held-out split and
timed on ONNX Runtime in this process, side by side; the fastest that passes is kept (fp32, which export validates
against PyTorch, when no INT8 candidate passes). A GPU cannot be measured from here, so ``gpu`` and ``jetson`` are
chosen by rule: fp16 graphs and the INT8 step in TensorRT's scheme, the pair TensorRT runs fastest and that passes
parity on every architecture measured; parity and speed are for ``edgecap parity`` and ``bench --backend trt`` on
the device. The manifest's ``target`` records the choice, every trial and why.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from edgecap.calib.options import Int8Options
from edgecap.errors import EdgecapError
from edgecap.runtime.manifest import Manifest

TARGETS = ("cpu", "gpu", "jetson")
FP32_VERDICT = "validated at export"  # fp32 has no INT8 gate: export checked its graphs against PyTorch
TIMED_RUNS, WARMUP = 20, 3  # per candidate: enough for a stable p50 of a batch-1 caption
Say = Callable[[str], None]


@dataclass(frozen=True)
class Candidate:
    name: str
    int8_graphs: tuple[str, ...]  # () : the fp32 graphs alone
    bias_correction: bool = False


CPU_CANDIDATES = (Candidate("int8 encoder and step, bias-corrected", ("encoder", "step"), bias_correction=True),
                  Candidate("int8 step beside the fp32 encoder", ("step",)),
                  Candidate("fp32", ()))


@dataclass(frozen=True)
class Trial:
    candidate: str
    precision: str
    int8_graphs: tuple[str, ...]
    bias_correction: bool
    caption_ms_p50: float | None  # None: never timed (its INT8 search failed the gate)
    parity: str  # the gate's outcome, or why it was not run
    delta_cider: float | None = None
    delta_cider_ci95: tuple[float, float] | None = None
    photos: int = 0


def target_options(target: str, int8: Int8Options | None,
                   given: dict[str, object]) -> tuple[tuple[str, ...], Int8Options | None]:
    """(precisions, INT8 options) a target exports; the flags it chooses itself must not be ``given`` too.

    ``cpu`` writes fp32 and INT8 (its candidates vary the INT8 options); ``gpu`` and ``jetson`` fp16, and the INT8
    step in TensorRT's scheme when photos are given.
    """
    named = ", ".join(flag for flag, value in given.items() if value is not None)
    if named:
        raise EdgecapError(f"--target {target} chooses the precisions, INT8 scheme and graphs itself: drop {named}, "
                           "or drop --target to choose them yourself")
    if target == "cpu":
        return ("fp32", "int8"), int8
    if int8 is None:
        return ("fp32", "fp16"), None
    return ("fp32", "fp16", "int8"), replace(int8, scheme="tensorrt", graphs=("step",), bias_correction=False)


def rule_record(target: str, precisions: tuple[str, ...]) -> dict:
    chosen = "int8" if "int8" in precisions else "fp16"
    return {"name": target, "precision": chosen, "trials": [],
            "reason": (f"chosen by rule for TensorRT ({', '.join(precisions)}; the INT8 step in TensorRT's scheme "
                       "beside the fp16 encoder): no GPU measured it here; on the device run `edgecap parity "
                       f"--backend trt --precision {chosen}` and `edgecap bench --backend trt` before shipping")}


def choose_for_cpu(directory: Path, manifest: Manifest, calibration, int8: Int8Options, *, photos: int,
                   say: Say) -> Manifest:
    """Build, gate and time every CPU candidate beside the fp32 graphs in ``directory``; keep the fastest passing
    one there and return its manifest, with the ``target`` record of every trial."""
    from edgecap.calib.build import add_int8
    from edgecap.evaluation import Evaluator

    built, gates, refused = {}, {}, []
    with Evaluator(spice=False) as evaluator:
        for number, candidate in enumerate(CPU_CANDIDATES):
            if not candidate.int8_graphs:
                built[candidate.name] = (directory, manifest, "fp32")
                continue
            trial_dir = directory.parent / f"{directory.name}.trial-{number}"
            _copy_fp32(directory, trial_dir)
            say(f"export --target cpu: trying {candidate.name}")
            options = replace(int8, scheme="ort-cpu", graphs=candidate.int8_graphs,
                              bias_correction=candidate.bias_correction)
            trial_manifest = add_int8(trial_dir, manifest, calibration, options, say=say)
            if "int8" not in trial_manifest.graphs:  # the layer search failed the gate: nothing to time
                refused.append(_refused(candidate, trial_manifest.quantization, say))
                shutil.rmtree(trial_dir, ignore_errors=True)
                continue
            built[candidate.name] = (trial_dir, trial_manifest, "int8")
            gates[candidate.name] = _parity(trial_dir, trial_manifest, calibration, int8, photos, evaluator)
    say("export --target cpu: timing every candidate side by side")
    times = dict(zip(built, _caption_ms_side_by_side(list(built.values()), int8.beam), strict=True))
    trials = [_trial(c, built[c.name][2], times[c.name], gates.get(c.name), say)
              for c in CPU_CANDIDATES if c.name in built] + refused
    passing = [t for t in trials if t.parity in ("pass", FP32_VERDICT)]
    best = min(passing, key=lambda t: t.caption_ms_p50)
    fp32_ms = next(t.caption_ms_p50 for t in trials if t.precision == "fp32")
    chosen_dir, chosen, _ = built[best.candidate]
    if chosen_dir != directory:
        for name in {*chosen.graphs["int8"].values()} - {*manifest.graphs["fp32"].values()}:
            shutil.copy2(chosen_dir / name, directory / name)
        if (chosen_dir / "calib").is_dir():
            shutil.copytree(chosen_dir / "calib", directory / "calib", dirs_exist_ok=True)
    for trial_dir, _, _ in built.values():
        if trial_dir != directory:
            shutil.rmtree(trial_dir, ignore_errors=True)
    reason = (f"{best.candidate}: the fastest candidate that passes parity ({best.caption_ms_p50:.1f} ms per caption "
              f"against fp32's {fp32_ms:.1f} on ONNX Runtime CPU, batch 1, beam {int8.beam}, one thread, side by side)")
    record = {"name": "cpu", "precision": best.precision, "reason": reason, "trials": [asdict(t) for t in trials]}
    say(f"export --target cpu: {reason}")
    return replace(chosen, target=record).write(directory)


def _copy_fp32(source: Path, target: Path) -> None:
    """The fp32 graphs, manifest and calibration cache of ``source`` in a fresh ``target``."""
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("reports"))


def _parity(directory: Path, manifest: Manifest, calibration, int8: Int8Options, photos: int, evaluator):
    """The INT8 gate on ``photos`` photos (0: all) of the held-out split that did not choose the candidate's fp32
    layers: fewer photos widen the interval the gate judges, so a candidate may be inconclusive where it would pass."""
    from edgecap.parity import run_parity
    from edgecap.runtime.search import SearchOptions

    chose = manifest.int8_heldout_ids(calibration.name)
    records = [r for r in calibration.split(int8.heldout_split) if r.image_id not in chose][: photos or None]
    return run_parity(directory, records, split=int8.heldout_split, precision="int8",
                      options=SearchOptions(beam_size=int8.beam), evaluator=evaluator, data_name=calibration.name)


def _refused(candidate: Candidate, q, say: Say) -> Trial:
    """The trial of a candidate whose INT8 layer search failed the gate on the held-out photos (never timed)."""
    say(f"export --target cpu: {candidate.name}: the INT8 search failed the gate (ΔCIDEr {q.delta_cider:+.2f} on "
        f"{q.heldout_images} held-out photos); not a candidate")
    return Trial(candidate.name, "int8", candidate.int8_graphs, candidate.bias_correction, None,
                 "fail (layer search)", q.delta_cider, q.delta_cider_ci95, q.heldout_images)


def _trial(candidate: Candidate, precision: str, caption_ms: float, parity, say: Say) -> Trial:
    if parity is None:
        trial = Trial(candidate.name, precision, (), False, caption_ms, FP32_VERDICT)
    else:
        trial = Trial(candidate.name, precision, candidate.int8_graphs, candidate.bias_correction, caption_ms,
                      parity.verdict.outcome, parity.delta_cider, parity.delta_cider_ci95, parity.n_images)
    detail = "" if parity is None else (f", parity {trial.parity}: ΔCIDEr {trial.delta_cider:+.2f} "
                                        f"({trial.delta_cider_ci95[0]:+.2f}..{trial.delta_cider_ci95[1]:+.2f}) on "
                                        f"{trial.photos} photos")
    say(f"export --target cpu: {candidate.name}: {caption_ms:.1f} ms per caption{detail}")
    return trial


def _caption_ms_side_by_side(candidates: list[tuple[Path, Manifest, str]], beam: int) -> list[float]:
    """Median ms of one caption (batch 1, ``beam``) of a sample photo on ONNX Runtime CPU, one thread, per candidate;
    the candidates take turns run by run, so a change in the machine's load falls on all of them alike."""
    from edgecap.preprocess import SAMPLE_IMAGES, Preprocessing, load_images
    from edgecap.runtime.backends.ort import OrtBackend
    from edgecap.runtime.search import SearchOptions
    from edgecap.runtime.timing import time_captions
    from edgecap.vocab import Vocab

    manifest = candidates[0][1]
    pixels = load_images(sorted(SAMPLE_IMAGES.glob("*.jpg"))[:1], Preprocessing.from_json(manifest.preprocessing))
    vocab = Vocab.from_json(manifest.vocab)
    backends = [OrtBackend(d, m, precision=p) for d, m, p in candidates]
    seconds = [[] for _ in backends]
    for run in range(WARMUP + TIMED_RUNS):
        for backend, times in zip(backends, seconds, strict=True):
            timed = time_captions(backend, pixels, SearchOptions(beam_size=beam), vocab, runs=1, warmup=0)
            if run >= WARMUP:
                times.append(float(timed.caption[0]))
    return [float(np.median(times) * 1e3) for times in seconds]


def require_target_inputs(target: str, int8: Int8Options | None) -> None:
    """``cpu`` measures INT8 candidates on real photos: it needs them, and the scoring package for parity."""
    if target not in TARGETS:
        raise EdgecapError(f"--target {target}: expected one of {', '.join(TARGETS)}")
    if target == "cpu" and int8 is None:
        raise EdgecapError("--target cpu builds and gates INT8 candidates: pass --calib-data SPEC (real photos), "
                           "e.g. --calib-data flickr8k:DIR")

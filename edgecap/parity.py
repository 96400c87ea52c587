"""Parity: does an exported backend/precision say what PyTorch says, on real held-out images?

The PyTorch reference and the candidate run through the very same beam search on
the same preprocessed pixels, so every difference comes from the compiled graphs
and their precision. Three views, from strict to forgiving:

- captions: identical-caption rate and, for each differing caption, the word
  position where it first diverges;
- teacher-forced numerics: both decoders are fed the reference caption's words
  and compared step by step (|Δ log-prob|, top-1 and top-k agreement), so one
  early divergence does not hide how close the numbers are;
- quality: BLEU-4/METEOR/ROUGE-L/CIDEr-D of both against the human references,
  with a paired-bootstrap 95% interval of ΔCIDEr.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np
from tqdm import tqdm

from edgecap.checkpoint import load_reference
from edgecap.data.records import ImageRecord
from edgecap.errors import DataError
from edgecap.preprocess import Preprocessing, load_images
from edgecap.runtime.decoding import decode
from edgecap.runtime.machine import machine_info
from edgecap.runtime.manifest import Manifest
from edgecap.runtime.pipeline import check_options, open_backend
from edgecap.runtime.search import Hypothesis, SearchOptions
from edgecap.torch_backend import TorchBackend
from edgecap.verdict import GATE_RULE, THRESHOLDS, Threshold, Verdict, gate, paired_bootstrap_ci
from edgecap.vocab import BOS, EOS, PAD, Vocab

if TYPE_CHECKING:  # scoring needs pycocoevalcap; the teacher-forced check and the gate's inputs do not
    from edgecap.evaluation import Evaluator, Scores


@dataclass(frozen=True)
class StepNumerics:
    """Teacher-forced comparison of one decoding position over the rows still inside their caption."""

    step: int
    rows: int
    max_abs_delta_logprob: float
    mean_abs_delta_logprob: float
    top1_agreement: float  # share of rows whose argmax word is the same
    topk_agreement: float  # mean overlap of the two top-k sets, 0-1


@dataclass(frozen=True)
class ParityResult:
    backend: str
    precision: str
    split: str
    options: SearchOptions  # the decoding both sides ran
    n_images: int
    identical_rate: float
    delta_cider: float  # candidate - reference, 0-100 scale
    delta_cider_ci95: tuple[float, float]
    reference: Scores
    candidate: Scores
    steps: list[StepNumerics]
    first_divergence: dict[int, int]  # word position -> number of differing captions that diverge there
    differing: list[dict]  # image id, reference caption, candidate caption (the first few)
    threshold: Threshold
    verdict: Verdict = Verdict("pass", ())
    graphs: dict[str, str] = field(default_factory=dict)  # graph -> the ONNX file of this precision set checked
    left_out: int = 0  # photos of the split INT8 calibration chose its fp32 layers on, not graded here
    machine: dict = field(default_factory=dict)  # the host fingerprint, as doctor and bench record it
    int8_layers: dict[str, dict[str, int]] = field(default_factory=dict)  # int8: per graph, layers INT8 / fp32, Q/DQ

    rule: ClassVar[str] = GATE_RULE

    @property
    def passed(self) -> bool:
        return self.verdict.outcome == "pass"


class _StepStats:
    """Accumulates teacher-forced differences per position over batches of images."""

    def __init__(self, k: int):
        self.k = k
        self.rows: Counter[int] = Counter()
        self.max_abs: dict[int, float] = {}
        self.sum_abs: Counter[int] = Counter()  # sum over rows of the mean |Δ| over the vocabulary
        self.top1: Counter[int] = Counter()
        self.topk: Counter[int] = Counter()

    def add(self, position: int, reference: np.ndarray, candidate: np.ndarray) -> None:
        """reference, candidate: float32 (R, V) log-probs of the rows still inside their caption."""
        if not len(reference):
            return
        delta = np.abs(reference.astype(np.float64) - candidate.astype(np.float64))
        self.rows[position] += len(reference)
        self.max_abs[position] = max(self.max_abs.get(position, 0.0), float(delta.max()))
        self.sum_abs[position] += float(delta.mean(axis=1).sum())
        self.top1[position] += int((reference.argmax(axis=1) == candidate.argmax(axis=1)).sum())
        top_ref = np.argpartition(-reference, self.k - 1, axis=1)[:, : self.k]
        top_cand = np.argpartition(-candidate, self.k - 1, axis=1)[:, : self.k]
        overlap = (top_ref[:, :, None] == top_cand[:, None, :]).any(axis=2).sum(axis=1)
        self.topk[position] += float(overlap.sum()) / self.k

    def result(self) -> list[StepNumerics]:
        return [StepNumerics(p, n, self.max_abs[p], self.sum_abs[p] / n, self.top1[p] / n, self.topk[p] / n)
                for p, n in sorted(self.rows.items())]


def teacher_forced(backend, pixels: np.ndarray, captions: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Per position, the (N, V) log-probs of a backend fed bos then each image's caption words."""
    session = backend.encode(pixels)
    session.tile(1)
    length = max(map(len, captions)) + 1  # the words, then the eos position
    words = np.full((len(captions), length), PAD, dtype=np.int64)
    for row, caption in enumerate(captions):
        words[row, : len(caption)] = caption
    rows = np.arange(len(captions), dtype=np.int64)
    tokens = np.full(len(captions), BOS, dtype=np.int64)
    out = []
    for position in range(length):
        out.append(session.step_logprobs(tokens, rows, position))
        tokens = words[:, position]
    return out


def first_divergence(a: Sequence, b: Sequence) -> int:
    """Index of the first word where two captions differ (the shorter length if one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


@dataclass(frozen=True)
class _Side:
    """One side of the comparison, decoding as it would on its own: its backend, preprocessing and vocabulary."""

    backend: object  # encode(pixels) -> StepSession
    prep: Preprocessing
    vocab: Vocab


def _decode_both(records: Sequence[ImageRecord], sides: dict[str, _Side], options: SearchOptions, stats: _StepStats,
                 *, batch_size: int, label: str) -> dict[str, list[Hypothesis]]:
    """Best hypothesis per record from each side, through the same search, on pixels preprocessed as each side
    preprocesses them; ``stats`` gains the teacher-forced comparison along the reference's captions."""
    hyps: dict[str, list[Hypothesis]] = {name: [] for name in sides}
    for start in tqdm(range(0, len(records), batch_size), desc=label, unit="batch"):
        chunk = records[start:start + batch_size]
        pixels = {}
        for name, side in sides.items():
            prep = side.prep.to_json()
            pixels[name] = next((p for other, p in pixels.items() if sides[other].prep.to_json() == prep), None)
            if pixels[name] is None:
                pixels[name] = load_images([r.path for r in chunk], side.prep)
            found = decode(side.backend.encode(pixels[name]), len(chunk), options, side.vocab)
            hyps[name] += [h[0] for h in found]
        forced_words = [h.tokens + (EOS,) for h in hyps["reference"][start:]]
        forced = [teacher_forced(side.backend, pixels[name], forced_words) for name, side in sides.items()]
        lengths = np.array([len(w) for w in forced_words])
        for position, (ref, cand) in enumerate(zip(*forced, strict=True)):
            inside = lengths > position
            stats.add(position, ref[inside], cand[inside])
    return hyps


def _int8_counts(manifest: Manifest) -> dict[str, dict[str, int]]:
    """What the int8 set's graphs run INT8: its weighted layers in INT8 and in fp32, and its Q/DQ nodes."""
    q = manifest.quantization
    graphs = [q.graph(g) for g in ("encoder", "step")] if q is not None else []
    return {name: {"int8": g.int8_layers, "fp32": g.layers - g.int8_layers, "qdq_nodes": g.qdq_nodes}
            for name, g in zip(("encoder", "step"), graphs, strict=False) if g.quantized}


def run_parity(export_dir: Path, records: Sequence[ImageRecord], *, split: str, backend: str = "ort",
               precision: str = "fp32", options: SearchOptions, reference_path: Path | None = None,
               evaluator: Evaluator, data_name: str = "", batch_size: int = 25) -> ParityResult:
    """Caption ``records`` with the PyTorch reference and the exported candidate; compare and gate.

    ``data_name`` (the dataset's name) lets an int8 gate leave out the photos calibration selected on.
    """
    manifest = Manifest.read(export_dir)
    # INT8 calibration kept layers fp32 until ΔCIDEr on its held-out photos was small: grading the gate on them
    # would grade the search on its own selection set.
    chosen = manifest.int8_heldout_ids(data_name) if precision == "int8" else frozenset()
    graded = [r for r in records if r.image_id not in chosen]
    if not graded:
        raise DataError(f"every photo asked for chose the INT8 export's fp32 layers ({len(records)}); "
                        "compare on more photos (--max-images) or another split")
    records, left_out = graded, len(records) - len(graded)
    check_options(manifest, options, export_dir)  # the search a deployed Captioner would run, or none
    loaded = load_reference(manifest, reference_path)
    k = manifest.topk
    # The candidate decodes as a deployed Captioner would: with the export's own preprocessing and vocabulary.
    sides = {"reference": _Side(TorchBackend(loaded.model, k), loaded.prep, loaded.vocab),
             "candidate": _Side(open_backend(export_dir, manifest, backend=backend, precision=precision),
                                Preprocessing.from_json(manifest.preprocessing), Vocab.from_json(manifest.vocab))}
    stats = _StepStats(k)
    hyps = _decode_both(records, sides, options, stats, batch_size=batch_size, label=f"parity {backend} {precision}")
    ids = [r.image_id for r in records]
    words = {name: [sides[name].vocab.decode(h.tokens).split() for h in found] for name, found in hyps.items()}
    texts = {name: dict(zip(ids, (" ".join(w) for w in found), strict=True)) for name, found in words.items()}
    pairs = list(zip(words["reference"], words["candidate"], strict=True))
    same = [a == b for a, b in pairs]
    divergence = Counter(first_divergence(a, b) for (a, b), s in zip(pairs, same, strict=True) if not s)
    references = {r.image_id: list(r.captions) for r in records}
    scores = {side: evaluator.score(references, texts[side]) for side in texts}
    per_image = [np.array([scores[side].per_image_cider[i] for i in ids]) for side in ("reference", "candidate")]
    low, high = paired_bootstrap_ci(*per_image)
    delta = 100 * (scores["candidate"].metrics["CIDEr"] - scores["reference"].metrics["CIDEr"])
    identical = float(np.mean(same))
    threshold = THRESHOLDS[precision]
    verdict = gate(delta, (100 * low, 100 * high), identical, len(records), threshold)
    differing = [{"image_id": i, "reference": texts["reference"][i], "candidate": texts["candidate"][i]}
                 for i, s in zip(ids, same, strict=True) if not s][:20]
    return ParityResult(backend=backend, precision=precision, split=split, options=options,
                        n_images=len(records), identical_rate=identical, delta_cider=delta,
                        delta_cider_ci95=(100 * low, 100 * high), reference=scores["reference"],
                        candidate=scores["candidate"], steps=stats.result(), first_divergence=dict(divergence),
                        differing=differing, threshold=threshold, verdict=verdict,
                        graphs=dict(manifest.graphs[precision]), left_out=left_out, machine=machine_info(),
                        int8_layers=_int8_counts(manifest) if precision == "int8" else {})


def check_export(export_dir: Path, data: str, split: str, *, backend: str, precision: str, options: SearchOptions,
                 reference_path: Path | None = None, max_images: int = 0, json_out: Path | None = None,
                 markdown_out: Path | None = None, say=print) -> ParityResult:
    """``edgecap parity``: gate ``export_dir`` on ``data``'s ``split``, write the reports, say what was compared
    and where the reports went. What this machine or the data lacks is said before the scoring package is needed."""
    from edgecap.data import load_dataset
    from edgecap.report import decoding_text, parity_json, parity_markdown, write_reports

    if backend == "trt":
        from edgecap.runtime.backends.trt_cuda import require_tensorrt

        require_tensorrt()  # before the reference model and the data are loaded
    dataset = load_dataset(data)
    records = dataset.split(split)[: max_images or None]
    say(f"parity: {export_dir} on {backend} {precision} against PyTorch, {dataset.name} {split}, up to "
        f"{len(records)} photos, {decoding_text(options)}")
    from edgecap.evaluation import Evaluator  # after the arguments and the data: scoring needs pycocoevalcap

    with Evaluator(spice=False) as evaluator:
        result = run_parity(export_dir, records, split=split, backend=backend, precision=precision, options=options,
                            reference_path=reference_path, evaluator=evaluator, data_name=dataset.name)
    text = parity_markdown(result)
    written = write_reports(parity_json(result), text, export_dir / "reports" / f"parity-{backend}-{precision}",
                            json_out=json_out, markdown_out=markdown_out)
    manifest = Manifest.read(export_dir)
    measured = f"{dataset.name} {split}, {result.n_images} photos, {decoding_text(options)}"
    replace(manifest, reference_scores={**manifest.reference_scores, measured: result.reference.metrics}).write(
        export_dir, record_files=False)
    say(text)
    say(f"reports: {', '.join(map(str, written))}")
    return result

"""Keep the layers whose INT8 costs captions in fp32, until the parity gate's rule passes on held-out photos.

What matters is the caption, so the verdict is CIDEr-D (``edgecap.cider``, Java-free, 0-100 scale) of
captions decoded exactly as ``edgecap.runtime.pipeline`` decodes them, against the held-out photos' human
references, with the fp32 graphs as the baseline. The all-INT8 pair is measured first; only when it fails are
layers ranked, and ranking every layer by ΔCIDEr would cost a decode of the held-out set per layer and drown in
the noise of a hundred captions. So a cheap proxy orders the candidates: the share of its graph's output error
(relative RMS on a few calibration feeds) that keeping one layer in fp32 removes. Layers are then kept fp32 in
that order, ΔCIDEr measured after each, until the gate's non-inferiority rule (``edgecap.verdict``) passes: the
paired-bootstrap interval's lower bound above -threshold, so the search stops on what parity will judge, not on a
point estimate as noisy as the threshold. When no set tried passes, every tried layer stays fp32 (the most accurate
set tried) and the verdict says whether it failed or the held-out photos were too few to tell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from edgecap.calib.quantize import QdqGraph
from edgecap.cider import CiderD
from edgecap.data.records import ImageRecord
from edgecap.preprocess import Preprocessing, load_images
from edgecap.runtime.backends.ort import OrtBackend, cpu_session
from edgecap.runtime.manifest import Manifest
from edgecap.runtime.pipeline import Captioner
from edgecap.runtime.search import SearchOptions
from edgecap.verdict import Verdict, judge
from edgecap.vocab import tokenize

TRIAL = "calib-trial"  # precision name under which a candidate graph pair is loaded


class CaptionScorer:
    """CIDEr-D (0-100) of the captions a pair of graph files gives the held-out records."""

    def __init__(self, directory: Path, manifest: Manifest, records: Sequence[ImageRecord], *, beam_size: int = 3,
                 batch_size: int = 16, progress: bool = True):
        self.directory, self.manifest, self.batch_size, self.progress = directory, manifest, batch_size, progress
        self.options = SearchOptions(beam_size=beam_size)
        self.image_ids = [r.image_id for r in records]
        self.pixels = load_images([r.path for r in records], Preprocessing.from_json(manifest.preprocessing))
        self.cider = CiderD({r.image_id: [tokenize(c) for c in r.captions] for r in records})

    def captions(self, encoder: Path, step: Path) -> list[str]:
        """Held-out captions through the graph files ``encoder`` and ``step``, decoded as the runtime decodes."""
        backend = OrtBackend(self.directory, self.manifest, precision=TRIAL, files=(encoder, step))
        captioner = Captioner(backend, self.manifest)
        out = []
        starts = range(0, len(self.pixels), self.batch_size)
        for start in tqdm(starts, desc="captioning held-out photos", unit="batch", leave=False,
                          disable=not self.progress):
            hyps = captioner.search(self.pixels[start:start + self.batch_size], self.options)
            out += [captioner.vocab.decode(h.tokens) for h in hyps]
        return out

    def scores(self, encoder: Path, step: Path) -> np.ndarray:
        """float64 (images,): each held-out photo's CIDEr-D; their mean is the corpus score."""
        words = [tokenize(text) for text in self.captions(encoder, step)]
        return 100.0 * self.cider.score(self.image_ids, words)


def compare(fp32: np.ndarray, int8: np.ndarray) -> tuple[float, float]:
    """ΔCIDEr (int8 - fp32) and its standard error over the paired per-image scores.

    A hundred photos give a standard error near 1 CIDEr point: a few captions that change decide the sign.
    """
    diff = int8 - fp32
    return float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(len(diff))) if len(diff) > 1 else 0.0


def _run(path: Path, feeds: Sequence[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
    session = cpu_session(path)
    return [session.run(None, feed) for feed in feeds]


def output_error(reference: list[list[np.ndarray]], candidate: list[list[np.ndarray]]) -> float:
    """Mean relative RMS error over the float outputs of every feed."""
    errors = [np.sqrt(np.sum((r - c) ** 2, dtype=np.float64) / max(np.sum(r.astype(np.float64) ** 2), 1e-30))
              for ref, cand in zip(reference, candidate, strict=True) for r, c in zip(ref, cand, strict=True)
              if r.dtype.kind == "f"]
    return float(np.mean(errors))


def rank_layers(graph: QdqGraph, feeds: Sequence[dict[str, np.ndarray]], *,
                progress: bool = True) -> list[tuple[str, float]]:
    """(layer, share of the all-INT8 output error removed by keeping it fp32), most helpful first.

    Leaves ``graph.target`` holding the last trial graph; the caller rewrites it.
    """
    reference = _run(graph.source, feeds)
    total = output_error(reference, _run(graph.write(), feeds))
    gains = []
    for layer in tqdm(graph.layers(), desc=f"ranking {graph.name} layers", unit="layer", disable=not progress):
        remaining = output_error(reference, _run(graph.write([layer]), feeds))
        gains.append((layer, (total - remaining) / total if total > 0 else 0.0))
    return sorted(gains, key=lambda item: -item[1])


@dataclass(frozen=True)
class Sensitivity:
    """What the search found; CIDEr-D on the 0-100 scale, per held-out photo."""

    kept_fp32: dict[str, list[str]]  # graph -> layers left in fp32, in the order they were kept
    fp32_scores: np.ndarray = field(repr=False)  # fp32 graphs
    int8_scores: np.ndarray = field(repr=False)  # the Q/DQ graphs as finally written
    all_int8_scores: np.ndarray = field(repr=False)  # every candidate layer quantised
    threshold: float = 1.0  # the gate's -threshold bound on ΔCIDEr
    verdict: Verdict = Verdict("pass", ())  # the gate's rule on int8_scores against fp32_scores
    layers_tried: int = 0  # layers kept fp32 one by one after the all-INT8 pair did not pass

    @property
    def threshold_met(self) -> bool:
        return self.verdict.outcome == "pass"


def keep_sensitive_layers(graphs: Mapping[str, QdqGraph], scorer: CaptionScorer,
                          proxy_feeds: Mapping[str, Sequence[dict[str, np.ndarray]]], *,
                          fixed: Mapping[str, Path] | None = None, threshold: float = 1.0, max_layers: int = 12,
                          progress: bool = True) -> Sensitivity:
    """Write the ``target`` of each of ``graphs`` with the fewest fp32 layers tried whose ΔCIDEr passes the gate's
    rule at ``threshold`` (a negative threshold never passes: every tried layer stays fp32).

    ``graphs`` holds the graphs being quantised (encoder, step or both); ``fixed`` names the file used for each
    graph left out of INT8. The baseline is always the fp32 pair.
    """
    fixed = dict(fixed or {})

    def trial() -> np.ndarray:
        files = {**fixed, **{name: graph.target for name, graph in graphs.items()}}
        return scorer.scores(files["encoder"], files["step"])

    fp32 = scorer.scores(*scorer.manifest.graph_files(scorer.directory, "fp32"))
    kept: dict[str, list[str]] = {name: [] for name in graphs}
    for graph in graphs.values():
        graph.write()
    int8 = all_int8 = trial()
    verdict = judge(fp32, int8, threshold)[2]
    if verdict.outcome == "pass":
        return Sensitivity(kept, fp32, int8, all_int8, threshold, verdict, 0)
    ranked = sorted(((gain, name, layer) for name, graph in graphs.items()
                     for layer, gain in rank_layers(graph, proxy_feeds[name], progress=progress)),
                    key=lambda item: -item[0])[:max_layers]
    for graph in graphs.values():  # rank_layers left trial graphs behind
        graph.write()
    tried = 0
    for _, name, layer in tqdm(ranked, desc="keeping sensitive layers fp32", unit="layer", disable=not progress):
        kept[name].append(layer)
        graphs[name].write(kept[name])
        tried += 1
        int8 = trial()
        verdict = judge(fp32, int8, threshold)[2]
        if verdict.outcome == "pass":
            return Sensitivity(kept, fp32, int8, all_int8, threshold, verdict, tried)
    return Sensitivity(kept, fp32, int8, all_int8, threshold, verdict, tried)

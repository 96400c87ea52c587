"""Captioning metrics through pycocoevalcap, scored the way papers score them.

Captions are tokenised with pycocoevalcap's Stanford PTBTokenizer rather than ``edgecap.vocab.tokenize``:
the two split words differently ("man's" -> "man 's" vs "mans"), and only the PTB numbers are comparable
with published results. That tokeniser, METEOR and SPICE run on Java, so scoring needs ``java`` on the
PATH; Java-free CIDEr for model selection lives in ``edgecap.cider``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from edgecap.data.records import ImageRecord
from edgecap.errors import EdgecapError

try:
    import pycocoevalcap.spice
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.spice.spice import Spice
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
except ImportError:  # a runtime-only install (edgecap[runtime]) captions but cannot score
    raise EdgecapError("scoring captions needs pycocoevalcap: pip install edgecap[metrics] "
                       "(and a Java runtime on the PATH)") from None
from edgecap.runtime.search import SearchOptions

if TYPE_CHECKING:
    from edgecap.runtime.pipeline import Captioner

SPICE_LIB = Path(pycocoevalcap.spice.__file__).parent / "lib"
# pycocoevalcap downloads these on SPICE's first use; offline that fails, so SPICE runs only if they are there.
SPICE_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


@dataclass(frozen=True)
class Scores:
    """Corpus metrics of one set of candidates, on pycocoevalcap's raw scales (CIDEr ~0-10, others 0-1)."""

    metrics: dict[str, float]  # Bleu_1..Bleu_4, METEOR, ROUGE_L, CIDEr, and SPICE when it ran
    per_image_cider: dict[str, float]  # image id -> CIDEr, for paired comparisons of two systems
    skipped: dict[str, str]  # metric -> one-line reason it was not computed


def spice_skip_reason(lib_dir: Path = SPICE_LIB) -> str | None:
    """Why SPICE cannot run offline (its Stanford CoreNLP jars are missing from ``lib_dir``), or None."""
    missing = [jar for jar in SPICE_JARS if not (lib_dir / jar).is_file()]
    if not missing:
        return None
    return f"Stanford CoreNLP jars missing from {lib_dir} ({', '.join(missing)}); pycocoevalcap would download them"


def _require_java() -> None:
    if shutil.which("java") is None:
        raise EdgecapError(
            "java not found on PATH: pycocoevalcap's PTB tokenizer, METEOR and SPICE need it; "
            "install a Java runtime, e.g. `apt-get install default-jre-headless`"
        )


def _stop_meteor(meteor: Meteor) -> None:
    """End METEOR's JVM: end-of-input makes it exit within ~0.1 s; kill it only if it does not."""
    process = meteor.meteor_p
    # pycocoevalcap leaves its lock held when a call fails midway; waiting on it forever would hang exit.
    locked = meteor.lock.acquire(timeout=10)
    try:
        process.stdin.close()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
        process.stderr.close()
    finally:
        if locked:
            meteor.lock.release()


@contextmanager
def _java_chatter_held() -> Iterator[None]:
    """Hold back what the Java tokenizer writes to stderr ("PTBTokenizer tokenized N tokens at ..."); it is shown
    only if tokenizing fails, when it is the reason."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            os.dup2(saved, 2)
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class Evaluator:
    """Scores candidates against references; keep one per run and reuse it.

    METEOR is a Java subprocess that takes ~10 s to start (JVM plus paraphrase table) and ~1.5 s per
    1,000 captions once warm, so it is started on first use and kept until ``close()``, the end of a
    ``with`` block, garbage collection or interpreter exit, whichever comes first.
    """

    def __init__(self, *, spice: bool = True):
        _require_java()  # before minutes of captioning, not after
        self._spice = spice  # SPICE needs an 8 GB Java heap and minutes per split; False skips it
        self._meteor: Meteor | None = None
        self._stop: weakref.finalize | None = None

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the METEOR process; a later ``score`` starts a new one."""
        if self._stop is not None:
            self._stop()
        self._meteor = self._stop = None

    def _meteor_scorer(self) -> Meteor:
        if self._meteor is None:
            self._meteor = Meteor()
            # A finalizer, not __del__: it also runs at interpreter exit and holds no reference to self.
            self._stop = weakref.finalize(self, _stop_meteor, self._meteor)
        return self._meteor

    def score(self, references: Mapping[str, Sequence[str]], candidates: Mapping[str, str]) -> Scores:
        """Metrics of one raw caption per image in ``candidates`` against that image's raw ``references``.

        Only the candidates' images are scored, so CIDEr's document frequencies come from their references,
        as in the COCO evaluation server.
        """
        if not candidates:
            raise ValueError("no candidates to score")
        unreferenced = [image_id for image_id in candidates if not references.get(image_id)]
        if unreferenced:
            raise ValueError(f"{len(unreferenced)} candidate images have no references, e.g. {unreferenced[0]!r}")
        _require_java()
        # One tokenizer run (one JVM start) for both sides, told apart by the key's first element.
        with _java_chatter_held():
            tokenized = PTBTokenizer().tokenize(
                {
                    (side, image_id): [{"caption": c} for c in captions]
                    for image_id in candidates
                    for side, captions in (("ref", references[image_id]), ("cand", [candidates[image_id]]))
                }
            )
        gts = {image_id: tokenized["ref", image_id] for image_id in candidates}
        res = {image_id: tokenized["cand", image_id] for image_id in candidates}

        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        metrics = {f"Bleu_{i + 1}": float(value) for i, value in enumerate(bleu)}
        metrics["METEOR"] = float(self._meteor_scorer().compute_score(gts, res)[0])
        metrics["ROUGE_L"] = float(Rouge().compute_score(gts, res)[0])
        cider, per_image = Cider().compute_score(gts, res)
        metrics["CIDEr"] = float(cider)

        skipped = {}
        reason = spice_skip_reason() if self._spice else "disabled (Evaluator(spice=False))"
        if reason is None:
            metrics["SPICE"] = float(Spice().compute_score(gts, res)[0])
        else:
            skipped["SPICE"] = reason
        return Scores(metrics, dict(zip(gts, map(float, per_image), strict=True)), skipped)


@dataclass(frozen=True)
class EvalResult:
    scores: Scores
    captions: dict[str, str]  # image_id -> generated caption
    n_images: int
    options: SearchOptions  # the decoding the captions came from
    backend: str = "torch"  # what ran the model: torch (a checkpoint), ort, openvino or trt (an export's graphs)
    precision: str = "fp32"


def score_captions(records: Sequence[ImageRecord], captions: Mapping[str, str], options: SearchOptions, *,
                   evaluator: Evaluator, backend: str = "torch", precision: str = "fp32") -> EvalResult:
    """Score one generated caption per record against the record's human references."""
    references = {r.image_id: list(r.captions) for r in records}
    return EvalResult(evaluator.score(references, captions), dict(captions), len(records), options, backend,
                      precision)


def evaluate_captioner(captioner: Captioner, records: Sequence[ImageRecord], options: SearchOptions, *,
                       evaluator: Evaluator, backend: str, precision: str, chunk: int = 64) -> EvalResult:
    """Caption and score a split with exported graphs (no torch): what the deployed model scores."""
    captions = {}
    for start in tqdm(range(0, len(records), chunk), desc="captioning", unit="chunk", leave=False):
        batch = records[start:start + chunk]
        results = captioner.caption([r.path for r in batch], options)
        captions.update({r.image_id: c.text for r, c in zip(batch, results, strict=True)})
    return score_captions(records, captions, options, evaluator=evaluator, backend=backend, precision=precision)

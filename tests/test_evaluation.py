
import numpy as np
import pytest

from edgecap.errors import EdgecapError
from tests.needs import needs_scoring

pytest.importorskip("pycocoevalcap", reason="scoring needs pycocoevalcap (pip install edgecap[metrics])")
from edgecap.evaluation import SPICE_JARS, Evaluator, spice_skip_reason  # noqa: E402
from edgecap.verdict import paired_bootstrap_ci  # noqa: E402

REFERENCES = {
    "dog": [
        "A black dog runs across the green grass.",
        "A dog is running on the grass.",
        "The black dog runs outside.",
    ],
    "beach": ["Two children play on the sandy beach.", "Kids are playing on a beach.", "Two kids play in the sand."],
    "snow": ["A man skis down a snowy hill.", "A skier goes down the snow.", "A man is skiing on a white slope."],
    "bike": ["A woman rides a red bicycle.", "A person riding a bike on the street.", "A lady on a red bike."],
}
PERFECT = {image_id: refs[0] for image_id, refs in REFERENCES.items()}
POOR = {image_id: "a" for image_id in REFERENCES}


@pytest.fixture(scope="module")
def evaluator():
    with Evaluator() as evaluator:
        yield evaluator


@needs_scoring
@pytest.mark.slow  # a JVM start for METEOR
def test_perfect_candidates_score_high_and_poor_ones_low(evaluator):
    perfect, poor = evaluator.score(REFERENCES, PERFECT), evaluator.score(REFERENCES, POOR)
    names = {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "METEOR", "ROUGE_L", "CIDEr"}
    assert names <= perfect.metrics.keys() and names <= poor.metrics.keys()
    assert perfect.metrics["Bleu_4"] > 0.7 and perfect.metrics["CIDEr"] > 1.0 and perfect.metrics["METEOR"] > 0.4
    assert poor.metrics["Bleu_4"] < 1e-3 and poor.metrics["CIDEr"] < 0.1
    assert all(perfect.metrics[name] > poor.metrics[name] for name in names)
    assert perfect.per_image_cider.keys() == REFERENCES.keys()
    assert np.mean(list(perfect.per_image_cider.values())) == pytest.approx(perfect.metrics["CIDEr"])


@needs_scoring
@pytest.mark.slow  # a JVM start for METEOR
def test_spice_is_skipped_with_a_reason_when_its_jars_are_absent(evaluator):
    if spice_skip_reason() is None:
        pytest.skip("the SPICE jars are installed here")
    scores = evaluator.score(REFERENCES, PERFECT)
    assert "SPICE" not in scores.metrics
    assert SPICE_JARS[0] in scores.skipped["SPICE"]


@needs_scoring
@pytest.mark.slow  # a JVM start for METEOR
def test_meteor_process_is_reused_across_calls_and_stopped_on_close(evaluator):
    # Closes the shared evaluator: kept after the other tests that use it, or they would start a new JVM.
    evaluator.score(REFERENCES, PERFECT)
    meteor = evaluator._meteor
    process = meteor.meteor_p
    evaluator.score(REFERENCES, POOR)
    assert evaluator._meteor is meteor and process.poll() is None
    evaluator.close()
    assert process.returncode is not None and process.stdout.closed
    evaluator.close()  # idempotent, as the fixture closes it again


def test_spice_skip_reason_names_the_missing_jars(tmp_path):
    assert SPICE_JARS[1] in spice_skip_reason(tmp_path)
    for jar in SPICE_JARS:
        (tmp_path / jar).touch()
    assert spice_skip_reason(tmp_path) is None


def test_missing_java_names_the_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EdgecapError, match="default-jre-headless"):
        Evaluator().score(REFERENCES, PERFECT)


@needs_scoring
def test_candidates_need_references():
    with pytest.raises(ValueError, match="have no references"):
        Evaluator().score(REFERENCES, {"unknown": "a dog"})


def test_bootstrap_ci_contains_the_true_difference_and_is_deterministic():
    rng = np.random.default_rng(1)
    a = rng.normal(1.0, 0.5, size=2000)
    b = a + 0.1 + rng.normal(0.0, 0.2, size=2000)  # true mean difference 0.1
    low, high = paired_bootstrap_ci(a, b)
    assert low < 0.1 < high and low < np.mean(b - a) < high
    assert high - low < 0.05
    assert paired_bootstrap_ci(a, b) == (low, high)
    assert paired_bootstrap_ci(a, b, seed=1) != (low, high)
    with pytest.raises(ValueError, match="equal-length"):
        paired_bootstrap_ci(a, b[:-1])

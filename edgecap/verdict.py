"""The parity gate's rule, on its own so the INT8 search (torch-free) stops on the same rule parity judges by.

Non-inferiority on the paired-bootstrap 95% interval of ΔCIDEr: a candidate passes when the interval's lower bound
is above -threshold, fails when its upper bound is below it, and is otherwise inconclusive, with about how many
photos would decide it. An improvement never fails.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Threshold:
    max_delta_cider: float  # |ΔCIDEr| on the 0-100 scale
    min_identical_rate: float  # share of captions identical to PyTorch's


THRESHOLDS = {
    "fp32": Threshold(0.1, 0.99),
    "fp16": Threshold(0.5, 0.95),
    "int8": Threshold(1.0, 0.0),
}


GATE_RULE = ("non-inferiority on the paired-bootstrap 95% interval of ΔCIDEr: pass when its lower bound is above "
             "-threshold and the identical-caption rate clears its bar; fail when its upper bound is below -threshold "
             "or the rate misses its bar; otherwise inconclusive, too few photos to tell. An improvement never fails.")
MAX_PHOTOS_TO_DECIDE = 1_000_000


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "pass", "fail" or "inconclusive"
    reasons: tuple[str, ...]  # why it failed, or why it could not decide
    photos_to_decide: int | None = None  # inconclusive: about how many photos would decide it


def gate(delta: float, ci95: tuple[float, float], identical: float, n_images: int, threshold: Threshold) -> Verdict:
    """The verdict of the non-inferiority rule (``GATE_RULE``) on one comparison of ``n_images`` photos.

    An interval's half-width shrinks as 1/sqrt(photos), so the photos that would separate it from -threshold are
    about ``n_images * (half-width / distance)**2``: the estimate for an inconclusive verdict.
    """
    bound, (low, high) = -threshold.max_delta_cider, ci95
    rate = f"identical captions {100 * identical:.1f}% < {100 * threshold.min_identical_rate:.0f}%"
    if identical < threshold.min_identical_rate:
        return Verdict("fail", (rate,))
    if high < bound:
        return Verdict("fail", (f"ΔCIDEr {delta:+.2f}: its whole 95% interval ({low:+.2f} .. {high:+.2f}) lies below "
                                f"{bound:+g}",))
    if low > bound:
        return Verdict("pass", ())
    distance = abs(delta - bound)
    half_width = (delta - low) if delta > bound else (high - delta)
    needed = MAX_PHOTOS_TO_DECIDE if distance == 0 else int(np.ceil(n_images * (half_width / distance) ** 2))
    return Verdict("inconclusive", (f"ΔCIDEr {delta:+.2f} with a 95% interval {low:+.2f} .. {high:+.2f} that reaches "
                                    f"across {bound:+g}: {n_images} photos are too few to tell",),
                   min(max(needed, n_images + 1), MAX_PHOTOS_TO_DECIDE))


def judge(reference: np.ndarray, candidate: np.ndarray, threshold: float) -> tuple[float, tuple[float, float], Verdict]:
    """ΔCIDEr (candidate - reference), its paired-bootstrap 95% interval and the gate's verdict on per-image CIDEr-D
    scores (0-100) of the same photos, with no identical-caption bar."""
    delta = float(np.mean(candidate) - np.mean(reference))
    ci95 = paired_bootstrap_ci(reference, candidate)
    return delta, ci95, gate(delta, ci95, 1.0, len(reference), Threshold(threshold, 0.0))


def paired_bootstrap_ci(a: np.ndarray, b: np.ndarray, *, samples: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of ``mean(b - a)`` over paired per-item scores ``a``, ``b`` of shape (N,).

    Resampling the pairs, not each system alone, keeps the per-image correlation that makes small
    differences between two systems on the same images detectable.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape or not len(a):
        raise ValueError(f"paired_bootstrap_ci needs two equal-length 1-D arrays, got shapes {a.shape} and {b.shape}")
    difference = b - a
    rng = np.random.default_rng(seed)
    # One resample at a time: a (samples, N) index matrix would be 320 MB for a 40k-image split.
    means = [difference[rng.integers(0, len(difference), len(difference))].mean() for _ in range(samples)]
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)

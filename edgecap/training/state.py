"""Where a run stands: the counters that selection, early stopping and ``--resume`` read, saved in ``last.pt``."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class TrainState:
    phase: str = "xe"  # "xe", "scst" or "done"
    epoch: int = 0  # epochs finished in the current phase
    step: int = 0  # optimiser steps over both phases
    best_cider: float = -1.0  # best dev CIDEr-D overall: what best.pt holds
    phase_best: float = -1.0  # best dev CIDEr-D of the current phase
    bad_epochs: int = 0  # epochs since the phase's best: patience ends the phase
    hard_baseline: float = 0.0  # hard attention's moving-average baseline of log p(y|s,a)

    def record(self, dev_cider: float) -> bool:
        """Count an epoch's dev score; True if it is the best overall, so best.pt should change.

        Patience counts epochs without a better score in the current phase, not overall: a self-critical phase
        selected at beam 3 starts below the cross-entropy best and climbs past it only after a few epochs.
        """
        if dev_cider > self.phase_best:
            self.phase_best, self.bad_epochs = dev_cider, 0
        else:
            self.bad_epochs += 1
        improved = dev_cider > self.best_cider
        if improved:
            self.best_cider = dev_cider
        return improved

    def start_phase(self, phase: str) -> None:
        self.phase, self.epoch, self.bad_epochs, self.phase_best = phase, 0, 0, -1.0

    def to_json(self) -> dict:
        return asdict(self)

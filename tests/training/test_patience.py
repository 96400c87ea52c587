"""Early stopping: patience counts from the current phase's best, selection keeps the best overall."""

from edgecap.training.loop import record_dev_score


def _phase(state, scores):
    return [(record_dev_score(state, s), state["bad_epochs"]) for s in scores]


def test_a_self_critical_phase_below_the_cross_entropy_best_keeps_its_own_patience():
    state = {"best_cider": -1.0, "phase_best": -1.0, "bad_epochs": 0}
    assert _phase(state, [40.0, 48.2, 48.0]) == [(True, 0), (True, 0), (False, 1)]
    state.update(bad_epochs=0, phase_best=-1.0)  # what starting the self-critical phase does
    # Row (0j)'s dip: 45.5, 45.5, 47.0 under the cross-entropy 48.2, then past it.
    assert _phase(state, [45.5, 45.5, 47.0, 48.5, 48.4]) == [(False, 0), (False, 1), (False, 0), (True, 0), (False, 1)]
    assert state["best_cider"] == 48.5


def test_patience_runs_out_when_the_phase_stops_improving():
    state = {"best_cider": 50.0, "phase_best": -1.0, "bad_epochs": 0}
    assert [bad for _, bad in _phase(state, [45.0, 44.0, 44.9, 45.0])] == [0, 1, 2, 3]

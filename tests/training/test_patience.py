"""Early stopping: patience counts from the current phase's best, selection keeps the best overall."""

from edgecap.training.state import TrainState


def _phase(state, scores):
    return [(state.record(s), state.bad_epochs) for s in scores]


def test_a_self_critical_phase_below_the_cross_entropy_best_keeps_its_own_patience():
    state = TrainState()
    assert _phase(state, [40.0, 48.2, 48.0]) == [(True, 0), (True, 0), (False, 1)]
    state.start_phase("scst")
    # A self-critical phase that dips under the cross-entropy best of 48.2, then climbs past it.
    assert _phase(state, [45.5, 45.5, 47.0, 48.5, 48.4]) == [(False, 0), (False, 1), (False, 0), (True, 0), (False, 1)]
    assert state.best_cider == 48.5 and state.phase == "scst"


def test_patience_runs_out_when_the_phase_stops_improving():
    state = TrainState(best_cider=50.0)
    assert [bad for _, bad in _phase(state, [45.0, 44.0, 44.9, 45.0])] == [0, 1, 2, 3]

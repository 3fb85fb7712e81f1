"""Every occurrence of every event (``t_events``, ``y_events``), ``terminal=n`` and a zero at the
start, against ``scipy.integrate.solve_ivp`` and closed forms; their files and restarts.

References: the rotation u'' = -u from (1, 0) gives u = (cos t, -sin t): cos t = 0 at
pi/2 + k pi, -sin t = 1/2 at 7 pi/6 + 2 k pi and 11 pi/6 + 2 k pi; ``solve_ivp`` (DOP853,
rtol 1e-12) with the same event functions gives ``t_events`` and, with ``terminal=n``, stops at
the n-th occurrence; the uninterrupted solve is the reference of a restart, bit for bit.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import ctformer
from ctformer import Event, SaveAt, labelled, solvers
from ctformer.discretizations import GaussLegendre
from ctformer.solvers import Piecewise, PIController, SplitProblem
from ctformer.solvers.restart import restart_point

from .conftest import read_back_solution as _read_back

ROTATION = np.array([[0.0, 1.0], [-1.0, 0.0]])
OSCILLATOR = Piecewise.single(SplitProblem([lambda u: ROTATION @ u]), 10.0)
U0 = np.array([[1.0], [0.0]])
TIGHT = PIController(rtol=1e-10, atol=1e-12)


def _reference(terminal=None):
    """solve_ivp's t_events of cos t = 0 and -sin t = 1/2 on [0, 10]."""
    def cosine(t, y):
        return y[0]

    def sine(t, y):
        return y[1] - 0.5

    if terminal is not None:
        sine.terminal = terminal
    return solve_ivp(lambda t, y: [y[1], -y[0]], (0.0, 10.0), [1.0, 0.0], method="DOP853",
                     rtol=1e-12, atol=1e-14, events=[cosine, sine])


def _events(terminal=False):
    return [Event(lambda t, u: float(u[0, 0]), terminal=False),
            Event(lambda t, u: float(u[1, 0]) - 0.5, terminal=terminal)]


def test_every_occurrence_of_every_event_as_solve_ivp():
    """Before: only the first event's state was kept (Solution had no t_events, y_events)."""
    ref = _reference()
    sol = solvers.integrate(OSCILLATOR, U0, TIGHT, scheme=solvers.get("dopri5"), events=_events())
    assert len(sol.t_events) == len(sol.y_events) == 2 and sol.events_before == (0, 0)
    for mine, theirs in zip(sol.t_events, ref.t_events):
        assert mine.dtype == np.float64
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-9)
    np.testing.assert_allclose(sol.t_events[0], [math.pi / 2 + k * math.pi for k in range(3)],
                               rtol=0, atol=1e-9)
    for times, states in zip(sol.t_events, sol.y_events):
        assert states.shape == (len(times), 2, 1)
        np.testing.assert_allclose(states[:, 0, 0], np.cos(times), rtol=0, atol=1e-9)
        np.testing.assert_allclose(states[:, 1, 0], -np.sin(times), rtol=0, atol=1e-9)
    # the first occurrence is still the Solution's event, and stats keep their order
    assert sol.event_time == sol.t_events[0][0] and sol.event_index == 0
    assert sorted(t for _, t in sol.stats["events"]) == sorted(np.concatenate(sol.t_events))
    none = solvers.integrate(OSCILLATOR, U0, TIGHT, scheme=solvers.get("dopri5"))
    assert none.t_events is None and none.y_events is None and none.events_before is None


@pytest.mark.parametrize("n", [1, 2, 3])
def test_terminal_count_stops_at_the_nth_occurrence_as_solve_ivp(n):
    """Before: Event(..., terminal=2) raised TypeError 'terminal must be True or False'."""
    ref = _reference(terminal=n)
    sol = solvers.integrate(OSCILLATOR, U0, TIGHT, scheme=solvers.get("dopri5"),
                            events=_events(terminal=n), save_at=SaveAt(steps=True))
    assert len(sol.t_events[1]) == n and sol.event_terminal and sol.event_index == 1
    assert abs(sol.event_time - ref.t[-1]) <= 1e-9 and ref.status == 1
    assert sol.times[-1] == sol.stats["step_times"][-1] == sol.event_time
    for mine, theirs in zip(sol.t_events, ref.t_events):   # nothing after the stop
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-9)
    assert abs(float(sol.final[1, 0]) - 0.5) <= 1e-9


@pytest.mark.parametrize("direction, fires", [(0, True), (1, True), (-1, False)])
def test_a_zero_at_the_start_fires_as_in_solve_ivp(direction, fires):
    """u' = 1 from u = 0, g = u: solve_ivp reports t = 0 for directions 0 and 1, not for -1.
    Before: the solve never fired there; a terminal one now ends the solve at its start."""
    def g(t, y):
        return y[0]

    g.direction = direction
    ref = solve_ivp(lambda t, y: [1.0], (0.0, 1.0), [0.0], events=g).t_events[0]
    assert ref.tolist() == ([0.0] if fires else [])
    clock = Piecewise.single(SplitProblem([lambda u: np.ones_like(u)]), 1.0)
    for control in (4, PIController(rtol=1e-8, atol=1e-10)):
        event = Event(lambda t, u: float(u[0, 0]), terminal=False, direction=direction)
        sol = solvers.integrate(clock, np.zeros((1, 1)), control, scheme=solvers.get("rk4"),
                                events=[event])
        assert sol.t_events[0].tolist() == ref.tolist()
        stop = solvers.integrate(clock, np.zeros((1, 1)), control, scheme=solvers.get("rk4"),
                                 events=[Event(event.condition, direction=direction)])
        assert stop.event_terminal == fires
        assert stop.times[-1] == (0.0 if fires else 1.0)
        assert abs(float(stop.final[0, 0]) - stop.times[-1]) <= 1e-15


def test_a_restart_from_a_zero_at_its_start_does_not_fire_again():
    """u' = 1 on two layers, g = u - 1 vanishes exactly at the layer boundary t = 1 (euler): the
    saved solve found that occurrence; the restart from t = 1 does not count it twice."""
    clock = Piecewise.layers([SplitProblem([lambda u: np.ones_like(u)])] * 2)
    event = Event(lambda t, u: float(u[0, 0]) - 1.0, terminal=False)
    full = solvers.integrate(clock, np.zeros((1, 1)), 2, scheme=solvers.get("euler"),
                             events=[event], save_at=SaveAt(layers=True))
    assert full.t_events[0].tolist() == [1.0]
    part = solvers.integrate(Piecewise.layers(clock.problems[:1]), np.zeros((1, 1)), 2,
                             scheme=solvers.get("euler"), events=[event], save_at=SaveAt(layers=True))
    start = restart_point(part, controlled=False, boundaries=(0.0, 1.0, 2.0))
    assert start.events_before == (1,)
    rest = solvers.integrate(Piecewise.layers(clock.problems, t0=1.0), start.u0, 2,
                             scheme=solvers.get("euler"), events=[event], start=start)
    assert rest.t_events[0].tolist() == [] and rest.events_before == (1,)


# -- files and restarts of a model's solve ------------------------------------------------------------
MODEL = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
GRIDS = dict(tokens=GaussLegendre(8), features=GaussLegendre(6))
EVERY = SaveAt(steps=True)


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


def _model_events(terminal=False):
    """max u crosses 1 near 0.35 (up) and 1.12 (down); mean u + 0.32 near 1.9 and 2.5."""
    return [Event(lambda t, u: float(np.max(u)) - 1.0, terminal=terminal),
            Event(lambda t, u: float(np.mean(u)) + 0.32, terminal=False)]


def test_every_occurrence_round_trips_bit_for_bit(tmp_path):
    """Before: the files held the first event's state only."""
    sol = MODEL.evolve(_u0, rtol=1e-8, save_at=EVERY, events=_model_events(), **GRIDS)
    assert [len(t) for t in sol.t_events] == [2, 2]
    for i, event in enumerate(_model_events()):   # each state is where its condition vanishes
        for t, y in zip(sol.t_events[i], sol.y_events[i]):
            assert abs(event.condition(t, y)) <= 1e-9
    for label, back in _read_back(sol, tmp_path).items():
        assert back.events_before == (0, 0), label
        for mine, theirs in zip(back.t_events, sol.t_events):
            assert mine.tobytes() == theirs.tobytes(), label
        for mine, theirs in zip(back.y_events, sol.y_events):
            assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, label
            assert mine.tobytes() == theirs.tobytes(), label
    none = MODEL.evolve(_u0, rtol=1e-6, events=[Event(lambda t, u: 5.0)], **GRIDS)
    assert none.t_events[0].shape == (0,) and none.y_events[0].shape == (0, 8, 6)
    for label, back in _read_back(none, tmp_path).items():
        assert back.t_events[0].shape == (0,) and back.y_events[0].shape == (0, 8, 6), label


def test_a_restart_counts_the_occurrences_of_the_saved_solve(tmp_path):
    """terminal=2 on max u = 1: the uninterrupted solve stops near 1.12 (the second crossing).
    The restart from a file cut after the first crossing stops there too, with the same bits;
    counting afresh it would have run to the end (no second crossing after the cut)."""
    events = _model_events(terminal=2)
    full = MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, events=events, **GRIDS)
    assert full.event_terminal and 1.1 < full.event_time < 1.2 and len(full.t_events[0]) == 2
    with pytest.raises(solvers.MaxStepsReached) as info:
        MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, events=events, max_steps=6, **GRIDS)
    part = info.value.solution
    k = len(part.times) - 1
    assert part.t_events[0][0] < part.times[-1] < full.t_events[0][1]
    for label, back in _read_back(part, tmp_path).items():
        rest = MODEL.evolve(None, rtol=1e-7, save_at=EVERY, events=events, initial=back, **GRIDS)
        assert rest.events_before == (1, 0), label
        assert rest.event_time == full.event_time and rest.event_terminal, label
        assert rest.event_state.tobytes() == full.event_state.tobytes(), label
        assert rest.states.tobytes() == full.states[k:].tobytes(), label
        assert rest.t_events[0].tolist() == full.t_events[0][1:].tolist(), label
    with pytest.raises(ValueError, match=r"saved solve had 2 events, this one 1.*pass those events"):
        MODEL.evolve(None, rtol=1e-7, events=events[:1], initial=part, **GRIDS)

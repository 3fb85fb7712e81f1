"""Events against SciPy's ``solve_ivp`` and closed forms; a terminal event's Solution ends at it.

References: u' = -u gives u = exp(-t), which is 1/2 at ln 2; the rotation u'' = -u from
(1, 0) gives u = cos t, zero at pi/2 + k pi (downward for even k); ``scipy.integrate.solve_ivp``
with the same event functions (its ``t_events``); the uninterrupted solve, which takes the same
steps up to the event.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from ctformer import Event, SaveAt, solvers
from ctformer.solvers import Piecewise, PIController, SplitProblem
from ctformer.solvers.restart import restart_point

DECAY = Piecewise.single(SplitProblem([lambda u: -u]), 2.0)            # u = exp(-t)
ROTATION = np.array([[0.0, 1.0], [-1.0, 0.0]])
OSCILLATOR = Piecewise.single(SplitProblem([lambda u: ROTATION @ u]), 10.0)   # u[0] = cos t
HALF = Event(lambda t, u: float(u[0, 0]) - 0.5, direction=-1)


def _decay(control, events, save_at=None, scheme="tsit5"):
    return solvers.integrate(DECAY, np.ones((1, 1)), control, scheme=solvers.get(scheme),
                             events=events, save_at=save_at)


# -- a terminal event's Solution ends at the event ----------------------------------------------------
def test_controlled_terminal_event_step_record_ends_at_the_event():
    """Before: step_times ended at 0.8398 (the full step) while the solve ended at ln 2 = 0.6931,
    and step_sizes/step_errors had 6 entries for 7 accepted steps."""
    control = PIController(rtol=1e-6, atol=1e-9)
    sol = _decay(control, [HALF], SaveAt(steps=True))
    full = _decay(control, [], SaveAt(steps=True))        # the same steps, without the event
    k = sol.stats["accepted"]
    assert abs(sol.event_time - math.log(2)) <= 1e-8 and sol.event_terminal
    assert sol.stats["step_times"][-1] == sol.event_time == sol.times[-1]
    assert full.stats["step_times"][k - 1] > sol.event_time   # the event lay inside step k
    np.testing.assert_array_equal(sol.stats["step_times"][:-1], full.stats["step_times"][:k - 1])
    # the step that met the event was computed in full: counted, sized and estimated as such
    assert len(sol.stats["step_sizes"]) == len(sol.stats["step_errors"]) == k
    np.testing.assert_array_equal(sol.stats["step_sizes"], full.stats["step_sizes"][:k])
    np.testing.assert_array_equal(sol.stats["step_errors"], full.stats["step_errors"][:k])
    assert sol.stats["rhs_evaluations"] >= 1 + 6 * k   # FSAL tsit5: 6 new stages per step
    assert abs(float(sol.final[0, 0]) - 0.5) <= 1e-8


def test_fixed_step_terminal_event_step_record_ends_at_the_event():
    """rk4, 4 steps of 0.5: the event lies in the second step. Before: step_times [0.5, 1.0]."""
    sol = _decay(4, [HALF], scheme="rk4")
    assert sol.stats["accepted"] == 2
    np.testing.assert_array_equal(sol.stats["step_times"], [0.5, sol.event_time])
    assert 0.5 < sol.event_time < 1.0 and abs(sol.event_time - math.log(2)) <= 4e-4


def test_non_terminal_event_has_its_state_and_the_solve_goes_on():
    """Before: event_state was None for a non-terminal event (event_time 0.6931 set)."""
    sol = _decay(PIController(rtol=1e-10, atol=1e-13), [Event(HALF.condition, terminal=False)],
                 SaveAt(dense=True))
    assert not sol.event_terminal and abs(sol.event_time - math.log(2)) <= 1e-10
    assert abs(float(sol.event_state[0, 0]) - 0.5) <= 1e-10
    assert sol.stats["step_times"][-1] == 2.0 and sol.times[-1] == 2.0
    assert abs(float(sol.evaluate(1.5)[0, 0]) - math.exp(-1.5)) <= 1e-10   # past the event
    # fixed steps: the state on the step's Hermite interpolant, where the condition is zero
    sol = _decay(4, [Event(HALF.condition, terminal=False)], scheme="rk4")
    assert abs(float(sol.event_state[0, 0]) - 0.5) <= 1e-12


def test_a_restart_at_a_terminal_event_is_refused():
    """Before: refused as 'an interpolated SaveAt time', which it is not."""
    sol = _decay(PIController(rtol=1e-6, atol=1e-9), [HALF], SaveAt(steps=True))
    with pytest.raises(ValueError, match=r"terminal event at t=0\.693.*u0=initial\.event_state"):
        restart_point(sol, controlled=True, boundaries=(0.0, 2.0))
    # fixed steps (before: 'restarts at a layer boundary ... save with SaveAt(layers=True)')
    sol = _decay(4, [HALF], SaveAt(layers=True), scheme="rk4")
    with pytest.raises(ValueError, match=r"terminal event at t=0\.693.*u0=initial\.event_state"):
        restart_point(sol, controlled=False, boundaries=(0.0, 2.0))
    # an event on a layer boundary is a step end: a fixed-step restart continues from there
    clock = Piecewise.layers([SplitProblem([lambda u: np.ones_like(u)])] * 2)
    sol = solvers.integrate(clock, np.zeros((1, 1)), 2, scheme=solvers.get("euler"),
                            events=[Event(lambda t, u: float(u[0, 0]) - 1.0)],
                            save_at=SaveAt(layers=True))
    assert sol.event_terminal and sol.event_time == 1.0 and sol.times.tolist() == [0.0, 1.0]
    assert restart_point(sol, controlled=False, boundaries=(0.0, 1.0, 2.0)).t0 == 1.0


def test_an_event_at_the_start_of_its_step_is_saved_once():
    """rk4 gives u(1) = 1 - 2**-53 at the layer boundary, so the crossing of u = 1 is found in
    the next step, at its start t = 1 (the root finder's tolerance). Before: times [0, 1, 1],
    the boundary state saved twice; now [0, 1], as a boundary that holds the event."""
    clock = Piecewise.layers([SplitProblem([lambda u: np.ones_like(u)])] * 2)
    for save_at in (SaveAt(layers=True), SaveAt(steps=True)):
        sol = solvers.integrate(clock, np.zeros((1, 1)), 2, scheme=solvers.get("rk4"),
                                events=[Event(lambda t, u: float(u[0, 0]) - 1.0)],
                                save_at=save_at)
        assert sol.event_time == 1.0 and sol.stats["accepted"] == 3
        assert sol.times[-1] == 1.0 and np.all(np.diff(sol.times) > 0), sol.times
        np.testing.assert_allclose(sol.states[:, 0, 0], sol.times, rtol=0, atol=1e-15)
        assert sol.stats["step_times"].tolist() == [0.5, 1.0, 1.0]   # the third step, cut at 1


# -- direction, counts and location against solve_ivp -------------------------------------------------
@pytest.mark.parametrize("direction", [0, 1, -1])
def test_directions_match_solve_ivp(direction):
    def g(t, y):
        return y[0]

    g.direction = direction
    ref = solve_ivp(lambda t, y: [y[1], -y[0]], (0.0, 10.0), [1.0, 0.0], method="DOP853",
                    rtol=1e-12, atol=1e-14, events=g).t_events[0]
    exact = [math.pi / 2 + k * math.pi for k in range(3)
             if direction == 0 or (direction == -1) == (k % 2 == 0)]
    np.testing.assert_allclose(ref, exact, rtol=0, atol=1e-10)
    u0 = np.array([[1.0], [0.0]])
    control = PIController(rtol=1e-10, atol=1e-12)
    sol = solvers.integrate(OSCILLATOR, u0, control, scheme=solvers.get("dopri5"),
                            events=[Event(lambda t, u: float(u[0, 0]), terminal=False,
                                          direction=direction)])
    assert [i for i, _ in sol.stats["events"]] == [0] * len(exact)
    np.testing.assert_allclose([t for _, t in sol.stats["events"]], ref, rtol=0, atol=1e-9)
    assert sol.event_time == sol.stats["events"][0][1] and sol.times[-1] == 10.0
    # terminal: solve_ivp stops at its first event; so does the solve, with the state there
    stop = solvers.integrate(OSCILLATOR, u0, control, scheme=solvers.get("dopri5"),
                             events=[Event(lambda t, u: float(u[0, 0]), direction=direction)])
    assert abs(stop.event_time - ref[0]) <= 1e-9 and stop.times[-1] == stop.event_time
    np.testing.assert_allclose(stop.final[:, 0], [0.0, -math.sin(ref[0])], rtol=0, atol=1e-9)


@pytest.mark.parametrize("scheme, rtol, tol", [("bosh3", 1e-8, 2e-8), ("dopri5", 1e-8, 2e-9),
                                              ("tsit5", 1e-8, 2e-9), ("rk4", 1e-8, 2e-8)])
def test_event_location_within_the_tolerance_of_the_closed_form(scheme, rtol, tol):
    """ln 2 within the solve's tolerance (solve_ivp's RK45 at rtol 1e-8: 7.8e-10 off)."""
    sol = _decay(PIController(rtol=rtol, atol=1e-3 * rtol), [HALF], scheme=scheme)
    assert abs(sol.event_time - math.log(2)) <= tol


def test_fixed_step_event_location_converges_with_the_scheme_order():
    """rk4 and the Hermite interpolant: error O(h^4) (ratios 15.7, 24.8, 10.7 at h = 1/2 ... 1/16)."""
    errors = [abs(_decay(k, [HALF], scheme="rk4").event_time - math.log(2)) for k in (4, 8, 16, 32)]
    orders = np.log2(np.array(errors[:-1]) / np.array(errors[1:]))
    assert errors[0] <= 4e-4 and np.all(orders > 3.3), (errors, orders)


@pytest.mark.parametrize("terminal, bad", [(-1, ValueError), (2.0, TypeError), ("2", TypeError)])
def test_a_count_of_occurrences_that_is_not_one_is_refused_by_name(terminal, bad):
    """terminal=n is solve_ivp's count (tests/test_events_audit2_occurrences.py); a negative, float or
    text count is refused by name, as solve_ivp refuses it."""
    with pytest.raises(bad, match=r"terminal must be True, False or a count n >= 1"):
        Event(lambda t, u: 0.0, terminal=terminal)
    assert Event(lambda t, u: 0.0, terminal=np.int64(3)).terminal == 3
    assert Event(lambda t, u: 0.0, terminal=1).terminal is True
    assert Event(lambda t, u: 0.0, terminal=0).terminal is False


def test_a_zero_at_the_start_is_an_occurrence_as_in_solve_ivp():
    """u = t from 0 with g = u: solve_ivp reports t = 0, and so does the solve (before: nothing)."""
    clock = Piecewise.single(SplitProblem([lambda u: np.ones_like(u)]), 1.0)
    assert solve_ivp(lambda t, y: [1.0], (0.0, 1.0), [0.0],
                     events=lambda t, y: y[0]).t_events[0].tolist() == [0.0]
    sol = solvers.integrate(clock, np.zeros((1, 1)), 4, scheme=solvers.get("rk4"),
                            events=[Event(lambda t, u: float(u[0, 0]), terminal=False)])
    assert sol.stats["events"] == [(0, 0.0)] and sol.event_time == 0.0
    assert float(sol.event_state[0, 0]) == 0.0


def test_a_boolean_depth_is_refused():
    """Before: evaluate(True) was read as the depth 1 and returned exp(-1)."""
    sol = _decay(PIController(rtol=1e-10, atol=1e-13), [], SaveAt(dense=True))
    assert abs(float(sol.evaluate(1.0)[0, 0]) - math.exp(-1.0)) <= 1e-10
    for t in (True, np.bool_(False), np.array([True, False])):
        with pytest.raises(TypeError, match="t must be a depth or an array of depths"):
            sol.evaluate(t)

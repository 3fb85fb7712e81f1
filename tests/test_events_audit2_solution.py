"""Dense output, statistics and restarts of a Solution against independent references.

References: u' = -u (u = exp(-t)); ``scipy.integrate.solve_ivp``'s RK45 dense output (the same
Dormand-Prince continuous extension); the cubic Hermite formula of Hairer, Norsett, Wanner I
(6.7) computed here; a right-hand side that counts its own calls; the uninterrupted solve.
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

from .conftest import require


class _Counted:
    """-u, counting its own calls (the reference for stats['rhs_evaluations'])."""

    def __init__(self, stop_at=None):
        self.calls, self.stop_at = 0, stop_at

    def __call__(self, u):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt  # Ctrl-C inside a right-hand side
        return -u


def _decay(rhs, t1=2.0):
    return Piecewise.single(SplitProblem([rhs]), t1)


HALF = Event(lambda t, u: float(u[0, 0]) - 0.5, terminal=False)


@pytest.mark.parametrize("control, scheme, calls", [(4, "rk4", 18),
                                                   (PIController(rtol=1e-6, atol=1e-9), "rk4", 220),
                                                   (PIController(rtol=1e-6, atol=1e-9), "tsit5", 86)])
def test_event_location_is_counted_once(control, scheme, calls):
    """The Hermite slopes of the step that holds an event were counted twice. Before: 20
    for 18 calls (rk4, fixed steps) and 222 for 220 (rk4, step doubling)."""
    rhs = _Counted()
    sol = solvers.integrate(_decay(rhs), np.ones((1, 1)), control, scheme=solvers.get(scheme),
                            events=[HALF])
    assert abs(sol.event_time - math.log(2)) <= 4e-4
    assert rhs.calls == calls and sol.stats["rhs_evaluations"] == calls


def test_an_interrupt_reports_the_evaluations_made():
    """Ctrl-C at the 60th call of a fixed-step solve with an event. Before: 62 reported."""
    rhs = _Counted(stop_at=60)
    with pytest.raises(solvers.SolveInterrupted, match=r"step 9 of 24.*kept 10 states") as info:
        solvers.integrate(Piecewise.layers([SplitProblem([rhs])] * 3), np.ones((1, 1)), 8,
                          scheme=solvers.get("tsit5"), events=[HALF], save_at=SaveAt(steps=True))
    part = info.value.result
    assert part.stats["rhs_evaluations"] == rhs.calls == 60 and part.stats["accepted"] == 9
    assert part.times[-1] == part.stats["step_times"][-1] == 1.125
    np.testing.assert_allclose(part.states[:, 0, 0], np.exp(-part.times), rtol=0, atol=1e-9)


def test_evaluate_on_an_empty_array_of_depths():
    """Before: IndexError 'list index out of range'; now an empty stack of states."""
    sol = solvers.integrate(_decay(_Counted()), np.ones((1, 1)), PIController(rtol=1e-8),
                            scheme=solvers.get("tsit5"), save_at=SaveAt(dense=True))
    for ts in (np.array([]), np.zeros((0, 3))):
        out = sol.evaluate(ts)
        assert out.shape == ts.shape + (1, 1) and out.dtype == np.float64
    np.testing.assert_allclose(sol.evaluate([[0.5, 1.0]])[..., 0, 0], np.exp([[-0.5, -1.0]]),
                               rtol=0, atol=1e-8)


def test_dense_output_controlled_pair_and_fixed_steps():
    """Controlled dopri5: its own continuous extension, that of solve_ivp's RK45 (local error
    O(h^5)); fixed steps keep no stages: the cubic Hermite interpolant (O(h^4)), as documented."""
    h, theta = 0.4, np.linspace(0.05, 0.95, 19)
    one = PIController(rtol=1e3, atol=1e3, dt0=h)   # one accepted step of h
    sol = solvers.integrate(_decay(_Counted(), h), np.ones((1, 1)), one,
                            scheme=solvers.get("dopri5"), save_at=SaveAt(dense=True))
    assert sol.stats["accepted"] == 1
    ref = solve_ivp(lambda t, y: -y, (0, h), [1.0], method="RK45", first_step=h, max_step=h,
                    rtol=1e3, atol=1e3, dense_output=True)
    np.testing.assert_allclose(sol.evaluate(theta * h)[:, 0, 0], ref.sol(theta * h)[0],
                               rtol=0, atol=1e-15)
    fixed = solvers.integrate(_decay(_Counted(), h), np.ones((1, 1)), 1,
                              scheme=solvers.get("dopri5"), save_at=SaveAt(dense=True))
    u1 = float(fixed.final[0, 0])
    hermite = ((1 - theta) + theta * u1 + theta * (theta - 1)
               * ((1 - 2 * theta) * (u1 - 1) + (theta - 1) * h * -1.0 + theta * h * -u1))
    np.testing.assert_allclose(fixed.evaluate(theta * h)[:, 0, 0], hermite, rtol=0, atol=1e-15)


def test_a_restart_with_other_controller_settings_is_refused(tmp_path):
    """safety 0.8 instead of 0.9 chooses other steps (before: accepted silently, step times
    off the uninterrupted solve's, end state 5.7e-12 away); now refused by name, in memory and
    from a file."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
    grids = dict(tokens=GaussLegendre(8), features=GaussLegendre(6))

    def u0(x, y):
        return np.cos(3 * y + np.sin(np.pi * x))

    with pytest.raises(solvers.MaxStepsReached) as info:
        model.evolve(u0, rtol=1e-7, save_at=SaveAt(steps=True), max_steps=6, **grids)
    part = info.value.solution
    assert part.control == {"pcoeff": 0.4, "icoeff": 0.3, "safety": 0.9, "factor_min": 0.2,
                            "factor_max": 10.0}
    require("h5netcdf")
    part.to_netcdf(tmp_path / "p.nc")
    back = labelled.open_dataset(tmp_path / "p.nc")
    full = model.evolve(u0, rtol=1e-7, save_at=SaveAt(steps=True), **grids)
    for initial in (part, back):
        with pytest.raises(ValueError, match=r"another computation \(safety: saved 0\.9, now 0\.8\)"):
            model.evolve(None, controller=PIController(rtol=1e-7, safety=0.8), initial=initial,
                         **grids)
        same = model.evolve(None, controller=PIController(rtol=1e-7, max_steps=50, dt0=0.3),
                            save_at=SaveAt(steps=True), initial=initial, **grids)
        assert same.states.tobytes() == full.states[6:].tobytes()   # dt0, max_steps: no matter

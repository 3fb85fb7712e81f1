"""Audit of the schemes' error control: embedded pairs on projecting problems, the starting
step's interval, the norm of an empty state, and the step counts against scipy's RK45/RK23."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import solve_ivp

import ctformer
from ctformer import solvers
from ctformer.discretizations import GaussLegendre
from ctformer.solvers import PIController, Piecewise, SplitProblem, rms, weighted_rms
from ctformer.solvers.steppers import DoublingStepper, PairStepper, stepper_for

_RNG = np.random.default_rng(1)
_A, _B = _RNG.standard_normal((3, 3)), _RNG.standard_normal((3, 3))
_U0 = _RNG.standard_normal(3)
_U0 /= np.linalg.norm(_U0)


def _sphere_problem():
    """u' = A u + tanh(B u), projected onto the unit sphere after the step (not a retraction:
    the flow is not tangent), whose limit is the projected flow u' = (I - u u^T) F(u)."""
    return SplitProblem((lambda u: _A @ u, lambda u: np.tanh(_B @ u)),
                        projections=(None, lambda u: u / np.linalg.norm(u)))


def _projected_flow_reference(t_end):
    def rhs(_, u):
        f = _A @ u + np.tanh(_B @ u)
        return f - u * (u @ f) / (u @ u)
    return solve_ivp(rhs, (0.0, t_end), _U0, method="DOP853", rtol=1e-13, atol=1e-13).y[:, -1]


def test_a_pair_is_controlled_by_step_doubling_where_projections_lower_its_order():
    problem = _sphere_problem()
    tsit5 = solvers.get("tsit5")
    assert tsit5.order(problem) == 1.0
    assert isinstance(stepper_for(tsit5), PairStepper)
    assert isinstance(stepper_for(tsit5, 5.0), PairStepper)
    doubling = stepper_for(tsit5, tsit5.order(problem))
    assert isinstance(doubling, DoublingStepper) and doubling.scheme_order == 1.0
    exact = _projected_flow_reference(2.0)
    for name in ("tsit5", "dopri5", "bosh3"):
        scheme = solvers.get(name)
        sol = solvers.integrate(Piecewise.single(problem, 2.0), _U0, PIController(1e-5, 1e-5),
                                scheme=scheme, order=scheme.order(problem))
        # the pair's own estimate took 12 steps to an error of 7.3e-3 (tsit5): 730 x rtol
        assert np.linalg.norm(sol.final - exact) <= 10 * 1e-5, name


def test_evolve_with_a_pair_on_a_post_projection_model_meets_the_tolerance():
    grids = dict(tokens=GaussLegendre(6), features=GaussLegendre(5))
    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=1,
                                                         placement="post-projection")
    x = np.asarray(grids["tokens"].nodes)[:, None]
    y = np.asarray(grids["features"].nodes)[None, :]
    u0 = np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)
    u0 = model.blocks[0].split_problem(ctformer.Grids(**grids)).project_all(u0)  # on the set
    # every scheme is first order here: Richardson's extrapolation of fixed rk4 steps
    coarse, fine = (model.evolve(u0, steps_per_layer=k, scheme="rk4", **grids).final
                    for k in (1000, 2000))
    reference = 2 * fine - coarse
    sol = model.evolve(u0, scheme="tsit5", rtol=1e-5, atol=1e-5, **grids)
    # before: 3 steps and an error of 2.7e-3 (266 x the tolerance); now 77 steps, 3.3e-5
    assert np.abs(sol.final - reference).max() <= 10 * 1e-5


@pytest.mark.parametrize("t_end, match", [(0.5, "t_end = t0 = 0.5: the interval is empty"),
                                          (float("nan"), "t_end must be a finite real number")])
def test_initial_step_refuses_an_empty_or_nan_interval(t_end, match):
    # before: ZeroDivisionError for t_end = t0, and a step of 0.1 for t_end = NaN
    with pytest.raises(ValueError, match=match):
        PIController().initial_step(lambda t, u: -u, 0.5, np.ones(3), 4.0, t_end=t_end)


def test_the_norm_of_an_empty_error_is_zero():
    # before: ZeroDivisionError (0 / 0 entries)
    empty = np.zeros((0, 3, 4))
    assert rms(np.zeros(0), np.zeros(0), np.zeros(0), 1e-3, 1e-6) == 0.0
    assert weighted_rms(empty, empty, empty, 1e-3, 1e-6, (np.ones(3), np.ones(4))) == 0.0


def _van_der_pol(u):
    return np.array([u[1], (1.0 - u[0] ** 2) * u[1] - u[0]])


@pytest.mark.parametrize("name, reference", [("dopri5", "RK45"), ("bosh3", "RK23")])
@pytest.mark.parametrize("rtol", [1e-3, 1e-6])
def test_elementary_controller_takes_scipys_steps(name, reference, rtol):
    # same pair, norm, safety 0.9, factor bounds [0.2, 10], no growth after a rejection and
    # the HNW starting step: the accepted and rejected steps are scipy's, one for one
    atol, y0, t_end = rtol * 1e-3, np.array([2.0, 0.0]), 10.0
    ref = solve_ivp(lambda t, u: _van_der_pol(u), (0.0, t_end), y0, method=reference,
                    rtol=rtol, atol=atol)
    stages = 6 if name == "dopri5" else 3   # evaluations per attempted FSAL step
    ref_rejected = (ref.nfev - 2) // stages - (len(ref.t) - 1)  # 2: the starting step's
    control = PIController(rtol, atol, pcoeff=0.0, icoeff=1.0, norm="rms")
    sol = solvers.integrate(Piecewise.single(SplitProblem((_van_der_pol,)), t_end), y0,
                            control, scheme=solvers.get(name))
    assert (sol.stats["accepted"], sol.stats["rejected"]) == (len(ref.t) - 1, ref_rejected)
    # the step times agree to the rounding of the error estimate (a sum that cancels to
    # rtol-sized values, formed in another order than scipy's), amplified by err^(-1/k)
    np.testing.assert_allclose(sol.stats["step_times"], ref.t[1:], rtol=1e-5)


def test_integrate_lowers_a_pairs_order_on_a_projecting_problem_by_default():
    """``integrate`` without ``order`` reads the scheme's order on the problem: the projected
    problem's tsit5 solve meets the tolerance (the pair's own estimate missed it 730-fold)."""
    problem = _sphere_problem()
    exact = _projected_flow_reference(2.0)
    sol = solvers.integrate(Piecewise.single(problem, 2.0), _U0, PIController(1e-5, 1e-5),
                            scheme=solvers.get("tsit5"))
    assert np.linalg.norm(sol.final - exact) <= 10 * 1e-5

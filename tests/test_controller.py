"""The step-size controller and the weighted error norm, against independent references.

References: a hand-written double loop, closed-form integrals, scipy's starting-step
routine, and scipy's own adaptive loop on the same embedded pair.
"""
import inspect
import math

import numpy as np
import pytest
import scipy.integrate
import scipy.special
from scipy.integrate._ivp import common as ivp_common
from scipy.integrate._ivp.rk import RungeKutta as ScipyRungeKutta

from ctformer import Grids
from ctformer.discretizations import P1, ClenshawCurtis, GaussLegendre
from ctformer.solvers import ControllerState, PIController, grid_weights, rms, weighted_rms
from tests.conftest import require


# -- the norm -------------------------------------------------------------------------------
def _double_loop(e, u, v, rtol, atol, wx, wy):
    num = den = 0.0
    for b in range(e.shape[0]):
        for i in range(e.shape[1]):
            for j in range(e.shape[2]):
                w = wx[i] * wy[j]
                s = e[b, i, j] / (atol + rtol * max(abs(u[b, i, j]), abs(v[b, i, j])))
                num += w * s * s
                den += w
    return math.sqrt(num / den)


def _random_case(seed=0, shape=(3, 5, 4)):
    rng = np.random.default_rng(seed)
    e, u, v = (rng.standard_normal(shape) for _ in range(3))
    return e, u, v, rng.uniform(0.1, 2.0, shape[1]), rng.uniform(0.1, 2.0, shape[2])


def test_weighted_rms_equals_double_loop():
    e, u, v, wx, wy = _random_case()
    expected = _double_loop(e, u, v, 1e-3, 1e-4, wx, wy)
    assert weighted_rms(e, u, v, 1e-3, 1e-4, (wx, wy)) == pytest.approx(expected, rel=1e-13)
    # one axis uniform
    ones = np.ones(wy.size)
    assert weighted_rms(e, u, v, 1e-3, 1e-4, (wx, None)) == pytest.approx(
        _double_loop(e, u, v, 1e-3, 1e-4, wx, ones), rel=1e-13)


def test_uniform_weights_equal_rms_and_scipy_norm():
    e, u, v, wx, wy = _random_case(1)
    plain = rms(e, u, v, 1e-2, 1e-3)
    scale = 1e-3 + 1e-2 * np.maximum(np.abs(u), np.abs(v))
    assert plain == pytest.approx(ivp_common.norm((e / scale).ravel()) * 1.0, rel=1e-13)
    assert weighted_rms(e, u, v, 1e-2, 1e-3, (np.full(5, 0.2), np.full(4, 7.0))) == pytest.approx(
        plain, rel=1e-13)
    # particles: weight 1/n per particle is the plain RMS
    assert weighted_rms(e[0], u[0], v[0], 1e-2, 1e-3, (np.full(5, 1 / 5), None)) == pytest.approx(
        rms(e[0], u[0], v[0], 1e-2, 1e-3), rel=1e-13)


def test_weighted_rms_on_torch_equals_numpy():
    torch = require("torch")
    e, u, v, wx, wy = _random_case(2)
    t = [torch.asarray(a) for a in (e, u, v)]
    assert weighted_rms(*t, 1e-3, 1e-6, (wx, wy)) == pytest.approx(
        weighted_rms(e, u, v, 1e-3, 1e-6, (wx, wy)), rel=1e-13)
    t32 = [a.to(torch.float32) for a in t]
    assert weighted_rms(*t32, 1e-3, 1e-6, (wx, wy)) == pytest.approx(
        weighted_rms(e, u, v, 1e-3, 1e-6, (wx, wy)), rel=1e-5)


def test_weights_of_wrong_shape_are_refused():
    e, u, v, wx, wy = _random_case()
    with pytest.raises(ValueError, match="token weights must have shape \\(5,\\)"):
        weighted_rms(e, u, v, 1e-3, 1e-4, (wy, wy))
    with pytest.raises(ValueError, match="feature weights must be finite, non-negative"):
        weighted_rms(e, u, v, 1e-3, 1e-4, (wx, -wy))
    with pytest.raises(ValueError, match="equal shapes"):
        weighted_rms(e, u[0], v, 1e-3, 1e-4)


def test_weighted_norm_is_resolution_independent_unweighted_drifts():
    """e(x, y) = exp(x) (1 + y) on GaussLegendre(n) x ClenshawCurtis(9) on [0, 1]^2.

    Weighted: sqrt(int int e^2) = sqrt((e^2 - 1)/2 * 7/3) = 2.730182920993712 at every n
    (n = 8, 16, 32, 64: 2.730182920993713, ...712, ...7125, ...712). Unweighted RMS:
    2.84628, 2.85716, 2.86232, 2.86483, drifting towards the arcsine-weighted mean of the
    Gauss nodes, sqrt(e I0(1) mean_j (1 + y_j)^2) (x = (1 + cos s)/2), 4.9% above the L2 value.
    """
    l2 = math.sqrt((math.e ** 2 - 1) / 2 * 7 / 3)
    weighted, plain = [], []
    for n in (8, 16, 32, 64):
        grids = Grids(GaussLegendre(n), ClenshawCurtis(9))
        x = grids.tokens.nodes[:, None]
        y = grids.features.nodes[None, :]
        e = np.exp(x) * (1 + y)
        zero = np.zeros_like(e)
        weighted.append(weighted_rms(e, zero, zero, 0.0, 1.0, grid_weights(grids)))
        plain.append(rms(e, zero, zero, 0.0, 1.0))
    np.testing.assert_allclose(weighted, l2, rtol=1e-14)
    limit = math.sqrt(math.e * scipy.special.i0(1.0) * np.mean((1 + grids.features.nodes) ** 2))
    assert abs(plain[-1] - limit) < abs(plain[0] - limit) / 4  # converges to the arcsine mean
    assert plain[-1] - plain[0] > 0.006 * l2  # drifts with n by 0.7%
    assert min(plain) > 1.04 * l2  # and is not the L2 norm


def test_galerkin_weights_lumped_and_at_quadrature_points():
    """P1: stored coefficients get int phi_j (lumped mass); points get the Gauss weights."""
    grids = Grids(P1(9), ClenshawCurtis(5))
    wx, wy = grid_weights(grids)
    np.testing.assert_allclose(wx, np.r_[0.0625, np.full(7, 0.125), 0.0625], rtol=1e-14)
    np.testing.assert_array_equal(wy, grids.features.quadrature_weights)
    rng = np.random.default_rng(3)
    c = rng.standard_normal(grids.stored_shape)
    zero = np.zeros_like(c)
    mass = grids.tokens.mass.toarray()
    exact = math.sqrt(np.einsum("ij,ik,kj->", c, mass, c * wy) / wy.sum())  # ||e_h||_{L2} / |X|
    px, py = grid_weights(grids, points=True)
    g = grids.to_points(c)
    g0 = np.zeros_like(g)
    assert weighted_rms(g, g0, g0, 0.0, 1.0, (px, py)) == pytest.approx(exact, rel=1e-12)
    lumped = weighted_rms(c, zero, zero, 0.0, 1.0, (wx, wy))
    assert exact <= lumped <= math.sqrt(3) * exact


# -- the controller's arguments ---------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    ({"rtol": -1e-3}, ValueError, "rtol must be a finite non-negative number"),
    ({"atol": float("nan")}, ValueError, "atol must be a finite non-negative number"),
    ({"rtol": 0.0, "atol": 0.0}, ValueError, "rtol and atol are both zero"),
    ({"rtol": True}, TypeError, "rtol must be"),
    ({"factor_min": 1.5}, ValueError, "factor_min and factor_max must satisfy"),
    ({"factor_max": 0.5}, ValueError, "factor_min and factor_max must satisfy"),
    ({"factor_min": 0.0}, ValueError, "factor_min must be a finite positive number"),
    ({"max_steps": 0}, ValueError, "max_steps must be a positive integer"),
    ({"max_steps": 10.0}, TypeError, "max_steps must be a positive integer"),
    ({"safety": 1.5}, ValueError, "safety must be in \\(0, 1\\]"),
    ({"pcoeff": 0.0, "icoeff": 0.0}, ValueError, "pcoeff \\+ icoeff must be positive"),
    ({"dt0": -0.1}, ValueError, "dt0 must be a finite positive number"),
    ({"dt0": 1e-9, "dt_min": 1e-6}, ValueError, "dt0 = 1e-09 is below dt_min"),
    ({"norm": "max"}, ValueError, "norm must be one of 'l2', 'rms'"),
])
def test_bad_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        PIController(**kwargs)


def test_controller_is_a_frozen_value():
    c = PIController(1e-4, 1e-7)
    assert c == PIController(rtol=1e-4, atol=1e-7) and hash(c) == hash(PIController(1e-4, 1e-7))
    with pytest.raises(AttributeError):
        c.rtol = 1.0
    with pytest.raises(TypeError):
        PIController(1e-4, 1e-7, 0.4)  # the coefficients are keyword-only
    assert c.min_step(10.0) == pytest.approx(1e-13) and PIController(dt_min=1e-5).min_step(10) == 1e-5


# -- the step rule ---------------------------------------------------------------------------
def test_propose_is_the_pi_formula_with_clipping():
    c = PIController()
    q = 4  # a 5(4) pair: k = 5
    err, prev = 0.3, 0.6
    assert c.propose(0.1, err, prev, q) == pytest.approx(
        0.1 * 0.9 * err ** (-0.7 / 5) * prev ** (0.4 / 5), rel=1e-14)
    assert c.propose(0.1, 1e-30, 1.0, q) == pytest.approx(1.0)  # clipped at factor_max
    assert c.propose(0.1, 0.0, 1.0, q) == pytest.approx(1.0)
    assert c.propose(0.1, 0.5, 1.0, q, after_rejection=True) <= 0.1  # no growth after a rejection
    # rejected: the elementary factor, clipped at factor_min, never growing
    assert c.propose(0.1, 4.0, 0.5, q) == pytest.approx(0.1 * 0.9 * 4.0 ** (-1 / 5), rel=1e-14)
    assert c.propose(0.1, 1e12, 0.5, q) == pytest.approx(0.02)
    assert c.propose(0.1, 1.0001, 1e-6, q) < 0.1
    assert c.propose(0.1, float("nan"), 0.5, q) == pytest.approx(0.02)
    assert c.propose(-0.1, 0.3, 0.6, q) == pytest.approx(-c.propose(0.1, 0.3, 0.6, q))
    i_controller = PIController(pcoeff=0.0, icoeff=1.0)
    assert i_controller.propose(0.1, 0.3, 1e-3, 2) == pytest.approx(0.1 * 0.9 * 0.3 ** (-1 / 3))


def test_update_returns_a_new_state():
    c, s0 = PIController(), ControllerState()
    ok, h, s1 = c.update(s0, 0.1, 2.0, 1)
    assert (ok, s1.rejected, s1.rejected_last, s0.rejected) == (False, 1, True, 0)
    ok, h2, s2 = c.update(s1, h, 0.5, 1)
    assert ok and h2 <= h and (s2.accepted, s2.err_prev, s2.rejected_last) == (1, 0.5, False)
    assert c.accept(1.0) and not c.accept(1.0 + 1e-12) and not c.accept(float("nan"))


# -- the starting step -----------------------------------------------------------------------
def _scipy_initial_step(fun, t0, y0, t_end, order, rtol, atol):
    f0 = fun(t0, y0)
    params = inspect.signature(ivp_common.select_initial_step).parameters
    kwargs = dict(fun=fun, t0=t0, y0=y0, f0=f0, direction=np.sign(t_end - t0), order=order,
                  rtol=rtol, atol=atol)
    if "t_bound" in params:
        kwargs.update(t_bound=t_end, max_step=np.inf)
    return ivp_common.select_initial_step(**{k: v for k, v in kwargs.items() if k in params})


@pytest.mark.parametrize("y0, t_end, order", [
    (np.array([1.0, 0.5, -2.0]), 10.0, 4),
    (np.array([1.0, 0.5, -2.0]), -10.0, 2),
    (np.array([1e-7, 0.0, 0.0]), 10.0, 1),  # d0 < 1e-5: h0 = 1e-6
])
def test_initial_step_equals_scipy(y0, t_end, order):
    a = np.array([[-0.5, 2.0, 0.0], [-2.0, -0.5, 0.3], [0.1, 0.0, -3.0]])

    def fun(t, y):
        return a @ y + np.array([np.sin(t), 0.0, 1.0])

    c = PIController(1e-5, 1e-8, norm="rms")
    expected = _scipy_initial_step(fun, 0.0, y0, t_end, order, 1e-5, 1e-8)
    assert c.initial_step(fun, 0.0, y0, order, t_end=t_end) == pytest.approx(expected, rel=1e-12)
    norm = lambda x, u, v: rms(x, u, v, c.rtol, c.atol)  # noqa: E731
    assert c.initial_step(fun, 0.0, y0, order, norm, t_end=t_end) == pytest.approx(expected, rel=1e-12)
    assert PIController(dt0=0.5).initial_step(fun, 0.0, y0, order, t_end=0.25) == 0.25


# -- end to end: a test-only adaptive loop with an embedded Heun-Euler pair -------------------
# c = (0, 1), a21 = 1, b = (1/2, 1/2) (order 2), b_hat = (1, 0) (order 1): error order q = 1.
HEUN_EULER = {"c": np.array([0.0, 1.0]), "a21": 1.0, "b": np.array([0.5, 0.5]),
              "b_hat": np.array([1.0, 0.0])}
A = np.array([[-0.1, 1.0], [-1.0, -0.1]])  # a damped rotation: u(t) = e^{-t/10} R(t) u0
U0, T = np.array([1.0, 0.0]), 5.0


def _rhs(t, u):
    return A @ u


def _exact(t):
    c, s = math.cos(t), math.sin(t)
    return math.exp(-0.1 * t) * np.array([[c, s], [-s, c]]) @ U0


def _heun_euler(controller):
    t, u, state = 0.0, U0.copy(), ControllerState()
    h = controller.initial_step(_rhs, t, u, 1, t_end=T)
    evaluations = 2
    while t < T:
        h = min(h, T - t)
        k1 = _rhs(t, u)
        k2 = _rhs(t + h, u + h * HEUN_EULER["a21"] * k1)
        evaluations += 2
        u_new = u + h * (0.5 * k1 + 0.5 * k2)
        err = controller.error_norm(h * (-0.5 * k1 + 0.5 * k2), u, u_new)
        accepted, h_next, state = controller.update(state, h, err, 1)
        if accepted:
            t, u = t + h, u_new
        h = h_next
        assert state.accepted + state.rejected < controller.max_steps
    return u, state, evaluations


class _ScipyHeunEuler(ScipyRungeKutta):
    """The same pair in scipy's loop (its I controller, safety 0.9, factors 0.2 .. 10)."""
    order, error_estimator_order, n_stages = 2, 1, 2
    C = HEUN_EULER["c"]
    A = np.array([[0.0, 0.0], [1.0, 0.0]])
    B = HEUN_EULER["b"]
    E = np.array([0.5, -0.5, 0.0])
    P = np.array([[1.0, -0.5], [0.0, 0.5]])


def test_tolerance_proportionality_heun_euler():
    """Global error at T = 5 against rtol = atol = 1e-3 .. 1e-8 (``pytest -s`` prints the table).

    The PI default: slope of log error against log rtol in [0.8, 1.2], error <= 10 rtol, at most
    3 rejections. The elementary controller (pcoeff=0, icoeff=1) in this loop takes exactly
    the steps scipy's loop takes on the same pair (scipy's controller is that one, and the
    starting step is the same); the PI controller takes more (its stationary error is
    theta^(k/0.3) = 0.50 against theta^k = 0.81) and is correspondingly more accurate.

    Measured (rtol: PI error / accepted, I = scipy error / steps, RK23 steps), no rejections:
    1e-3: 1.22e-3 / 99, 2.11e-3 / 74, 13;   1e-4: 1.24e-4 / 300, 2.06e-4 / 232, 26;
    1e-5: 1.24e-5 / 936, 2.05e-5 / 729, 55; 1e-6: 1.25e-6 / 2946, 2.04e-6 / 2301, 116;
    1e-7: 1.25e-7 / 9305, 2.04e-7 / 7274, 249; 1e-8: 1.25e-8 / 29412, 2.04e-8 / 22999, 534.
    Slope 0.998.
    """
    tolerances = 10.0 ** -np.arange(3, 9)
    errors = []
    for rtol in tolerances:
        u, state, _ = _heun_euler(PIController(rtol, rtol, norm="rms"))
        ui, state_i, _ = _heun_euler(PIController(rtol, rtol, pcoeff=0.0, icoeff=1.0, norm="rms"))
        errors.append(float(np.max(np.abs(u - _exact(T)))))
        same = scipy.integrate.solve_ivp(_rhs, (0, T), U0, method=_ScipyHeunEuler, rtol=rtol,
                                         atol=rtol)
        rk23 = scipy.integrate.solve_ivp(_rhs, (0, T), U0, method="RK23", rtol=rtol, atol=rtol)
        scipy_steps = same.t.size - 1
        print(f"rtol {rtol:.0e}  PI: error {errors[-1]:.2e} accepted {state.accepted:6d} "
              f"rejected {state.rejected}  I: error {np.max(np.abs(ui - _exact(T))):.2e} "
              f"accepted {state_i.accepted:6d} rejected {state_i.rejected}  scipy same pair: "
              f"error {np.max(np.abs(same.y[:, -1] - _exact(T))):.2e} steps {scipy_steps:6d}  "
              f"RK23 steps {rk23.t.size - 1:5d}")
        assert errors[-1] <= 10 * rtol and state.rejected <= 3
        assert state_i.accepted == scipy_steps and state_i.rejected == 0
        np.testing.assert_allclose(ui, same.y[:, -1], rtol=1e-10)
        assert scipy_steps < state.accepted < 1.5 * scipy_steps
    slope = np.polyfit(np.log(tolerances), np.log(errors), 1)[0]
    print(f"slope {slope:.3f}")
    assert 0.8 <= slope <= 1.2

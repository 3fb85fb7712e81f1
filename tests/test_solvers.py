"""Schemes: observed orders against closed forms and scipy.integrate.solve_ivp references."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg
from scipy.integrate import solve_ivp

import ctformer.solvers as solvers
from ctformer.discretizations import GaussLegendre
from ctformer.solvers import SplitProblem

from .conftest import fitted_order

STEPS = [4, 8, 16, 32, 64]


def integrate(scheme, problem, u0, steps, T=1.0):
    u = np.array(u0, dtype=float)
    for _ in range(int(round(steps * T))):
        u = scheme.step(problem, u, 1.0 / steps)
    return u


@pytest.fixture(scope="module")
def linear_pair():
    """Two non-commuting 4 x 4 matrices A, B (flows f1 = A u, f2 = B u) and u0."""
    rng = np.random.default_rng(7)
    A = 0.8 * rng.standard_normal((4, 4))
    B = 0.8 * rng.standard_normal((4, 4))
    assert np.linalg.norm(A @ B - B @ A) > 0.5  # the splitting error is really there
    return A, B, rng.standard_normal(4)


SCHEMES = [
    ("euler", {}, 1.0), ("lie", {}, 1.0), ("lie", {"substep": "heun"}, 1.0),
    ("strang", {}, 2.0), ("strang", {"substep": "euler"}, 1.0), ("strang", {"substep": "rk4"}, 2.0),
    ("parallel", {}, 1.0), ("parallel", {"substep": "heun"}, 1.0), ("rk4", {}, 4.0),
]


@pytest.mark.parametrize("name,kwargs,order", SCHEMES)
def test_order_on_noncommuting_linear_flows(linear_pair, name, kwargs, order):
    A, B, u0 = linear_pair
    scheme = solvers.get(name, **kwargs)
    assert scheme.order() == order
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u])
    exact = scipy.linalg.expm(A + B) @ u0
    errors = [np.linalg.norm(integrate(scheme, problem, u0, k) - exact) for k in STEPS]
    assert abs(fitted_order(1.0 / np.array(STEPS), errors) - order) < 0.3


def test_strang_order_with_three_flows(linear_pair):
    A, B, u0 = linear_pair
    C = np.roll(A, 1, axis=0) - B.T
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u, lambda u: C @ u])
    exact = scipy.linalg.expm(A + B + C) @ u0
    errors = [np.linalg.norm(integrate(solvers.get("strang"), problem, u0, k) - exact) for k in STEPS]
    assert abs(fitted_order(1.0 / np.array(STEPS), errors) - 2.0) < 0.3


def test_macaron_order_of_substeps(linear_pair):
    # Strang with Euler sub-steps is (I + dt/2 B)(I + dt A)(I + dt/2 B): half FFN first.
    A, B, u0 = linear_pair
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u])
    dt = 0.3
    half = np.eye(4) + 0.5 * dt * B
    expected = half @ (np.eye(4) + dt * A) @ half @ u0
    got = solvers.Strang(substep="euler").step(problem, u0, dt)
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-14)


def test_lie_step_is_the_composition(linear_pair):
    A, B, u0 = linear_pair
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u])
    expected = (np.eye(4) + B) @ (np.eye(4) + A) @ u0
    np.testing.assert_allclose(solvers.get("lie").step(problem, u0, 1.0), expected, rtol=1e-14)


def test_parallel_with_euler_substeps_is_explicit_euler(linear_pair):
    # (1/K) sum_k (u + K dt f_k(u)) = u + dt sum_k f_k(u), exactly.
    A, B, u0 = linear_pair
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u])
    expected = u0 + 0.25 * (A + B) @ u0
    np.testing.assert_allclose(solvers.get("parallel").step(problem, u0, 0.25), expected, rtol=1e-14)


def _layer_norm(v):
    c = v - v.mean()
    return c / np.sqrt(np.mean(c**2))


def test_projected_lie_and_euler_are_first_order():
    """A LayerNorm-type projection after sub-steps converges to the projected flow.

    Reference: u' = P_T(u) (f1(u) + f2(u)) on S = {mean 0, var 1}, with
    P_T(u) g = g - mean(g) - <g - mean g, u> u / <u, u>, by solve_ivp (rtol 1e-12).
    """
    rng = np.random.default_rng(3)
    A, B = 0.8 * rng.standard_normal((2, 6, 6))
    f1, f2 = (lambda u: A @ u), (lambda u: np.tanh(B @ u))
    u0 = _layer_norm(rng.standard_normal(6))

    def projected(t, u):
        g = f1(u) + f2(u)
        g = g - g.mean()
        return g - (u @ g) / (u @ u) * u

    exact = solve_ivp(projected, (0, 1), u0, method="DOP853", rtol=1e-12, atol=1e-13).y[:, -1]
    problem = SplitProblem([f1, f2], [_layer_norm, _layer_norm])
    steps = [8, 16, 32, 64, 128]
    for name in ("lie", "euler", "strang"):
        errors = [np.linalg.norm(integrate(solvers.get(name), problem, u0, k) - exact) for k in steps]
        assert abs(fitted_order(1.0 / np.array(steps), errors) - 1.0) < 0.3, name


def test_registry_and_bad_input(linear_pair):
    A, B, u0 = linear_pair
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u])
    assert solvers.available() == ["lie", "strang", "parallel", "euler", "heun", "rk4", "bosh3",
                                   "dopri5", "tsit5"]
    with pytest.raises(ValueError, match="unknown scheme 'midpoint'"):
        solvers.get("midpoint")
    with pytest.raises(ValueError, match="substep must be one of"):
        solvers.get("strang", substep="midpoint")
    with pytest.raises(ValueError, match="dt must be a finite positive"):
        solvers.get("rk4").step(problem, u0, 0.0)
    with pytest.raises(ValueError, match="dt must be a finite positive"):
        solvers.get("strang").step(problem, u0, float("nan"))
    for bad in (float("inf"), -0.5, -0.0):  # the fast path for floats lets none of these through
        with pytest.raises(ValueError, match="dt must be a finite positive"):
            solvers.get("euler").step(problem, u0, bad)
    with pytest.raises(TypeError, match="dt must be a real number"):
        solvers.get("lie").step(problem, u0, "0.1")
    with pytest.raises(ValueError, match="projections must be empty or one per flow"):
        SplitProblem([lambda u: u], [None, None])


# -- the real model ------------------------------------------------------------------------
def _initial(x, y):
    return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


@pytest.fixture(scope="module")
def grids_and_start():
    from ctformer import Grids

    tokens, features = GaussLegendre(8), GaussLegendre(12)
    return tokens, features, Grids(tokens, features).sample(_initial)


def _l2(tokens, features, diff):
    return float(np.sqrt(np.einsum("ij,i,j->", diff**2, tokens.weights, features.weights)))


def _ivp(rhs, u, shape):
    sol = solve_ivp(lambda t, v: rhs(v.reshape(shape)).ravel(), (0.0, 1.0), u.ravel(),
                    method="DOP853", rtol=1e-12, atol=1e-13)
    return sol.y[:, -1].reshape(shape)


@pytest.fixture(scope="module")
def pre_norm_reference(grids_and_start):
    """Pre-norm random_smooth model, and its exact flow by solve_ivp layer by layer."""
    from ctformer.model import ContinuousTransformer

    tokens, features, u0 = grids_and_start
    model = ContinuousTransformer.random_smooth(seed=0, layers=2, placement="pre")
    grids = model.grids(tokens, features)
    u = u0
    for block in model.blocks:
        u = _ivp(block.split_problem(grids).rhs, u, u0.shape)
    return model, model.final_normalization.discretize(grids)(u)


@pytest.mark.parametrize("name,steps,order", [
    ("euler", [1, 2, 4, 8, 16], 1.0), ("lie", [1, 2, 4, 8, 16], 1.0),
    ("strang", [1, 2, 4, 8, 16], 2.0), ("parallel", [1, 2, 4, 8, 16], 1.0),
    ("rk4", [1, 2, 4, 8], 4.0),
])
def test_depth_order_on_pre_norm_model(grids_and_start, pre_norm_reference, name, steps, order):
    tokens, features, _ = grids_and_start
    model, exact = pre_norm_reference
    errors = [_l2(tokens, features, model.solve(_initial, tokens=tokens, features=features,
                                                 scheme=name, steps_per_layer=k) - exact)
              for k in steps]
    assert abs(fitted_order(1.0 / np.array(steps), errors) - order) < 0.3


def test_depth_order_on_post_norm_projection_model(grids_and_start):
    """Scalar (sigma1, sigma2) post-norm with Lie: first order to the direction flow.

    After a step the state is N2(w) = b2 w + b1 with w of mean 0 and variance 1; to first
    order in dt the Lie step moves w by dt P_T(w)[Attn(N2 w) / b2 + F(N1 w) / a2], with
    P_T(w) g = g - mean g - <g - mean g, w> w the tangent projection and a2, b2 the scalar
    gains of N1, N2. That ODE (solve_ivp, rtol 1e-12) is the reference; the output is N2(w(T)).
    """
    from ctformer.model import ContinuousTransformer

    tokens, features, u0 = grids_and_start
    model = ContinuousTransformer.random_smooth(seed=0, layers=2, placement="post-projection")
    assert not model.warns_inconsistent_depth
    grids = model.grids(tokens, features)
    wy = features.weights / features.weights.sum()

    def std(v):
        return np.sqrt(((v - (v @ wy)[:, None]) ** 2) @ wy)

    w = (u0 - (u0 @ wy)[:, None]) / std(u0)[:, None]
    for block in model.blocks:
        attention, ffn = block.attention.discretize(grids), block.feedforward.discretize(grids)
        n1, n2 = block.normalization1.discretize(grids), block.normalization2.discretize(grids)
        a2, b2 = std(n1(w))[0], std(n2(w))[0]

        def rhs(v, attention=attention, ffn=ffn, n1=n1, n2=n2, a2=a2, b2=b2):
            g = attention(n2(v)) / b2 + ffn(n1(v)) / a2
            g = g - (g @ wy)[:, None]
            return g - ((g * v) @ wy)[:, None] * v

        w = _ivp(rhs, w, u0.shape)
    exact = n2(w)
    steps = [2, 4, 8, 16, 32]
    errors = [_l2(tokens, features, model.solve(_initial, tokens=tokens, features=features,
                                                 scheme="lie", steps_per_layer=k) - exact)
              for k in steps]
    assert abs(fitted_order(1.0 / np.array(steps), errors) - 1.0) < 0.3


def test_post_norm_affine_refinement_warns(grids_and_start):
    from ctformer.model import ContinuousTransformer, InconsistentDepthLimitWarning

    tokens, features, _ = grids_and_start
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, placement="post")
    assert model.warns_inconsistent_depth
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.solve(_initial, tokens=tokens, features=features, scheme="strang", steps_per_layer=1)
    with pytest.warns(InconsistentDepthLimitWarning, match="no consistent"):
        model.solve(_initial, tokens=tokens, features=features, scheme="strang", steps_per_layer=2)


# -- a new Runge-Kutta method is one tableau and one registration ------------------------------
NEW_TABLEAUS = [
    # Ralston's second-order method and the three-stage strong-stability-preserving method
    solvers.ButcherTableau("ralston", a=((), (2.0 / 3.0,)), b=(0.25, 0.75), order=2.0),
    solvers.ButcherTableau("ssprk3", a=((), (1.0,), (0.25, 0.25)), b=(1 / 6, 1 / 6, 2 / 3),
                           order=3.0),
]


@pytest.fixture(params=NEW_TABLEAUS, ids=lambda t: t.name)
def new_tableau(request):
    from ctformer.solvers import base

    tableau = request.param
    solvers.register_tableau(tableau)
    try:
        yield tableau
    finally:
        del solvers.TABLEAUS[tableau.name], base._REGISTRY[tableau.name]


def test_a_registered_tableau_is_a_scheme_and_a_substep(linear_pair, new_tableau):
    A, B, u0 = linear_pair
    name, p = new_tableau.name, new_tableau.order
    assert solvers.available()[-1] == name and solvers.SUBSTEPS[name] is new_tableau
    scheme, strang = solvers.get(name), solvers.get("strang", substep=name)
    assert scheme.order() == p and strang.order() == min(2.0, p)
    assert solvers.get("lie", substep=name).order() == 1.0
    assert scheme.order(SplitProblem([lambda u: u], [lambda u: u / 2])) == 1.0
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u])
    exact = scipy.linalg.expm(A + B) @ u0
    for method, order in ((scheme, p), (strang, min(2.0, p))):
        errors = [np.linalg.norm(integrate(method, problem, u0, k) - exact) for k in STEPS]
        assert abs(fitted_order(1.0 / np.array(STEPS), errors) - order) < 0.15, (method, errors)


def test_register_tableau_refuses_a_duplicate_or_a_non_tableau():
    with pytest.raises(ValueError, match="a tableau named 'rk4' is registered already"):
        solvers.register_tableau(solvers.ButcherTableau("rk4", a=((),), b=(1.0,), order=1.0))
    with pytest.raises(TypeError, match="tableau must be a ButcherTableau, got dict"):
        solvers.register_tableau({"name": "x"})


def test_tableaus_and_schemes_have_one_name_each():
    assert solvers.RK4 is solvers.runge_kutta.RK4 and isinstance(solvers.get("rk4"), solvers.RK4)
    assert solvers.RK4.tableau is solvers.RK4_TABLEAU is solvers.TABLEAUS["rk4"]
    assert sorted(solvers.TABLEAUS) == ["bosh3", "dopri5", "euler", "heun", "rk4", "tsit5"]
    assert not hasattr(solvers, "ClassicalRK4") and not hasattr(solvers.runge_kutta, "EULER")

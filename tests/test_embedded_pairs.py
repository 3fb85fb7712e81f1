"""Embedded Runge-Kutta pairs (bosh3, dopri5, tsit5) as fixed-step schemes, their error
estimates and dense outputs, each against an independent reference: the rooted-tree order
conditions, scipy.integrate's RK23/RK45 tableaus, expm, and solve_ivp DOP853."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.linalg
from scipy.integrate import solve_ivp
from scipy.integrate._ivp.rk import RK23, RK45

import ctformer.solvers as solvers
from ctformer.discretizations import GaussLegendre
from ctformer.solvers import ButcherTableau, SplitProblem

from .conftest import fitted_order

PAIRS = {"bosh3": (3, 2, 3), "dopri5": (5, 4, 4), "tsit5": (5, 4, 4)}  # order, embedded, dense


# -- the rooted-tree order conditions -----------------------------------------------------------
def _trees(order):
    """Rooted trees with ``order`` vertices, each a sorted tuple of its children's subtrees."""
    if order == 1:
        return [()]
    out = set()
    for parts in _partitions(order - 1):
        for children in _products([_trees(p) for p in parts]):
            out.add(tuple(sorted(children)))
    return sorted(out)


def _partitions(n, largest=None):
    largest = n if largest is None else largest
    if n == 0:
        yield ()
        return
    for first in range(min(n, largest), 0, -1):
        for rest in _partitions(n - first, first):
            yield (first,) + rest


def _products(choices):
    if not choices:
        yield ()
        return
    for head in choices[0]:
        for tail in _products(choices[1:]):
            yield (head,) + tail


def _size(tree):
    return 1 + sum(_size(child) for child in tree)


def _gamma(tree):
    return _size(tree) * math.prod(_gamma(child) for child in tree)


def _phi(A, tree):
    """The stage vector of a tree: prod over children of (A phi(child)), ones for a leaf."""
    out = np.ones(A.shape[0])
    for child in tree:
        out = out * (A @ _phi(A, child))
    return out


def _matrix(tableau):
    A = np.zeros((tableau.stages, tableau.stages))
    for i, row in enumerate(tableau.a):
        A[i, :i] = row
    return A


def order_defects(tableau, weights, order, theta=1.0):
    """max over trees t with |t| <= order of |w . phi(t) - theta^|t| / gamma(t)|."""
    A, w = _matrix(tableau), np.asarray(weights)
    return max(abs(w @ _phi(A, t) - theta ** _size(t) / _gamma(t))
               for p in range(1, order + 1) for t in _trees(p))


def test_tree_counts_are_the_known_ones():
    # 1, 1, 2, 4, 9, 20 rooted trees of orders 1..6 (OEIS A000081)
    assert [len(_trees(p)) for p in range(1, 7)] == [1, 1, 2, 4, 9, 20]


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_order_conditions_of_method_embedded_and_dense(name):
    p, q, d = PAIRS[name]
    t = solvers.TABLEAUS[name]
    assert (t.order, t.error_order, t.dense_order, t.fsal) == (p, q, d, True)
    assert order_defects(t, t.b, p) < 1e-12
    assert order_defects(t, t.b, p + 1) > 1e-4           # exactly order p, the checker can fail
    assert order_defects(t, t.embedded_weights, q) < 1e-12
    assert order_defects(t, t.embedded_weights, q + 1) > 1e-4
    for theta in (0.2, 0.5, 0.9):
        weights = t.dense_weights(theta)
        assert order_defects(t, weights, d, theta) < 1e-12, theta
    np.testing.assert_allclose(t.dense_weights(1.0), t.b, rtol=0, atol=1e-14)
    np.testing.assert_array_equal(t.dense_weights(0.0), 0.0)


@pytest.mark.parametrize("name, reference", [("bosh3", RK23), ("dopri5", RK45)])
def test_coefficients_equal_scipys(name, reference):
    t, s = solvers.TABLEAUS[name], reference.n_stages
    np.testing.assert_allclose(_matrix(t)[:s, :reference.A.shape[1]], reference.A, rtol=0, atol=1e-15)
    np.testing.assert_allclose(t.b[:s], reference.B, rtol=0, atol=1e-15)
    np.testing.assert_allclose(t.c[:s], reference.C, rtol=0, atol=1e-15)
    np.testing.assert_allclose(t.a[-1], reference.B, rtol=0, atol=1e-15)   # the FSAL row
    # scipy's E is b_hat - b; ours is b - b_hat
    np.testing.assert_allclose(t.error_weights, -reference.E, rtol=0, atol=1e-15)
    np.testing.assert_allclose(np.array(t.dense), reference.P, rtol=0, atol=1e-14)


def test_tsit5_values_as_rationals_of_the_paper():
    t = solvers.TSIT5_TABLEAU
    assert t.c == (0.0, 0.161, 0.327, 0.9, 0.9800255409045097, 1.0, 1.0)
    assert Fraction(t.b_error[-1]).limit_denominator(100) == Fraction(1, 66)


# -- linear ODE with a closed form: embedded order, error estimate, dense output ------------------
@pytest.fixture(scope="module")
def linear():
    rng = np.random.default_rng(3)
    A = 0.7 * rng.standard_normal((5, 5))
    return A, rng.standard_normal(5)


def _one_step(t, A, u0, h):
    u_new, ks = t.advance(lambda u: A @ u, u0, h)
    return u_new, ks, scipy.linalg.expm(h * A) @ u0


H = np.array([0.2, 0.1, 0.05, 0.025])


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_local_errors_and_the_estimate_on_a_linear_ode(linear, name):
    A, u0 = linear
    t = solvers.TABLEAUS[name]
    p, q, d = PAIRS[name]
    main, embedded, ratio = [], [], []
    for h in H:
        u_new, ks, exact = _one_step(t, A, u0, h)
        estimate = t.error_estimate(ks, h)
        embedded_new = u0 + h * sum(w * k for w, k in zip(t.embedded_weights, ks))
        np.testing.assert_allclose(u_new - embedded_new, estimate, rtol=1e-10, atol=1e-15)
        main.append(np.linalg.norm(u_new - exact))
        embedded.append(np.linalg.norm(embedded_new - exact))
        # signed: err = u_new - u_hat ~ exact - u_hat, the local error of u_hat
        ratio.append(estimate @ (exact - embedded_new) / np.linalg.norm(exact - embedded_new) ** 2)
    # local errors O(h^(p+1)), O(h^(q+1)); tsit5's small principal error term leaves the
    # h^(p+2) term visible down to h = 0.05 (observed 6.3 on the last pair), hence 0.4
    assert abs(fitted_order(H[1:], main[1:]) - (p + 1)) < 0.4, main
    assert abs(fitted_order(H, embedded) - (q + 1)) < 0.25, embedded
    assert abs(ratio[-1] - 1.0) < 0.05 and abs(ratio[-1] - 1) < abs(ratio[0] - 1), ratio


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_dense_output_local_error_on_a_linear_ode(linear, name):
    A, u0 = linear
    t = solvers.TABLEAUS[name]
    d = PAIRS[name][2]
    for theta in (0.3, 0.6):
        errors = []
        for h in H / 4:
            _, ks, _ = _one_step(t, A, u0, h)
            errors.append(np.linalg.norm(t.interpolate(u0, ks, h, theta)
                                         - scipy.linalg.expm(theta * h * A) @ u0))
        assert abs(fitted_order(H / 4, errors) - (d + 1)) < 0.35, (theta, errors)


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_global_fixed_step_order_and_embedded_order_on_a_linear_ode(linear, name):
    A, u0 = linear
    t = solvers.TABLEAUS[name]
    p, q, _ = PAIRS[name]
    exact = scipy.linalg.expm(A) @ u0
    scheme, problem = solvers.get(name), SplitProblem([lambda u: A @ u])
    steps = [16, 32, 64, 128]
    main, embedded = [], []
    for k in steps:
        u, v = u0, u0
        for _ in range(k):
            u = scheme.step(problem, u, 1.0 / k)
            v = v + (1.0 / k) * sum(w * s for w, s in zip(t.embedded_weights,
                                                            t.advance(lambda x: A @ x, v, 1.0 / k)[1]))
        main.append(np.linalg.norm(u - exact))
        embedded.append(np.linalg.norm(v - exact))
    assert abs(fitted_order(1.0 / np.array(steps), main) - p) < 0.25, main
    assert abs(fitted_order(1.0 / np.array(steps), embedded) - q) < 0.25, embedded


# -- the model: fixed-step orders against solve_ivp DOP853 ---------------------------------------
def _initial(x, y):
    return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


@pytest.fixture(scope="module")
def model_reference():
    from ctformer import ContinuousTransformer, Grids

    tokens, features = GaussLegendre(8), GaussLegendre(12)
    model = ContinuousTransformer.random_smooth(seed=1, layers=2, placement="pre")
    grids = model.grids(tokens, features)
    u = Grids(tokens, features).sample(_initial)
    for block in model.blocks:
        rhs = block.split_problem(grids).rhs
        sol = solve_ivp(lambda _, v: rhs(v.reshape(u.shape)).ravel(), (0.0, 1.0), u.ravel(),
                        method="DOP853", rtol=1e-13, atol=1e-15)
        u = sol.y[:, -1].reshape(u.shape)
    return model, tokens, features, model.final_normalization.discretize(grids)(u)


@pytest.mark.parametrize("name, steps", [("bosh3", [2, 4, 8, 16]), ("dopri5", [2, 4, 8]),
                                         ("tsit5", [2, 4, 8])])
def test_fixed_step_order_on_a_pre_norm_model(model_reference, name, steps):
    model, tokens, features, exact = model_reference
    errors = [np.abs(model.solve(_initial, tokens=tokens, features=features, scheme=name,
                                 steps_per_layer=k) - exact).max() for k in steps]
    assert min(errors) > 2e-13, errors          # above the reference's error (rtol 1e-13, |u| ~ 1.5)
    assert abs(fitted_order(1.0 / np.array(steps), errors) - PAIRS[name][0]) < 0.3, errors


# -- FSAL: one right-hand side saved per step ------------------------------------------------------
@pytest.mark.parametrize("name", ["rk4"] + sorted(PAIRS))
def test_fsal_saves_one_evaluation_per_step(linear, name):
    A, u0 = linear
    calls = []
    problems = [SplitProblem([lambda u, M=M: calls.append(1) or M @ u]) for M in (A, -0.5 * A)]
    scheme, stages, steps = solvers.get(name), solvers.TABLEAUS[name].stages, 5
    u = solvers.integrate(solvers.Piecewise.layers(problems), u0, steps, scheme=scheme).final
    fsal = solvers.TABLEAUS[name].fsal
    # per layer: the first step evaluates every stage, the others one fewer with FSAL
    assert len(calls) == 2 * (stages + (steps - 1) * (stages - fsal))
    # the same numbers as evaluating every stage (a fresh scheme per step)
    v = u0
    for M in (A, -0.5 * A):
        problem = SplitProblem([lambda x, M=M: M @ x])
        for _ in range(steps):
            v = solvers.get(name).step(problem, v, 1.0 / steps)
    np.testing.assert_array_equal(u, v)


def test_fsal_is_not_reused_after_a_projection_or_for_another_state(linear):
    A, u0 = linear
    calls = []
    projected = SplitProblem([lambda u: calls.append(1) or A @ u], [lambda u: u / np.linalg.norm(u)])
    scheme = solvers.get("tsit5")
    u = u0
    for _ in range(3):
        u = scheme.step(projected, u, 0.1)
    assert len(calls) == 21                                      # 7 per step: F(u_new) is stale
    plain = SplitProblem([lambda u: calls.append(1) or A @ u])
    scheme.step(plain, u0, 0.1)
    scheme.step(plain, u0.copy(), 0.1)                           # another state: no reuse
    assert len(calls) == 35


def test_strang_with_a_pair_as_substep_is_second_order():
    rng = np.random.default_rng(7)
    A, B = 0.8 * rng.standard_normal((4, 4)), 0.8 * rng.standard_normal((4, 4))
    u0 = rng.standard_normal(4)
    problem = SplitProblem([lambda u: A @ u, lambda u: B @ u])
    exact = scipy.linalg.expm(A + B) @ u0
    strang, steps = solvers.get("strang", substep="tsit5"), [4, 8, 16, 32, 64]
    assert strang.order() == 2.0
    errors = []
    for k in steps:
        u = u0
        for _ in range(k):
            u = strang.step(problem, u, 1.0 / k)
        errors.append(np.linalg.norm(u - exact))
    assert abs(fitted_order(1.0 / np.array(steps), errors) - 2.0) < 0.15, errors


# -- bad tableaus are refused, naming the field --------------------------------------------------
HEUN = dict(a=((), (1.0,)), b=(0.5, 0.5), order=2.0)


@pytest.mark.parametrize("fields, message", [
    (dict(a=((), (1.0, 0.0)), b=(0.5, 0.5), order=2.0), r"a must be strictly lower triangular"),
    (dict(a=((), (1.0,)), b=(0.5, 0.6), order=2.0), r"the weights b must sum to 1"),
    (dict(HEUN, c=(0.0, 0.5)), r"c\[1\] = 0.5 but row a\[1\] sums to 1.0"),
    (dict(HEUN, c=(0.0,)), r"c needs one node per stage"),
    (dict(HEUN, b_error=(0.5, -0.4), error_order=1.0), r"b_error .* must sum to 0"),
    (dict(HEUN, b_error=(0.5, -0.5, 0.0), error_order=1.0), r"b_error needs one entry per stage"),
    (dict(HEUN, b_error=(0.5, -0.5)), r"error_order must be the order of the embedded"),
    (dict(HEUN, b_error=(0.5, -0.5), error_order=2.0), r"error_order .* below order = 2"),
    (dict(HEUN, error_order=1.0), r"error_order is given without b_error"),
    (dict(HEUN, fsal=True), r"fsal=True needs the last row of a to equal b"),
    (dict(HEUN, dense=((1.0, -0.5), (0.0, 0.4)), dense_order=2.0), r"dense\[1\] gives b_1\(1\)"),
    (dict(HEUN, dense=((1.0, -0.5), (0.5,)), dense_order=2.0), r"dense needs one row"),
    (dict(HEUN, dense=((1.0, -0.5), (0.0, 0.5))), r"dense_order must be the order"),
    (dict(HEUN, dense_order=2.0), r"dense_order is given without dense"),
    (dict(a=((), (float("nan"),)), b=(0.5, 0.5), order=2.0), r"a\[1\] must be finite"),
])
def test_bad_tableaus_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        ButcherTableau("bad", **fields)


def test_bad_queries_are_refused():
    with pytest.raises(ValueError, match="b_error is None"):
        solvers.RK4_TABLEAU.error_weights
    with pytest.raises(ValueError, match="dense is None"):
        solvers.RK4_TABLEAU.dense_weights(0.5)
    with pytest.raises(ValueError, match=r"theta must lie in \[0, 1\]"):
        solvers.TSIT5_TABLEAU.dense_weights(1.5)
    with pytest.raises(TypeError, match="fsal"):
        ButcherTableau("bad", **HEUN, fsal="yes")
    with pytest.raises(TypeError, match="b must be a sequence of real numbers"):
        ButcherTableau("bad", a=((), (1.0,)), b=("x", 0.5), order=2.0)

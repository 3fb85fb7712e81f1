"""ctformer.adjoint.gradient: every scheme on both routes, validated inputs, NumPy in -> NumPy
out, and the default scheme of solve (issue 19, item 9). References: central finite
differences of the NumPy solve (float64), torch autograd of the discrete solve, and the identity
"parallel splitting with Euler sub-steps = explicit Euler on the full right-hand side"."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctformer.discretizations as d
import ctformer.solvers as solvers
from ctformer import ContinuousTransformer, Grids
from ctformer.studies import smooth_initial_state

from .conftest import require

pytestmark = pytest.mark.torch
SETTINGS = settings(max_examples=12, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
TOKENS, FEATURES = d.GaussLegendre(4), d.GaussLegendre(3)
GRIDS = dict(tokens=TOKENS, features=FEATURES)


@pytest.fixture(scope="module")
def torch():
    return require("torch")


@pytest.fixture(scope="module")
def gradient(torch):
    from ctformer.adjoint import gradient

    return gradient


def _start():
    return Grids(TOKENS, FEATURES).sample(smooth_initial_state)


def _cubic(u):
    return (u ** 3).sum()


def _finite_differences(model, u0, h=1e-6, **kw):
    """Central differences of sum(solve(u0)^3) in NumPy float64 (no torch involved)."""
    out = np.empty_like(u0)
    for index in np.ndindex(u0.shape):
        up, down = u0.copy(), u0.copy()
        up[index] += h
        down[index] -= h
        out[index] = (np.sum(model.solve(up, **GRIDS, **kw) ** 3)
                      - np.sum(model.solve(down, **GRIDS, **kw) ** 3)) / (2 * h)
    return out


def _relative(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))) / np.max(np.abs(np.asarray(b))))


def test_parallel_scheme_works_on_the_adjoint_route(torch, gradient):
    # the user's reproducer: TypeError: unsupported operand ... '_Augmented' and 'int'
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0 = torch.tensor(_start())
    parallel = gradient(model, u0, _cubic, scheme="parallel", route="adjoint", steps_per_layer=4, **GRIDS)
    # parallel splitting with Euler sub-steps is explicit Euler on the full right-hand side, so
    # both backward solves are the same map
    euler = gradient(model, u0, _cubic, scheme="euler", route="adjoint", steps_per_layer=4, **GRIDS)
    assert _relative(parallel, euler) < 1e-13
    # and its difference to the exact discrete gradient falls at order 1
    differences = []
    for k in (4, 8, 16):
        exact = gradient(model, u0, _cubic, scheme="parallel", route="autograd", steps_per_layer=k, **GRIDS)
        adjoint = gradient(model, u0, _cubic, scheme="parallel", route="adjoint", steps_per_layer=k, **GRIDS)
        differences.append(_relative(adjoint, exact))
    assert 0.1 > differences[0] > differences[1] > differences[2]
    orders = np.log2(np.array(differences[:-1]) / np.array(differences[1:]))
    assert np.all(np.abs(orders - 1.0) < 0.15), orders


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "2"])
def test_steps_per_layer_is_validated(torch, gradient, steps):
    # the user's reproducer: steps_per_layer=0 raised ZeroDivisionError
    model = ContinuousTransformer.random_smooth(seed=3, layers=1)
    for route in ("adjoint", "autograd"):
        with pytest.raises(ValueError, match=rf"steps_per_layer must be a positive integer, got {steps!r}"):
            gradient(model, _start(), _cubic, steps_per_layer=steps, route=route, **GRIDS)
    with pytest.raises(ValueError, match="limit of 100000000 steps"):
        gradient(model, _start(), _cubic, steps_per_layer=10**9, **GRIDS)


@pytest.mark.parametrize("route", ["adjoint", "autograd"])
def test_loss_is_validated(torch, gradient, route):
    model = ContinuousTransformer.random_smooth(seed=3, layers=1)
    u0 = torch.tensor(_start())
    with pytest.raises(TypeError, match=r"loss must be a callable loss\(u_T\) -> scalar torch tensor, got int"):
        gradient(model, u0, 3, route=route, **GRIDS)
    with pytest.raises(TypeError, match=r"loss must return a scalar torch tensor .*got float .*a Python "
                                        r"or NumPy number carries no gradient"):
        gradient(model, u0, lambda u: float((u ** 2).sum().detach()), route=route, **GRIDS)
    with pytest.raises(ValueError, match=r"loss must return a scalar, got a tensor of shape \(4, 3\)"):
        gradient(model, u0, lambda u: u ** 2, route=route, **GRIDS)
    with pytest.raises(ValueError, match="does not depend on its argument"):
        gradient(model, u0, lambda u: torch.tensor(1.0, dtype=torch.float64), route=route, **GRIDS)
    with pytest.raises(ValueError, match=r"loss is nan at u\(T\)"):
        gradient(model, u0, lambda u: (u * math.nan).sum(), route=route, **GRIDS)
    # a one-element tensor is a scalar
    g = gradient(model, u0, lambda u: (u ** 2).sum().reshape(1, 1), route=route, **GRIDS)
    assert tuple(g.shape) == tuple(u0.shape)


@pytest.mark.parametrize("route", ["adjoint", "autograd"])
def test_numpy_u0_gives_numpy_gradients_equal_to_the_torch_ones(torch, gradient, route):
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    start = _start()
    kw = dict(scheme="rk4", steps_per_layer=4, route=route, **GRIDS)
    from_numpy, params = gradient(model, start, _cubic, parameters=True, **kw)
    from_torch, torch_params = gradient(model, torch.tensor(start), _cubic, parameters=True, **kw)
    assert type(from_numpy) is np.ndarray and from_numpy.dtype == np.float64
    assert isinstance(from_torch, torch.Tensor)  # torch in -> torch out
    np.testing.assert_array_equal(from_numpy, from_torch.numpy())
    assert set(params) == set(model.parameters())
    for name, value in params.items():
        assert type(value) is np.ndarray and value.shape == np.shape(model.parameters()[name])
        np.testing.assert_array_equal(value, torch_params[name].numpy())
    # lists are NumPy input too; the caller's array is not changed
    before = start.copy()
    np.testing.assert_array_equal(gradient(model, start.tolist(), _cubic, **kw), from_numpy)
    np.testing.assert_array_equal(start, before)


def test_autograd_route_is_the_gradient_of_the_numpy_solve(torch, gradient):
    """Against central finite differences of the NumPy float64 solve: the exact discrete
    gradient, to the differences' own error (~1e-9 relative)."""
    model = ContinuousTransformer.random_smooth(seed=5, layers=2)
    start = _start()
    exact = gradient(model, start, _cubic, scheme="strang", steps_per_layer=2, route="autograd", **GRIDS)
    reference = _finite_differences(model, start, scheme="strang", steps_per_layer=2)
    assert _relative(exact, reference) < 1e-8


def test_default_scheme_is_the_default_of_solve(torch, gradient):
    """gradient's default is "lie", as solve's: its autograd route differentiates exactly the map
    that model.solve(u0) computes (finite differences of solve with its own defaults)."""
    import inspect

    from ctformer.adjoint import gradient as function

    solve_default = inspect.signature(ContinuousTransformer.solve).parameters["scheme"].default
    assert inspect.signature(function).parameters["scheme"].default == solve_default == "lie"
    model = ContinuousTransformer.random_smooth(seed=4, layers=2)
    start = _start()
    reference = _finite_differences(model, start)  # solve's defaults: lie, 1 step per layer
    assert _relative(gradient(model, start, _cubic, route="autograd", **GRIDS), reference) < 1e-8
    # Euler on the full right-hand side (the old default) is another map: its gradient differs
    euler = gradient(model, start, _cubic, scheme="euler", route="autograd", **GRIDS)
    assert _relative(euler, reference) > 1e-3


@given(scheme=st.sampled_from(["euler", "lie", "parallel", "strang", "heun", "rk4"]),
       seed=st.integers(0, 50), layers=st.integers(1, 2))
@SETTINGS
def test_adjoint_agrees_with_autograd_within_the_scheme_order(torch, gradient, scheme, seed, layers):
    """Property: for any random smooth pre-norm model, the continuous adjoint's gradient differs
    from the exact gradient of the discrete solve by O(dt^p), p = the scheme's order: halving dt
    divides the difference by at least 2^(p - 0.3), and it is small at dt = 1/4."""
    model = ContinuousTransformer.random_smooth(seed=seed, layers=layers)
    u0 = torch.tensor(_start())
    order = solvers.get(scheme).order()
    differences = []
    for k in (4, 8):
        kw = dict(scheme=scheme, steps_per_layer=k, **GRIDS)
        exact = gradient(model, u0, _cubic, route="autograd", **kw)
        adjoint = gradient(model, u0, _cubic, route="adjoint", **kw)
        differences.append(_relative(adjoint, exact))
    assert differences[0] < 0.05
    if differences[0] > 1e-11:  # above rounding
        assert math.log2(differences[0] / differences[1]) > order - 0.3, differences

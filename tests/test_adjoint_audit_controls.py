"""ctformer.adjoint.gradient, third audit: the error-controlled backward solve with parameters
takes the steps of the one without (the parameter gradient is left out of the norm), a finite
loss with a NaN gradient is refused by name, and both routes converge to the continuous
gradient. References: autograd of a fine rk4 solve (float64), central finite differences of
the NumPy solve (float64), and the steps of the same solve without parameters."""
from __future__ import annotations

import functools

import numpy as np
import pytest

import ctformer.solvers as solvers
from ctformer import ContinuousTransformer

from .conftest import fitted_order, rel_err
# the grids, the start and the torch / gradient fixtures of the input tests
from .test_adjoint_inputs import GRIDS, _cubic, _start, gradient, torch  # noqa: F401

pytestmark = pytest.mark.torch


def _backward_steps(monkeypatch):
    """Record the accepted steps of every error-controlled backward solve."""
    seen, integrate = [], solvers.integrate

    def spy(*args, **kwargs):
        solution = integrate(*args, **kwargs)
        if kwargs.get("what") == "the adjoint state":
            seen.append(solution.stats["accepted"])
        return solution

    monkeypatch.setattr(solvers, "integrate", spy)
    return seen


def _reference(torch, gradient, model):
    """The continuous gradient: autograd of rk4 with 64 steps per layer (error ~1e-12)."""
    return gradient(model, _start(), _cubic, scheme="rk4", steps_per_layer=64, route="autograd",
                    parameters=True, **GRIDS)


def _parameter_error(grads, reference):
    scale = max(np.abs(v).max() for v in reference.values())
    return max(np.abs(grads[n] - reference[n]).max() for n in reference) / scale


@pytest.mark.parametrize("scheme, rtol, tolerance", [("strang", 1e-3, 1e-4), ("rk4", 1e-3, 1e-6)])
def test_parameters_do_not_change_the_backward_steps(torch, gradient, monkeypatch, scheme, rtol,
                                                     tolerance):
    # before: the parameter gradient g was in the step-size norm; each entry starts a layer at 0
    # and grows like h, so its relative error did not shrink with h: strang took 35 backward
    # steps instead of 8, rk4 12 instead of 3, for the same accuracy (2.1e-5 / 3.0e-7)
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0_ref, reference = _reference(torch, gradient, model)
    steps = _backward_steps(monkeypatch)
    plain = gradient(model, _start(), _cubic, scheme=scheme, rtol=rtol, **GRIDS)
    u0_grad, grads = gradient(model, _start(), _cubic, scheme=scheme, rtol=rtol, parameters=True,
                              **GRIDS)
    assert steps[0] == steps[1], steps
    np.testing.assert_array_equal(u0_grad, plain)
    assert rel_err(u0_grad, u0_ref) < tolerance
    assert _parameter_error(grads, reference) < tolerance


def test_lie_with_rtol_and_parameters_takes_few_steps(torch, gradient, monkeypatch):
    # before: lie (the default scheme) with rtol=1e-2 and parameters=True took 2132 backward
    # steps (134 s) where 9 reach the same accuracy (3.2e-3); capped at 200 steps it failed
    monkeypatch.setattr(solvers, "PIController", functools.partial(solvers.PIController,
                                                                   max_steps=200))
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0_ref, reference = _reference(torch, gradient, model)
    steps = _backward_steps(monkeypatch)
    u0_grad, grads = gradient(model, _start(), _cubic, rtol=1e-2, parameters=True, **GRIDS)
    assert steps == [9]
    assert rel_err(u0_grad, u0_ref) < 1e-2         # measured 7.0e-3
    assert _parameter_error(grads, reference) < 5e-3   # measured 3.2e-3


def _kink(u):
    """Finite at every u, with an infinite derivative at u(T) itself (sqrt of |0|)."""
    return (u - u.detach()).abs().sqrt().sum() + (u ** 2).sum()


@pytest.mark.parametrize("route", ["autograd", "adjoint"])
@pytest.mark.parametrize("control", [dict(steps_per_layer=2), dict(rtol=1e-3)])
def test_a_loss_with_a_nan_gradient_is_refused(torch, gradient, route, control):
    # before: 12 NaN entries returned silently (fixed steps, both routes), or StepSizeTooSmall
    # "after the state became NaN or inf (the right-hand side overflows)" (adjoint, rtol)
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    with pytest.raises(ValueError, match=r"gradient of loss with respect to its argument u\(T\) "
                                         r"has 12 NaN or inf entries of 12 .*not differentiable"):
        gradient(model, _start(), _kink, route=route, scheme="rk4", **control, **GRIDS)


def test_a_non_finite_backward_solve_is_refused(torch, gradient, monkeypatch):
    """A fixed-step backward solve that overflows returns no NaN: it is refused, naming the
    gradient and the remedy (the overflow is simulated in one vector-Jacobian product)."""
    import ctformer.adjoint as adjoint

    vjps = adjoint._vjps

    def overflowing(torch, f, u, cotangent, params):
        value, u_bar, theta_bar = vjps(torch, f, u, cotangent, params)
        return value, u_bar * float("inf"), theta_bar

    monkeypatch.setattr(adjoint, "_vjps", overflowing)
    model = ContinuousTransformer.random_smooth(seed=3, layers=1)
    with pytest.raises(ValueError, match=r"gradient of loss with respect to u0 has \d+ NaN or inf "
                                         r"entries .*route='adjoint'.*more steps_per_layer"):
        gradient(model, _start(), _cubic, scheme="rk4", **GRIDS)


def test_autograd_route_agrees_with_central_differences_at_second_order(torch, gradient):
    """Central differences of the float64 NumPy solve approach the autograd gradient as h^2
    until rounding: measured 3.1e-4, 3.1e-6, 3.0e-8 at h = 1e-2, 1e-3, 1e-4."""
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    kw = dict(scheme="rk4", steps_per_layer=4)
    exact = gradient(model, _start(), _cubic, route="autograd", **kw, **GRIDS)
    index, errors = (1, 2), []
    for h in (1e-2, 1e-3, 1e-4):
        up, down = _start(), _start()
        up[index] += h
        down[index] -= h
        difference = (np.sum(model.solve(up, **kw, **GRIDS) ** 3)
                      - np.sum(model.solve(down, **kw, **GRIDS) ** 3)) / (2 * h)
        errors.append(abs(difference - exact[index]) / abs(exact[index]))
    assert errors[-1] < 1e-7
    assert abs(fitted_order([1e-2, 1e-3, 1e-4], errors) - 2.0) < 0.1, errors


@pytest.mark.parametrize("scheme, order", [("strang", 2.0), ("rk4", 4.0)])
def test_adjoint_route_converges_to_the_continuous_gradient_at_the_scheme_order(
        torch, gradient, scheme, order):
    """Against the continuous gradient (not the discrete one): the fitted slope is the scheme's
    order (measured 2.0 for strang, 3.9 for rk4 over 1 to 8 steps per layer)."""
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0_ref, reference = _reference(torch, gradient, model)
    steps = [1, 2, 4, 8]
    u0_errors, parameter_errors = [], []
    for k in steps:
        u0_grad, grads = gradient(model, _start(), _cubic, scheme=scheme, steps_per_layer=k,
                                  parameters=True, **GRIDS)
        u0_errors.append(rel_err(u0_grad, u0_ref))
        parameter_errors.append(_parameter_error(grads, reference))
    h = [1.0 / k for k in steps]
    assert abs(fitted_order(h, u0_errors) - order) < 0.3, u0_errors
    assert abs(fitted_order(h, parameter_errors) - order) < 0.3, parameter_errors

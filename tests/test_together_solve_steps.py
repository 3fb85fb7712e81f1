"""An explicit ``steps_per_layer=1`` beside ``rtol`` is refused, in ``solve`` and ``gradient``.

One step a layer is the default, so ``solve(steps_per_layer=1, rtol=1e-3)`` could not be told
from ``solve(rtol=1e-3)``: the explicit fixed step was ignored and error control ran (4.3e-3
from the fixed-step solve asked for). The default is now a marked 1, told apart by identity;
leaving it out keeps both solves exactly as before.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import adjoint
from ctformer.discretizations import Midpoint
from ctformer.model import ContinuousTransformer

MODEL = ContinuousTransformer.random_smooth(seed=0, layers=1)
GRIDS = dict(tokens=Midpoint(6), features=Midpoint(4))
U0 = np.cos(np.arange(24.0).reshape(6, 4))


@pytest.mark.parametrize("steps", [1, 2])
def test_solve_refuses_explicit_steps_beside_rtol(steps):
    with pytest.raises(ValueError, match=rf"steps_per_layer={steps} and rtol/atol both given"):
        MODEL.solve(U0, steps_per_layer=steps, rtol=1e-3, **GRIDS)
    # the default left out: error control as before; one explicit step alone: the fixed step
    controlled, fixed = MODEL.solve(U0, rtol=1e-3, **GRIDS), MODEL.solve(U0, **GRIDS)
    np.testing.assert_array_equal(MODEL.solve(U0, steps_per_layer=1, **GRIDS), fixed)
    assert np.abs(controlled - fixed).max() > 1e-4   # they are two different computations


@pytest.mark.parametrize("route", ["autograd", "adjoint"])
def test_gradient_refuses_explicit_steps_beside_rtol(route):
    loss = lambda u: (u ** 2).sum()  # noqa: E731
    with pytest.raises(ValueError, match=r"steps_per_layer=1 and rtol/atol both given"):
        adjoint.gradient(MODEL, U0, loss, steps_per_layer=1, rtol=1e-4, route=route, **GRIDS)
    g = adjoint.gradient(MODEL, U0, loss, rtol=1e-8, scheme="tsit5", route=route, **GRIDS)
    reference = adjoint.gradient(MODEL, U0, loss, steps_per_layer=64, scheme="rk4", route="autograd", **GRIDS)
    np.testing.assert_allclose(g, reference, rtol=0, atol=1e-5 * np.abs(reference).max())

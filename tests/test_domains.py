"""The domain of a discretization does not change the model (issue 9, item 7): every
function of a model acts on the reference variable s = (y - a)/(b - a)."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint, P2
from ctformer.operators import FeatureFunction


def _initial(n_tokens, n_features):
    # node values of a smooth state: the same array on every domain (same reference nodes)
    s = GaussLegendre(n_features).nodes
    x = Midpoint(n_tokens).nodes
    return np.cos(np.pi * x)[:, None] + 0.5 * np.sin(2 * np.pi * s)[None, :] + 0.1


@pytest.mark.parametrize("placement", ["pre", "post", "none"])
def test_random_smooth_model_is_the_same_on_any_feature_domain(placement):
    model = ContinuousTransformer.random_smooth(seed=3, layers=2, placement=placement)
    u0 = _initial(6, 5)
    unit = model.solve(u0, tokens=Midpoint(6), features=GaussLegendre(5, (0, 1)))
    wide = model.solve(u0, tokens=Midpoint(6), features=GaussLegendre(5, (0, 5)))
    shifted = model.solve(u0, tokens=Midpoint(6, (-2, 3)), features=GaussLegendre(5, (-1, 0.5)))
    assert np.max(np.abs(unit - u0)) > 0.05  # the model does something
    np.testing.assert_allclose(wide, unit, rtol=0, atol=1e-13)
    np.testing.assert_allclose(shifted, unit, rtol=0, atol=1e-13)


def test_callable_is_evaluated_at_reference_coordinates():
    f = FeatureFunction(lambda s: s**2, "b")
    disc = GaussLegendre(4, (2.0, 6.0))
    s = (disc.nodes - 2.0) / 4.0
    np.testing.assert_allclose(f.evaluate(disc), s**2, rtol=0, atol=1e-15)
    # Galerkin: at the reference coordinates of the per-element Gauss points
    fe = P2(5, (-1.0, 1.0))
    np.testing.assert_allclose(f.evaluate(fe), ((fe.quadrature_nodes + 1.0) / 2.0) ** 2,
                               rtol=0, atol=1e-15)
    # on [0, 1] the reference coordinate is the node itself, bit for bit
    unit = GaussLegendre(4)
    np.testing.assert_array_equal(f.evaluate(unit), unit.nodes**2)


def test_complex_feature_function_is_refused():
    f = FeatureFunction(lambda s: s + 1j, "b_O")
    with pytest.raises(TypeError, match="b_O: the callable must be real, got complex"):
        f.evaluate(Midpoint(3))
    with pytest.raises(TypeError, match="b_1 must be real, got complex"):
        FeatureFunction(np.array([1.0, 2.0 + 1e-3j]), "b_1")

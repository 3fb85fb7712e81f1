"""Arguments that were read silently as something else are refused (issue 19, item 12):
flags that are not booleans, fit_order on mismatched or negative errors, NaN points in the
particle diagnostics, a custom activation that does not act pointwise."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ctformer.solvers as solvers
from ctformer import validation
from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import SmoothRandom
from ctformer.operators import FeedForward, GatedFeedForward, Grids
from ctformer.particles import cluster_count, energy, gram
from ctformer.studies import fit_order

GRIDS = dict(tokens=Midpoint(4), features=GaussLegendre(4))


@pytest.mark.parametrize("flag", ["yes", [0, 2], 1, 0, None, "False"])
def test_trajectory_must_be_a_boolean(flag):
    # the user's reproducer: trajectory="yes" or [0, 2] was taken as True
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    with pytest.raises(TypeError, match=rf"trajectory must be True or False, got {type(flag).__name__} "
                                        rf"{flag!r}".replace("[", r"\[").replace("]", r"\]")):
        model.solve(np.ones((4, 4)), trajectory=flag, **GRIDS)
    with pytest.raises(TypeError, match="checkpoint must be True or False"):
        model.solve(np.ones((4, 4)), checkpoint=flag, **GRIDS)


def test_boolean_flags_keep_working():
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    u0 = np.random.default_rng(1).standard_normal((4, 4))
    path = model.solve(u0, trajectory=np.True_, **GRIDS)
    assert len(path) == 3  # t = 0, 1, 2
    final = model.solve(u0, trajectory=False, **GRIDS)
    np.testing.assert_array_equal(final, path[-1])
    assert validation.boolean(np.False_, "x") is False


def test_fit_order_refuses_mismatched_lengths():
    # the user's reproducer: NaN for mismatched lengths
    with pytest.raises(ValueError, match="h and errors must have the same length, got 3 mesh widths "
                                         "and 2 errors"):
        fit_order([0.5, 0.25, 0.125], [1e-2, 2.5e-3])


@pytest.mark.parametrize("errors", [[1e-2, -2.5e-3, 6e-4], [1e-2, math.nan, 6e-4], [math.inf, 1e-3, 1e-4]])
def test_fit_order_refuses_errors_that_are_not_norms(errors):
    # the user's reproducer: NaN for a negative error
    with pytest.raises(ValueError, match=r"errors must be norms \(finite, >= 0; None to skip a level\)"):
        fit_order([0.5, 0.25, 0.125], errors)


@pytest.mark.parametrize("h", [[0.5, 0.0, 0.125], [0.5, -0.25, 0.125], [math.nan, 0.25, 0.125]])
def test_fit_order_refuses_mesh_widths_that_are_not_positive(h):
    with pytest.raises(ValueError, match="h must hold finite mesh widths > 0"):
        fit_order(h, [1e-2, 2.5e-3, 6.25e-4])


def test_fit_order_is_the_least_squares_slope():
    h = [0.5, 0.25, 0.125, 0.0625]
    np.testing.assert_allclose(fit_order(h, [3 * x**2 for x in h]), 2.0, rtol=1e-13)
    # None and errors at the floor are skipped, fit_levels keeps the finest ones
    assert fit_order(h, [None, 1.0, 0.25, 1e-20], floor=1e-16) == pytest.approx(2.0, rel=1e-13)
    assert fit_order(h, [1.0, 0.1, 0.025, 0.00625], fit_levels=2) == pytest.approx(2.0, rel=1e-13)
    with pytest.raises(ValueError, match="fit_levels must be a positive integer or None, got 0"):
        fit_order(h, [1.0, 0.5, 0.25, 0.125], fit_levels=0)
    assert math.isnan(fit_order(h[:1], [1.0]))  # fewer than two levels: documented NaN


@pytest.mark.parametrize("function", [gram, cluster_count, energy])
def test_particle_diagnostics_refuse_nan_points(function):
    # the user's reproducer: gram(nan) returned NaN
    x = np.array([[1.0, 0.0], [math.nan, 0.0]])
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        function(x, 1.0) if function is not gram else function(x)
    with pytest.raises(ValueError, match="x contains NaN or inf"):
        gram(np.full((2, 3), math.inf))


def test_gram_is_the_matrix_of_inner_products():
    x = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, -1.0]])
    np.testing.assert_allclose(gram(x), [[1, 0.6, 0], [0.6, 1, -0.8], [0, -0.8, 1]], rtol=0, atol=1e-15)


def _grids():
    return Grids(Midpoint(3), GaussLegendre(4), hidden=GaussLegendre(5))


@pytest.mark.parametrize("make", [
    lambda phi: FeedForward(SmoothRandom(1), SmoothRandom(2), activation=phi),
    lambda phi: GatedFeedForward(SmoothRandom(1), SmoothRandom(2), SmoothRandom(3), activation=phi),
])
def test_custom_activation_of_the_wrong_shape_is_refused(make):
    # the user's reproducer: the wrong shape failed inside a matmul gufunc
    def first_column(v):
        return v[..., :1]

    op = make(first_column).discretize(_grids())
    with pytest.raises(ValueError, match=r"activation 'first_column' must act pointwise and return an "
                                         r"array of its input's shape \(3, 5\), got ndarray of shape \(3, 1\)"):
        op(np.ones((3, 4)))
    with pytest.raises(ValueError, match=r"got float of shape \(\)"):
        make(lambda v: 0.5).discretize(_grids())(np.ones((3, 4)))


def test_custom_pointwise_activation_equals_the_builtin():
    """A custom tanh-GELU written by hand gives the built-in's numbers to rounding."""
    def my_gelu(v):
        return 0.5 * v * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))

    u = np.random.default_rng(0).standard_normal((3, 4))
    custom = FeedForward(SmoothRandom(1), SmoothRandom(2), activation=my_gelu).discretize(_grids())(u)
    builtin = FeedForward(SmoothRandom(1), SmoothRandom(2), activation="gelu_tanh").discretize(_grids())(u)
    np.testing.assert_allclose(custom, builtin, rtol=1e-14, atol=1e-15)

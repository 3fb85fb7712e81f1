"""Fifth audit, dtypes and namespaces: the quadrature-point maps of a product with a Galerkin factor
check their values as every other method does, and evaluation points are read as real numbers."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ctformer.discretizations as d


def _product():
    # P1 reproduces linear functions exactly and Chebyshev(5) every polynomial of degree <= 4,
    # so the stored values of f(x1, x2) = 2 x1 - x2^2 give f itself at the quadrature points
    return d.Product(d.P1(4), d.Chebyshev(5))


def _f(x1, x2):
    return 2.0 * x1 - x2 ** 2


def test_a_list_of_values_maps_like_the_array_and_reproduces_the_closed_form():
    """A list was refused by the namespace lookup ("list is not a supported array type")."""
    disc = _product()
    c = disc.sample(_f)
    q = disc.quadrature_nodes
    exact = _f(q[:, 0], q[:, 1])
    out = disc.to_quadrature(c.tolist())
    assert isinstance(out, np.ndarray) and out.dtype == np.float64
    np.testing.assert_allclose(out, exact, rtol=0, atol=1e-13)
    back = disc.from_quadrature(exact.tolist())
    np.testing.assert_allclose(back, c, rtol=0, atol=1e-13)


def test_an_axis_out_of_range_is_refused_not_wrapped():
    """``axis=3`` of a 2-D array was read as axis 1 (3 % 2) and mapped without a word."""
    disc = _product()
    values = np.stack([disc.sample(_f)] * 2)
    with pytest.raises(ValueError, match="axis 3 is out of range for values with 2 dimensions"):
        disc.to_quadrature(values, axis=3)
    with pytest.raises(ValueError, match="axis -3 is out of range"):
        disc.from_quadrature(np.ones((2, 45)), axis=-3)


@pytest.mark.parametrize("method, length", [("to_quadrature", 20), ("from_quadrature", 45)])
def test_a_wrong_length_or_a_scalar_is_refused_with_the_expected_length(method, length):
    """A raster of another length failed inside NumPy's reshape ("cannot reshape array of size
    19 into shape (4,5)"), a scalar with ZeroDivisionError or inside array_api_compat."""
    disc = _product()
    with pytest.raises(ValueError, match=f"values has length {length - 1} along axis 0, expected n = {length}"):
        getattr(disc, method)(np.ones(length - 1))
    with pytest.raises(ValueError, match="values must have at least one dimension, got a scalar"):
        getattr(disc, method)(np.float64(1.0))
    with pytest.raises(ValueError, match="values must have at least one dimension, got a scalar"):
        getattr(disc, method)(3.0)
    with pytest.raises(TypeError, match="values must be an array of real numbers"):
        getattr(disc, method)(["a"] * length)


def test_integer_values_become_float64():
    disc = _product()
    ints = np.arange(20)
    out = disc.to_quadrature(ints)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, disc.to_quadrature(ints.astype(np.float64)), rtol=0, atol=0)


# -- evaluation points --------------------------------------------------------------------------
NAMES = ["midpoint", "trapezoid", "gauss-legendre", "clenshaw-curtis", "fourier", "chebyshev",
         "legendre", "p1", "p2"]


@pytest.mark.parametrize("name", NAMES)
def test_complex_points_are_refused_not_cut_to_their_real_part(name):
    """``interpolate(v, [0.2 + 0.1j])`` evaluated at 0.2 (NumPy's ComplexWarning only): Chebyshev
    gave cos(0.2) = 0.980 for a point off the interval."""
    disc = d.get(name, 9)
    values = disc.sample(np.cos)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="points must be real, got complex values"):
            disc.interpolate(values, np.array([0.2 + 0.1j, 0.5]))
        with pytest.raises(TypeError, match="points must be real, got complex values"):
            disc.interpolation_matrix([0.2 + 0.1j])
    with pytest.raises(TypeError, match="points must be an array of real numbers, got dtype <U1"):
        disc.interpolate(values, ["a"])


@pytest.mark.parametrize("name", NAMES)
def test_torch_bfloat16_points_evaluate_at_their_values(name):
    """torch bfloat16 points failed inside NumPy ("Got unsupported ScalarType BFloat16"); 0.25 and
    0.5 are exact in bfloat16, so the result is that at the float64 points."""
    disc = d.get(name, 9)
    # every rule reproduces 1 + 2x exactly, Fourier(9) the trigonometric 1 + 2 sin(2 pi x)
    f, exact = ((lambda x: 1.0 + 2.0 * np.sin(2 * np.pi * x)), [3.0, 1.0]) if name == "fourier" else \
        ((lambda x: 1.0 + 2.0 * x), [1.5, 2.0])
    values = disc.sample(f)
    points = torch.tensor([0.25, 0.5], dtype=torch.bfloat16)
    out = disc.interpolate(values, points)
    np.testing.assert_allclose(out, disc.interpolate(values, np.array([0.25, 0.5])), rtol=0, atol=0)
    np.testing.assert_allclose(out, exact, rtol=0, atol=1e-13)
    np.testing.assert_allclose(disc.interpolation_matrix(points), disc.interpolation_matrix(np.array([0.25, 0.5])),
                               rtol=0, atol=0)


def test_product_points_are_checked_the_same_way():
    disc = d.Product(d.GaussLegendre(4), d.P1(3))
    values = disc.sample(lambda x1, x2: x1 + 2.0 * x2)
    out = disc.interpolate(values, torch.tensor([[0.25, 0.5]], dtype=torch.bfloat16))
    np.testing.assert_allclose(out, [1.25], rtol=0, atol=1e-14)
    with pytest.raises(TypeError, match="points must be real, got complex values"):
        disc.interpolate(values, np.array([[0.25 + 1j, 0.5]]))

"""Fifth audit, dtypes and namespaces of the particle entries: the sphere maps, the circle mean
field's density and the harmonic moments of particles."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import ctformer.particles as P


# -- retract and tangent_projection --------------------------------------------------------------
def test_retract_refuses_complex_rows_instead_of_returning_nan():
    """``retract([[1j, 1]])`` divided by sqrt(sum x^2) = sqrt(-1 + 1) = 0: [[nan+infj, inf+nanj]]."""
    with pytest.raises(TypeError, match="x must be real; got a complex array"):
        P.retract(np.array([[1j, 1.0]]))


def test_retract_of_integers_is_float64_in_every_namespace():
    """Integers become float64 as in every other particle entry (torch gave its default float32)."""
    expected = np.array([[0.6, 0.8]])
    out = P.retract(torch.tensor([[3, 4]]))
    assert out.dtype == torch.float64
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-16)
    listed = P.retract([[3, 4]])   # a list was refused inside array_api_compat
    assert listed.dtype == np.float64
    np.testing.assert_allclose(listed, expected, rtol=0, atol=1e-16)


def test_retract_refuses_a_0d_array():
    """A 0-d array has no coordinate axis (it came back as 1.0)."""
    with pytest.raises(ValueError, match="x must have a last axis holding the coordinates, got a 0-d array"):
        P.retract(np.float64(2.0))


def test_tangent_projection_of_integers_is_float64():
    """``tangent_projection`` of int64 arrays stayed int64 (bool arrays too)."""
    x, y = np.array([[1, 0, 0]]), np.array([[2, 3, 5]])
    out = P.tangent_projection(x, y)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, [[0.0, 3.0, 5.0]])   # y - <x, y> x
    torch_out = P.tangent_projection(torch.tensor(x), torch.tensor(y))
    assert torch_out.dtype == torch.float64
    np.testing.assert_array_equal(torch_out.numpy(), [[0.0, 3.0, 5.0]])
    np.testing.assert_array_equal(P.tangent_projection(x.tolist(), y.tolist()), [[0.0, 3.0, 5.0]])


@pytest.mark.parametrize("x, y, error, message", [
    (np.array([[True, False]]), np.ones((1, 2)), TypeError, "x must be a real floating or integer array, got dtype bool"),
    (np.ones((1, 2)), np.array([[1j, 0.0]]), TypeError, "y must be real; got a complex array"),
    (np.ones((2, 3)), np.ones((2, 4)), ValueError, r"x and y must have the same last axis .* \(2, 3\) and \(2, 4\)"),
    (torch.ones(2, 3, dtype=torch.float64), np.ones((2, 3)), TypeError, "x and y must be arrays of one library"),
    (np.array([[np.nan, 0.0]]), np.ones((1, 2)), ValueError, "x contains NaN or infinite entries"),
    (np.float64(1.0), np.ones(1), ValueError, "x must have a last axis"),
])
def test_tangent_projection_refuses_what_it_cannot_project(x, y, error, message):
    with pytest.raises(error, match=message):
        P.tangent_projection(x, y)


def test_tangent_projection_keeps_float32_and_the_solve_is_unchanged():
    rng = np.random.default_rng(0)
    x = P.retract(rng.standard_normal((5, 3)))
    y = rng.standard_normal((5, 3))
    ref = y - np.sum(x * y, axis=-1, keepdims=True) * x
    out = P.tangent_projection(x.astype(np.float32), y.astype(np.float32))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5 * np.max(np.abs(ref)))
    np.testing.assert_allclose(P.tangent_projection(x, y), ref, rtol=0, atol=1e-15)


# -- the circle mean field ------------------------------------------------------------------------
def test_circle_mean_field_takes_a_bfloat16_density_like_its_float32_value():
    """A torch bfloat16 density failed inside NumPy ("Got unsupported ScalarType BFloat16")."""
    field = P.CircleMeanField(3.0, 16)
    rho = torch.tensor(1 + 0.3 * np.cos(field.grid), dtype=torch.bfloat16)
    reference = field.velocity(rho.float().numpy())   # every bfloat16 number is a float32
    out = field.velocity(rho)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, reference, rtol=0, atol=1e-15)
    # the velocity of rho = 1 + a cos(theta) is -a I_1/I_0 sin(theta) to first order: a = 0.3
    # gives |X| below 0.3 I_1(3)/I_0(3) = 0.243 times a second-order factor
    assert np.max(np.abs(out)) < 0.3
    solution = field.solve(rho, 0.2, 0.1)
    np.testing.assert_allclose(solution.density[-1], field.solve(rho.float().numpy(), 0.2, 0.1).density[-1],
                               rtol=0, atol=1e-15)


# -- harmonic moments of particles -----------------------------------------------------------------
def _particles(n=5, seed=1):
    x = np.random.default_rng(seed).standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _solvers():
    return [P.ZonalMeanField(2.0, 3, 6), P.SphericalMeanField(2.0, 4)]


@pytest.mark.parametrize("solver", _solvers(), ids=["zonal", "spherical"])
def test_empirical_density_refuses_complex_positions_and_weights(solver):
    """The imaginary parts were dropped (a NumPy ComplexWarning only) and the moments of the
    real parts returned."""
    x = _particles()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TypeError, match="positions must be real, got complex values"):
            P.empirical_density(x + 0.5j, solver)
        with pytest.raises(TypeError, match="weights must be real, got complex values"):
            P.empirical_density(x, solver, weights=np.ones(5) + 1j)
    with pytest.raises(TypeError, match="weights must be an array of real numbers, got dtype <U1"):
        P.empirical_density(x, solver, weights=["a"] * 5)


@pytest.mark.parametrize("solver", _solvers(), ids=["zonal", "spherical"])
def test_empirical_density_of_half_precision_positions_normalized_in_their_dtype(solver):
    """float16 and bfloat16 points normalized in their own precision (1e-3 off the sphere) were
    refused by the fixed 1e-6 test; their moments equal those of the same float64 numbers."""
    x16 = _particles().astype(np.float16)
    assert np.max(np.abs(np.linalg.norm(x16.astype(np.float64), axis=1) - 1)) > 1e-6
    reference = P.empirical_density(x16.astype(np.float64) / np.linalg.norm(x16.astype(np.float64), axis=1,
                                                                             keepdims=True), solver)
    moments = P.empirical_density(x16, solver)
    # a rounding of 5e-4 in the norm changes each moment by as much
    np.testing.assert_allclose(moments, reference, rtol=0, atol=2e-3 * np.max(np.abs(reference)))
    xb = torch.tensor(_particles(), dtype=torch.bfloat16)
    moments_b = P.empirical_density(xb, solver)
    np.testing.assert_allclose(moments_b, P.empirical_density(
        xb.double().numpy() / np.linalg.norm(xb.double().numpy(), axis=1, keepdims=True), solver),
        rtol=0, atol=2e-2 * np.max(np.abs(reference)))
    # points far off the sphere are still refused, naming the tolerance of their dtype
    with pytest.raises(ValueError, match=r"positions must lie on the unit sphere \(\|x_i\| = 1 to 0.031"):
        P.empirical_density((1.1 * _particles()).astype(np.float16), solver)


def test_empirical_density_takes_torch_bfloat16_weights():
    """torch bfloat16 weights failed inside NumPy ("Got unsupported ScalarType BFloat16")."""
    solver = P.ZonalMeanField(2.0, 3, 6)
    x = _particles()
    w = torch.tensor([1.0, 2.0, 0.5, 0.25, 1.0], dtype=torch.bfloat16)   # exact in bfloat16
    np.testing.assert_allclose(P.empirical_density(x, solver, weights=w),
                               P.empirical_density(x, solver, weights=w.double().numpy()), rtol=0, atol=0)
    # c_0 = sum_i w_i phi_0 with phi_0 = 1 / sqrt(|S^2|) = 1 / sqrt(4 pi)
    assert P.empirical_density(x, solver, weights=w)[0] == pytest.approx(4.75 / np.sqrt(4 * np.pi), rel=1e-14)

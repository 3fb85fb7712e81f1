"""Feature kernels: exact discrete embedding, refinement, quadrature accuracy, FFT convolution."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, special

from ctformer.discretizations import Fourier, GaussLegendre, Midpoint, Trapezoid
from ctformer.kernels import Convolution, PiecewiseConstant, Smooth, SmoothRandom, cell_index

from .conftest import fitted_order


# -- PiecewiseConstant: the embedding of a torch nn.Linear weight ------------------------------
def test_piecewise_constant_matrix_on_midpoint_is_the_weight(rng):
    a = rng.standard_normal((5, 7))
    mat = PiecewiseConstant(a).matrix(Midpoint(5), Midpoint(7))
    np.testing.assert_array_equal(mat, a)  # bit for bit: the discrete limit is exact


@pytest.mark.parametrize("factor", [2, 3])
def test_piecewise_constant_refinement_leaves_results_unchanged(rng, factor):
    d_out, d_in = 4, 6
    a = rng.standard_normal((d_out, d_in))
    u = rng.standard_normal((3, d_in))  # three tokens of piecewise-constant feature data
    reference = u @ a.T  # nn.Linear without bias
    kernel = PiecewiseConstant(a)
    fine = kernel.apply(np.repeat(u, factor, axis=-1), Midpoint(factor * d_out), Midpoint(factor * d_in))
    np.testing.assert_allclose(fine, np.repeat(reference, factor, axis=-1), rtol=0, atol=1e-14)


def test_piecewise_constant_on_smooth_data_converges_to_cell_integrals(rng):
    # (W u)(y) = sum_j d_in A[i(y), j] int_{cell j} u; with u = exp the cell integrals are closed form
    a = rng.standard_normal((3, 4))
    y = GaussLegendre(9)
    edges = np.linspace(0, 1, 5)
    cell_integrals = 4 * (np.exp(edges[1:]) - np.exp(edges[:-1]))
    exact = a[cell_index(y.quadrature_nodes, (0, 1), 3)] @ cell_integrals
    # outputs at Gauss points (inside the cells), inputs on midpoint grids aligned with the cells
    errors, hs = [], []
    for n in (8, 16, 32, 64):
        inp = Midpoint(n)
        got = PiecewiseConstant(a).apply(np.exp(inp.nodes), y, inp)
        errors.append(np.abs(got - exact).max())
        hs.append(inp.h)
    assert abs(fitted_order(hs, errors) - 2.0) < 0.05


def test_apply_batched_along_any_axis_equals_matrix_product(rng):
    kernel = SmoothRandom(3)
    out, inp = GaussLegendre(6), Midpoint(5)
    u = rng.standard_normal((2, 5, 3))
    got = kernel.apply(u, out, inp, axis=1)
    expected = np.einsum("ij,bjk->bik", kernel.matrix(out, inp), u)
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-14)
    assert kernel.apply(u.astype(np.float32), out, inp, axis=1).dtype == np.float32


def test_cell_index_boundaries():
    np.testing.assert_array_equal(cell_index([0.0, 0.25, 0.2499, 0.5, 1.0], (0, 1), 4), [0, 1, 0, 2, 3])
    np.testing.assert_array_equal(cell_index([2.0, 3.0, 4.0], (2, 4), 2), [0, 1, 1])


# -- Smooth kernels: quadrature of the integral operator --------------------------------------
def _exact_smooth(y):
    return np.array([integrate.quad(lambda e: np.cos(3 * yy * e) * np.exp(e), 0, 1, epsabs=1e-14)[0] for yy in y])


def test_smooth_kernel_gauss_is_spectral_and_midpoint_second_order():
    kernel = Smooth(lambda s, t: np.cos(3 * s * t))
    out = GaussLegendre(5)
    exact = _exact_smooth(out.nodes)
    gauss = kernel.apply(np.exp(GaussLegendre(12).nodes), out, GaussLegendre(12))
    assert np.abs(gauss - exact).max() < 1e-13
    hs, errors = [], []
    for n in (8, 16, 32, 64):
        inp = Midpoint(n)
        errors.append(np.abs(kernel.apply(np.exp(inp.nodes), out, inp) - exact).max())
        hs.append(inp.h)
    assert abs(fitted_order(hs, errors) - 2.0) < 0.05


def test_kernel_on_other_domain_is_transplanted():
    # W_ref(s, t) = s + t on [0,1]^2, inputs on [2, 4]: (W u)(y) = int_2^4 (s + t) u(eta) deta / 2
    kernel = Smooth(lambda s, t: s + t)
    out, inp = GaussLegendre(3, domain=(-1, 1)), GaussLegendre(4, domain=(2, 4))
    u = inp.nodes**2
    s = (out.nodes + 1) / 2
    exact = [integrate.quad(lambda e: (ss + (e - 2) / 2) * e**2 / 2, 2, 4)[0] for ss in s]
    np.testing.assert_allclose(kernel.apply(u, out, inp), exact, rtol=1e-13)


# -- SmoothRandom ---------------------------------------------------------------------------
def test_smooth_random_is_deterministic_normalized_and_entire():
    a, b, c = SmoothRandom(7, scale=2.0), SmoothRandom(7, scale=2.0), SmoothRandom(8)
    grid = GaussLegendre(6)
    np.testing.assert_array_equal(a.matrix(grid, grid), b.matrix(grid, grid))
    assert np.abs(a.matrix(grid, grid) - c.matrix(grid, grid)).max() > 1e-3
    norm2, _ = integrate.dblquad(lambda t, s: float(a.evaluate(s, t)) ** 2, 0, 1, 0, 1, epsabs=1e-11)
    assert abs(np.sqrt(norm2) - 2.0) < 1e-9
    # entire kernel: the Gauss rule converges spectrally on smooth data
    out = Midpoint(4)
    exact = np.array([integrate.quad(lambda e: float(a.evaluate(y, e)) * np.sin(2 * e), 0, 1, epsabs=1e-14)[0]
                      for y in out.nodes])
    got = a.apply(np.sin(2 * GaussLegendre(16).nodes), out, GaussLegendre(16))
    assert np.abs(got - exact).max() < 1e-12


# -- Convolution ----------------------------------------------------------------------------
def _profile(z):
    return np.exp(np.cos(2 * np.pi * z)) + 0.3 * z  # not periodic-smooth on purpose at z = 0


@pytest.mark.parametrize("dense_below", [0, 128], ids=["fft", "small grids dense"])
@pytest.mark.parametrize("grid", [Midpoint(16), Midpoint(15), Fourier(16), Fourier(9)], ids=repr)
def test_convolution_fft_equals_dense_matrix(rng, grid, dense_below, monkeypatch):
    monkeypatch.setattr(Convolution, "dense_below", dense_below)
    kernel = Convolution(_profile)
    assert Convolution.is_uniform_periodic(grid)
    u = rng.standard_normal((2, 3, grid.n))
    dense = u @ kernel.matrix(grid, grid).T
    np.testing.assert_allclose(kernel.apply(u, grid, grid), dense, rtol=0, atol=1e-13)
    # along another axis, and in float32
    np.testing.assert_allclose(kernel.apply(np.moveaxis(u, -1, 0), grid, grid, axis=0),
                               np.moveaxis(dense, -1, 0), rtol=0, atol=1e-13)
    single = kernel.apply(u.astype(np.float32), grid, grid)
    assert single.dtype == np.float32
    np.testing.assert_allclose(single, dense, rtol=0, atol=2e-5)


def test_convolution_against_bessel_closed_form():
    # int_0^1 e^{cos 2 pi (y - e)} cos(2 pi e) de = I_1(1) cos(2 pi y)
    kernel = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z)))
    grid = Fourier(16)
    got = kernel.apply(np.cos(2 * np.pi * grid.nodes), grid, grid)
    np.testing.assert_allclose(got, special.i1(1.0) * np.cos(2 * np.pi * grid.nodes), rtol=0, atol=1e-14)


def test_convolution_falls_back_to_dense_off_periodic_grids(rng):
    kernel = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z)))
    for out, inp in ((Trapezoid(9), Trapezoid(9)), (Midpoint(8), Midpoint(6)), (GaussLegendre(12), GaussLegendre(12))):
        assert not (out == inp and Convolution.is_uniform_periodic(inp))
        u = rng.standard_normal(len(inp.nodes))
        np.testing.assert_allclose(kernel.apply(u, out, inp), kernel.matrix(out, inp) @ u, rtol=1e-14, atol=1e-14)
    # the dense fallback on Gauss points still computes the convolution: spectral accuracy
    grid = GaussLegendre(24)
    got = kernel.apply(np.cos(2 * np.pi * grid.nodes), grid, grid)
    np.testing.assert_allclose(got, special.i1(1.0) * np.cos(2 * np.pi * grid.nodes), atol=1e-12)


# -- clear errors ---------------------------------------------------------------------------
def test_kernel_errors():
    with pytest.raises(ValueError, match="2-D"):
        PiecewiseConstant(np.ones(3))
    with pytest.raises(ValueError, match="NaN or inf"):
        PiecewiseConstant(np.array([[1.0, np.nan]]))
    with pytest.raises(TypeError, match="callable"):
        Smooth(3.0)
    with pytest.raises(TypeError, match="callable"):
        Convolution("gauss")
    with pytest.raises(ValueError, match="modes"):
        SmoothRandom(0, modes=0)
    with pytest.raises(ValueError, match="decay"):
        SmoothRandom(0, decay=np.inf)
    with pytest.raises(TypeError, match="seed must be a non-negative integer, got 1.5"):
        SmoothRandom(1.5)
    with pytest.raises(ValueError, match="NaN or inf"):
        Smooth(lambda s, t: np.where(s == t, np.nan, s + t)).matrix(Midpoint(3), Midpoint(3))
    with pytest.raises(TypeError, match="out must be a Discretization"):
        SmoothRandom(0).matrix(3, Midpoint(3))
    with pytest.raises(ValueError, match="expected 4"):
        SmoothRandom(0).apply(np.ones((2, 3)), Midpoint(3), Midpoint(4))
    # array-likes (integer arrays, lists) are accepted as float64; complex is refused
    np.testing.assert_array_equal(SmoothRandom(0).apply(np.ones(4, dtype=int), Midpoint(3), Midpoint(4)),
                                  SmoothRandom(0).apply(np.ones(4), Midpoint(3), Midpoint(4)))
    np.testing.assert_array_equal(SmoothRandom(0).apply([1, 1, 1, 1], Midpoint(3), Midpoint(4)),
                                  SmoothRandom(0).apply(np.ones(4), Midpoint(3), Midpoint(4)))
    with pytest.raises(TypeError, match="u must be a real floating array, got dtype complex128"):
        SmoothRandom(0).apply(np.ones(4) + 1j, Midpoint(3), Midpoint(4))
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        SmoothRandom(-1)

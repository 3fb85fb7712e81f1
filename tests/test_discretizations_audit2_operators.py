"""Fourth audit of the discretizations: as the feature integral operators use them.

References: :math:`(Ku)(s) = \\int_0^1 k(s, t) u(t)\\,dt` by ``scipy.integrate.quad`` for a
smooth kernel, the closed form of an atom's term, closed-form finite-element mass matrices,
the value of the interpolant at a node, and the ``nbytes`` of the arrays a discretization
builds.
"""
import numpy as np
import pytest
import scipy.integrate

import ctformer.discretizations as d
from ctformer.discretizations.report import fit_order
from ctformer.kernels import PiecewiseConstant, Smooth


def _k(s, t):
    return np.exp(s * t) * np.cos(3.0 * t + s)


def _u(t):
    return np.sin(2.0 * t) + 1.0 + t**2


_OUT = d.Midpoint(3)
_KERNEL = Smooth(_k)


def _quad_reference(out):
    return np.array([scipy.integrate.quad(lambda t: _k(s, t) * _u(t), 0.0, 1.0, epsabs=1e-13,
                                          epsrel=1e-13, limit=200)[0] for s in out.nodes])


_REFERENCE = _quad_reference(_OUT)


def _operator_errors(name, sizes):
    hs, errors = [], []
    for n in sizes:
        inp = d.get(name, n)
        got = _KERNEL.apply(inp.to_quadrature(inp.sample(_u)), _OUT, inp)
        hs.append(inp.h)
        errors.append(np.abs(got - _REFERENCE).max())
    return hs, errors


@pytest.mark.parametrize("name, sizes, order", [
    ("midpoint", (8, 16, 32, 64), 2.0),
    ("trapezoid", (9, 17, 33, 65), 2.0),
    ("fourier", (8, 16, 32, 64), 1.0),   # non-periodic data: a left Riemann sum
    ("p1", (9, 17, 33, 65), 4.0),        # projection error squared: 2 (p + 1)
    ("p2", (9, 17, 33, 65), 6.0),
])
def test_the_integral_operator_converges_with_the_order_of_its_input_rule(name, sizes, order):
    hs, errors = _operator_errors(name, sizes)
    assert abs(fit_order(hs, errors) - order) < 0.3


@pytest.mark.parametrize("name", ["gauss-legendre", "clenshaw-curtis", "chebyshev", "legendre"])
def test_the_integral_operator_on_a_spectral_rule_reaches_rounding(name):
    _, errors = _operator_errors(name, (17,))
    assert errors[0] < 1e-13


@pytest.mark.parametrize("weight", [None, 0.3])
def test_a_class_token_atom_adds_its_own_term_to_the_operator(weight):
    inp = d.WithAtoms(d.GaussLegendre(20), 1, weight=weight, locations=[0.5])
    atom = 1.0 / 21.0 if weight is None else weight
    expected = atom * _k(_OUT.nodes, 0.5) * _u(0.5) + (1.0 - atom) * _REFERENCE
    got = _KERNEL.apply(inp.sample(_u), _OUT, inp)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-14)


def test_a_piecewise_kernel_on_aligned_p2_elements_is_exact_to_the_gauss_rule():
    a = np.array([[1.0, -2.0], [0.5, 3.0]])
    inp = d.P2(9)                                   # 4 elements, 2 per kernel cell
    u = inp.quadrature_nodes**3                     # a cubic: 4 Gauss points are exact
    exact = 2.0 * a @ np.array([0.5**4 / 4.0, (1.0 - 0.5**4) / 4.0])
    got = PiecewiseConstant(a).apply(u, d.Midpoint(2), inp)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-15)


def test_galerkin_mass_matrices_are_the_closed_forms_on_a_shifted_domain():
    p1, p2 = d.P1(9, domain=(-2.0, 3.0)), d.P2(9, domain=(-2.0, 3.0))
    m1, m2 = np.zeros((9, 9)), np.zeros((9, 9))
    for e in range(8):
        m1[e:e + 2, e:e + 2] += p1.element_width / 6.0 * np.array([[2, 1], [1, 2]])
    for e in range(4):
        m2[2 * e:2 * e + 3, 2 * e:2 * e + 3] += p2.element_width / 30.0 * np.array(
            [[4, 2, -1], [2, 16, 2], [-1, 2, 4]])
    np.testing.assert_allclose(p1.mass.toarray(), m1, rtol=0, atol=1e-15)
    np.testing.assert_allclose(p2.mass.toarray(), m2, rtol=0, atol=1e-15)


def test_float32_states_stay_float32_through_a_smooth_kernel():
    inp = d.ClenshawCurtis(17)
    u32 = _u(inp.nodes).astype(np.float32)
    got = _KERNEL.apply(u32, _OUT, inp)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _REFERENCE, rtol=0, atol=2e-6)


# -- defects of this round ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["gauss-legendre", "clenshaw-curtis", "chebyshev"])
@pytest.mark.parametrize("point", [5e-324, 1e-310, 1e-308])
def test_barycentric_interpolation_next_to_a_node_at_zero_is_that_nodes_value(name, point):
    # the middle node of an odd rule on (-1, 1) is 0: lambda / (x - 0) overflowed to inf and
    # the row became inf / inf = NaN
    disc = d.get(name, 9, domain=(-1.0, 1.0))
    values = disc.sample(np.cos)
    np.testing.assert_array_equal(disc.interpolation_matrix([point]) @ values, [1.0])
    np.testing.assert_array_equal(disc.interpolate(values, [point]), [1.0])


def test_a_kernel_refuses_a_two_dimensional_grid_by_name():
    square = d.Product(d.Midpoint(4), d.Midpoint(4))
    with pytest.raises(TypeError, match="inp must discretize an interval"):
        _KERNEL.apply(np.ones(16), _OUT, square)
    with pytest.raises(TypeError, match="out must discretize an interval"):
        _KERNEL.matrix(d.WithAtoms(square), _OUT)


def _nbytes(a):
    if hasattr(a, "indptr"):
        return a.data.nbytes + a.indices.nbytes + a.indptr.nbytes
    return np.asarray(a).nbytes


@pytest.mark.parametrize("cls", [d.P1, d.P2])
def test_the_galerkin_memory_estimate_covers_what_a_projection_builds(cls):
    n = 20001
    disc = cls(n)
    disc.sample(np.sin)  # builds the basis, B^T W, the mass matrix and its LU factors
    lu = disc._mass_lu
    built = sum(_nbytes(a) for a in (disc.nodes, disc.weights, disc.quadrature_nodes,
                                     disc.quadrature_weights, disc.quadrature_basis,
                                     disc._projection_rhs, disc.mass, lu.L, lu.U))
    estimate = disc._bytes_per_value * n
    assert built <= estimate < 1.02 * built   # it was 160 bytes a value, 264 (P1) were built


def test_a_nodal_product_keeps_one_copy_of_its_nodes_within_its_estimate():
    square = d.Product(d.GaussLegendre(40), d.Midpoint(50))
    arrays = {id(a): a for a in (square.nodes, square.weights, square.quadrature_nodes,
                                 square.quadrature_weights)}
    assert sum(a.nbytes for a in arrays.values()) == 24 * square.n   # was 48 n
    galerkin = d.Product(d.P1(11), d.Midpoint(7))
    arrays = (galerkin.nodes, galerkin.weights, galerkin.quadrature_nodes, galerkin.quadrature_weights)
    assert sum(a.nbytes for a in arrays) == 24 * (galerkin.n + 3 * 10 * 7)

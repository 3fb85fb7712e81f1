"""Third audit of the discretizations: a piecewise-constant kernel sampled at or across its
jumps, and interval ends that are not numbers.

The reference for the kernel is the closed form of :math:`\\int_0^1 W(s, t) u(t)\\,dt` with
:math:`u(t) = e^t \\cos(3t + 1)` (an antiderivative on every kernel cell); the orders are the
fitted slopes of the maximum error against :math:`h`.
"""
import numpy as np
import pytest

import ctformer.discretizations as d
from ctformer.kernels import PiecewiseConstant


def _u(t):
    return np.exp(t) * np.cos(3.0 * t + 1.0)


def _antiderivative(t):
    return np.exp(t) * (np.cos(3.0 * t + 1.0) + 3.0 * np.sin(3.0 * t + 1.0)) / 10.0


_A = np.random.default_rng(0).standard_normal((3, 4))
_KERNEL = PiecewiseConstant(_A)
# (K u) on output cell i: d_in sum_j A_ij int_{cell j} u, closed form
_EXACT = 4 * _A @ np.diff(_antiderivative(np.arange(5) / 4.0))


def _fitted_order(name, sizes):
    hs, errors = [], []
    for n in sizes:
        inp = d.get(name, n)
        got = _KERNEL.matrix(d.Midpoint(3), inp) @ inp.to_quadrature(inp.sample(_u))
        hs.append(inp.h)
        errors.append(np.abs(got - _EXACT).max())
    return np.polyfit(np.log(hs), np.log(errors), 1)[0]


@pytest.mark.parametrize("name, sizes, reported", [
    ("midpoint", (4, 8, 16, 32, 64), 2.0),        # cells are unions of kernel cells
    ("midpoint", (6, 18, 54, 162), 1.0),          # jumps at 1/4, 3/4 inside midpoint cells
    ("trapezoid", (5, 9, 17, 33, 65, 129), 1.0),  # nodes on every jump
    ("gauss-legendre", (4, 8, 16, 32, 64), 1.0),
    ("clenshaw-curtis", (5, 9, 17, 33, 65), 1.0),
    ("p1", (4, 10, 28, 82), 1.0),                 # 3, 9, 27, 81 elements: misaligned
])
def test_piecewise_constant_reports_the_order_it_converges_with(name, sizes, reported):
    assert _KERNEL.quadrature_order(d.get(name, sizes[0])) == reported
    assert _fitted_order(name, sizes) == pytest.approx(reported, abs=0.25)


def test_aligned_elements_keep_their_order_and_one_input_cell_has_no_jump():
    # 4, 8, ..., 64 elements: every jump on an element end, Gauss points inside (at least order 2)
    assert _KERNEL.quadrature_order(d.P1(17)) == 2.0
    assert _fitted_order("p1", (5, 9, 17, 33, 65)) > 2.0 - 0.25
    assert _KERNEL.quadrature_order(d.P2(17)) == 3.0
    # a single input cell: W is constant in t and every rule keeps its order
    assert PiecewiseConstant(np.ones((2, 1))).quadrature_order(d.Trapezoid(9)) == 2.0
    assert PiecewiseConstant(np.ones((2, 1))).quadrature_order(d.GaussLegendre(9)) == np.inf


def test_quadrature_order_refuses_what_is_not_an_interval_rule():
    with pytest.raises(TypeError, match="inp must be a Discretization of an interval"):
        _KERNEL.quadrature_order(d.Product(d.Midpoint(2), d.Midpoint(2)))
    with pytest.raises(TypeError, match="inp must be a Discretization of an interval"):
        _KERNEL.quadrature_order("midpoint")


@pytest.mark.parametrize("domain", [(True, 2.0), (0.0, np.True_), ("0", "1"), (b"0", 1.0)])
def test_domain_ends_must_be_real_numbers(domain):
    # float() used to read True as 1.0 and "1" as 1.0: Midpoint(3, (True, 2)) lived on [1, 2]
    with pytest.raises(ValueError, match=r"domain must be a pair \(a, b\) of real numbers.*"
                                         r"domain=\(0.0, 1.0\)"):
        d.Midpoint(3, domain=domain)


def test_numpy_and_integer_domain_ends_stay_accepted():
    assert d.Midpoint(3, domain=(np.float32(0.0), np.int64(2))).domain == (0.0, 2.0)
    assert d.get("p2", 5, domain=np.array([-1.0, 1.0])).domain == (-1.0, 1.0)

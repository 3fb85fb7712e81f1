"""Cached kernel matrices never belong to another computation: a kernel whose function's
numbers were edited in place before it was built is another kernel, with its own matrix.

A parametrized function (one with ``parameters()``) holds its arrays writable in the user's
object. Kernels compared the function by identity only, so a kernel built after ``f.a[0] = 2``
was equal to one built before and read that one's cached matrix (ratio 1.0 where the
closed form gives 2.0)."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import Convolution, Smooth


class _Scaled:
    r"""A parametrized kernel function :math:`W(s, t) = a_0 \exp(-(s - t)^2)` whose numbers
    ``a`` (only ``a[0]`` is read) live in the user's object, writable."""

    def __init__(self, size=1):
        self.a = np.ones(size)

    def parameters(self):
        return {"a": self.a}

    def __call__(self, s, t):
        return self.a[0] * np.exp(-(s - t) ** 2)


class _Profile:
    r"""A parametrized convolution profile :math:`p(z) = a_0 \cos(2 \pi z)`."""

    def __init__(self):
        self.a = np.ones(1)

    def parameters(self):
        return {"a": self.a}

    def __call__(self, z):
        return self.a[0] * np.cos(2 * np.pi * z)


def _gauss_matrix(scale, n):
    """The closed-form matrix :math:`a\\, e^{-(s_i - s_j)^2} w_j` on Gauss-Legendre nodes of
    [0, 1], from NumPy's own rule."""
    x, w = np.polynomial.legendre.leggauss(n)
    s, w = 0.5 * (x + 1.0), 0.5 * w
    return scale * np.exp(-(s[:, None] - s[None, :]) ** 2) * w[None, :]


def test_a_kernel_built_after_its_function_changed_in_place_has_the_new_matrix():
    f = _Scaled()
    grid = GaussLegendre(6)
    first = Smooth(f)
    before = first.matrix(grid, grid)
    f.a[0] = 2.0
    second = Smooth(f)
    assert second != first
    np.testing.assert_allclose(second.matrix(grid, grid), _gauss_matrix(2.0, 6), rtol=1e-14, atol=0)
    # the kernel built before keeps the matrix of its own numbers (a frozen value)
    np.testing.assert_allclose(before, _gauss_matrix(1.0, 6), rtol=1e-14, atol=0)


def test_a_change_outside_the_hashed_samples_is_seen_too():
    """The hash reads 64 of an array's entries; a function's numbers are digested whole, since
    the full comparison runs later, when the change has already happened."""
    f = _Scaled(size=4096)
    grid = GaussLegendre(4)
    first = Smooth(f)
    first.matrix(grid, grid)
    f.a[1] = 5.0   # entry 1 is not among the sampled ones (every 64th)
    assert Smooth(f) != first
    f.a[1] = 1.0   # back to the first numbers: the same kernel again
    assert Smooth(f) == first


def test_a_convolution_built_after_its_profile_changed_in_place_applies_the_new_profile():
    p = _Profile()
    grid = Midpoint(8)
    u = np.random.default_rng(0).standard_normal((3, 8))
    first = Convolution(p)
    first.apply(u, grid, grid)
    p.a[0] = 3.0
    # the circulant matrix A_ij = p(((i - j) mod n) / n) / n, assembled here
    i = np.arange(8)
    circulant = 3.0 * np.cos(2 * np.pi * ((i[:, None] - i[None, :]) % 8) / 8) / 8
    np.testing.assert_allclose(Convolution(p).apply(u, grid, grid), u @ circulant.T, rtol=1e-12, atol=1e-14)


def test_the_float32_device_matrix_is_read_only_like_the_float64_one():
    """``device_matrix`` hands out the cached float32 copy: it was writable, so ``m *= 2``
    doubled the matrix of every later call (and of every equal kernel)."""
    kernel, grid = Smooth(_gauss_kernel), GaussLegendre(5)
    u32 = np.ones((2, 5), np.float32)
    first = kernel.device_matrix(u32, grid, grid)
    assert first.dtype == np.float32
    with pytest.raises(ValueError, match="read-only"):
        first *= 2
    again = Smooth(_gauss_kernel).device_matrix(u32, grid, grid)
    np.testing.assert_allclose(again, _gauss_matrix(1.0, 5), rtol=1e-6, atol=0)
    assert not kernel.device_matrix(np.ones((2, 5)), grid, grid).flags.writeable


def _gauss_kernel(s, t):
    return np.exp(-(s - t) ** 2)

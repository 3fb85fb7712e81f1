"""Feature kernels audited against independent references: parametrized functions with tensor
parameters (autograd against the closed-form derivative), ``with_parameters`` through a
kernel's function, and the argument checks of :meth:`Kernel.apply`."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import integrate

from ctformer import ContinuousTransformer
from ctformer.discretizations import Fourier, GaussLegendre, Midpoint
from ctformer.kernels import Convolution, PiecewiseConstant, Smooth
from ctformer.model import Block
from ctformer.operators import FeedForward


class _OneParameter:
    """A callable with one named parameter, a number or a torch tensor; ``_lib(*x)`` gives
    the library of the parameter (``numpy`` or ``torch``) and ``x`` in it."""

    name = ""

    def __init__(self, value):
        setattr(self, self.name, value)  # with_parameters assigns it under its name
        self.__name__ = type(self).__name__

    @property
    def value(self):
        return getattr(self, self.name)

    def parameters(self):
        return {self.name: self.value}

    def _lib(self, *x):
        if isinstance(self.value, torch.Tensor):
            return (torch, *(torch.as_tensor(v, dtype=self.value.dtype) for v in x))
        return (np, *x)


class GaussianKernel(_OneParameter):
    r"""A parametrized kernel function :math:`W(s, t) = \exp(-(s - t)^2 / w)`, NumPy or torch."""

    name = "width"

    def __call__(self, s, t):
        lib, s, t = self._lib(s, t)
        return lib.exp(-(s - t) ** 2 / self.value)


class CosineProfile(_OneParameter):
    r"""A parametrized convolution profile :math:`p(z) = a \cos(2 \pi z)`, NumPy or torch."""

    name = "amplitude"

    def __call__(self, z):
        lib, z = self._lib(z)
        return self.value * lib.cos(2 * np.pi * z)


def _u(t):
    return np.sin(3 * t) + t**2


def test_smooth_kernel_with_tensor_parameters_differentiates_like_the_integral():
    # d/dw int_0^1 exp(-(s - t)^2 / w) u(t) dt = int (s - t)^2 / w^2 exp(-(s - t)^2 / w) u(t) dt
    width = 0.1
    out, inp = GaussLegendre(5), GaussLegendre(40)
    s = np.asarray(out.quadrature_nodes)
    value = [integrate.quad(lambda t, y=y: np.exp(-(y - t) ** 2 / width) * _u(t), 0, 1,
                            epsabs=1e-15, epsrel=1e-13)[0] for y in s]
    slope = [integrate.quad(lambda t, y=y: (y - t) ** 2 / width**2 * np.exp(-(y - t) ** 2 / width) * _u(t),
                            0, 1, epsabs=1e-15, epsrel=1e-13)[0] for y in s]
    w = torch.tensor(width, dtype=torch.float64, requires_grad=True)
    got = Smooth(GaussianKernel(w)).apply(torch.as_tensor(_u(np.asarray(inp.quadrature_nodes))), out, inp)
    np.testing.assert_allclose(got.detach().numpy(), value, rtol=0, atol=1e-13)
    got.sum().backward()
    np.testing.assert_allclose(float(w.grad), sum(slope), rtol=1e-12)


def test_convolution_with_tensor_parameters_differentiates_like_the_closed_form():
    # int_0^1 a cos(2 pi (s - t)) sin(2 pi t) dt = (a / 2) sin(2 pi s), on Fourier grids above
    # the FFT crossover as well
    for n in (8, 256):
        grid = Fourier(n)
        x = np.asarray(grid.nodes)
        a = torch.tensor(3.0, dtype=torch.float64, requires_grad=True)
        got = Convolution(CosineProfile(a)).apply(torch.as_tensor(np.sin(2 * np.pi * x)), grid, grid)
        np.testing.assert_allclose(got.detach().numpy(), 1.5 * np.sin(2 * np.pi * x), rtol=0, atol=1e-14)
        (got * torch.as_tensor(np.sin(2 * np.pi * x))).sum().backward()
        np.testing.assert_allclose(float(a.grad), 0.5 * np.sum(np.sin(2 * np.pi * x) ** 2), rtol=1e-13)


def test_with_parameters_reaches_a_smooth_kernels_function():
    # parameters() lists the function's width; with_parameters must find it (a KeyError before)
    grid = GaussLegendre(6)
    ff = FeedForward(Smooth(GaussianKernel(np.array(0.1))), Smooth(lambda s, t: np.cos(s + t)),
                     activation="silu")
    model = ContinuousTransformer([Block(feedforward=ff)])
    assert list(model.parameters()) == ["blocks.0.feedforward.W_1.width"]
    changed = model.with_parameters({"blocks.0.feedforward.W_1.width": np.array(0.2)})
    kernel = changed.blocks[0].feedforward.W_1
    s = np.asarray(grid.quadrature_nodes)
    expected = np.exp(-(s[:, None] - s[None, :]) ** 2 / 0.2) * np.asarray(grid.quadrature_weights)
    np.testing.assert_allclose(kernel.matrix(grid, grid), expected, rtol=1e-15, atol=0)
    np.testing.assert_array_equal(model.blocks[0].feedforward.W_1.function.width, 0.1)  # unchanged


def test_with_parameters_reaches_a_convolution_profile():
    ff = FeedForward(Convolution(CosineProfile(2.0)), Convolution(CosineProfile(1.0)), activation="relu")
    model = ContinuousTransformer([Block(feedforward=ff)])
    changed = model.with_parameters({"blocks.0.feedforward.W_1.amplitude": 5.0,
                                     "blocks.0.feedforward.W_2.amplitude": 1.0})
    assert changed.blocks[0].feedforward.W_1.profile.amplitude == 5.0


def test_tensor_parameters_keep_the_dtype_of_u_and_refuse_numpy_states():
    a = np.random.default_rng(0).standard_normal((3, 4))
    kernel = PiecewiseConstant(a)
    kernel._replace("weight", torch.tensor(a))   # what with_parameters hands in
    u = np.random.default_rng(1).standard_normal((2, 4))
    got = kernel.apply(torch.tensor(u, dtype=torch.float32), Midpoint(3), Midpoint(4))
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), u @ a.T, rtol=0, atol=1e-5)
    with pytest.raises(TypeError, match=r"u is a numpy.ndarray but the parameters .* torch.Tensor .*torch.as_tensor"):
        kernel.apply(u, Midpoint(3), Midpoint(4))


@pytest.mark.parametrize("kernel", [Smooth(lambda s, t: np.ones(3)), Convolution(lambda z: np.ones(3))],
                         ids=["smooth", "convolution"])
def test_a_function_of_the_wrong_shape_is_refused_by_name(kernel):
    with pytest.raises(ValueError, match=r"returned values of shape \(3,\) for 5 output x 5 input points; "
                                         r"expected shape \(5, 5\).*vectorized"):
        kernel.matrix(GaussLegendre(5), GaussLegendre(5))


def test_apply_refuses_a_string_grid_a_float_axis_and_a_0d_state():
    kernel = PiecewiseConstant(np.ones((2, 3)))
    with pytest.raises(TypeError, match="inp must be a Discretization, got str"):
        kernel.apply(np.ones((4, 3)), Midpoint(2), "midpoint")
    with pytest.raises(TypeError, match="inp must be a Discretization, got str"):
        Convolution(np.cos).apply(np.ones(8), Fourier(8), "fourier")
    with pytest.raises(TypeError, match="axis must be an integer, got float 1.0"):
        kernel.apply(np.ones((4, 3, 5)), Midpoint(2), Midpoint(3), axis=1.0)
    with pytest.raises(ValueError, match="u must have an axis of 3 values .* got a 0-d array"):
        kernel.apply(np.array(1.0), Midpoint(2), Midpoint(3))

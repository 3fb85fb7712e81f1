r"""Smooth kernels: a user's function, and a random entire function.

:class:`Smooth` evaluates a vectorized function :math:`W_{\mathrm{ref}}(s, t)` given by the
user. :class:`SmoothRandom` is deterministic in its seed,

.. math::  W_{\mathrm{ref}}(s, t) = c \sum_{p, q = 0}^{m - 1} a_{pq}
           \cos(\pi p s + \phi_p) \cos(\pi q t + \psi_q) ,

with :math:`c` such that :math:`\|W\|_{L^2([0,1]^2)}` = ``scale``; its matrix is built
separably, :math:`A_{ij} = (B_{\mathrm{out}}\, c a\, B_{\mathrm{in}}^T)_{ij}\, w_j / L_{\mathrm{in}}`
with :math:`(B_{\mathrm{out}})_{ip} = \cos(\pi p s_i + \phi_p)`, :math:`(B_{\mathrm{in}})_{jq} =
\cos(\pi q t_j + \psi_q)`.
"""
from __future__ import annotations

import math
from typing import Callable

import array_api_compat
import numpy as np

from .. import validation
from .base import Kernel, _reference_points
from .parameters import _to_host, callable_parameters, is_host, read_only_parameters


class Smooth(Kernel):
    r"""A kernel given by a vectorized function :math:`W_{\mathrm{ref}}(s, t)` on :math:`[0, 1]^2`.

    Parameters
    ----------
    function : callable
        ``function(s, t)`` with broadcasting NumPy arrays ``s`` (column) and ``t`` (row),
        returning values of their broadcast shape (or one that broadcasts to it). An object
        with a ``parameters()`` method is a parametrized function: its numbers are the
        kernel's (``with_parameters`` replaces them); when they are torch tensors it may
        return a tensor, and the kernel's matrix is then built in torch, so autograd sees it.

    Raises
    ------
    TypeError
        If ``function`` is not callable.
    ValueError
        When discretized, if the values have a shape that does not broadcast to the grid
        pair's, or are NaN or inf.
    """

    def __init__(self, function: Callable):
        if not callable(function):
            raise TypeError(f"Smooth needs a callable function(y, eta), got {type(function).__name__}")
        self.function = function

    def __repr__(self) -> str:
        return f"Smooth({getattr(self.function, '__name__', self.function)!r})"

    def parameters(self) -> dict:
        """The function's own ``parameters()`` (read-only views), if it has any."""
        return callable_parameters(self.function)

    def evaluate(self, s, t):
        """The function's values at ``(s, t)``; an array of another namespace (a parametrized
        function of tensors) is kept there, so autograd sees the kernel."""
        return _function_values(self, self.function(s, t), "the function")


class SmoothRandom(Kernel):
    r"""A random smooth (entire) kernel, deterministic in ``seed``.

    .. math::

        W_{\mathrm{ref}}(s, t) = c \sum_{p, q = 0}^{m - 1} a_{pq}
            \cos(\pi p s + \phi_p) \cos(\pi q t + \psi_q),
        \qquad a_{pq} \sim \mathcal{N}(0, 1)\, (1 + p + q)^{-\alpha},

    with random phases :math:`\phi_p, \psi_q \in [0, 2\pi)`, :math:`m` = ``modes``,
    :math:`\alpha` = ``decay``, and :math:`c` chosen so that
    :math:`\|W\|_{L^2([0,1]^2)}` = ``|scale|`` (a negative ``scale`` flips the kernel's sign).
    Since the Hilbert-Schmidt norm bounds the operator norm,
    :math:`\|W u\|_{L^2} \le` ``|scale|`` :math:`\|u\|_{L^2}`: operators are O(1). The kernel is
    entire in both arguments and not periodic, so spectral rules converge spectrally and
    periodic rules do not get an unfair advantage.

    Parameters
    ----------
    seed : int
        Seed of :func:`numpy.random.default_rng`.
    modes : int, optional
        Number :math:`m \ge 1` of modes per variable. Default 4.
    decay : float, optional
        Decay exponent :math:`\alpha \ge 0` of the coefficients. Default 2.
    scale : float, optional
        :math:`L^2` norm of the kernel, with its sign (the kernel of ``-scale`` is minus that
        of ``scale``). Default 1.

    Raises
    ------
    TypeError
        For a seed or modes that is not an integer, a decay or scale that is not a real number.
    ValueError
        For a negative seed, modes < 1, a negative or non-finite decay, or a non-finite scale.
    """

    def __init__(self, seed: int, modes: int = 4, decay: float = 2.0, scale: float = 1.0):
        self.seed = validation.integer(seed, "seed", minimum=0)
        self.modes = validation.integer(modes, "modes")
        self.decay = validation.real(decay, "decay", nonnegative=True)
        self.scale = validation.real(scale, "scale")
        rng = np.random.default_rng(self.seed)
        p = np.arange(self.modes)
        coeffs = rng.standard_normal((self.modes, self.modes)) * (1.0 + p[:, None] + p[None, :]) ** -self.decay
        self.phase_out = rng.uniform(0.0, 2 * np.pi, self.modes)
        self.phase_in = rng.uniform(0.0, 2 * np.pi, self.modes)
        # L2 norm of the unscaled kernel by a Gauss rule that is exact to rounding for these modes
        t, w = np.polynomial.legendre.leggauss(4 * self.modes + 24)
        t, w = 0.5 * (t + 1.0), 0.5 * w
        vals = self._basis(t, self.phase_out) @ coeffs @ self._basis(t, self.phase_in).T
        norm = math.sqrt(float(w @ vals**2 @ w))
        self.coefficients = coeffs * (self.scale / norm)
        for values in (self.coefficients, self.phase_out, self.phase_in):
            values.setflags(write=False)

    def __repr__(self) -> str:
        return f"SmoothRandom(seed={self.seed}, modes={self.modes}, decay={self.decay}, scale={self.scale})"

    def parameters(self) -> dict:
        """The scaled coefficients and the phases (see the class docstring), read-only views."""
        return read_only_parameters({"coefficients": self.coefficients,
                                     "phase_out": self.phase_out, "phase_in": self.phase_in})

    def _host(self) -> bool:
        return (type(self.coefficients) is np.ndarray and type(self.phase_out) is np.ndarray
                and type(self.phase_in) is np.ndarray)

    def _basis(self, s, phase):
        s = np.asarray(s, dtype=np.float64)
        if is_host(phase):
            return np.cos(np.pi * np.arange(self.modes) * s[..., None] + phase)
        xp = array_api_compat.array_namespace(phase)
        grid = xp.asarray(np.pi * np.arange(self.modes) * s[..., None], dtype=phase.dtype,
                          device=array_api_compat.device(phase))
        return xp.cos(grid + phase)

    def evaluate(self, s, t):
        s, t = np.broadcast_arrays(np.asarray(s, dtype=np.float64), np.asarray(t, dtype=np.float64))
        return np.einsum("...p,pq,...q->...", self._basis(s, self.phase_out), self.coefficients,
                         self._basis(t, self.phase_in))

    def _build_matrix(self, out, inp):
        b_out = self._basis(_reference_points(out), self.phase_out)
        b_in = self._basis(_reference_points(inp), self.phase_in)
        w = (np.asarray(inp.quadrature_weights) / inp.length)[None, :]
        if self._host():
            return (b_out @ self.coefficients @ b_in.T) * w
        xp = array_api_compat.array_namespace(*(v for v in self.parameters().values() if not is_host(v)))
        like = next(v for v in self.parameters().values() if not is_host(v))
        device = array_api_compat.device(like)

        def on(a):
            return a if not is_host(a) else xp.asarray(np.array(a), dtype=like.dtype, device=device)

        return (on(b_out) @ on(self.coefficients) @ xp.matrix_transpose(on(b_in))) * on(w)


def _function_values(kernel, values, what: str):
    """``values`` of a kernel's user function as a host float64 array, or as they are when
    they are an array of another namespace and the kernel's parameters live there too."""
    if not is_host(values) and not kernel._host():
        return values
    from ..discretizations.base import real_host_array

    return real_host_array(_to_host(values), f"{kernel!r}: {what}")

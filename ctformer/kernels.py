r"""Feature kernels :math:`W(y, \eta)` and their discretization on pairs of discretizations.

A kernel defines the integral operator of the design notes, section 1,

.. math::  (W u)(y) = \int_{Y_{\mathrm{in}}} W(y, \eta)\, u(\eta)\, d\eta ,

mapping functions of :math:`\eta` (the input variable, e.g. features :math:`Y`) to functions of
:math:`y` (the output variable, e.g. head features :math:`Y_h` or the FFN variable :math:`R`).
Operators act on values at quadrature points, so a kernel discretized on an output
discretization ``out`` and an input discretization ``inp`` is the host matrix

.. math::  A_{ij} = W(y_i, \eta_j)\, w_j ,

with :math:`y_i` = ``out.quadrature_nodes``, :math:`\eta_j` = ``inp.quadrature_nodes`` and
:math:`w_j` = ``inp.quadrature_weights`` (:meth:`Kernel.matrix`). Applying the operator is a
contraction with this matrix (:meth:`Kernel.apply`), except for :class:`Convolution`, which uses
FFTs on uniform periodic grids.

Every kernel is defined on the reference square :math:`[0, 1]^2`. On other domains it is
transplanted affinely, :math:`W(y, \eta) = W_{\mathrm{ref}}(s, t) / L_{\mathrm{in}}` with
:math:`s = (y - a_{\mathrm{out}}) / L_{\mathrm{out}}` and :math:`t = (\eta - a_{\mathrm{in}}) /
L_{\mathrm{in}}`, so that the operator does not depend on the domain length.

==========================  ==========================================================
kernel                      :math:`W_{\mathrm{ref}}(s, t)`
==========================  ==========================================================
:class:`PiecewiseConstant`  :math:`d_{\mathrm{in}} A_{ij}` on cell :math:`(i, j)` (a torch ``nn.Linear``)
:class:`Smooth`             a user function
:class:`SmoothRandom`       a random entire function (trigonometric modes)
:class:`Convolution`        :math:`p((s - t) \bmod 1)`
==========================  ==========================================================
"""
from __future__ import annotations

import abc
import math
from typing import Callable

import array_api_compat
import numpy as np

from . import validation
from ._numerics.convolution_route import dense_below as measured_dense_below
from .backend import _cached, backend_of, constant, to_host

__all__ = ["Kernel", "PiecewiseConstant", "Smooth", "SmoothRandom", "Convolution", "cell_index",
           "read_only", "read_only_parameters", "callable_parameters"]


def cell_index(points, domain, cells: int) -> np.ndarray:
    r"""Index of the uniform cell of ``domain`` that contains each point.

    .. math::  i(y) = \min(\max(\lfloor d\,(y - a) / (b - a) \rfloor, 0), d - 1)

    Points on an interior cell boundary belong to the cell on their right; the right end
    :math:`b` belongs to the last cell.

    Parameters
    ----------
    points : array_like
        Points in ``domain``.
    domain : tuple of float
        The interval ``(a, b)``.
    cells : int
        Number ``d`` of uniform cells.

    Returns
    -------
    ndarray of int
        Cell indices in ``0 .. d - 1``, same shape as ``points``.
    """
    a, b = domain
    idx = np.floor((np.asarray(points, dtype=np.float64) - a) * (cells / (b - a)))
    return np.clip(idx, 0, cells - 1).astype(np.intp)


def _to_host(x):
    """Host NumPy copy of an array of any namespace (other inputs pass through)."""
    return to_host(x) if hasattr(x, "__array_namespace__") or hasattr(x, "detach") else x


def is_host(value) -> bool:
    """True for parameters held on the host (NumPy, numbers): discretizations of them are
    cached. Arrays of another namespace (torch tensors handed in by ``with_parameters``) are
    assembled afresh in their own namespace at every use, so autograd sees them and an
    in-place update is never hidden behind a cached copy."""
    if type(value) is np.ndarray or type(value) is float or value is None:
        return True
    return isinstance(value, (np.ndarray, np.generic)) or not array_api_compat.is_array_api_obj(value)


def read_only(value):
    """``value`` as a read-only view when it is a host array (no copy), else unchanged.

    What ``parameters()`` hands out: editing a model's arrays in place raises
    :class:`ValueError` (``v *= 2``: ``output array is read-only``; ``v[0] = 1``: ``assignment
    destination is read-only``) instead of changing values that cached discretizations and
    pickled copies do not see. Tensors (handed in by
    ``with_parameters`` for autograd) are returned as they are: an optimizer updates them in
    place, and operators holding them are never cached.
    """
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def read_only_parameters(parameters) -> dict:
    """A ``parameters()`` mapping with every host array a read-only view (:func:`read_only`)."""
    return {name: read_only(value) for name, value in dict(parameters).items()}


def callable_parameters(function) -> dict:
    """The numbers of a user's function: its own ``parameters()`` (read-only views) if it has
    that method, else ``{}``.

    A kernel's function, a convolution profile or a feature function may be a plain Python
    function (no numbers of its own) or an object with a ``parameters()`` method returning a
    mapping ``name -> array`` (a parametrized function, whose numbers ``with_parameters``
    replaces); this is the one place that tells the two apart.
    """
    own = getattr(function, "parameters", None)
    return read_only_parameters(own()) if callable(own) else {}


def _reference_points(disc) -> np.ndarray:
    a, b = disc.domain
    return (np.asarray(disc.quadrature_nodes, dtype=np.float64) - a) / (b - a)


def _check_discretization(disc, argname: str):
    if not (hasattr(disc, "quadrature_nodes") and hasattr(disc, "quadrature_weights")):
        raise TypeError(f"{argname} must be a Discretization, got {type(disc).__name__}")


class Kernel(abc.ABC):
    r"""A kernel :math:`W(y, \eta)` on :math:`[0, 1]^2` that discretizes onto any pair of grids.

    Subclasses implement :meth:`evaluate`; they may override :meth:`_build_matrix` (for an
    exact or separable construction) and :meth:`apply` (for a fast algorithm).

    Notes
    -----
    Host matrices are built once per ``(out, inp)`` pair and device copies once per namespace,
    device and dtype, both in the library's cache (:func:`ctformer.backend.constant`), not on
    the kernel: a kernel is plain data.
    """

    @abc.abstractmethod
    def evaluate(self, s, t) -> np.ndarray:
        r"""Kernel values :math:`W_{\mathrm{ref}}(s, t)` at reference points (NumPy, broadcasting).

        Parameters
        ----------
        s, t : ndarray
            Output and input reference coordinates in :math:`[0, 1]`, broadcast together.

        Returns
        -------
        ndarray
            The kernel values, of the broadcast shape.
        """

    def parameters(self) -> dict:
        """Named arrays of the kernel's numbers (a user function's own ``parameters()``, if any)."""
        return {}

    def _host(self) -> bool:
        """True when every parameter is on the host (the cached, NumPy assembly applies)."""
        return all(is_host(v) for v in self.parameters().values())

    def matrix(self, out, inp) -> np.ndarray:
        r"""The host matrix :math:`A_{ij} = W(y_i, \eta_j) w_j` of shape ``(nq_out, nq_in)``.

        Parameters
        ----------
        out : Discretization
            Discretization of the output variable :math:`y` (rows).
        inp : Discretization
            Discretization of the input variable :math:`\eta` (columns, with weights).

        Returns
        -------
        ndarray, shape (len(out.quadrature_nodes), len(inp.quadrature_nodes))
            Read-only float64 array.

        Raises
        ------
        TypeError
            If ``out`` or ``inp`` is not a discretization.
        ValueError
            If the kernel takes non-finite values on these grids.
        """
        _check_discretization(out, "out")
        _check_discretization(inp, "inp")
        from .discretizations.base import check_dense

        check_dense(len(out.quadrature_nodes), len(inp.quadrature_nodes),
                    f"the matrix of {self!r} on {out!r} x {inp!r}", "use smaller discretizations")
        if not self._host():
            return self._build_matrix(out, inp)    # in the parameters' namespace, not cached
        return _cached(self, ("matrix", out, inp), lambda: self._checked_matrix(out, inp))

    def _checked_matrix(self, out, inp) -> np.ndarray:
        built = self._build_matrix(out, inp)
        shared = built is getattr(self, "weight", None)  # checked when the kernel was made
        mat = built.view() if shared else np.ascontiguousarray(built, dtype=np.float64)
        shape = (len(out.quadrature_nodes), len(inp.quadrature_nodes))
        if mat.shape != shape:
            raise ValueError(f"{type(self).__name__} produced a matrix of shape {mat.shape}, expected {shape}")
        if not shared and not np.all(np.isfinite(mat)):
            raise ValueError(f"{type(self).__name__} takes NaN or inf values on {out!r} x {inp!r}")
        mat.setflags(write=False)
        return mat

    def transposed_matrix(self, out, inp) -> np.ndarray:
        r"""The host matrix :math:`A^T` of :meth:`matrix`, for products :math:`u A^T` from the right.

        The transposed view of :meth:`matrix`, whatever its layout (no copy): the kernel's own
        weight (:class:`PiecewiseConstant` in the discrete limit) or the matrix built for these
        grids. BLAS reads either layout; the few-row float64 kernel
        (:mod:`ctformer._numerics.few_rows`) reads the rows of :meth:`matrix`. Cached with the
        kernel, like :meth:`matrix`.
        """
        return _cached(self, ("matrix_t", out, inp), lambda: self.matrix(out, inp).T)

    def _build_matrix(self, out, inp) -> np.ndarray:
        s = _reference_points(out)
        t = _reference_points(inp)
        values = np.broadcast_to(self.evaluate(s[:, None], t[None, :]), (s.size, t.size))
        return values * (np.asarray(inp.quadrature_weights) / inp.length)[None, :]

    def device_matrix(self, u, out, inp):
        """The matrix of :meth:`matrix` on the backend and in the dtype of the array ``u``."""
        return constant(self, ("matrix", out, inp), lambda: self.matrix(out, inp), u)

    def apply(self, u, out, inp, axis: int = -1):
        r"""Apply the operator: :math:`(W u)(y_i) = \sum_j A_{ij} u_j` along ``axis``.

        Parameters
        ----------
        u : array
            Values at ``inp.quadrature_nodes`` along ``axis`` (NumPy or CuPy, real floating).
        out, inp : Discretization
            Output and input discretizations.
        axis : int
            The axis of ``u`` holding the input variable; it is replaced by the output one.

        Returns
        -------
        array
            Same backend and dtype as ``u``; length ``len(out.quadrature_nodes)`` along ``axis``.

        Raises
        ------
        ValueError
            If ``u`` has the wrong length along ``axis``.
        TypeError
            If ``u`` is not a real floating array.
        """
        if not self._host():
            xp, axis = _check_input(u, inp, axis)
            product = xp.moveaxis(u, axis, -1) @ xp.matrix_transpose(self.matrix(out, inp))
            return xp.moveaxis(product, -1, axis)
        native = type(u) is np.ndarray  # lists take the checked path (they may hold inf)
        if not native or u.dtype.kind != "f":
            u = _as_input(u)
        transposed = lambda: self.transposed_matrix(out, inp)  # noqa: E731
        if (native and u.dtype.kind == "f" and axis in (-1, u.ndim - 1)
                and u.shape[-1] == len(inp.quadrature_nodes)):
            # the hot path of a solve: one product with the cached transposed matrix
            return u @ constant(self, ("matrix_t", out, inp), transposed, u)
        xp, axis = _check_input(u, inp, axis)
        mat_t = constant(self, ("matrix_t", out, inp), transposed, u)
        return xp.moveaxis(xp.moveaxis(u, axis, -1) @ mat_t, -1, axis)


def _finite_sum(a) -> bool:
    """True when the sum of ``a`` is finite (then every entry is; NaN and inf propagate)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, or an overflowing sum
        return bool(np.isfinite(np.sum(a)))


def _identity(index, cells: int) -> bool:
    """True when the cell indices are ``0, 1, ..., cells - 1``: one node per cell, in order."""
    return index.size == cells and bool(np.all(index == np.arange(cells)))


def _as_input(u):
    """Lists and NumPy integer arrays become float64 host arrays; complex is refused."""
    if isinstance(u, np.ndarray) and u.dtype.kind in "biu":
        return u.astype(np.float64)
    if array_api_compat.is_array_api_obj(u) and not isinstance(u, np.generic):
        return u
    from .discretizations.base import real_host_array

    return real_host_array(u, "u")


def _check_input(u, inp, axis):
    xp = array_api_compat.array_namespace(u)
    if not xp.isdtype(u.dtype, "real floating"):
        raise TypeError(f"u must be a real floating array, got dtype {u.dtype}")
    if not -u.ndim <= axis < u.ndim:
        raise ValueError(f"axis {axis} is out of range for u with {u.ndim} dimensions")
    axis %= u.ndim
    nq = len(inp.quadrature_nodes)
    if u.shape[axis] != nq:
        raise ValueError(
            f"u has length {u.shape[axis]} along axis {axis}, expected {nq} "
            f"(the quadrature points of {inp!r})"
        )
    return xp, axis


class PiecewiseConstant(Kernel):
    r"""The embedding of a discrete weight matrix :math:`A \in \mathbb{R}^{d_{out} \times d_{in}}`.

    .. math::  W_{\mathrm{ref}}(s, t) = d_{\mathrm{in}}\, A_{i(s)\, j(t)} ,

    where :math:`i(s)`, :math:`j(t)` are the cells of the uniform partitions of :math:`[0, 1]`
    into :math:`d_{out}` and :math:`d_{in}` cells (:func:`cell_index`). On
    ``Midpoint(d_out)`` x ``Midpoint(d_in)`` the discretized matrix is exactly :math:`A`, so a
    torch ``nn.Linear`` (weight ``A``, :math:`y = A x`) is this operator on the midpoint grid.
    On refined midpoint grids, piecewise-constant data are mapped to the same values.

    Parameters
    ----------
    matrix : array_like, shape (d_out, d_in)
        The weight (NumPy, CuPy or a torch tensor; copied to the host in float64).
    copy : bool, optional
        ``False`` keeps a float64 NumPy ``matrix`` as a read-only view of its memory, in its
        own layout (what the bridges do: one copy of each weight); the caller then must not
        change it in place. Other inputs are copied either way. Default ``True``.

    Raises
    ------
    ValueError
        If ``matrix`` is not 2-D, is empty, or contains NaN or inf.

    Notes
    -----
    On ``Midpoint(d_out)`` x ``Midpoint(d_in)`` (the discrete limit) :meth:`matrix` is the
    weight itself, a view: no matrix is built, and the transposed matrix of a product is its
    transposed view.
    """

    def __init__(self, matrix, copy: bool = True):
        from .discretizations.base import real_host_array

        if not validation.boolean(copy, "copy") and type(matrix) is np.ndarray and matrix.dtype == np.float64:
            a = matrix.view()
        else:
            try:
                a = np.array(real_host_array(_to_host(matrix), "matrix"))
            except TypeError as exc:
                raise TypeError(f"PiecewiseConstant: {exc} (got {type(matrix).__name__})") from None
        if a.ndim != 2 or a.size == 0:
            raise ValueError(f"PiecewiseConstant matrix must be a non-empty 2-D array (d_out, d_in), got shape {a.shape}")
        # a finite sum needs finite entries; only an overflowing sum takes the full check
        if not _finite_sum(a) and not np.all(np.isfinite(a)):
            raise ValueError("PiecewiseConstant matrix contains NaN or inf")
        a.setflags(write=False)
        self.weight = a

    def parameters(self) -> dict:
        """``{"weight": A}``: the discrete weight, as many numbers as the ``nn.Linear`` has
        (a read-only view; ``model.with_parameters`` changes it)."""
        return {"weight": read_only(self.weight)}

    def _host(self) -> bool:
        return type(self.weight) is np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        """``(d_out, d_in)``."""
        return self.weight.shape

    def __repr__(self) -> str:
        return f"PiecewiseConstant(shape={self.shape})"

    def evaluate(self, s, t):
        d_out, d_in = self.shape
        i = cell_index(s, (0.0, 1.0), d_out)
        j = cell_index(t, (0.0, 1.0), d_in)
        return d_in * self.weight[i, j]

    def _build_matrix(self, out, inp):
        d_out, d_in = self.shape
        i = cell_index(out.quadrature_nodes, out.domain, d_out)
        j = cell_index(inp.quadrature_nodes, inp.domain, d_in)
        # w_j / (cell width) is exactly 1 on Midpoint(d_in) and exactly 1/2 on Midpoint(2 d_in):
        # the discrete weight is reproduced bit for bit in the discrete limit.
        ratio = np.asarray(inp.quadrature_weights) / (inp.length / d_in)
        if is_host(self.weight):
            if _identity(i, d_out) and _identity(j, d_in) and np.all(ratio == 1.0):
                return self.weight  # the discrete limit: the weight itself, no copy
            return self.weight[i[:, None], j[None, :]] * ratio[None, :]
        xp = array_api_compat.array_namespace(self.weight)
        device = array_api_compat.device(self.weight)
        rows = xp.take(self.weight, xp.asarray(i, device=device), axis=0)
        return xp.take(rows, xp.asarray(j, device=device), axis=1) * xp.asarray(
            ratio[None, :], dtype=self.weight.dtype, device=device)


class Smooth(Kernel):
    r"""A kernel given by a vectorized function :math:`W_{\mathrm{ref}}(s, t)` on :math:`[0, 1]^2`.

    Parameters
    ----------
    function : callable
        ``function(s, t)`` with broadcasting NumPy arrays ``s`` (column) and ``t`` (row).

    Raises
    ------
    TypeError
        If ``function`` is not callable.
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
        from .discretizations.base import real_host_array

        return real_host_array(self.function(s, t), f"{self!r}: the function")


class SmoothRandom(Kernel):
    r"""A random smooth (entire) kernel, deterministic in ``seed``.

    .. math::

        W_{\mathrm{ref}}(s, t) = c \sum_{p, q = 0}^{m - 1} a_{pq}
            \cos(\pi p s + \phi_p) \cos(\pi q t + \psi_q),
        \qquad a_{pq} \sim \mathcal{N}(0, 1)\, (1 + p + q)^{-\alpha},

    with random phases :math:`\phi_p, \psi_q \in [0, 2\pi)`, :math:`m` = ``modes``,
    :math:`\alpha` = ``decay``, and :math:`c` chosen so that
    :math:`\|W\|_{L^2([0,1]^2)}` = ``scale``. Since the Hilbert-Schmidt norm bounds the operator
    norm, :math:`\|W u\|_{L^2} \le` ``scale`` :math:`\|u\|_{L^2}`: operators are O(1). The kernel is
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
        :math:`L^2` norm of the kernel. Default 1.

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


class Convolution(Kernel):
    r"""A translation-invariant periodic kernel :math:`W_{\mathrm{ref}}(s, t) = p((s - t) \bmod 1)`.

    On a uniform periodic grid (same grid for input and output, :math:`n` equally spaced
    points with equal weights :math:`1/n` of the period, e.g. ``Midpoint`` or ``Fourier``) the
    matrix is circulant, :math:`A_{ij} = p(((i - j) \bmod n)/n) / n`, and :meth:`apply` computes
    it by FFT in :math:`O(n \log n)` through the backend (pyFFTW on the CPU, ``cupyx.scipy.fft``
    on the GPU), except on NumPy arrays of at most :attr:`dense_below` points, where one
    product with the (cached) dense matrix is faster than two FFTs. Elsewhere it uses the
    dense matrix. Both ways give the same values to rounding.

    Parameters
    ----------
    profile : callable
        ``profile(z)`` for ``z`` in :math:`[0, 1)`, vectorized; read as 1-periodic.

    Raises
    ------
    TypeError
        If ``profile`` is not callable.
    """

    #: NumPy grids of at most this many points apply the dense matrix instead of FFTs; 0
    #: always uses the FFT. None (the default): this machine's crossover for the array's
    #: dtype, measured once and stored (:func:`ctformer._numerics.convolution_route.dense_below`;
    #: 16-256 points on an AMD EPYC, by dtype and BLAS kernel). Set an int on the class or an
    #: instance to pin it, e.g. for the same bits on different machines.
    dense_below: int | None = None

    def __init__(self, profile: Callable):
        if not callable(profile):
            raise TypeError(f"Convolution needs a callable profile(z), got {type(profile).__name__}")
        self.profile = profile

    def __repr__(self) -> str:
        return f"Convolution({getattr(self.profile, '__name__', self.profile)!r})"

    def parameters(self) -> dict:
        """The profile's own ``parameters()`` (read-only views), if it has any."""
        return callable_parameters(self.profile)

    def evaluate(self, s, t):
        z = np.asarray(s, dtype=np.float64) - np.asarray(t, dtype=np.float64)
        nearest = np.round(z)
        # differences that are integers up to rounding are exactly 0 mod 1 (no p(1 - eps) vs p(0))
        z = np.where(np.abs(z - nearest) < 1e-13, 0.0, z - np.floor(z))
        from .discretizations.base import real_host_array

        return real_host_array(self.profile(z), f"{self!r}: the profile")

    @staticmethod
    def is_uniform_periodic(disc) -> bool:
        """True when ``disc`` has equally spaced quadrature points with equal weights ``L / n``."""
        x = np.asarray(disc.quadrature_nodes, dtype=np.float64)
        w = np.asarray(disc.quadrature_weights, dtype=np.float64)
        n, length = x.size, disc.length
        h = length / n
        tol = 1e-12 * length
        return bool(
            np.all(np.abs(w - h) <= tol)
            and (n == 1 or np.all(np.abs(np.diff(x) - h) <= tol))
            and -tol <= x[0] - disc.domain[0] < h
        )

    def symbol(self, disc) -> np.ndarray:
        r"""``rfft`` of the circulant's first column :math:`c_k = p(k / n) / n` (host, complex)."""
        n = len(disc.quadrature_nodes)
        from .discretizations.base import real_host_array

        c = real_host_array(self.profile(np.arange(n) / n), f"{self!r}: the profile") / n
        c = np.broadcast_to(c, (n,))
        if not np.all(np.isfinite(c)):
            raise ValueError(f"Convolution profile takes NaN or inf values on {disc!r}")
        return np.fft.rfft(c)

    def _dense_limit(self, dtype) -> int:
        """:attr:`dense_below`, or this machine's measured crossover for ``dtype`` where it is None."""
        return self.dense_below if self.dense_below is not None else measured_dense_below(dtype)

    def _numpy_route(self, out, inp, dtype):
        """How NumPy rows of ``dtype`` are applied: ``(True, n, symbol in dtype's complex
        type)`` by FFT, ``(False, n, transposed matrix in dtype)`` by one product on a host
        kernel, else ``()`` (:meth:`Kernel.apply`; not None, which the cache would take for a miss)."""
        n = len(inp.quadrature_nodes)
        if not (out == inp and self.is_uniform_periodic(inp)) or n <= self._dense_limit(dtype):
            if not self._host():
                return ()
            like = np.empty(0, dtype=dtype)
            return False, n, constant(self, ("matrix_t", out, inp), lambda: self.transposed_matrix(out, inp), like)
        complex_dtype = np.complex64 if dtype == np.float32 else np.complex128
        return True, n, self.symbol(inp).astype(complex_dtype)

    def apply(self, u, out, inp, axis: int = -1):
        """Apply by FFT when ``out == inp`` is uniform periodic, else by the dense matrix.

        See :meth:`Kernel.apply` for the parameters.
        """
        if type(u) is np.ndarray and u.dtype.kind == "f" and axis in (-1, u.ndim - 1):
            # the hot path: one cached lookup says how, no axis moves, no further checks
            route = _cached(self, ("numpy route", out, inp, u.dtype.char, self.dense_below),
                            lambda: self._numpy_route(out, inp, u.dtype))
            if not route:
                return super().apply(u, out, inp, axis)
            by_fft, n, operand = route
            if u.shape[-1] == n and not by_fft:
                return u @ operand
            if u.shape[-1] == n:
                symbol = operand
                fft = backend_of(u).fft
                spectrum = fft.rfft(u, axis=-1)
                spectrum *= symbol
                return fft.irfft(spectrum, n=n, axis=-1)
        if not (out == inp and _cached(inp, "uniform periodic", lambda: self.is_uniform_periodic(inp))):
            return super().apply(u, out, inp, axis)
        if type(u) is not np.ndarray or u.dtype.kind != "f":
            u = _as_input(u)
        n = len(inp.quadrature_nodes)
        if type(u) is np.ndarray and n <= self._dense_limit(u.dtype):
            return super().apply(u, out, inp, axis)
        xp, axis = _check_input(u, inp, axis)
        moved = xp.moveaxis(u, axis, -1)
        # pyFFTW / cupyx for NumPy and CuPy, the namespace's own fft (torch.fft, ...) otherwise
        if array_api_compat.is_numpy_array(u) or array_api_compat.is_cupy_array(u):
            fft = backend_of(u).fft
            spectrum = fft.rfft(moved, axis=-1)
            symbol = constant(self, ("symbol", inp), lambda: self.symbol(inp), spectrum)
            result = fft.irfft(spectrum * symbol, n=n, axis=-1)
        else:
            spectrum = xp.fft.rfft(moved)
            symbol = constant(self, ("symbol", inp), lambda: self.symbol(inp), spectrum)
            result = xp.fft.irfft(spectrum * symbol, n=n)
        return xp.moveaxis(xp.astype(xp.asarray(result), u.dtype, copy=False), -1, axis)

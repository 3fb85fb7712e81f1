r"""The :class:`Kernel` contract: values on the reference square, the matrix, its application.

A kernel :math:`W_{\mathrm{ref}}(s, t)` on :math:`[0, 1]^2`, discretized on an output
discretization ``out`` and an input discretization ``inp`` of lengths :math:`L_{\mathrm{out}}`,
:math:`L_{\mathrm{in}}`, is the host matrix

.. math::  A_{ij} = W_{\mathrm{ref}}(s_i, t_j)\, w_j / L_{\mathrm{in}} ,

with :math:`s_i = (y_i - a_{\mathrm{out}}) / L_{\mathrm{out}}`, :math:`t_j = (\eta_j -
a_{\mathrm{in}}) / L_{\mathrm{in}}` and :math:`w_j` = ``inp.quadrature_weights``; applying it is
the contraction :math:`(W u)(y_i) = \sum_j A_{ij} u_j` along one axis of ``u``. Also here: the
checks of that input array, shared by every kernel's :meth:`Kernel.apply`.
"""
from __future__ import annotations

import abc
from typing import ClassVar

import array_api_compat
import numpy as np

from .. import validation
from ..backend import _cached, constant
from ..discretizations.base import _Frozen
from .parameters import _BOOKKEEPING, is_host, value_key


def _reference_points(disc) -> np.ndarray:
    a, b = disc.domain
    return (np.asarray(disc.quadrature_nodes, dtype=np.float64) - a) / (b - a)


def _check_discretization(disc, argname: str):
    if not (hasattr(disc, "quadrature_nodes") and hasattr(disc, "quadrature_weights")):
        raise TypeError(f"{argname} must be a Discretization, got {type(disc).__name__}")
    if getattr(disc, "dimension", 1) != 1:
        # a kernel W(y, eta) maps functions of one variable: a rectangle's nodes are pairs
        raise TypeError(f"{argname} must discretize an interval (a feature variable), got "
                        f"{disc!r} of dimension {disc.dimension}; a kernel acts on one variable, "
                        "so discretize it by an interval rule, e.g. GaussLegendre(n)")


class Kernel(metaclass=_Frozen):
    r"""A kernel :math:`W(y, \eta)` on :math:`[0, 1]^2` that discretizes onto any pair of grids.

    Subclasses implement :meth:`evaluate`; they may override :meth:`_build_matrix` (for an
    exact or separable construction) and :meth:`apply` (for a fast algorithm).

    Notes
    -----
    Host matrices are built once per ``(out, inp)`` pair and device copies once per namespace,
    device and dtype, both in the library's cache (:func:`ctformer.backend.constant`), not on
    the kernel: a kernel is plain data.

    A kernel is a frozen value. Setting or deleting an attribute after construction raises
    :class:`AttributeError` (build a new kernel, or use ``model.with_parameters``), except the
    settings in :attr:`_settings`, which choose how it is applied, not what it computes. Two
    kernels are equal when they have the same type and the same attributes, arrays compared
    byte for byte (``0.0`` and ``-0.0`` differ); a user's function compares as its class
    defines (by identity unless it defines ``==`` and a hash), together with the numbers of its
    ``parameters()`` as they were when the kernel was first hashed (a kernel built after the
    function's arrays were changed in place is another kernel, with its own matrices). A
    pickled or deep-copied kernel is therefore equal to its original, hashes alike and shares
    its cached matrices. A kernel holding tensors (``with_parameters``) is equal only to
    itself: an optimizer changes them in place. The hash reads at most 64 entries of each
    array (every byte of a function's numbers); the full comparison digests every byte once
    per kernel (BLAKE2b), only when two distinct kernels hash alike.
    """

    #: attributes that may still be set after construction: they choose a route, not values
    _settings: ClassVar[frozenset] = frozenset()

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen", False) and name not in self._settings:
            raise AttributeError(_frozen_message(self, name))
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if self.__dict__.get("_frozen", False) and name not in self._settings:
            raise AttributeError(_frozen_message(self, name))
        object.__delattr__(self, name)

    def __getstate__(self):
        # the freeze flag and the cached keys are rebuilt, not carried (copies refreeze)
        return {k: v for k, v in self.__dict__.items() if k not in _BOOKKEEPING}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__["_frozen"] = True

    def _replace(self, name: str, value) -> None:
        """Set the attribute ``name`` of a kernel that no cache has seen: what
        ``with_parameters`` does to the copy it has just made (a deep copy carries no keys).

        Raises
        ------
        AttributeError
            If the kernel has no attribute ``name`` (a new name is never added).
        """
        if name not in self.__dict__:
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r} to replace")
        object.__setattr__(self, name, value)
        for cached in _BOOKKEEPING - {"_frozen"}:
            self.__dict__.pop(cached, None)

    def __eq__(self, other) -> bool:
        if self is other:   # every cache hit of the kernel itself: no key is read
            return True
        if type(other) is not type(self):
            return NotImplemented
        short = value_key(self, full=False)
        return (short is not None and short == value_key(other, full=False)
                and value_key(self, full=True) == value_key(other, full=True))

    def __hash__(self) -> int:
        found = self.__dict__.get("_hash")   # read at every cache lookup: kept as an int
        if found is None:
            short = value_key(self, full=False)
            found = self.__dict__["_hash"] = object.__hash__(self) if short is None else hash(short)
        return found

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
            If ``out`` or ``inp`` is not a discretization of an interval (a
            :class:`~ctformer.discretizations.Product` of two intervals is refused by name).
        ValueError
            If the kernel takes non-finite values on these grids.
        """
        _check_discretization(out, "out")
        _check_discretization(inp, "inp")
        from ..discretizations.base import check_dense

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
        weights = (np.asarray(inp.quadrature_weights, dtype=np.float64) / inp.length)[None, :]
        values = _broadcast_values(self, self.evaluate(s[:, None], t[None, :]), (s.size, t.size))
        if is_host(values):
            return values * weights
        # a parametrized function of tensors: the matrix stays in their namespace (autograd)
        xp = array_api_compat.array_namespace(values)
        return values * xp.asarray(weights, dtype=values.dtype, device=array_api_compat.device(values))

    def device_matrix(self, u, out, inp):
        """The matrix of :meth:`matrix` on the backend and in the dtype of the array ``u``;
        cached, and read-only where it is a NumPy array, as :meth:`matrix` is."""
        mat = constant(self, ("matrix", out, inp), lambda: self.matrix(out, inp), u)
        if type(mat) is np.ndarray and mat.flags.writeable:
            # the cached float32 copy: an in-place edit of it reached every later call
            mat.flags.writeable = False
        return mat

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
            return _apply_in_namespace(self, u, out, inp, axis)
        native = type(u) is np.ndarray  # lists take the checked path (they may hold inf)
        if not native or u.dtype.kind != "f":
            u = _as_input(u)
        transposed = lambda: self.transposed_matrix(out, inp)  # noqa: E731
        if native and u.dtype.kind == "f" and type(axis) is int and u.ndim and axis in (-1, u.ndim - 1):
            # the hot path of a solve: one product with the cached transposed matrix (a miss
            # builds it through matrix(), which checks out and inp)
            mat_t = constant(self, ("matrix_t", out, inp), transposed, u)
            if u.shape[-1] == mat_t.shape[0]:
                return u @ mat_t
        xp, axis = _check_input(u, inp, axis)
        mat_t = constant(self, ("matrix_t", out, inp), transposed, u)
        return xp.moveaxis(xp.moveaxis(u, axis, -1) @ mat_t, -1, axis)


def _frozen_message(kernel, name: str) -> str:
    return (f"{type(kernel).__name__} is immutable (a frozen value that caches key on): cannot set "
            f"or delete {name!r}; build a new kernel instead, e.g. {kernel!r} with other "
            "arguments, or change a model's numbers with model.with_parameters({...})")


def _as_input(u):
    """Lists and NumPy integer arrays become float64 host arrays; complex is refused."""
    if isinstance(u, np.ndarray) and u.dtype.kind in "biu":
        return u.astype(np.float64)
    if array_api_compat.is_array_api_obj(u) and not isinstance(u, np.generic):
        return u
    from ..discretizations.base import real_host_array

    return real_host_array(u, "u")


def _check_input(u, inp, axis):
    _check_discretization(inp, "inp")
    xp = array_api_compat.array_namespace(u)
    if not xp.isdtype(u.dtype, "real floating"):
        raise TypeError(f"u must be a real floating array, got dtype {u.dtype}")
    if not validation.is_integer(axis):
        raise TypeError(f"axis must be an integer, got {type(axis).__name__} {axis!r}")
    if u.ndim == 0:
        raise ValueError(f"u must have an axis of {len(inp.quadrature_nodes)} values at the "
                         f"quadrature points of {inp!r}, got a 0-d array; pass an array of them")
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


def _broadcast_values(kernel, values, shape):
    """A kernel's values at the grid pairs, broadcast to ``shape`` (any namespace), or a clear error."""
    try:
        if is_host(values):
            return np.broadcast_to(values, shape)
        return array_api_compat.array_namespace(values).broadcast_to(values, shape)
    except (ValueError, RuntimeError):
        raise ValueError(
            f"{kernel!r} returned values of shape {tuple(values.shape)} for {shape[0]} output x "
            f"{shape[1]} input points; expected shape {shape} or one that broadcasts to it. "
            "Make the function vectorized: s arrives as a column, t as a row"
        ) from None


def _apply_in_namespace(kernel, u, out, inp, axis):
    """:meth:`Kernel.apply` for parameters of another namespace (tensors handed in by
    ``with_parameters``): the matrix is built afresh in their namespace, so autograd sees it."""
    _check_discretization(out, "out")
    xp, axis = _check_input(u, inp, axis)
    mat = kernel.matrix(out, inp)
    if array_api_compat.array_namespace(mat) is not xp:
        raise TypeError(
            f"u is a {type(u).__module__}.{type(u).__name__} but the parameters of {kernel!r} are "
            f"{type(mat).__module__}.{type(mat).__name__} arrays; pass u as an array of that kind "
            "(e.g. torch.as_tensor(u)), on the parameters' device")
    if mat.dtype != u.dtype:
        mat = xp.astype(mat, u.dtype)  # the result keeps u's dtype, as on the host path
    return xp.moveaxis(xp.moveaxis(u, axis, -1) @ xp.matrix_transpose(mat), -1, axis)

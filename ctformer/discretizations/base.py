r"""The :class:`Discretization` contract and the registry of discretizations by name.

A discretization of an interval :math:`[a, b]` turns a function :math:`f` into ``n``
numbers (``sample``), integrates such numbers (``integrate``), and reconstructs the function
between them (``interpolate``). Every continuous variable of ctformer (tokens ``x``,
features ``y``, head features ``sigma``, FFN hidden ``r``) is discretized by one object of
this contract, so operators never need to know which rule is in use.

Two kinds of values exist:

* **nodal** discretizations (quadrature and spectral rules) store point values
  :math:`f(x_j)`; integrals are :math:`\sum_j w_j f(x_j)`.
* **Galerkin** discretizations store coefficients :math:`c_j` of a finite-element
  function :math:`f_h = \sum_j c_j \phi_j`; integrals are :math:`\int f_h`.

Operators that act pointwise (softmax, activations, normalization) need values *at
points*. The pair :meth:`Discretization.to_quadrature` / :meth:`Discretization.from_quadrature`
together with ``quadrature_nodes`` / ``quadrature_weights`` gives a uniform way to do that:
for nodal rules both maps are the identity and the quadrature points are the nodes; for
Galerkin rules ``to_quadrature`` evaluates :math:`f_h` at per-element Gauss points and
``from_quadrature`` is the :math:`L^2` projection :math:`M^{-1} B^T W g` back onto the space.
"""
from __future__ import annotations

import abc
from functools import cached_property
from typing import Callable, ClassVar

import numpy as np

from .. import validation
from ..backend import constant
from .checks import (MIN_DOMAIN_ULPS, MIN_NODE_GAP_ULPS, _MAX_ENDPOINT, as_values,  # noqa: F401
                     check_domain, check_node_gaps, check_values, host_points, is_native_array,
                     real_host_array)
from .matrices import apply_along_first, apply_matrix, barycentric_matrix, linear_matrix  # noqa: F401
from .memory import (MEMORY_BUDGET_ENV, _ALWAYS_WITHIN_BUDGET, SizeTooLargeError,  # noqa: F401
                     _format_bytes, check_allocation, check_dense, memory_budget)

__all__ = [
    "Discretization",
    "check_domain",
    "check_node_gaps",
    "register",
    "get",
    "available",
    "check_values",
    "SizeTooLargeError",
    "memory_budget",
    "check_allocation",
    "check_dense",
    "as_values",
    "real_host_array",
    "as_discretization",
    "apply_matrix",
    "apply_along_first",
    "is_native_array",
]

_REGISTRY: dict[str, type["Discretization"]] = {}


def register(cls: type["Discretization"]) -> type["Discretization"]:
    """Class decorator: make ``cls`` available as ``get(cls.name, ...)``."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    """Names accepted by :func:`get`, in the order of the design notes, section 3."""
    return list(_REGISTRY)


def get(name: str, n: int | None = None, domain=(0.0, 1.0), **kwargs) -> "Discretization":
    """Build a discretization by name: ``get("gauss-legendre", 12)`` or ``get("gauss-legendre:12")``.

    Parameters
    ----------
    name : str
        One of :func:`available` (e.g. ``"midpoint"``, ``"gauss-legendre"``, ``"p2"``), or
        ``"NAME:N"`` with the size after the colon (the form the command line and the studies
        accept).
    n : int, optional
        Number of values (nodes or degrees of freedom); required unless ``name`` is ``"NAME:N"``.
    domain : tuple of float, optional
        The interval ``(a, b)`` with ``a < b``; default ``(0, 1)``.

    Raises
    ------
    ValueError
        If ``name`` is unknown (the message lists the known names and the closest one), if the
        size is missing, given twice, or ``N`` in ``"NAME:N"`` is not an integer.
    """
    if isinstance(name, str) and ":" in name:
        base, _, size = name.partition(":")
        if n is not None:
            raise ValueError(f"get({name!r}, {n!r}): the size is given twice; pass "
                             f"get({base.strip()!r}, {n!r}) or get({name!r})")
        try:
            n = int(size.strip())
        except ValueError:
            raise ValueError(f"discretization {name!r}: the size after ':' must be an integer, "
                             f"e.g. '{base.strip()}:16'") from None
        name = base.strip()
    if name not in _REGISTRY:
        raise ValueError(f"unknown discretization name {name!r}{_did_you_mean(name)}; known names: "
                         f"{', '.join(available())}")
    if n is None:
        raise ValueError(f"discretization {name!r} needs a size: get({name!r}, n) or "
                         f"get('{name}:N')")
    return _REGISTRY[name](n, domain=domain, **kwargs)


def _did_you_mean(name) -> str:
    """``" (did you mean 'x'?)"`` for the registered name closest to ``name``, else ``""``."""
    import difflib

    close = difflib.get_close_matches(str(name), available(), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def as_discretization(spec, n: int | None = None) -> "Discretization":
    """Accept a :class:`Discretization` or a registered name (then ``n`` is required)."""
    if isinstance(spec, Discretization):
        return spec
    if isinstance(spec, str):
        if n is None:
            raise ValueError(f"discretization given by name {spec!r} needs n")
        return get(spec, n)
    raise TypeError(f"expected a Discretization or a name from {available()}, got {type(spec).__name__}")


class _Frozen(abc.ABCMeta):
    """Metaclass that freezes a discretization once its (outermost) ``__init__`` has returned."""

    def __call__(cls, *args, **kwargs):
        obj = super().__call__(*args, **kwargs)
        obj.__dict__["_frozen"] = True
        return obj


class _Fixed(metaclass=_Frozen):
    """A value whose attributes are neither set nor deleted once its ``__init__`` has returned;
    the refusal's words are its ``_refusal(name)``."""

    def __setattr__(self, name, value):
        if self.__dict__.get("_frozen", False):
            raise AttributeError(self._refusal(name))
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        if self.__dict__.get("_frozen", False):
            raise AttributeError(self._refusal(name))
        object.__delattr__(self, name)

    def _refusal(self, name: str) -> str:
        return f"{type(self).__name__} is immutable: cannot set or delete {name!r}"


class Discretization(_Fixed):
    r"""A discretization of an interval :math:`[a, b]` by ``n`` values.

    Subclasses set the class attributes ``name`` (registry key), ``order`` (expected order of
    accuracy on smooth data, ``math.inf`` for spectral methods), ``min_n``, and implement
    :meth:`_nodes`, :meth:`_weights` and :meth:`interpolation_matrix`.

    What the rest of ctformer reads from a discretization is declared here, with a default
    that fits an interval rule with point values; a subclass overrides what differs:

    - :attr:`dimension` (int): the dimension of the domain, 1 for an interval, 2 for a
      product of two intervals (:class:`~ctformer.discretizations.Product`); nodes have shape
      ``(n,)`` in one dimension and ``(n, dimension)`` otherwise;
    - :attr:`nodal` (bool): True when the stored values are point values :math:`f(x_j)`
      (quadrature and spectral rules), False when they are coefficients of a Galerkin
      expansion :math:`f_h = \sum_j c_j \phi_j` (then :meth:`to_quadrature` evaluates and
      :meth:`from_quadrature` projects);
    - :attr:`atoms` (int): the number of point masses in the measure (class tokens,
      :class:`~ctformer.discretizations.WithAtoms`), 0 for a plain domain;
    - :attr:`label` (str): a short name for tables and plots, :attr:`name` by default.

    Parameters
    ----------
    n : int
        Number of values (nodes or degrees of freedom); at least ``min_n``.
    domain : tuple of float, optional
        Interval ``(a, b)`` with finite ``a < b``. Default ``(0, 1)``. It must be
        representable (:func:`check_domain`): ``|a|, |b|`` at most half the largest float64 and
        ``b - a`` at least 64 ulp of ``max(|a|, |b|)``; and ``n`` must be small enough that
        neighbouring nodes are 4 ulp apart (checked when the nodes are first built).

    Raises
    ------
    ValueError
        For a domain or ``n`` that breaks these rules; the message names the argument.

    Notes
    -----
    A discretization is a frozen value: equal ones (same type, ``n`` and domain) hash alike and
    compute the same bits, caches key on them, and setting or deleting an attribute after
    construction raises :class:`AttributeError` (the cached nodes, weights and matrices belong
    to the values it was built with). Pickling and copying keep only what defines it, and
    ``eval(repr(d)) == d``.
    """

    name: ClassVar[str]
    order: ClassVar[float]
    kind: ClassVar[str] = "quadrature"  # "quadrature", "spectral" or "galerkin": a display name
    min_n: ClassVar[int] = 1
    periodic: ClassVar[bool] = False
    #: Dimension of the domain: 1 for an interval (a product of two intervals: 2).
    dimension: ClassVar[int] = 1
    #: True when stored values are point values; False for Galerkin coefficients.
    nodal: ClassVar[bool] = True
    #: Number of point masses (atoms) in the measure; 0 for a plain domain.
    atoms: ClassVar[int] = 0

    def __init__(self, n: int, domain=(0.0, 1.0)):
        n = validation.integer(n, "n", minimum=None)
        if n < self.min_n:
            raise ValueError(f"{type(self).__name__} needs n >= {self.min_n}, got n = {n}")
        self.n = n
        self.domain = check_domain(domain)
        check_allocation(self._bytes_per_value * float(n), f"{type(self).__name__}(n={n})",
                         "choose a smaller n (argument n)")

    #: Whether :attr:`nodes` are increasing and must be resolved (:func:`check_node_gaps`).
    _ordered_nodes: ClassVar[bool] = True

    #: Bytes of host arrays per value (nodes and weights; more for Galerkin elements).
    _bytes_per_value: ClassVar[float] = 16.0

    # -- geometry ------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """A short name for tables and plots (the registry :attr:`name` for an interval rule)."""
        return self.name

    @property
    def length(self) -> float:
        """Length :math:`b - a` of the interval."""
        return self.domain[1] - self.domain[0]

    @property
    def h(self) -> float:
        """Characteristic mesh width ``length / n`` (the abscissa of convergence plots)."""
        return self.length / self.n

    @cached_property
    def nodes(self) -> np.ndarray:
        """Node points (host array, shape ``(n,)``)."""
        x = np.asarray(self._nodes(), dtype=np.float64)
        if self._ordered_nodes:
            check_node_gaps(x, self)
        x.setflags(write=False)
        return x

    @cached_property
    def weights(self) -> np.ndarray:
        """Weights :math:`w_j` with :math:`\\int_a^b f \\approx \\sum_j w_j v_j` (host, ``(n,)``)."""
        w = np.asarray(self._weights(), dtype=np.float64)
        w.setflags(write=False)
        return w

    @abc.abstractmethod
    def _nodes(self) -> np.ndarray: ...

    @abc.abstractmethod
    def _weights(self) -> np.ndarray: ...

    # -- the contract --------------------------------------------------------------------
    def integrate(self, values, axis: int = -1):
        r"""Integral over the interval: :math:`\sum_j w_j v_j` along ``axis``."""
        values, xp, axis = as_values(values, self.n, axis)
        w = constant(self, "weights", lambda: self.weights, values)
        v = xp.moveaxis(values, axis, -1)
        return xp.sum(v * w, axis=-1)

    def interpolate(self, values, points, axis: int = -1):
        """Evaluate the reconstruction of ``values`` at ``points``.

        Parameters
        ----------
        values : array
            Discrete values, length ``n`` along ``axis``.
        points : array_like, shape (P,)
            Points in the closed interval ``domain``.
        axis : int
            Axis of ``values`` that holds the ``n`` values; it is replaced by ``P`` points.

        Notes
        -----
        The reconstruction is linear in ``values``: the default applies the host-built
        ``(P, n)`` matrix :meth:`interpolation_matrix` (barycentric or piecewise-polynomial,
        never a monomial fit).
        """
        values, xp, axis = as_values(values, self.n, axis)
        pts = self._check_points(points)
        mat = constant(None, None, lambda: self.interpolation_matrix(pts), values)
        return apply_matrix(mat, values, axis)

    @abc.abstractmethod
    def interpolation_matrix(self, points) -> np.ndarray:
        """Host matrix ``L`` of shape ``(P, n)`` with ``interpolate(v, points) = L @ v``."""

    def _check_resolution(self) -> None:
        """Build (and so check, :func:`check_node_gaps`) the nodes every reconstruction uses."""
        self.nodes

    def _check_points(self, points) -> np.ndarray:
        self._check_resolution()
        pts = host_points(points)
        if pts.ndim != 1:
            raise ValueError(f"points must be a 1-D array, got shape {pts.shape}")
        if not np.all(np.isfinite(pts)):
            raise ValueError("points contains NaN or inf")
        a, b = self.domain
        tol = 1e-12 * self.length
        if pts.size and (pts.min() < a - tol or pts.max() > b + tol):
            raise ValueError(f"points must lie in the domain [{a:g}, {b:g}]")
        return np.clip(pts, a, b)

    def sample(self, f: Callable) -> np.ndarray:
        """Discrete values of the function ``f``: ``f(nodes)`` for nodal rules.

        A scalar result is broadcast to all nodes; a result of another shape than the nodes,
        NaN or inf raises :class:`ValueError`.
        """
        v = real_host_array(f(self.nodes), "the values of f")
        if v.ndim == 0:
            v = np.full(self.n, float(v))
        if v.shape != self.nodes.shape:
            raise ValueError(f"f must map the nodes (shape {self.nodes.shape}) to one value each, "
                             f"got shape {v.shape}")
        if not np.all(np.isfinite(v)):
            raise ValueError("f returned NaN or inf at the nodes")
        return v

    def refine(self, factor: int = 2) -> "Discretization":
        """The same rule with ``factor`` times as many cells (or points)."""
        factor = _check_factor(factor)
        return type(self)(self._refined_n(factor), domain=self.domain)

    def _refined_n(self, factor: int) -> int:
        return self.n * factor

    # -- values at quadrature points (identity for nodal rules) ---------------------------
    @property
    def quadrature_nodes(self) -> np.ndarray:
        """Points where pointwise nonlinear operators are evaluated (nodes for nodal rules)."""
        return self.nodes

    @property
    def quadrature_weights(self) -> np.ndarray:
        """Quadrature weights belonging to :attr:`quadrature_nodes`."""
        return self.weights

    def to_quadrature(self, values, axis: int = -1):
        """Values at :attr:`quadrature_nodes`: for nodal rules the values themselves.

        Checked like every other method's values (:func:`as_values`): floating arrays come
        back as they are (same object, namespace and dtype), lists and integer arrays as
        float64; a scalar, another length along ``axis``, NaN or inf are refused.
        """
        return self._points_identity(values, axis)

    def from_quadrature(self, values, axis: int = -1):
        """Inverse of :meth:`to_quadrature`: for nodal rules the values themselves (checked
        as there), the :math:`L^2` projection for Galerkin elements."""
        return self._points_identity(values, axis)

    def _points_identity(self, values, axis: int):
        # the same checks as the Galerkin maps: an integer array would otherwise enter float
        # arithmetic as int64, and a scalar or a row of the wrong length would pass unnoticed
        values, _, _ = as_values(values, len(self.quadrature_nodes), axis)
        return values

    # -- misc ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        a, b = self.domain
        # repr of the floats (shortest round trip), not :g: eval(repr(d)) must give d back
        dom = "" if (a, b) == (0.0, 1.0) else f", domain=({a!r}, {b!r})"
        return f"{type(self).__name__}({self.n}{dom})"

    def _refusal(self, name: str) -> str:
        return _frozen_message(self, name)

    def __getstate__(self):
        # Only (n, domain) define a discretization; cached matrices and factorizations
        # (e.g. SuperLU objects, which cannot be pickled) are rebuilt on demand after unpickling.
        return {"n": self.n, "domain": self.domain}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__dict__["_frozen"] = True

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.n == other.n and self.domain == other.domain

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.n, self.domain))


def _frozen_message(disc, name: str) -> str:
    return (f"{type(disc).__name__} is immutable (a frozen value that caches key on): cannot set "
            f"or delete {name!r}; build a new one instead, e.g. {disc!r} with other arguments, "
            "or .refine(factor)")


def _check_factor(factor) -> int:
    return validation.integer(factor, "refine factor")

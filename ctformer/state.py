r"""The state space: a tensor product of discretizations that owns every representation.

A state :math:`u(x, y)` of the continuous Transformer lives on tokens :math:`x \in X` times
features :math:`y \in Y`; its operators also integrate over a per-head feature variable
:math:`\sigma \in Y_h` and the feed-forward variable :math:`r \in R`. One discretization per
variable makes a :class:`Grids`, and :class:`Grids` is the only place that knows how a state
is *stored*:

* nodal discretizations (quadrature and spectral rules) store point values
  :math:`u(x_i, y_j)`;
* Galerkin discretizations store coefficients :math:`c` of :math:`u_h = \sum c_{ij}
  \phi_i(x) \psi_j(y)`.

Operators act on *point values*, arrays shaped ``(..., Nq_tokens, Nq_features)`` at the
quadrature points of both axes. :class:`Grids` moves between the two on every axis,

.. math::  g = (E_x \otimes E_y)\, c, \qquad c = (\Pi_x \otimes \Pi_y)\, g,

with :math:`E` the evaluation at quadrature points and :math:`\Pi = M^{-1} B^T W` the
:math:`L^2` projection (both the identity for nodal rules), and lifts a flow :math:`f` on
point values to the flow :math:`c \mapsto \Pi f(E c)` on stored values (:meth:`Grids.lift`).
It also samples initial data, evaluates a state at arbitrary points, validates a state where
it enters a computation, and measures the smallest feature standard deviation (LayerNorm is
singular where it vanishes). A new kind of axis is a change to this module plus its
discretization.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Callable

import array_api_compat
import numpy as np

from .backend import to_host
from .discretizations.base import Discretization
from .discretizations.checks import real_host_array
from .validation import is_real

__all__ = ["Grids", "AXES"]

#: Axis of each spatial variable in a state array ``(..., tokens, features)``.
AXES = {"tokens": -2, "features": -1}


def _namespace(u, argname):
    try:
        return array_api_compat.array_namespace(u)
    except TypeError:
        raise TypeError(f"{argname} must be an array (NumPy, CuPy, ...), got {type(u).__name__}") from None


def _as_state(u, argname):
    """``u`` with NumPy integers and lists as float64 arrays; other arrays as they are."""
    if isinstance(u, np.ndarray) and u.dtype.kind in "iu":
        return u.astype(np.float64)
    if isinstance(u, np.generic) or not array_api_compat.is_array_api_obj(u):
        return real_host_array(u, argname)
    return u


def _sampled(values) -> np.ndarray:
    """What ``u0(x, y)`` returned, as a float64 host array (booleans: indicator functions)."""
    try:
        g = to_host(values)
    except (TypeError, ValueError):  # ragged nested lists
        g = np.empty(0, dtype=object)
    if g.dtype.kind == "c":
        raise TypeError("u0(x, y) returned complex values; the state is real")
    if g.dtype.kind not in "biuf":
        hint = " (a function without a return statement returns None)" if values is None else ""
        raise TypeError(f"u0(x, y) must return real numbers, an array that broadcasts to the grid, "
                        f"got {type(values).__name__}{hint}")
    return np.asarray(g, dtype=np.float64)


def _check_arity(u0, tokens) -> None:
    """Refuse a ``u0`` that cannot take the arguments of this token domain, before calling it.

    A two-argument ``u0(x, y)`` on a square (or ``u0(x1, x2, y)`` on an interval) would
    otherwise fail inside the call with Python's own message, which names neither the token
    domain nor the convention. Callables without a readable signature are left to the call.
    """
    count = 3 if tokens.dimension == 2 else 2
    try:
        signature = inspect.signature(u0)
    except (TypeError, ValueError):  # builtins, some C extensions
        return
    try:
        signature.bind(*range(count))
    except TypeError:
        name = getattr(u0, "__qualname__", type(u0).__name__)
        if count == 3:
            raise TypeError(f"u0 is called as u0(x1, x2, y) on the two-dimensional token domain "
                            f"{tokens!r}; {name}{signature} cannot take three arguments: give "
                            f"a function of (x1, x2, y)") from None
        raise TypeError(f"u0 is called as u0(x, y) on the token interval {tokens!r}; "
                        f"{name}{signature} cannot take two arguments: give a function of "
                        f"(x, y) (u0(x1, x2, y) is for a Product of two intervals)") from None


def _positive(value) -> bool:
    return is_real(value) and math.isfinite(value) and value > 0


def _check_length(length, tokens):
    """``None``, a positive number, or (on a two-dimensional token domain) one per axis."""
    if length is None:
        return None
    if tokens.dimension == 2 and isinstance(length, (tuple, list)):
        if len(length) == 2 and all(_positive(v) for v in length):
            return tuple(float(v) for v in length)
    elif _positive(length):
        return float(length)
    raise ValueError(f"context_length must be a positive number (or, on a two-dimensional token "
                     f"domain, a pair of them, one per axis), got {length!r}")


@dataclass(frozen=True)
class Grids:
    r"""One discretization per continuous variable: the discrete state space.

    Parameters
    ----------
    tokens : Discretization
        The token variable :math:`x \in X`.
    features : Discretization
        The feature variable :math:`y \in Y`.
    head_features : Discretization, optional
        The per-head feature variable :math:`\sigma \in Y_h` (all heads share it). Default:
        ``features``.
    hidden : Discretization, optional
        The feed-forward variable :math:`r \in R`. Default: ``features``.

    Raises
    ------
    TypeError
        If a field is not a discretization, or ``features``, ``head_features`` or ``hidden``
        is not one of an interval (a :class:`~ctformer.discretizations.Product` is a token
        domain only).

    Notes
    -----
    Frozen and hashable: discretized operators are cached per ``Grids``. Two ``Grids`` with
    equal discretizations are equal.
    """

    tokens: object
    features: object
    head_features: object = None
    hidden: object = None
    context_length: float | None = None

    def __post_init__(self):
        if self.head_features is None:
            object.__setattr__(self, "head_features", self.features)
        if self.hidden is None:
            object.__setattr__(self, "hidden", self.features)
        for name in ("tokens", "features", "head_features", "hidden"):
            if not isinstance(getattr(self, name), Discretization):
                raise TypeError(f"Grids.{name} must be a Discretization, got "
                                f"{type(getattr(self, name)).__name__}")
            if name != "tokens" and getattr(self, name).dimension != 1:
                # only tokens may live on a square; a norm read (N, 2) nodes and failed in NumPy
                raise TypeError(f"Grids.{name} must discretize an interval, got {getattr(self, name)!r} "
                                f"of dimension {getattr(self, name).dimension}: a product of two "
                                "intervals is a token domain (an image); pass an interval rule here, "
                                "e.g. GaussLegendre(n)")
        object.__setattr__(self, "context_length", _check_length(self.context_length, self.tokens))

    # -- shapes ------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        """``(Nq_tokens, Nq_features)``: the last two axes of point values (what operators see)."""
        return (len(self.tokens.quadrature_nodes), len(self.features.quadrature_nodes))

    @property
    def stored_shape(self) -> tuple[int, int]:
        """``(tokens.n, features.n)``: the last two axes of stored values (what solvers see)."""
        return (self.tokens.n, self.features.n)

    def positions(self) -> np.ndarray:
        r"""Token positions :math:`p(x) = L s(x) - 1/2` at the token quadrature points.

        :math:`s(x) = (x - a)/(b - a)` is the reference coordinate of the token domain
        :math:`[a, b]`; on ``Midpoint(N)`` with :math:`L = N` these are exactly
        :math:`0, 1, \dots, N - 1`. On a two-dimensional token domain (a product) with one
        length per axis, shape ``(N, 2)``: :math:`p_k = L_k s_k - 1/2`.

        Raises
        ------
        ValueError
            If the grids have no ``context_length``, or the token axis has atoms (they have
            no position).
        """
        if self.context_length is None:
            raise ValueError("these grids have no context_length; positions p(x) = L x - 1/2 need "
                             "the model's reference length L (pass context_length=...)")
        if self.tokens.atoms:
            raise ValueError(f"positions p(x) = L x - 1/2 are defined for tokens without atoms, "
                             f"not on {self.tokens!r}")
        nodes = np.asarray(self.tokens.quadrature_nodes, dtype=np.float64)
        if nodes.ndim == 2:
            if not isinstance(self.context_length, tuple):
                raise ValueError(f"a two-dimensional token domain needs one context length per "
                                 f"axis, context_length=(L1, L2); got {self.context_length!r}")
            (a1, b1), (a2, b2) = self.tokens.domain
            s = np.stack([(nodes[:, 0] - a1) / (b1 - a1), (nodes[:, 1] - a2) / (b2 - a2)], axis=-1)
            return np.asarray(self.context_length) * s - 0.5
        a, b = self.tokens.domain
        return self.context_length * (nodes - a) / (b - a) - 0.5

    @property
    def is_nodal(self) -> bool:
        """True when stored values are point values on both axes (no change of representation)."""
        return self.tokens.nodal and self.features.nodal

    def replace(self, **changes) -> "Grids":
        """A copy with some discretizations replaced (``head_features``/``hidden`` kept)."""
        fields = {name: getattr(self, name)
                  for name in ("tokens", "features", "head_features", "hidden", "context_length")}
        fields.update(changes)
        return Grids(**fields)

    # -- representations -----------------------------------------------------------------------
    def to_points(self, u):
        """Stored values ``(..., n_x, n_y)`` -> values at the quadrature points of both axes."""
        if self.is_nodal:
            return u
        return self.tokens.to_quadrature(self.features.to_quadrature(u, axis=-1), axis=-2)

    def from_points(self, g):
        """Values at the quadrature points -> stored values (the :math:`L^2` projection for FE)."""
        if self.is_nodal:
            return g
        return self.tokens.from_quadrature(self.features.from_quadrature(g, axis=-1), axis=-2)

    def lift(self, f: Callable | None) -> Callable | None:
        r"""The flow :math:`c \mapsto \Pi f(E c)` on stored values, for ``f`` on point values.

        For nodal grids this is ``f`` itself (no wrapper, no cost); ``None`` stays ``None``.
        """
        if f is None or self.is_nodal:
            return f
        to_points, from_points = self.to_points, self.from_points

        def lifted(c):
            return from_points(f(to_points(c)))

        return lifted

    def sample(self, u0: Callable) -> np.ndarray:
        r"""Stored values of :math:`u_0(x, y)` (host float64 array of shape :attr:`stored_shape`).

        Parameters
        ----------
        u0 : callable
            ``u0(x, y)`` for ``x`` of shape ``(Nq, 1)`` and ``y`` of shape ``(1, dq)``
            (broadcasting); on a two-dimensional token domain (a product) ``u0(x1, x2, y)``
            with ``x1``, ``x2`` of shape ``(Nq, 1)``. Evaluated at the quadrature points and
            projected (the identity for nodal rules).

        Raises
        ------
        TypeError
            If ``u0`` cannot take the arguments of the token domain (two, or three on a
            product), or returns anything but real numbers (None, strings, complex values, a
            ragged list); booleans are read as 0 and 1 (an indicator function).
        ValueError
            If the values do not broadcast to the grid or are not finite.
        """
        _check_arity(u0, self.tokens)
        nodes = np.asarray(self.tokens.quadrature_nodes)
        y = np.asarray(self.features.quadrature_nodes)[None, :]
        if nodes.ndim == 2:  # a token domain in two dimensions
            x = nodes[:, :1]
            g = _sampled(u0(nodes[:, :1], nodes[:, 1:], y))
        else:
            x = nodes[:, None]
            g = _sampled(u0(x, y))
        try:
            g = np.broadcast_to(g, (x.shape[0], y.shape[1])).copy()
        except ValueError:
            raise ValueError(
                f"u0(x, y) must broadcast to shape ({x.shape[0]}, {y.shape[1]}) for x of shape "
                f"{x.shape} and y of shape {y.shape}; got shape {g.shape}"
            ) from None
        if not np.all(np.isfinite(g)):
            raise ValueError("u0(x, y) returned NaN or inf")
        return self.from_points(g)

    def evaluate(self, u, tokens=None, features=None):
        """Values of the stored state ``u`` at points along each axis.

        Parameters
        ----------
        u : array, shape (..., n_x, n_y)
            Stored values.
        tokens, features : array_like of points, optional
            Points where each axis is evaluated through its discretization's ``interpolate``;
            ``None`` takes the axis' quadrature points.

        Returns
        -------
        array, shape (..., len(tokens) or Nq_tokens, len(features) or Nq_features)
            In the namespace, on the device and in the dtype of ``u`` (float64 for integer
            arrays and lists).

        Raises
        ------
        TypeError
            If ``u`` is not an array of real numbers (complex, boolean, strings).
        ValueError
            If ``u`` has fewer than two axes, last two axes other than :attr:`stored_shape`,
            or NaN or inf.
        """
        # checked here, under its own name: the nodal maps below return u as it came
        u = _as_state(u, "u")
        self.validate(u, "u")
        for disc, points, axis in ((self.tokens, tokens, -2), (self.features, features, -1)):
            if points is None:
                u = disc.to_quadrature(u, axis=axis)
            else:
                u = disc.interpolate(u, points, axis=axis)
        return u

    # -- validation and diagnostics ------------------------------------------------------------
    def validate(self, u, argname: str = "u", points: bool = False):
        """Check a state where it enters a computation; return its array namespace.

        Parameters
        ----------
        u : array
            Stored values ``(..., n_x, n_y)`` (or point values with ``points=True``).
        argname : str
            Name used in messages.
        points : bool
            Validate point values ``(..., Nq_tokens, Nq_features)`` instead.

        Raises
        ------
        TypeError
            If ``u`` is not a real floating array.
        ValueError
            If the last two axes do not match the grids, or ``u`` contains NaN or inf.
        """
        xp = _namespace(u, argname)
        if not xp.isdtype(u.dtype, "real floating"):
            raise TypeError(f"{argname} must be a real floating array, got dtype {u.dtype}")
        shape = self.shape if points else self.stored_shape
        if u.ndim < 2 or tuple(u.shape[-2:]) != shape:
            if points:
                raise ValueError(
                    f"{argname} must have shape (..., {shape[0]}, {shape[1]}) (values at the "
                    f"quadrature points of tokens {self.tokens!r} x features {self.features!r}), "
                    f"got shape {tuple(u.shape)}")
            raise ValueError(
                f"{argname} has shape {tuple(u.shape)}; its last two axes must be (tokens.n, "
                f"features.n) = ({shape[0]}, {shape[1]}) for tokens {self.tokens!r} and features "
                f"{self.features!r}")
        if not bool(xp.all(xp.isfinite(u))):
            raise ValueError(f"{argname} contains NaN or inf")
        return xp

    def min_feature_std(self, states) -> float:
        r"""The smallest feature standard deviation :math:`\min_x \sqrt{\mathrm{var}_y u(x, \cdot)}`.

        Over all tokens (and batch entries) of one stored state or a sequence of them, with
        the feature quadrature; LayerNorm is smooth only where this stays away from zero.
        """
        if hasattr(states, "shape"):
            states = [states]
        w = np.asarray(self.features.quadrature_weights, dtype=np.float64)
        w = w / w.sum()
        smallest = math.inf
        for u in states:
            g = to_host(self.to_points(u), np.float64)
            centred = g - (g @ w)[..., None]
            smallest = min(smallest, float(np.sqrt(np.min((centred * centred) @ w))))
        return smallest

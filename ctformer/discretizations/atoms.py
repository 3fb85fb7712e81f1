r"""Atoms in the token measure: a class token (or register tokens) as point masses.

A vision transformer's class token is not a patch: it is a token of its own that every patch
attends to and that attends to every patch. In the continuum it is a point mass in the token
measure,

.. math::  \mu = \sum_{a=1}^{A} w_a\, \delta_{x_a} + \Big(1 - \sum_a w_a\Big) \rho\, dx,

and :class:`WithAtoms` puts ``count`` such atoms first on the token axis (as BERT and ViT
order their special tokens), before the nodes of a base discretization of the patch field.
Two consistent limits exist:

* ``weight=None``: every atom weighs as much as one average token, :math:`|X| / (n + A)`,
  and the base weights are scaled by :math:`n / (n + A)`. With a midpoint base this is
  exactly the discrete network (all tokens weigh the same, softmax attention). Under
  refinement the atoms' mass vanishes: each becomes a passive particle that reads the patch
  field and is not read by it.
* ``weight=w``: the atoms share a fixed total mass :math:`w` (each :math:`w / A`), the base
  weights are scaled by :math:`1 - w / |X|`. The atoms keep acting on the patches in the
  limit.

Interpolation acts on the base part; atoms are evaluated as themselves (their values come
first in the result). Atoms have a location in the token domain (``locations``, default the
lower corner) only so that initial data :math:`u_0(x, y)` can be sampled there.
"""
from __future__ import annotations

from functools import cached_property
from typing import Callable

import numpy as np

from .. import validation
from ..backend import constant
from .base import Discretization, as_values, check_dense, real_host_array
from .product import at_size

__all__ = ["WithAtoms"]


class WithAtoms(Discretization):
    r"""``count`` point masses placed before the nodes of ``base`` on the token axis.

    Parameters
    ----------
    base : Discretization
        A nodal discretization of the patch field (an interval or a :class:`Product`).
    count : int, optional
        Number of atoms :math:`A \ge 1`. Default 1 (a class token).
    weight : float or None, optional
        ``None``: each atom weighs one average token (the discrete limit of ViT); a number
        :math:`0 < w < |X|`: the atoms' fixed total mass.
    locations : array_like, optional
        Where ``u0`` is sampled for each atom: ``count`` points of the token domain (shape
        ``(count,)`` or ``(count, 2)``). Default: the lower corner of the domain.

    Raises
    ------
    TypeError
        For a Galerkin base (atoms need point values), a base that has atoms already, or a
        ``count`` that is not an integer.
    ValueError
        For a ``count`` below 1, a bad ``weight`` or ``locations``.

    Notes
    -----
    Equality includes the base, the count, the weight convention and the locations, so the
    two conventions never share cached operators.
    """

    name = "with-atoms"

    _ordered_nodes = False  # atoms first, then the (already checked) base nodes

    def __init__(self, base, count: int = 1, weight=None, locations=None):
        if not isinstance(base, Discretization):
            raise TypeError(f"WithAtoms: base must be a Discretization, got {type(base).__name__}")
        if isinstance(base, WithAtoms):
            raise TypeError("WithAtoms: base already has atoms; give count instead")
        if not base.nodal:
            raise TypeError("WithAtoms needs a nodal base (point values); got a Galerkin one")
        count = validation.integer(count, "count")
        if weight is not None:
            if not validation.is_real(weight) or not 0.0 < float(weight) < base.length:
                raise ValueError(f"weight must be None or a total atom mass in (0, {base.length:g}) "
                                 f"(the measure of the token domain), got {weight!r}")
            weight = float(weight)
        self.base, self.atoms, self.weight = base, int(count), weight
        self.dimension = base.dimension
        self.locations = self._check_locations(locations)
        self.n = base.n + self.atoms
        self.domain = base.domain

    def _check_locations(self, locations) -> np.ndarray:
        if locations is None:
            corner = [d[0] for d in self.base.domain] if self.dimension == 2 else self.base.domain[0]
            locations = np.broadcast_to(np.asarray(corner, dtype=np.float64),
                                        (self.atoms, 2) if self.dimension == 2 else (self.atoms,))
        pts = np.array(locations, dtype=np.float64) + 0.0  # -0.0 becomes 0.0: one hash
        shape = (self.atoms, 2) if self.dimension == 2 else (self.atoms,)
        if pts.shape != shape or not np.all(np.isfinite(pts)):
            raise ValueError(f"locations must be finite, of shape {shape}, got {np.shape(locations)}")
        lower, upper = np.array(self.base.domain, dtype=np.float64).T
        if not np.all((lower <= pts) & (pts <= upper)):
            raise ValueError(f"locations must lie in the token domain {self.base.domain}, "
                             f"got {pts.tolist()}")
        pts.setflags(write=False)
        return pts

    # -- value-object identity ------------------------------------------------------------
    def __getstate__(self):
        return {"base": self.base, "count": self.atoms, "weight": self.weight,
                "locations": np.asarray(self.locations)}

    def __setstate__(self, state):
        self.__init__(state["base"], state["count"], state["weight"], state["locations"])
        self.__dict__["_frozen"] = True   # as after construction

    def __eq__(self, other) -> bool:
        return (type(other) is WithAtoms and self.base == other.base and self.atoms == other.atoms
                and self.weight == other.weight and np.array_equal(self.locations, other.locations))

    def __hash__(self) -> int:
        return hash(("with-atoms", self.base, self.atoms, self.weight, self.locations.tobytes()))

    def __repr__(self) -> str:
        # the locations are part of the value: shown unless they are the default corner
        default = self._check_locations(None)
        where = "" if np.array_equal(self.locations, default) else f", locations={self.locations.tolist()!r}"
        return f"WithAtoms({self.base!r}, count={self.atoms}, weight={self.weight!r}{where})"

    @property
    def label(self) -> str:
        """A short name for tables and plots, e.g. ``"midpoint x midpoint + 1 atom"``."""
        base = self.base.label
        mass = "" if self.weight is None else f" of mass {self.weight:g}"
        return f"{base} + {self.atoms} atom{'s' if self.atoms > 1 else ''}{mass}"

    # -- geometry -------------------------------------------------------------------------
    @property
    def order(self) -> float:  # type: ignore[override]
        return self.base.order

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.base.kind

    @property
    def length(self) -> float:
        return self.base.length

    @property
    def h(self) -> float:
        return self.base.h

    @property
    def atom_weights(self) -> np.ndarray:
        """The weight of each atom."""
        total = self.base.length * self.atoms / self.n if self.weight is None else self.weight
        return np.full(self.atoms, total / self.atoms)

    @property
    def base_scale(self) -> float:
        """The factor multiplying the base weights (the mass left to the patch field)."""
        return self.base.n / self.n if self.weight is None else 1.0 - self.weight / self.base.length

    def _nodes(self):
        return np.concatenate([self.locations, np.asarray(self.base.nodes)], axis=0)

    def _weights(self):
        return np.concatenate([self.atom_weights, self.base_scale * np.asarray(self.base.weights)])

    @cached_property
    def quadrature_nodes(self) -> np.ndarray:
        return self.nodes

    @cached_property
    def quadrature_weights(self) -> np.ndarray:
        return self.weights

    # -- the contract ---------------------------------------------------------------------
    def interpolation_matrix(self, points) -> np.ndarray:
        """Block matrix ``[[I, 0], [0, L_base]]``: atoms first, then the base at ``points``."""
        lower = self.base.interpolation_matrix(points)
        check_dense(self.atoms + lower.shape[0], self.n, "the interpolation matrix with atoms")
        out = np.zeros((self.atoms + lower.shape[0], self.n))
        out[: self.atoms, : self.atoms] = np.eye(self.atoms)
        out[self.atoms:, self.atoms:] = lower
        return out

    def interpolate(self, values, points, axis: int = -1):
        """The atoms' values, then the base reconstruction at ``points`` (along ``axis``)."""
        values, xp, axis = as_values(values, self.n, axis, allow_complex=True)  # as before: the factors decide
        atoms = xp.take(values, xp.arange(self.atoms), axis=axis)
        rest = xp.take(values, xp.arange(self.atoms, self.n), axis=axis)
        return xp.concat([atoms, self.base.interpolate(rest, points, axis=axis)], axis=axis)

    def integrate(self, values, axis: int = -1):
        r""":math:`\sum_a w_a v_a + \text{scale} \sum_j w_j v_j`."""
        values, xp, axis = as_values(values, self.n, axis, allow_complex=True)  # as before: the factors decide
        w = constant(self, "weights", lambda: self.weights, values)
        return xp.sum(xp.moveaxis(values, axis, -1) * w, axis=-1)

    def sample(self, f: Callable) -> np.ndarray:
        """``f`` at the atoms' locations, then at the base nodes."""
        x = self.nodes
        g = f(x[:, 0], x[:, 1]) if self.dimension == 2 else f(x)
        g = real_host_array(g, "the values of f")
        g = np.broadcast_to(g, (self.n,)).copy() if g.ndim == 0 else g
        if g.shape != (self.n,) or not np.all(np.isfinite(g)):
            raise ValueError(f"f must return {self.n} finite values, got shape {g.shape}")
        return g

    def refine(self, factor: int = 2) -> "WithAtoms":
        return WithAtoms(self.base.refine(factor), self.atoms, self.weight, self.locations)

    def at(self, n: int) -> "WithAtoms":
        """The same atoms on the base of the same family with size ``n``."""
        return WithAtoms(at_size(self.base, n), self.atoms, self.weight, self.locations)

r"""Butcher tableaus: an explicit Runge-Kutta method as validated data.

A :class:`ButcherTableau` holds the coefficients :math:`a_{ij}` (:math:`j < i`), the weights
:math:`b_i` and the nodes :math:`c_i = \sum_j a_{ij}` of an :math:`s`-stage method, and
optionally the error weights :math:`e_i = b_i - \hat b_i` of an embedded pair and the
coefficients :math:`d_{im}` of a continuous extension :math:`b_i(\theta) = \sum_m d_{im}
\theta^m`. Every field is checked when the tableau is made: :math:`\sum_i b_i = 1`,
:math:`\sum_i e_i = 0`, :math:`b_i(1) = b_i`, to rounding. The tableau advances a state by
its stages and forms the error estimate and the dense output from them.

:data:`TABLEAUS` holds the tableaus by name; :func:`ctformer.solvers.runge_kutta.register_tableau`
fills it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from ..validation import boolean, real
from .combination import _combine

__all__ = ["ButcherTableau", "TABLEAUS"]


def _floats(values, field: str, name: str) -> tuple:
    try:
        out = tuple(float(v) for v in values)
    except (TypeError, ValueError):
        raise TypeError(f"tableau {name!r}: {field} must be a sequence of real numbers, got "
                        f"{values!r}") from None
    if not all(math.isfinite(v) for v in out):
        raise ValueError(f"tableau {name!r}: {field} must be finite, got {out}")
    return out


def _close(x: float, y: float, scale: float) -> bool:
    """Equal to rounding: ``|x - y| <= 1e-14 max(1, scale)``."""
    return abs(x - y) <= 1e-14 * max(1.0, scale)


def _check_shape(t: "ButcherTableau") -> None:
    s = len(t.b)
    if len(t.a) != s or any(len(row) != i for i, row in enumerate(t.a)):
        raise ValueError(f"tableau {t.name!r}: a must be strictly lower triangular with one row per "
                         f"weight (a[i] holds i entries, {s} rows), got row lengths "
                         f"{[len(row) for row in t.a]}")
    if not _close(sum(t.b), 1.0, sum(map(abs, t.b))):
        raise ValueError(f"tableau {t.name!r}: the weights b must sum to 1, got {sum(t.b)!r}")
    for i, (row, c_i) in enumerate(zip(t.a, t.c)):
        if not _close(sum(row), c_i, sum(map(abs, row))):
            raise ValueError(f"tableau {t.name!r}: c[{i}] = {c_i!r} but row a[{i}] sums to "
                             f"{sum(row)!r}; the nodes must satisfy c_i = sum_j a_ij")


def _paired(t: "ButcherTableau", field: str, partner: str) -> bool:
    """Whether ``field`` is given; refuses ``partner`` given without it (both or neither)."""
    if getattr(t, field) is not None:
        return True
    if getattr(t, partner) is not None:
        raise ValueError(f"tableau {t.name!r}: {partner} is given without {field}; give both "
                         "or neither")
    return False


def _check_error(t: "ButcherTableau") -> None:
    if not _paired(t, "b_error", "error_order"):
        return
    if len(t.b_error) != len(t.b):
        raise ValueError(f"tableau {t.name!r}: b_error needs one entry per stage ({len(t.b)}), "
                         f"got {len(t.b_error)}")
    if not _close(sum(t.b_error), 0.0, sum(map(abs, t.b_error))):
        raise ValueError(f"tableau {t.name!r}: b_error is the difference b - b_embedded and must "
                         f"sum to 0, got {sum(t.b_error)!r}")
    if t.error_order is None or not 0 < t.error_order < t.order:
        raise ValueError(f"tableau {t.name!r}: error_order must be the order of the embedded "
                         f"solution, positive and below order = {t.order:g}, got {t.error_order!r}")


def _check_fsal(t: "ButcherTableau", declared) -> bool:
    structural = len(t.b) > 1 and t.a[-1] == t.b[:-1] and t.b[-1] == 0.0
    if declared is None:
        return structural
    if declared and not structural:
        raise ValueError(f"tableau {t.name!r}: fsal=True needs the last row of a to equal b and "
                         f"b[-1] = 0 (then c_last = 1); a[-1] = {t.a[-1]}, b = {t.b}")
    return bool(declared)


def _check_dense(t: "ButcherTableau") -> None:
    if not _paired(t, "dense", "dense_order"):
        return
    if len(t.dense) != len(t.b) or len({len(row) for row in t.dense}) != 1:
        raise ValueError(f"tableau {t.name!r}: dense needs one row of polynomial coefficients per "
                         f"stage ({len(t.b)} rows of equal length), got row lengths "
                         f"{[len(row) for row in t.dense]}")
    for i, (row, b_i) in enumerate(zip(t.dense, t.b)):
        if not _close(sum(row), b_i, sum(map(abs, row))):
            raise ValueError(f"tableau {t.name!r}: dense[{i}] gives b_{i}(1) = {sum(row)!r}, but "
                             f"the interpolant must end at the step: b_{i}(1) = b[{i}] = {b_i!r}")
    if t.dense_order is None or not 0 < t.dense_order <= t.order:
        raise ValueError(f"tableau {t.name!r}: dense_order must be the order of the continuous "
                         f"extension, positive and at most order = {t.order:g}, got "
                         f"{t.dense_order!r}")


@dataclass(frozen=True)
class ButcherTableau:
    r"""An explicit Runge-Kutta method, optionally an embedded pair with a continuous extension.

    The method advances :math:`u' = F(u)` by :math:`h` with the stages
    :math:`k_i = F(u + h \sum_{j<i} a_{ij} k_j)`, :math:`u_{\text{new}} = u + h \sum_i b_i k_i`.
    An embedded pair carries a second, lower-order solution
    :math:`\hat u_{\text{new}} = u + h \sum_i \hat b_i k_i` from the same stages; the difference

    .. math::  \text{err} = u_{\text{new}} - \hat u_{\text{new}}
               = h \sum_i e_i k_i, \qquad e_i = b_i - \hat b_i,

    estimates the local error of :math:`\hat u` (of order ``error_order``). The continuous
    extension (dense output) gives the state inside the step from the same stages,

    .. math::  u(t + \theta h) \approx u + h \sum_i b_i(\theta) k_i, \qquad
               b_i(\theta) = \sum_{m=1}^{M} d_{im} \theta^m, \quad b_i(1) = b_i .

    Parameters
    ----------
    name : str
    a : tuple of tuples
        ``a[i]`` holds :math:`a_{i0}, \dots, a_{i,i-1}` (``a[0] = ()``).
    b : tuple of float
        One weight per stage; they sum to 1.
    order : float
        The classical order of the method (of :math:`u_{\text{new}}`).
    b_error : tuple of float, optional
        The error weights :math:`e_i = b_i - \hat b_i` (the *difference*, not :math:`\hat b`);
        they sum to 0. ``None`` (the default): no embedded solution.
    error_order : float, optional
        The order of the embedded solution :math:`\hat u`, below ``order``; required with
        ``b_error``.
    fsal : bool, optional
        First same as last: the last stage is evaluated at :math:`u_{\text{new}}` (last row of
        ``a`` equal to ``b``, :math:`b_s = 0`, hence :math:`c_s = 1`), so it is the first stage of
        the next step. ``None`` (the default) detects it; ``True`` is checked; ``False`` turns
        the reuse off.
    dense : tuple of tuples, optional
        ``dense[i][m - 1]`` is :math:`d_{im}`, the coefficient of :math:`\theta^m` in
        :math:`b_i(\theta)` (ascending powers from :math:`\theta^1`); each row sums to
        :math:`b_i`.
    dense_order : float, optional
        The order of the continuous extension (its local error is
        :math:`O(h^{\text{dense\_order} + 1})` at every :math:`\theta`); required with ``dense``.
    c : tuple of float, optional
        The nodes :math:`c_i`; checked against :math:`c_i = \sum_j a_{ij}`, derived when
        omitted.

    Raises
    ------
    ValueError
        Naming the field: rows of ``a`` of the wrong length, ``c`` not the row sums of ``a``,
        ``b`` not summing to 1, ``b_error`` not summing to 0 or of the wrong length, ``fsal=True``
        without the structure, ``dense`` not ending at ``b``, a missing or out-of-range
        ``error_order`` / ``dense_order``.
    """

    name: str
    a: tuple
    b: tuple
    order: float
    b_error: tuple | None = None
    error_order: float | None = None
    fsal: bool | None = None
    dense: tuple | None = None
    dense_order: float | None = None
    c: tuple | None = None

    def __post_init__(self):
        name, put = self.name, lambda field, value: object.__setattr__(self, field, value)
        put("a", tuple(_floats(row, f"a[{i}]", name) for i, row in enumerate(self.a)))
        put("b", _floats(self.b, "b", name))
        put("order", real(self.order, "order", positive=True))
        put("c", tuple(math.fsum(row) for row in self.a) if self.c is None else _floats(self.c, "c", name))
        if len(self.c) != len(self.b):
            raise ValueError(f"tableau {name!r}: c needs one node per stage ({len(self.b)}), got "
                             f"{len(self.c)}")
        _check_shape(self)
        if self.b_error is not None:
            put("b_error", _floats(self.b_error, "b_error", name))
        for field in ("error_order", "dense_order"):
            if getattr(self, field) is not None:
                put(field, real(getattr(self, field), field, positive=True))
        _check_error(self)
        if self.dense is not None:
            put("dense", tuple(_floats(row, f"dense[{i}]", name) for i, row in enumerate(self.dense)))
        _check_dense(self)
        put("fsal", _check_fsal(self, None if self.fsal is None else boolean(self.fsal, "fsal")))

    @property
    def stages(self) -> int:
        return len(self.b)

    @property
    def error_weights(self) -> tuple:
        r"""The error weights :math:`e_i = b_i - \hat b_i`: ``err = h sum_i e_i k_i``."""
        return self._embedded("error_weights", self.b_error)

    @property
    def embedded_weights(self) -> tuple:
        r"""The weights :math:`\hat b_i = b_i - e_i` of the embedded (lower-order) solution."""
        return self._embedded("embedded_weights",
                              tuple(b_i - e_i for b_i, e_i in zip(self.b, self.b_error or ())))

    def _embedded(self, what: str, value):
        if self.b_error is None:
            raise ValueError(f"tableau {self.name!r} is not an embedded pair (b_error is None), so "
                             f"it has no {what}; use an embedded pair ("
                             f"{', '.join(n for n, t in TABLEAUS.items() if t.b_error is not None)})")
        return value

    def dense_weights(self, theta) -> tuple:
        r"""The interpolation weights :math:`b_i(\theta) = \sum_m d_{im} \theta^m`.

        Parameters
        ----------
        theta : float
            The fraction of the step, in :math:`[0, 1]`.

        Returns
        -------
        tuple of float
            :math:`u(t + \theta h) \approx u + h \sum_i b_i(\theta) k_i`; :math:`b_i(0) = 0`,
            :math:`b_i(1) = b_i`.
        """
        if self.dense is None:
            raise ValueError(f"tableau {self.name!r} has no continuous extension (dense is None); "
                             "use a tableau with dense output")
        theta = real(theta, "theta")
        if not 0.0 <= theta <= 1.0:
            raise ValueError(f"theta must lie in [0, 1] (a fraction of the step), got {theta!r}")
        return tuple(sum(d * theta ** (m + 1) for m, d in enumerate(row)) for row in self.dense)

    def advance(self, f: Callable, u, h: float, first=None):
        r"""One step with its stages: ``(u_new, ks)``.

        Parameters
        ----------
        f : callable
            The right-hand side :math:`F`.
        u : array
        h : float
        first : array, optional
            :math:`k_1 = F(u)` when it is known already (the last stage of the previous step
            of an FSAL method); then ``f`` is called :math:`s - 1` times instead of :math:`s`.

        Returns
        -------
        u_new : array
            :math:`u + h \sum_i b_i k_i` (for an FSAL method the last stage's argument, the
            same sum).
        ks : list of arrays
            The stages :math:`k_1, \dots, k_s`.
        """
        ks = [] if first is None else [first]
        stage = u
        for row in self.a[len(ks):]:
            stage = _combine(u, h, row, ks)
            ks.append(f(stage))
        return (stage if self.fsal else _combine(u, h, self.b, ks)), ks

    def step(self, f: Callable, u, h: float):
        """One step of size ``h`` for :math:`u' = f(u)`."""
        return self.advance(f, u, h)[0]

    def error_estimate(self, ks, h: float):
        r"""The local error estimate :math:`h \sum_i e_i k_i = u_{\text{new}} - \hat u_{\text{new}}`."""
        return _combine(0.0 * ks[0], h, self.error_weights, ks)

    def interpolate(self, u, ks, h: float, theta):
        r"""The dense output :math:`u + h \sum_i b_i(\theta) k_i` inside the step from ``u``."""
        return _combine(u, h, self.dense_weights(theta), ks)


#: The tableaus by name: the sub-step methods of the splitting schemes.
TABLEAUS: dict[str, ButcherTableau] = {}

r"""Explicit Runge-Kutta methods as data: a Butcher tableau and its order.

An explicit :math:`s`-stage method for :math:`u' = F(u)` with tableau
:math:`(a_{ij})_{j < i}`, weights :math:`b_i` advances a step :math:`h` by

.. math::

    k_i = F\Big(u + h \sum_{j < i} a_{ij} k_j\Big), \qquad
    u \leftarrow u + h \sum_i b_i k_i .

The library has one of each method: :data:`EULER_TABLEAU` (order 1), :data:`HEUN_TABLEAU`
(order 2) and :data:`RK4_TABLEAU` (the classical method, order 4), and the embedded pairs with
dense output of :mod:`ctformer.solvers.tableaus` (``bosh3``, ``dopri5``, ``tsit5``). They serve
as the sub-step method of the splitting schemes (``substep=``) and, on the unsplit right-hand
side :math:`F = \sum_k f_k`, as the schemes of the same names.

A tableau may carry an embedded solution (``b_error``, ``error_order``), be first-same-as-last
(``fsal``) and carry its continuous extension (``dense``, ``dense_order``); see
:class:`ButcherTableau`. Each field is validated when the tableau is made.

A new explicit method is one tableau and one call: :func:`register_tableau` adds it to
:data:`TABLEAUS` (so every splitting scheme accepts it as ``substep=``) and registers the
scheme that applies it to the unsplit right-hand side (so :func:`ctformer.solvers.get` and
:func:`ctformer.solvers.available` list it, with the tableau's order)::

    RALSTON_TABLEAU = register_tableau(ButcherTableau(
        "ralston", a=((), (2 / 3,)), b=(1 / 4, 3 / 4), order=2.0))
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Callable, ClassVar

import numpy as np

from ..validation import boolean, real
from .base import Scheme, SplitProblem, check_dt, register

__all__ = ["ButcherTableau", "EULER_TABLEAU", "HEUN_TABLEAU", "RK4_TABLEAU", "TABLEAUS",
           "register_tableau", "RungeKutta", "Euler", "Heun", "RK4", "summing"]


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


_IN_PLACE_MIN = 1 << 16  # entries from which a stage term is summed into itself (no second array)
_SUMMING = threading.local()  # .add: the adder of large unit-weight terms inside a summing block


class summing:
    """A block in which this thread's steps form their large unit-weight sums :math:`u + k`
    (a residual block in the discrete limit, NumPy arrays of at least ``_IN_PLACE_MIN``
    entries) by ``add(u, k)``, which must return a new array with the bits of ``u + k`` (a
    faster engine for the same sum: the model's solves pass
    :func:`ctformer._numerics.elementwise.add`). Nested blocks keep the outer adder; other
    threads are not affected."""

    __slots__ = ("add", "entered")

    def __init__(self, add: Callable):
        self.add = add

    def __enter__(self):
        self.entered = getattr(_SUMMING, "add", None) is None
        if self.entered:
            _SUMMING.add = self.add
        return self

    def __exit__(self, *exc):
        if self.entered:
            _SUMMING.add = None


def _combine(u, h: float, weights, ks):
    r""":math:`u + h \sum_i w_i k_i`, skipping the zero weights; a factor :math:`h w_i = 1`
    (a residual block in the discrete limit) adds :math:`k_i` as it is (by the adder of a
    :class:`summing` block for large NumPy arrays), and a large NumPy term is scaled and
    summed in one new array (the same bits: IEEE products by 1 and sums commute)."""
    out = u
    for w_i, k in zip(weights, ks):
        if w_i:
            c = h * w_i
            if c == 1:
                add = getattr(_SUMMING, "add", None) if type(out) is np.ndarray and out.size >= _IN_PLACE_MIN else None
                out = out + k if add is None else add(out, k)
            elif (type(k) is np.ndarray and k.size >= _IN_PLACE_MIN and type(out) is np.ndarray
                  and k.shape == out.shape and k.dtype == out.dtype):  # small arrays: the plain sum is cheaper
                term = c * k
                term += out
                out = term
            else:
                out = out + c * k
    return out


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


class RungeKutta(Scheme):
    r"""A Runge-Kutta method on the full right-hand side :math:`F(u) = \sum_k f_k(u)`, then the
    projections in order:

    .. math::  u \leftarrow P\big(\Phi^{\Delta t}_F(u)\big).

    Order: the tableau's on pre-norm problems whose parameters are constant over each step (a
    converted network: steps never straddle a layer boundary when ``steps_per_layer`` is an
    integer); 1 with projections that are not the identity (:meth:`Scheme.order`).

    For a first-same-as-last tableau (``tableau.fsal``) on a problem without projections, the
    last stage :math:`F(u_{\text{new}})` of a step is the first stage of the next step from
    :math:`u_{\text{new}}`: stepping on with the same problem (a layer) and the returned state
    costs :math:`s - 1` evaluations of :math:`F` per step instead of :math:`s`. The scheme keeps
    that one stage; a different problem (the next layer, whose parameters differ) or another
    state starts afresh.
    """

    tableau: ClassVar[ButcherTableau]

    def __init__(self):
        self._last = None  # (problem, u_new, F(u_new)) of the last FSAL step

    @property
    def nominal_order(self) -> float:
        """The tableau's order."""
        return self.tableau.order

    def step(self, problem: SplitProblem, u, dt: float):
        dt = check_dt(dt)
        last, self._last = self._last, None
        first = last[2] if last is not None and last[0] is problem and last[1] is u else None
        u_new, ks = self.tableau.advance(problem.rhs, u, dt, first=first)
        if self.tableau.fsal and not problem.has_projections:
            self._last = (problem, u_new, ks[-1])
        return problem.project_all(u_new)


def register_tableau(tableau: ButcherTableau, scheme: type | None = None) -> ButcherTableau:
    """Make ``tableau`` a sub-step method and a scheme of the same name.

    Parameters
    ----------
    tableau : ButcherTableau
        Added to :data:`TABLEAUS` under ``tableau.name``.
    scheme : subclass of RungeKutta, optional
        The scheme class registered for ``tableau.name`` (its ``tableau`` is set); default a
        new :class:`RungeKutta` subclass named after the tableau.

    Returns
    -------
    ButcherTableau
        ``tableau`` itself.

    Raises
    ------
    TypeError
        If ``tableau`` is not a :class:`ButcherTableau`.
    ValueError
        If a tableau of that name is registered already.
    """
    if not isinstance(tableau, ButcherTableau):
        raise TypeError(f"tableau must be a ButcherTableau, got {type(tableau).__name__}")
    if tableau.name in TABLEAUS:
        raise ValueError(f"a tableau named {tableau.name!r} is registered already; choose another "
                         "name")
    if scheme is None:
        scheme = type(tableau.name.capitalize(), (RungeKutta,),
                      {"__doc__": f"The Runge-Kutta method {tableau.name!r} on the full right-hand "
                                  f"side. Order {tableau.order:g}.", "__module__": __name__})
    scheme.name, scheme.tableau = tableau.name, tableau
    TABLEAUS[tableau.name] = tableau
    register(scheme)
    return tableau


class Euler(RungeKutta):
    r"""Explicit Euler on the full right-hand side, :math:`u \leftarrow P(u + \Delta t \sum_k f_k(u))`.

    With ``dt = 1`` on a pre-norm model this is the *parallel* block of GPT-J and PaLM
    (attention and FFN read the same input). Order 1.
    """


class Heun(RungeKutta):
    r"""Heun's method (explicit trapezoid) on the full right-hand side. Order 2."""


class RK4(RungeKutta):
    r"""The classical four-stage Runge-Kutta method on the full right-hand side. Order 4.

    .. math::

        k_1 = F(u),\; k_2 = F(u + \tfrac{\Delta t}{2} k_1),\;
        k_3 = F(u + \tfrac{\Delta t}{2} k_2),\; k_4 = F(u + \Delta t\, k_3),

        u \leftarrow P\Big(u + \tfrac{\Delta t}{6}(k_1 + 2 k_2 + 2 k_3 + k_4)\Big).
    """


EULER_TABLEAU = register_tableau(ButcherTableau("euler", a=((),), b=(1.0,), order=1.0), Euler)
HEUN_TABLEAU = register_tableau(ButcherTableau("heun", a=((), (1.0,)), b=(0.5, 0.5), order=2.0), Heun)
RK4_TABLEAU = register_tableau(ButcherTableau(
    "rk4", a=((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)),
    b=(1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0), order=4.0), RK4)

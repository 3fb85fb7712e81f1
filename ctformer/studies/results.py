r"""The result of a convergence study: the error table, observed orders, export and plots.

For levels :math:`i` with mesh widths (or time steps) :math:`h_i` and errors :math:`e_i`, the
order observed between neighbours is

.. math::  p_i = \frac{\log(e_{i-1} / e_i)}{\log(h_{i-1} / h_i)},

and :attr:`ConvergenceResult.observed_order` is the least-squares slope of
:math:`\log e_i` against :math:`\log h_i` over the *asymptotic levels*: the levels whose error
lies above the rounding floor :math:`10^{-12} \max(1, \|u_{\text{ref}}\|)` (below it the
error is rounding noise, e.g. a spectral method that has converged), optionally restricted to
the ``fit_levels`` finest of them.

With ``reference="finest"`` the measured error is :math:`e_h - e_{\text{ref}}`; a reference only
one refinement (ratio :math:`r`) finer than the last measured level biases the last
neighbour order up to :math:`\log_r(r^p + 1)`, so make the reference several refinements finer.

Headlines. A spectral rule (expected order ``inf``) has no algebraic order: its error falls by a
growing factor per refinement, so the summary reports those factors
(:meth:`ConvergenceResult.reductions`) and says that the fitted slope means nothing. Galerkin
elements refined in the FFN hidden variable act as composite Gauss rules (design notes,
section 3), so the summary names the order :math:`2q` of that rule, with :math:`q` Gauss points
per element, next to the element order. A study without a consistent limit
(``consistent_limit=False``) prints no expected order.

Contracts that lower the order (:func:`order_limits`). The expected order is the refined rule's
own, lowered where the problem breaks an assumption of that rule, and the summary says why
(``limitation``):

* the causal mask with the full diagonal weights the diagonal key by its whole cell: a
  first-order rule for :math:`\int_0^x` (order 1 whatever the token rule; ``diagonal="half"``
  is second order);
* a periodic rule (``Fourier``) on data that is not periodic in the refined variable: its
  quadrature is a left Riemann sum (order 1), and the trigonometric interpolant of a function
  whose periodic extension jumps has Gibbs oscillations, an :math:`L^2` error
  :math:`O(h^{1/2})` and a maximum error that does not decrease (order 0). Token dynamics keep
  periodic data periodic only without a mask and without position encodings.

A summary whose observed order misses the expected one by more than 0.3 says so, and, when the
neighbour orders move towards the expected one, that the levels are pre-asymptotic.
"""
from __future__ import annotations

import csv
import io
import json
import math
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .orders import effective_order, fit_order, neighbour_orders
from ..labelled_methods import LabelledResult

__all__ = ["Row", "ConvergenceResult", "fit_order", "neighbour_orders", "comparison_table",
           "effective_order", "order_limits", "limited_order", "NonPeriodicDataWarning"]

COLUMNS = ("level", "n", "h", "error", "order", "seconds")


@dataclass(frozen=True)
class Row:
    """One level of a study.

    Attributes
    ----------
    level : int
        Index of the level, 0 for the coarsest.
    n : int
        Number of values of the refined variable, or steps per layer when refining time.
    h : float
        Mesh width ``length / n`` of the refined variable, or the time step ``1 / n``.
    error : float or None
        Error against the reference; ``None`` for the level that *is* the reference.
    order : float or None
        Order observed between this level and the previous one (``None`` on the first).
    seconds : float
        Wall time of the solve.
    """

    level: int
    n: int
    h: float
    error: float | None
    order: float | None
    seconds: float


def _fmt(value, spec):
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else format(value, spec)


def _write_atomic(path, data):
    """Write ``data`` (str or bytes) to ``path`` through :func:`ctformer.atomic.write_atomic`."""
    from ..atomic import write_atomic

    write_atomic(path, data)


def _reductions_text(factors) -> str:
    return ", ".join(f"x{f:.3g}" for f in factors) if factors else "-"


@dataclass
class ConvergenceResult(LabelledResult):
    """Error table and observed order of a convergence study (see :func:`convergence`).

    Attributes
    ----------
    table : list of Row
        One row per level, coarsest first.
    observed_order : float
        Least-squares order over the asymptotic levels (module notes).
    expected_order : float
        The theoretical order of the refined discretization or scheme (``inf`` if spectral).
    refine : str
        ``"tokens"``, ``"features"``, ``"hidden"`` or ``"time"``.
    method : str
        The refined discretization's name, or the scheme when refining time.
    reference : str
        ``"finest"``, ``"richardson"`` or ``"exact"``.
    norm : str
        ``"l2"`` or ``"max"``.
    min_feature_std : float
        Smallest feature standard deviation :math:`\\min_x \\mathrm{std}_y\\, u(t, x, \\cdot)`
        met at the layer boundaries of all cases (LayerNorm is singular where it is small).
    wall_seconds : float
        Wall time of the whole study.
    parameters : dict
        Everything else that defines the study (discretizations, scheme, model fingerprint).
    consistent_limit : bool
        False when the refined model has no consistent limit (refining depth in a post-norm
        model whose LayerNorm has per-feature affine parameters): no expected order is
        reported then.
    gauss_points : int or None
        :math:`q` when the levels act as composite Gauss rules of order :math:`2q` (Galerkin
        elements refined in the FFN hidden variable), else None; computed once by the study
        from the refined discretization.
    limitation : str or None
        Why ``expected_order`` is below the refined rule's own order (:func:`order_limits`),
        else None.
    """

    table: list
    observed_order: float
    expected_order: float
    refine: str
    method: str
    reference: str
    norm: str
    min_feature_std: float
    wall_seconds: float
    parameters: dict = field(default_factory=dict)
    consistent_limit: bool = True
    gauss_points: int | None = None
    limitation: str | None = None

    # -- views ------------------------------------------------------------------------
    @property
    def h(self) -> np.ndarray:
        """Mesh widths (or time steps) of the levels that have an error."""
        return np.array([r.h for r in self.table if r.error is not None])

    @property
    def errors(self) -> np.ndarray:
        """Errors of the levels that have one (the reference level has none)."""
        return np.array([r.error for r in self.table if r.error is not None])

    @property
    def n(self) -> np.ndarray:
        """Sizes (or steps per layer) of the levels that have an error."""
        return np.array([r.n for r in self.table if r.error is not None])

    def reductions(self) -> list:
        """Error reduction factors :math:`e_{i-1} / e_i` between neighbouring levels.

        Returns
        -------
        list of float
            One factor per pair of neighbouring levels that both have a positive error.
        """
        e = [r.error for r in self.table]
        return [a / b for a, b in zip(e, e[1:]) if a is not None and b is not None and b > 0]

    @property
    def error_norm(self) -> str:
        """The norm of the error, ``"l2"`` or ``"max"`` (the same as :attr:`norm`)."""
        return self.norm

    @property
    def refinement(self):
        """The refined variable as a :class:`ctformer.studies.Refinement`."""
        from .refinement import as_refinement

        return as_refinement(self.refine)

    @property
    def label(self) -> str:
        """A short legend entry, e.g. ``"tokens: gauss-legendre"``."""
        return f"{self.refine}: {self.method}"

    # -- export -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain-Python form (what :meth:`to_json` writes)."""
        def clean(x):
            return None if isinstance(x, float) and not math.isfinite(x) else x

        return {
            "refine": self.refine, "method": self.method, "reference": self.reference,
            "norm": self.norm, "observed_order": clean(self.observed_order),
            "expected_order": clean(self.expected_order),
            "consistent_limit": self.consistent_limit, "gauss_points": self.gauss_points,
            "limitation": self.limitation,
            "min_feature_std": clean(self.min_feature_std), "wall_seconds": self.wall_seconds,
            "parameters": self.parameters, "table": [asdict(r) for r in self.table],
        }

    def to_json(self, path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path``; returns the path."""
        path = Path(path)
        _write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def to_csv(self, path) -> Path:
        """Write the table to ``path``: columns ``level, n, h, error, order, seconds``, named
        as the printed table names them (``level, steps, dt, ...`` when refining time)."""
        path = Path(path)
        handle = io.StringIO(newline="")
        writer = csv.writer(handle)
        writer.writerow(("level", self.refinement.size_name, self.refinement.step_name)
                        + COLUMNS[3:])
        for r in self.table:
            writer.writerow(["" if getattr(r, c) is None else repr(getattr(r, c)) if
                             isinstance(getattr(r, c), float) else getattr(r, c)
                             for c in COLUMNS])
        _write_atomic(path, handle.getvalue())
        return path

    def plot(self, path=None, *, ax=None):
        """Log-log plot of error against h with reference slopes; see :func:`plot_convergence`."""
        from .plotting import plot_convergence

        return plot_convergence([self], path=path, ax=ax)

    # -- printing ---------------------------------------------------------------------
    def __str__(self) -> str:
        size, step = self.refinement.size_name, self.refinement.step_name
        head = (f"convergence in {self.refine} ({self.method}), reference {self.reference}, "
                f"{self.norm} norm")
        lines = [head, f"{'level':>5} {size:>6} {step:>10} {'error':>10} {'order':>6} {'seconds':>8}"]
        for r in self.table:
            err = "reference" if r.error is None else _fmt(r.error, ".3e")
            lines.append(f"{r.level:>5} {r.n:>6} {r.h:>10.3e} {err:>10} {_fmt(r.order, '6.2f'):>6} "
                         f"{r.seconds:>8.3f}")
        lines.append(self.headline())
        lines.append(f"min feature std {_fmt(self.min_feature_std, '.3g')}; "
                     f"wall time {self.wall_seconds:.2f} s")
        return "\n".join(lines)

    def headline(self) -> str:
        """The summary line: observed against expected order, in words where needed.

        Returns
        -------
        str
            ``"observed order 2.01 (expected 2)"``; for a spectral rule the error reduction
            per refinement instead; for Galerkin elements in the hidden variable the order of
            the composite Gauss rule they act as; without a consistent limit no expected order.
        """
        observed = _fmt(self.observed_order, ".2f")
        if not self.consistent_limit:
            return (f"observed order {observed}; no expected order: this model has no "
                    "consistent limit under this refinement (post-norm LayerNorm with "
                    "per-feature gain or shift), so the order means nothing")
        if math.isinf(self.expected_order):
            return (f"error reduction per refinement {_reductions_text(self.reductions())} "
                    f"(spectral: the error falls faster than any power of {self.refinement.step_name}, so an "
                    f"algebraic order - fitted slope {observed} - means nothing)")
        if not math.isfinite(self.observed_order):
            why = ("no order: an order needs errors at two levels at least"
                   + (" (the finest level is the reference)" if self.reference == "finest" else ""))
            return f"{why}; expected {self.expected_order:g}"
        q = self.gauss_points
        if q:
            return (f"observed order {observed} (expected {2 * q}: the hidden variable carries no "
                    f"state and enters only the FFN integral, which {self.method} evaluates at {q} "
                    f"Gauss points per element - a composite Gauss rule of order {2 * q}; the "
                    f"element order {self.expected_order:g} holds for stored states)"
                    + self._miss_note(2 * q))
        why = f": {self.limitation}" if self.limitation else ""
        return (f"observed order {observed} (expected {self.expected_order:g}{why})"
                + self._miss_note(self.expected_order))

    def _miss_note(self, expected: float) -> str:
        """``""`` when the observed order is within 0.3 of ``expected``, else what the
        neighbour orders say: moving towards it (pre-asymptotic levels) or not."""
        orders = [r.order for r in self.table if r.order is not None and math.isfinite(r.order)]
        if abs(self.observed_order - expected) <= 0.3 or len(orders) < 2:
            return ""  # within the tolerance, or one neighbour order: no trend to read
        side = "below" if self.observed_order < expected else "above"
        listed = ", ".join(f"{p:.2f}" for p in orders)
        gaps = [abs(p - expected) for p in orders]
        if all(b < a for a, b in zip(gaps, gaps[1:])):
            return (f"; {side} it on these levels, and the neighbour orders ({listed}) move "
                    f"towards {expected:g}: the coarse levels are pre-asymptotic, finer ones "
                    "show the order")
        return (f"; {side} it, and the neighbour orders ({listed}) do not approach it: "
                "something this study does not model limits the error (the data, a fixed "
                "discretization, or a reference too close to the finest measured level)")

    def __repr__(self) -> str:
        return (f"ConvergenceResult(refine={self.refine!r}, method={self.method!r}, "
                f"levels={[r.n for r in self.table]}, observed_order={self.observed_order:.3g})")


def comparison_table(results, title: str | None = None) -> str:
    """Side-by-side text table of several studies of the same variable and levels.

    Parameters
    ----------
    results : sequence of ConvergenceResult
        Studies whose tables have the same ``n`` column (e.g. two discretizations).
    title : str, optional
        First line; default names the refined variable.

    Returns
    -------
    str
        Columns ``n``, ``h`` and, for each study, its error and neighbour order, then a line
        of observed orders.

    Raises
    ------
    ValueError
        If ``results`` is empty or the studies have different levels.
    """
    results = list(results)
    if not results:
        raise ValueError("comparison_table needs at least one study")
    ns = [r.n for r in results[0].table]
    if any([r.n for r in res.table] != ns for res in results):
        raise ValueError("comparison_table needs studies with the same levels")
    refine = results[0].refine
    size, step = results[0].refinement.size_name, results[0].refinement.step_name
    width = max(18, *(len(res.method) + 2 for res in results))
    lines = [title or f"convergence in {refine} ({results[0].norm} error, reference "
                      f"{results[0].reference})",
             f"{size:>6} {step:>10}" + "".join(f"{res.method:>{width}}" for res in results)]
    for i, n in enumerate(ns):
        cells = []
        for res in results:
            row = res.table[i]
            err = "reference" if row.error is None else f"{row.error:.3e}"
            order = "" if row.order is None else f" ({row.order:.2f})"
            cells.append(f"{err + order:>{width}}")
        lines.append(f"{n:>6} {results[0].table[i].h:>10.3e}" + "".join(cells))
    def observed(res):
        if math.isinf(res.expected_order) or not res.consistent_limit:
            return "-"
        return _fmt(res.observed_order, ".2f")

    def expected(res):
        p = effective_order(res)
        return "spectral" if math.isinf(p) else "none" if math.isnan(p) else format(p, "g")

    def reduction(res):
        factors = res.reductions()
        return f"x{factors[-1]:.3g}" if factors else "-"

    lines.append(f"{'observed order':>17}" + "".join(f"{observed(res):>{width}}" for res in results))
    lines.append(f"{'expected order':>17}" + "".join(f"{expected(res):>{width}}" for res in results))
    lines.append(f"{'last reduction':>17}" + "".join(f"{reduction(res):>{width}}" for res in results))
    notes = []
    if any(math.isinf(res.expected_order) for res in results):
        notes.append("spectral rules have no algebraic order: read the error reduction per "
                     "refinement (last reduction: error of the second-finest measured level over "
                     "the finest)")
    if any(res.gauss_points for res in results):
        notes.append("Galerkin elements in the hidden variable act as composite Gauss rules "
                     "(order 2q with q Gauss points per element)")
    if not all(res.consistent_limit for res in results):
        notes.append("none: no consistent limit, so no order is expected")
    lines += [f"  note: {n}" for n in notes]
    return "\n".join(lines)


class NonPeriodicDataWarning(UserWarning):
    """A periodic rule (``Fourier``) refines a variable in which the data are not periodic."""


_CAUSAL_FULL = ("the causal mask with the full diagonal weights the diagonal key by its whole "
                "cell, a first-order rule for the integral over x' <= x, whatever the token rule "
                "(diagonal='half' is second order)")
_CAUSAL_HALF = "the causal mask with the half diagonal is a second-order rule"


def _masks(model) -> list:
    """The attention masks of ``model``'s blocks, split into their parts."""
    parts = []
    for block in getattr(model, "blocks", ()):
        mask = getattr(getattr(block, "attention", None), "mask", None)
        if mask is not None:
            parts += list(mask.parts())
    return parts


def _has_positions(model) -> bool:
    from ..operators.positions import NoPositions

    return any(not isinstance(getattr(getattr(b, "attention", None), "positions", None),
                              (NoPositions, type(None))) for b in getattr(model, "blocks", ()))


def _periodic_in(u0, variable: str, domain) -> bool | None:
    """Whether the callable ``u0(x, y)`` takes the same values at both ends of ``domain`` in
    ``variable`` (tokens: x, features: y), checked on 17 points of the other variable; None
    when it cannot tell (an array, or the hidden variable, which carries no data)."""
    if not callable(u0) or hasattr(u0, "shape") or variable not in ("tokens", "features"):
        return None
    ends, other = np.array([[domain[0]], [domain[1]]]), np.linspace(0.0, 1.0, 17)[None, :]
    values = np.asarray(u0(ends, other) if variable == "tokens" else u0(other.T, ends.T),
                        dtype=np.float64)
    a, b = (values[0], values[1]) if variable == "tokens" else (values[:, 0], values[:, 1])
    return bool(np.max(np.abs(a - b)) <= 1e-10 * max(1.0, float(np.max(np.abs(values)))))


def order_limits(model, variable: str, discretization, u0=None, *, error_norm: str = "l2",
                 evaluate: str = "interpolate") -> list:
    r"""What the problem imposes on the order of the refined rule (module notes).

    Parameters
    ----------
    model : ContinuousTransformer or None
        Read for its attention masks and position encodings.
    variable : {"tokens", "features", "hidden"}
        The refined variable.
    discretization : Discretization
        The refined rule at one level (its ``order``, ``periodic`` and ``domain`` are read).
    u0 : callable, optional
        The initial state :math:`u_0(x, y)`, checked for periodicity at the domain's ends.
    error_norm, evaluate : str
        How the study measures the error: ``"max"`` sees the Gibbs oscillations undamped,
        ``"coarsest-nodes"`` avoids interpolation.

    Returns
    -------
    list of (float, str)
        ``(order, reason)`` for each assumption of the rule that the problem breaks; empty when
        the rule's own order holds.
    """
    limits = []
    masks = _masks(model) if variable == "tokens" else []
    for mask in masks:
        diagonal = getattr(mask, "diagonal", None)
        if diagonal == "full":
            limits.append((1.0, _CAUSAL_FULL))
        elif diagonal == "half":
            limits.append((2.0, _CAUSAL_HALF))
    if getattr(discretization, "periodic", False) and variable != "hidden":
        periodic = _periodic_in(u0, variable, discretization.domain)
        moving = variable == "tokens" and (masks or _has_positions(model))
        if periodic is False or moving:
            why = "the data are not periodic in " + variable if periodic is False else \
                "a mask or position encoding makes the token dynamics non-periodic"
            if evaluate == "coarsest-nodes":
                limits.append((1.0, f"{discretization.name} is spectral only on periodic data; "
                               f"{why}, so its quadrature is a left Riemann sum (order 1)"))
            else:
                order = 0.0 if error_norm == "max" else 0.5
                limits.append((order, f"{discretization.name} is spectral only on periodic data; "
                               f"{why}: the periodic extension jumps at the ends and the "
                               f"trigonometric interpolant has Gibbs oscillations, an L2 error "
                               f"O(h^1/2) and a maximum error that does not decrease"))
    return limits


def limited_order(order: float, model, variable: str, discretization, u0=None, *,
                  error_norm: str = "l2", evaluate: str = "interpolate",
                  stacklevel: int = 3) -> tuple:
    """``min(order, limits)`` and the reason of the lowest limit below ``order`` (or None).

    Warns with :class:`NonPeriodicDataWarning` when a periodic rule meets non-periodic data.
    """
    limits = [(p, why) for p, why in order_limits(model, variable, discretization, u0,
                                                   error_norm=error_norm, evaluate=evaluate)
              if p < order]
    if not limits:
        return float(order), None
    p, why = min(limits, key=lambda item: item[0])
    if any(getattr(discretization, "periodic", False) and "periodic" in w for _, w in limits):
        warnings.warn(f"refining {variable} with {discretization.name} on non-periodic data: "
                      f"expect order {p:g}, not spectral convergence ({why.split('; ', 1)[-1]})",
                      NonPeriodicDataWarning, stacklevel=stacklevel)
    return float(p), why

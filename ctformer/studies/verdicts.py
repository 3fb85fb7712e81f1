r"""The printed forms of convergence studies: the error table, the headline, side by side.

Headlines (:func:`headline`). A spectral rule (expected order ``inf``) has no algebraic order:
its error falls by a growing factor per refinement, so the summary reports those factors
(:meth:`ConvergenceResult.reductions <ctformer.studies.ConvergenceResult.reductions>`) and says
that the fitted slope means nothing. Galerkin elements refined in the FFN hidden variable act
as composite Gauss rules (design notes, section 3), so the summary names the order :math:`2q`
of that rule, with :math:`q` Gauss points per element, next to the element order. A study
without a consistent limit (``consistent_limit=False``) prints no expected order.

A summary whose observed order misses the expected one by more than 0.3 (:data:`TOLERANCE`;
1.7 and 2.3 against 2 do not, with a rounding slack of :math:`10^{-9}`) says so, and, when the
neighbour orders move towards the expected one, that the levels are pre-asymptotic; with fewer
than two neighbour orders it says the miss and that the levels are too few to read a trend.
"""
from __future__ import annotations

import math

from .orders import effective_order

__all__ = ["comparison_table", "headline", "table_text", "TOLERANCE"]

#: How far the observed order may lie from the expected one, either side, without a note.
TOLERANCE = 0.3


def _fmt(value, spec):
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) \
        else format(value, spec)


def _reductions_text(factors) -> str:
    return ", ".join(f"x{f:.3g}" for f in factors) if factors else "-"


def table_text(result) -> str:
    """The error table of one study with its headline, wall time and smallest feature std.

    Parameters
    ----------
    result : ConvergenceResult
        The study (what ``str(result)`` prints).

    Returns
    -------
    str
        A title line, one line per level (size, step, error, neighbour order, seconds), the
        :func:`headline`, then the smallest feature standard deviation and the wall time.
    """
    size, step = result.refinement.size_name, result.refinement.step_name
    head = (f"convergence in {result.refine} ({result.method}), reference {result.reference}, "
            f"{result.norm} norm")
    lines = [head, f"{'level':>5} {size:>6} {step:>10} {'error':>10} {'order':>6} {'seconds':>8}"]
    for r in result.table:
        err = "reference" if r.error is None else _fmt(r.error, ".3e")
        lines.append(f"{r.level:>5} {r.n:>6} {r.h:>10.3e} {err:>10} {_fmt(r.order, '6.2f'):>6} "
                     f"{r.seconds:>8.3f}")
    lines.append(headline(result))
    if result.rounding is not None and result.rounding > 2.0 ** -52:  # float64: no line
        lines.append(f"errors <= {result.floor:.2g} (100 eps of these states' precision, "
                     f"eps = {result.rounding:.3g}) are rounding and left out of the fit")
    lines.append(f"min feature std {_fmt(result.min_feature_std, '.3g')}; "
                 f"wall time {result.wall_seconds:.2f} s")
    return "\n".join(lines)

def headline(result) -> str:
    """The summary line of a study: observed against expected order, in words where needed.

    Parameters
    ----------
    result : ConvergenceResult
        The study (what :meth:`ConvergenceResult.headline
        <ctformer.studies.ConvergenceResult.headline>` returns).

    Returns
    -------
    str
        ``"observed order 2.01 (expected 2)"``; for a spectral rule the error reduction
        per refinement instead; for Galerkin elements in the hidden variable the order of
        the composite Gauss rule they act as; without a consistent limit no expected order.
    """
    observed = _fmt(result.observed_order, ".2f")
    if not result.consistent_limit:
        return (f"observed order {observed}; no expected order: this model has no "
                "consistent limit under this refinement (post-norm LayerNorm with "
                "per-feature gain or shift), so the order means nothing")
    if math.isinf(result.expected_order):
        return (f"error reduction per refinement {_reductions_text(result.reductions())} "
                f"(spectral: the error falls faster than any power of "
                f"{result.refinement.step_name}, so an "
                f"algebraic order - fitted slope {observed} - means nothing)")
    if not math.isfinite(result.observed_order):
        zeros = sum(1 for r in result.table if r.error == 0)
        why = ("no order: an order needs errors above the rounding floor at two levels at least"
               + (" (the finest level is the reference)" if result.reference == "finest" else "")
               + (f"; the error is 0 at {zeros} level(s), which the fit leaves out"
                  if zeros else ""))
        return f"{why}; expected {effective_order(result):g}"
    q = result.gauss_points
    if q and not result.limitation:  # a limitation (jumping kernels) caps the Gauss rule too
        return (f"observed order {observed} (expected {2 * q}: the hidden variable carries no "
                f"state and enters only the FFN integral, which {result.method} evaluates at {q} "
                f"Gauss points per element - a composite Gauss rule of order {2 * q}; the "
                f"element order {result.expected_order:g} holds for stored states)"
                + _miss_note(result, 2 * q))
    why = f": {result.limitation}" if result.limitation else ""
    return (f"observed order {observed} (expected {result.expected_order:g}{why})"
            + _miss_note(result, result.expected_order))

def _miss_note(result, expected: float) -> str:
    """``""`` when the observed order is within 0.3 of ``expected``, else what the
    neighbour orders say: moving towards it (pre-asymptotic levels) or not; with fewer than
    two of them, that the levels are too few to tell."""
    orders = [r.order for r in result.table if r.order is not None and math.isfinite(r.order)]
    # the slack keeps the stated boundary on both sides: the float 1.7 lies 6e-17 further
    # from 2 than the float 0.3, and read as a miss where 2.3 did not
    if abs(result.observed_order - expected) <= TOLERANCE + 1e-9:
        return ""
    side = "below" if result.observed_order < expected else "above"
    listed = ", ".join(f"{p:.2f}" for p in orders)
    if len(orders) < 2:  # the miss is said all the same; a trend needs two neighbour orders
        which = f"one neighbour order ({listed})" if orders else "no neighbour order"
        return (f"; {side} it, with {which}: too few levels to tell pre-asymptotic levels "
                "from an error limited by something else; add levels")
    gaps = [abs(p - expected) for p in orders]
    if all(b < a for a, b in zip(gaps, gaps[1:])):
        return (f"; {side} it on these levels, and the neighbour orders ({listed}) move "
                f"towards {expected:g}: the coarse levels are pre-asymptotic, finer ones "
                "show the order")
    return (f"; {side} it, and the neighbour orders ({listed}) do not approach it: "
            "something this study does not model limits the error (the data, a fixed "
            "discretization, or a reference too close to the finest measured level)")

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
    for label, cell in (("observed order", _observed), ("expected order", _expected),
                        ("last reduction", _reduction)):
        lines.append(f"{label:>17}" + "".join(f"{cell(res):>{width}}" for res in results))
    lines += [f"  note: {n}" for n in _notes(results)]
    return "\n".join(lines)


def _observed(res) -> str:
    if math.isinf(res.expected_order) or not res.consistent_limit:
        return "-"
    return _fmt(res.observed_order, ".2f")


def _expected(res) -> str:
    p = effective_order(res)
    return "spectral" if math.isinf(p) else "none" if math.isnan(p) else format(p, "g")


def _reduction(res) -> str:
    factors = res.reductions()
    return f"x{factors[-1]:.3g}" if factors else "-"


def _notes(results) -> list:
    """The notes under a comparison: how to read spectral, Galerkin and inconsistent columns."""
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
    return notes

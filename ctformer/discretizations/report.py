r"""Error tables: how fast each discretization integrates and reconstructs a smooth function.

For a function :math:`f` on :math:`[a, b]` and each discretization ``D`` with ``n`` values,

.. math::

    e_{\int} = \Big| \texttt{D.integrate}(\texttt{D.sample}(f)) - \int_a^b f \Big|, \qquad
    e_{\infty} = \max_p \big| \texttt{D.interpolate}(\texttt{D.sample}(f), x_p) - f(x_p) \big|,

with :math:`x_p` uniform check points including both ends. Between consecutive rows the
observed rate :math:`\log(e_{k-1}/e_k) / \log(h_{k-1}/h_k)` estimates the order
(:func:`neighbour_orders`); :func:`fit_order` is the least-squares slope over many rows.
These two are the library's one order fitter: convergence studies
(:mod:`ctformer.studies.orders`) and the bridge reports use them too.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from ..validation import integer, is_integer, real
from .base import available, get

__all__ = ["error_table", "format_error_table", "neighbour_orders", "fit_order"]


def _valid_n(name: str, n: int) -> int:
    # P2 needs an odd number of degrees of freedom (2 E + 1): round up.
    if name == "p2" and n % 2 == 0:
        return n + 1
    return n


def _checked_levels(h, errors) -> tuple[list, list]:
    """``h`` and ``errors`` as lists, refused (naming the first offending index) unless every
    mesh width is finite and > 0 and every error a norm (finite, >= 0) or None."""
    h, errors = list(h), list(errors)
    if len(h) != len(errors):
        raise ValueError(f"h and errors must have the same length, got {len(h)} mesh widths and "
                         f"{len(errors)} errors")
    for i, hi in enumerate(h):
        if not (math.isfinite(float(hi)) and float(hi) > 0):
            raise ValueError(f"h must hold finite mesh widths > 0, got h[{i}] = {float(hi)}")
    for i, ei in enumerate(errors):
        if ei is not None and not 0 <= float(ei) < math.inf:
            # a NaN or inf error is a diverged or overflowed solve, not a level to skip
            raise ValueError(f"errors must be norms (finite, >= 0; None to skip a level), got "
                             f"errors[{i}] = {float(ei)}; measure that level again or "
                             "pass None for it")
    return h, errors


def neighbour_orders(h, errors) -> list:
    r"""Observed orders between neighbouring levels.

    .. math::  p_i = \frac{\log(e_{i-1} / e_i)}{\log(h_{i-1} / h_i)}, \qquad i \ge 1.

    Parameters
    ----------
    h, errors : sequence of float
        Mesh widths and errors, one per level (``None`` errors are skipped, e.g. the level
        that is the reference).

    Returns
    -------
    list
        ``None`` first, then :math:`p_i`; ``None`` where it is undefined: an error that is
        ``None`` or zero (the logarithm of 0; :func:`fit_order` leaves such a level out too)
        or two equal mesh widths.

    Raises
    ------
    ValueError
        As :func:`fit_order`: different lengths, a mesh width that is not finite and > 0, or
        an error that is negative, NaN or inf (named with its index).
    """
    h, errors = _checked_levels(h, errors)
    out = [None]
    for i in range(1, len(h)):
        e0, e1 = errors[i - 1], errors[i]
        if e0 is None or e1 is None or e0 == 0 or e1 == 0 or h[i - 1] == h[i]:
            out.append(None)
        else:
            out.append(math.log(e0 / e1) / math.log(h[i - 1] / h[i]))
    return out


def fit_order(h, errors, floor: float = 0.0, fit_levels: int | None = None) -> float:
    r"""Least-squares slope of ``log(error)`` against ``log(h)`` over the asymptotic levels.

    With the kept levels :math:`(h_i, e_i)`, :math:`x_i = \log h_i`, :math:`y_i = \log e_i`,

    .. math::  p = \frac{\sum_i (x_i - \bar x)(y_i - \bar y)}{\sum_i (x_i - \bar x)^2}.

    Parameters
    ----------
    h, errors : sequence of float
        Mesh widths and errors (``None`` errors are skipped).
    floor : float
        Errors at or below it are rounding noise and are left out.
    fit_levels : int, optional
        Use only this many of the finest remaining levels: those of the smallest ``h``,
        whatever the order in which the levels are given.

    Returns
    -------
    float
        The slope, or NaN when fewer than two levels with distinct mesh widths remain (a
        slope through points of one abscissa is undefined; a study reports it as "-").

    Raises
    ------
    ValueError
        If ``h`` and ``errors`` differ in length, a mesh width is not finite and > 0, an error
        is negative, NaN or inf (an error is a norm; the message names its index), or
        ``fit_levels`` is not a positive integer.
    """
    h, errors = _checked_levels(h, errors)
    if fit_levels is not None and not (is_integer(fit_levels) and fit_levels >= 1):
        raise ValueError(f"fit_levels must be a positive integer or None, got {fit_levels!r}")
    pts = [(float(hi), float(ei)) for hi, ei in zip(h, errors) if ei is not None and ei > floor]
    if fit_levels is not None:
        # the finest levels are those of the smallest h (stable: ties keep their order)
        pts = sorted(pts, key=lambda p: -p[0])[-fit_levels:]
    if len({hi for hi, _ in pts}) < 2:
        return float("nan")
    hh, ee = np.log(np.array(pts, dtype=float)).T
    return float(np.polyfit(hh, ee, 1)[0])


def error_table(
    f: Callable,
    exact_integral: float,
    ns: Sequence[int] = (4, 8, 16, 32),
    names: Sequence[str] | None = None,
    domain=(0.0, 1.0),
    check_points: int = 1001,
) -> list[dict]:
    r"""Integration and interpolation errors of discretizations against ``n``.

    Parameters
    ----------
    f : callable
        Vectorized function of one variable on ``domain``.
    exact_integral : float
        :math:`\int_a^b f(x)\, dx`.
    ns : sequence of int, optional
        Numbers of values. For ``"p2"`` an even ``n`` is replaced by ``n + 1``.
    names : sequence of str, optional
        Discretization names (default: all of :func:`~ctformer.discretizations.available`).
    domain : tuple of float, optional
        Interval ``(a, b)``; default ``(0, 1)``.
    check_points : int, optional
        Number of uniform points (ends included) for the maximum interpolation error.

    Returns
    -------
    list of dict
        One row per (name, n) with keys ``name``, ``n``, ``h``, ``integration_error``,
        ``interpolation_error``, ``integration_rate``, ``interpolation_rate`` (rates are
        ``nan`` in the first row of each name).

    Raises
    ------
    ValueError
        For an unknown name, an ``n`` below a method's minimum, a non-finite
        ``exact_integral`` or fewer than two ``check_points``.
    TypeError
        For an ``exact_integral`` that is not a real number, or an ``n`` or ``check_points``
        that is not an integer.
    """
    exact_integral = real(exact_integral, "exact_integral")
    check_points = integer(check_points, "check_points", minimum=2)
    ns = [integer(n, "every n of ns") for n in ns]
    names = available() if names is None else list(names)
    points = np.linspace(float(domain[0]), float(domain[1]), check_points)
    reference = np.asarray(f(points), dtype=np.float64)
    rows: list[dict] = []
    for name in names:
        block = []
        for n in ns:
            disc = get(name, _valid_n(name, n), domain=domain)
            values = disc.sample(f)
            block.append({
                "name": name, "n": disc.n, "h": disc.h,
                "integration_error": abs(float(disc.integrate(values)) - float(exact_integral)),
                "interpolation_error": float(np.max(np.abs(disc.interpolate(values, points)
                                                           - reference))),
            })
        h = [row["h"] for row in block]
        for kind in ("integration", "interpolation"):
            rates = neighbour_orders(h, [row[f"{kind}_error"] for row in block])
            for row, rate in zip(block, rates):
                row[f"{kind}_rate"] = math.nan if rate is None else rate
        rows += block
    return rows


def format_error_table(rows: Sequence[dict]) -> str:
    """Format the rows of :func:`error_table` as a fixed-width text table.

    Parameters
    ----------
    rows : sequence of dict
        Output of :func:`error_table`.

    Returns
    -------
    str
        One line per row, a header, and a blank line between discretizations.
    """

    def num(x: float, fmt: str) -> str:
        return "" if math.isnan(x) else format(x, fmt)

    header = f"{'method':<16}{'n':>5}  {'integration err':>16}{'rate':>7}  {'interpolation err':>18}{'rate':>7}"
    lines = [header, "-" * len(header)]
    last = None
    for row in rows:
        if last is not None and row["name"] != last:
            lines.append("")
        last = row["name"]
        lines.append(
            f"{row['name']:<16}{row['n']:>5}  {row['integration_error']:>16.3e}"
            f"{num(row['integration_rate'], '.2f'):>7}  {row['interpolation_error']:>18.3e}"
            f"{num(row['interpolation_rate'], '.2f'):>7}"
        )
    return "\n".join(lines)

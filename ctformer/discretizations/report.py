r"""Error tables: how fast each discretization integrates and reconstructs a smooth function.

For a function :math:`f` on :math:`[a, b]` and each discretization ``D`` with ``n`` values,

.. math::

    e_{\int} = \Big| \texttt{D.integrate}(\texttt{D.sample}(f)) - \int_a^b f \Big|, \qquad
    e_{\infty} = \max_p \big| \texttt{D.interpolate}(\texttt{D.sample}(f), x_p) - f(x_p) \big|,

with :math:`x_p` uniform check points including both ends. Between consecutive rows the
observed rate :math:`\log(e_{k-1}/e_k) / \log(h_{k-1}/h_k)` estimates the order.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np

from .base import available, get

__all__ = ["error_table", "format_error_table"]


def _valid_n(name: str, n: int) -> int:
    # P2 needs an odd number of degrees of freedom (2 E + 1): round up.
    if name == "p2" and n % 2 == 0:
        return n + 1
    return n


def _rate(e_prev: float, e: float, h_prev: float, h: float) -> float:
    if e_prev <= 0.0 or e <= 0.0:
        return math.nan
    return math.log(e_prev / e) / math.log(h_prev / h)


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
        For an unknown name, an ``n`` below a method's minimum, or a non-finite
        ``exact_integral``.
    """
    if not math.isfinite(float(exact_integral)):
        raise ValueError(f"exact_integral must be finite, got {exact_integral!r}")
    names = available() if names is None else list(names)
    points = np.linspace(float(domain[0]), float(domain[1]), int(check_points))
    reference = np.asarray(f(points), dtype=np.float64)
    rows: list[dict] = []
    for name in names:
        previous = None
        for n in ns:
            disc = get(name, _valid_n(name, int(n)), domain=domain)
            values = disc.sample(f)
            e_int = abs(float(disc.integrate(values)) - float(exact_integral))
            e_interp = float(np.max(np.abs(disc.interpolate(values, points) - reference)))
            row = {
                "name": name,
                "n": disc.n,
                "h": disc.h,
                "integration_error": e_int,
                "interpolation_error": e_interp,
                "integration_rate": math.nan,
                "interpolation_rate": math.nan,
            }
            if previous is not None:
                row["integration_rate"] = _rate(previous["integration_error"], e_int, previous["h"], disc.h)
                row["interpolation_rate"] = _rate(
                    previous["interpolation_error"], e_interp, previous["h"], disc.h
                )
            rows.append(row)
            previous = row
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

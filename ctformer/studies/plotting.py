r"""Log-log convergence plots with reference slopes.

Each study is drawn as error against :math:`h` (or :math:`\Delta t`) on log-log axes. A dashed
line of slope :math:`p`, a factor 3 below the finest point of each study, shows the expected
order :math:`p`: a study converging at that order runs parallel to it. Spectral studies (expected
order ``inf``) get no reference line; their curves bend downwards instead.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["plot_convergence"]


def plot_convergence(results, path=None, *, ax=None, title=None, slopes=True):
    r"""Plot one or several :class:`ConvergenceResult` on log-log axes.

    Parameters
    ----------
    results : ConvergenceResult or sequence of them
        Studies to draw; each is labelled by its ``label`` and observed order.
    path : str or os.PathLike, optional
        Save the figure there (format from the suffix, e.g. ``.png``).
    ax : matplotlib.axes.Axes, optional
        Draw into these axes instead of a new figure.
    title : str, optional
        Axes title.
    slopes : bool, optional
        Draw a dashed reference line of the expected slope for each finite-order study.

    Returns
    -------
    matplotlib.figure.Figure
        The figure holding the axes.

    Raises
    ------
    ValueError
        If a study has no positive errors to draw.
    """
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    if not isinstance(results, (list, tuple)):
        results = [results]
    if ax is None:
        fig, ax = plt.subplots(figsize=(5.5, 4.0))
    else:
        fig = ax.figure
    for res in results:
        h, err = res.h, res.errors
        keep = err > 0
        if not keep.any():
            raise ValueError(f"study {res.label!r} has no positive errors to plot")
        order = "-" if not math.isfinite(res.observed_order) else f"{res.observed_order:.2f}"
        (line,) = ax.loglog(h[keep], err[keep], "o-", label=f"{res.label} (order {order})")
        p = res.expected_order
        if slopes and math.isfinite(p):
            # drawn a factor 3 below the finest point so that it does not hide the data
            h0, e0 = h[keep][-1], err[keep][-1] / 3.0
            hs = np.array([h[keep][0], h0])
            ax.loglog(hs, e0 * (hs / h0) ** p, "--", color=line.get_color(), alpha=0.7,
                      label=f"slope {p:g}")
    unit = "time step" if all(r.refine == "time" for r in results) else "h"
    ax.set_xlabel(r"$\Delta t$" if unit == "time step" else "$h$")
    ax.set_ylabel(f"error ({results[0].norm})")
    if title:
        ax.set_title(title)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    if path is not None:
        fig.savefig(path, dpi=120, bbox_inches="tight")
    return fig

r"""Log-log convergence plots with reference slopes.

Each study is drawn as error against :math:`h` (or :math:`\Delta t`) on log-log axes. A dashed
line of slope :math:`p`, a factor 3 below the finest point of each study, shows the expected
order :math:`p`: a study converging at that order runs parallel to it. Spectral studies (expected
order ``inf``) get no reference line; their curves bend downwards instead. Galerkin elements
refined in the hidden variable get the slope of the composite Gauss rule they act as
(:func:`ctformer.studies.orders.effective_order`), and a study without a consistent limit gets
none.

Both axes carry at least two labelled ticks (:func:`_label_axes`): the :math:`h` axis is labelled
at the levels themselves, and an error axis that spans less than two decades gets ticks at 1, 2
and 5 times the powers of ten (a plain log axis there showed one label, or none), or, where
fewer than two of those fall inside, evenly spaced ones, with as many digits as keep their
labels apart.

Figures are written atomically (:func:`save_figure`): a reader never sees half a file.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from .orders import effective_order

__all__ = ["plot_convergence", "save_figure"]

INSTALL_MATPLOTLIB = 'pip install matplotlib (or pip install "ctformer[demo]")'


def save_figure(fig, path, *, dpi: int = 120) -> Path:
    """Save ``fig`` to ``path`` atomically (format from the suffix, e.g. ``.png``).

    The figure is rendered into memory first and then written with
    :func:`ctformer.atomic.write_atomic` (a temporary file in the same directory, then a
    rename), so an interrupted run never leaves a truncated image.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    path : str or os.PathLike
    dpi : int, optional

    Returns
    -------
    pathlib.Path
        The path written.
    """
    from ..atomic import write_atomic

    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".").lower() or "png", dpi=dpi,
                bbox_inches="tight")
    write_atomic(path, buffer.getvalue())
    return path


def _label_axes(ax, steps) -> None:
    """Labelled ticks at the levels' ``steps`` (up to eight of them) on the x axis, and at
    1, 2, 5 x 10^k on a y axis narrower than two decades."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    if 2 <= len(steps) <= 8:
        ax.xaxis.set_major_locator(FixedLocator(steps))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    low, high = ax.get_ylim()
    if high / low < 100:
        # within a decade with fewer than two of 1, 2, 5 x 10^k, LogLocator falls back to
        # linear ticks, which two digits labelled alike (0.0013, 0.0013, 0.0014, ...)
        ticks = [t for t in LogLocator(base=10, subs=(1.0, 2.0, 5.0)).tick_values(low, high)
                 if low <= t <= high]
        digits = next((d for d in range(2, 8)
                       if len({f"{t:.{d}g}" for t in ticks}) == len(ticks)), 8)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.{digits}g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(low, high)


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
    ImportError
        If matplotlib is not installed (the message names the ``pip install`` command).
    ValueError
        If a study has no positive errors to draw.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:  # matplotlib is optional: say how to get it, not just its name
        raise ImportError(f"plotting a convergence study needs matplotlib, which is not installed ({exc}): "
                          f"{INSTALL_MATPLOTLIB}") from exc

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
        if math.isinf(res.expected_order):
            note = "spectral"
        else:
            note = "order " + ("-" if not math.isfinite(res.observed_order)
                               else f"{res.observed_order:.2f}")
        (line,) = ax.loglog(h[keep], err[keep], "o-", label=f"{res.label} ({note})")
        p = effective_order(res)
        if slopes and math.isfinite(p):
            # drawn a factor 3 below the finest point so that it does not hide the data
            h0, e0 = h[keep][-1], err[keep][-1] / 3.0
            hs = np.array([h[keep][0], h0])
            ax.loglog(hs, e0 * (hs / h0) ** p, "--", color=line.get_color(), alpha=0.7,
                      label=f"slope {p:g}")
    in_time = all(r.refinement.refines_depth for r in results)
    ax.set_xlabel(r"$\Delta t$" if in_time else "$h$")
    ax.set_ylabel(f"error ({results[0].norm})")
    if title:
        ax.set_title(title)
    _label_axes(ax, np.unique(np.concatenate([r.h[r.errors > 0] for r in results])))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    if path is not None:
        save_figure(fig, path)
    return fig

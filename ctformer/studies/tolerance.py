r"""Work and precision in depth: refine the tolerance, measure the achieved error and the work.

For each scheme and each tolerance :math:`\mathrm{rtol}_m` (``atol = ratio * rtol``) the model is
evolved with error control and compared with one reference solve :math:`u^\star(T)`:

.. math::  \varepsilon_m = \frac{\|u_m(T) - u^\star(T)\|_{L^2_w}}{\|u^\star(T)\|_{L^2_w}},
           \qquad \|v\|_{L^2_w}^2 = \sum_{ij} w^x_i w^y_j |v_{ij}|^2,

the grids' quadrature norm (the controller's). A controller is *tolerance proportional* when
:math:`\varepsilon \propto \mathrm{rtol}`: the fitted slope of :math:`\log \varepsilon` against
:math:`\log \mathrm{rtol}` is 1 (the embedded pairs propagate their higher-order solution, step
doubling controls the error per unit step; :mod:`ctformer.solvers.steppers`). The work is the
number of right-hand-side evaluations, so that schemes compare at equal achieved error.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from .. import solvers
from ..backend import to_host
from ..labelled_methods import LabelledResult
from ..validation import real
from .orders import fit_order

__all__ = ["ToleranceLevel", "WorkPrecision", "work_precision"]


@dataclass(frozen=True)
class ToleranceLevel:
    """One error-controlled solve of a work-precision study."""

    scheme: str
    rtol: float
    atol: float
    error: float
    rhs_evaluations: float
    accepted: int
    rejected: int
    seconds: float


@dataclass(frozen=True)
class WorkPrecision(LabelledResult):
    """The levels of :func:`work_precision`, with the reference they were measured against.

    Attributes
    ----------
    levels : tuple of ToleranceLevel
    reference : str
        How :math:`u^\\star(T)` was computed.
    """

    levels: tuple
    reference: str

    @property
    def schemes(self) -> list[str]:
        return list(dict.fromkeys(level.scheme for level in self.levels))

    def of(self, scheme: str) -> list:
        """The levels of one scheme, in the order of the tolerances."""
        return [level for level in self.levels if level.scheme == scheme]

    def slope(self, scheme: str, floor: float = 1e-13) -> float:
        r"""The fitted slope of :math:`\log \varepsilon` against :math:`\log \mathrm{rtol}`
        (1 for tolerance proportionality); errors at or below ``floor`` are left out."""
        levels = self.of(scheme)
        return fit_order([lv.rtol for lv in levels], [lv.error for lv in levels], floor=floor)

    def table(self) -> str:
        """A plain-text table: scheme, rtol, error, error/rtol, evaluations, steps."""
        lines = [f"{'scheme':>8} {'rtol':>8} {'error':>10} {'err/rtol':>9} {'rhs':>7} "
                 f"{'steps':>6} {'rejected':>8}"]
        for lv in self.levels:
            lines.append(f"{lv.scheme:>8} {lv.rtol:8.0e} {lv.error:10.3e} {lv.error / lv.rtol:9.3g} "
                         f"{lv.rhs_evaluations:7.0f} {lv.accepted:6d} {lv.rejected:8d}")
        for scheme in self.schemes:
            lines.append(f"{scheme}: slope of log error against log rtol {self.slope(scheme):.3f}")
        return "\n".join(lines)


def _relative_l2(u, reference, weights) -> float:
    u, reference = np.asarray(to_host(u)), np.asarray(to_host(reference))
    if u.shape != reference.shape:  # NumPy broadcast it, or failed naming neither
        raise ValueError(f"reference has shape {reference.shape}, the solutions on these grids "
                         f"{u.shape}; pass u*(T) on the same tokens and features (or leave "
                         "reference=None to compute it)")
    w = np.outer(*weights) if weights is not None else np.ones(u.shape[-2:])
    diff = float(np.sum(w * np.abs(u - reference) ** 2))
    size = float(np.sum(w * np.abs(reference) ** 2))
    return math.sqrt(diff / size) if size > 0 else math.sqrt(diff)


def work_precision(model, u0, *, tokens, features, schemes=("bosh3", "dopri5", "tsit5"),
                   rtols=(1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8), atol_ratio=1e-3, reference=None,
                   norm="l2", **options) -> WorkPrecision:
    r"""Achieved error and work of error-controlled depth solves over a range of tolerances.

    Parameters
    ----------
    model : ctformer.ContinuousTransformer
    u0 : array or callable
        As for :meth:`~ctformer.ContinuousTransformer.evolve`.
    tokens, features : Discretization
    schemes : sequence of str
        Schemes to compare (any of :func:`ctformer.solvers.available`; those without an
        embedded pair are controlled by step doubling).
    rtols : sequence of float
        Relative tolerances; ``atol = atol_ratio * rtol``.
    reference : array, optional
        :math:`u^\star(T)` on the same grids; default: ``dopri5`` at ``rtol = 1e-13``,
        ``atol = 1e-16`` (its own error is near the float64 rounding of the solve).
    norm : {"l2", "rms"}
        The controller's norm (the achieved error is always measured in the grids' norm).
    **options
        Passed to ``evolve`` (``head_features``, ``hidden``, ``padding_mask``, ...).

    Returns
    -------
    WorkPrecision

    Raises
    ------
    ValueError
        If a given ``reference`` holds NaN or inf, or its shape is not the solutions' shape.
    """
    grids = dict(tokens=tokens, features=features)
    ratio = real(atol_ratio, "atol_ratio", nonnegative=True)
    if reference is None:
        exact = solvers.PIController(rtol=1e-13, atol=1e-16, max_steps=1_000_000)
        ref_solution = model.evolve(u0, scheme="dopri5", controller=exact, **grids, **options)
        reference, described = ref_solution.final, "dopri5 at rtol=1e-13, atol=1e-16"
    else:
        described, ref_solution = "given by the caller", None
        if not np.all(np.isfinite(to_host(reference))):  # every error would be NaN
            raise ValueError("reference holds NaN or inf; pass a finite u*(T) (or leave "
                             "reference=None to compute it)")
    weights = None
    levels = []
    for name in schemes:
        for rtol in rtols:
            rtol = real(rtol, "rtols", positive=True)
            controller = solvers.PIController(rtol=rtol, atol=ratio * rtol, norm=norm)
            start = time.perf_counter()
            sol = model.evolve(u0, scheme=name, controller=controller, **grids, **options)
            seconds = time.perf_counter() - start
            if weights is None and sol.grids is not None:
                weights = solvers.grid_weights(sol.grids)
            levels.append(ToleranceLevel(
                scheme=solvers.get(name).label, rtol=rtol, atol=ratio * rtol,
                error=_relative_l2(sol.final, reference, weights),
                rhs_evaluations=float(sol.stats["rhs_evaluations"]),
                accepted=int(sol.stats["accepted"]), rejected=int(sol.stats["rejected"]),
                seconds=seconds))
    return WorkPrecision(levels=tuple(levels), reference=described)

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
from ..backend import floating_info, namespace, to_host
from ..evolution import _real_token_weights
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
    floor : float
        Errors at or below it are the states' rounding, not the controller's, and are left out
        of :meth:`slope`: ``1e-13`` for float64 states, ten units of roundoff of a lower
        precision (``10 * 2**-23 = 1.19e-6`` for float32, whose errors stall near ``3e-7``).
    """

    levels: tuple
    reference: str
    floor: float = 1e-13

    @property
    def schemes(self) -> list[str]:
        return list(dict.fromkeys(level.scheme for level in self.levels))

    def of(self, scheme: str) -> list:
        """The levels of one scheme, in the order of the tolerances."""
        return [level for level in self.levels if level.scheme == scheme]

    def slope(self, scheme: str, floor: float | None = None) -> float:
        r"""The fitted slope of :math:`\log \varepsilon` against :math:`\log \mathrm{rtol}`
        (1 for tolerance proportionality); errors at or below ``floor`` (default
        :attr:`floor`, the states' rounding) are left out, NaN when fewer than two remain."""
        levels = self.of(scheme)
        floor = self.floor if floor is None else floor
        return fit_order([lv.rtol for lv in levels], [lv.error for lv in levels], floor=floor)

    def table(self) -> str:
        """A plain-text table: scheme, rtol, error, error/rtol, evaluations, steps."""
        lines = [f"{'scheme':>8} {'rtol':>8} {'error':>10} {'err/rtol':>9} {'rhs':>7} "
                 f"{'steps':>6} {'rejected':>8}"]
        for lv in self.levels:
            lines.append(f"{lv.scheme:>8} {lv.rtol:8.0e} {lv.error:10.3e} {lv.error / lv.rtol:9.3g} "
                         f"{lv.rhs_evaluations:7.0f} {lv.accepted:6d} {lv.rejected:8d}")
        for scheme in self.schemes:
            lines.append(f"{scheme}: slope of log error against log rtol {self.slope(scheme):.3f} "
                         f"(errors <= {self.floor:.2g}, the states' rounding, left out)")
        return "\n".join(lines)


def _relative_l2(u, reference, weights) -> float:
    u, reference = np.asarray(to_host(u)), np.asarray(to_host(reference))
    if u.shape != reference.shape:  # NumPy broadcast it, or failed naming neither
        raise ValueError(f"reference has shape {reference.shape}, the solutions on these grids "
                         f"{u.shape}; pass u*(T) on the same tokens and features (or leave "
                         "reference=None to compute it)")
    # per-sequence token weights (..., n_x) of a padding mask broadcast over the features
    w = weights[0][..., :, None] * weights[1] if weights is not None else np.ones(u.shape[-2:])
    diff = float(np.sum(w * np.abs(u - reference) ** 2))
    size = float(np.sum(w * np.abs(reference) ** 2))
    return math.sqrt(diff / size) if size > 0 else math.sqrt(diff)


def _measured_weights(grids, padding_mask):
    """The controller's weights: the grids', with a padding mask's padded tokens at zero and
    each sequence's real tokens keeping its total weight (a padded token is never read)."""
    weights = solvers.grid_weights(grids)
    return weights if padding_mask is None else _real_token_weights(weights, padding_mask)


def _state_eps(u0) -> float:
    """Unit roundoff of a floating array ``u0``; float64's for a callable or other data."""
    dtype = getattr(u0, "dtype", None)
    try:
        return float(floating_info(dtype).eps)
    except TypeError:  # a callable sampled in float64, or integers the model converts
        return float(np.finfo(np.float64).eps)


def _rounding_floor(u0) -> float:
    """Errors at or below this are the states' rounding: 1e-13 in float64, else 10 eps."""
    eps = _state_eps(u0)
    return 1e-13 if eps <= np.finfo(np.float64).eps else 10.0 * eps


def _reference(model, u0, reference, grids, options):
    """u*(T) and how it was computed: dopri5 at rtol=1e-13 in float64 (a float32 solve at that
    tolerance cannot take a step above its rounding: a million steps, then MaxStepsReached)."""
    if reference is not None:
        if not np.all(np.isfinite(to_host(reference))):  # every error would be NaN
            raise ValueError("reference holds NaN or inf; pass a finite u*(T) (or leave "
                             "reference=None to compute it)")
        return reference, "given by the caller"
    exact = solvers.PIController(rtol=1e-13, atol=1e-16, max_steps=1_000_000)
    described = "dopri5 at rtol=1e-13, atol=1e-16"
    if _state_eps(u0) > np.finfo(np.float64).eps:
        xp = namespace(u0)
        wide = xp.complex128 if xp.isdtype(u0.dtype, "complex floating") else xp.float64
        u0, described = xp.astype(u0, wide), described + " in float64"
    return model.evolve(u0, scheme="dopri5", controller=exact, **grids, **options).final, described


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
        ``atol = 1e-16`` (its own error is near the float64 rounding of the solve), from
        ``u0`` converted to float64 when it is a lower precision (float32, float16, ...), in
        its own namespace and device.
    norm : {"l2", "rms"}
        The controller's norm (the achieved error is always measured in the grids' norm).
    **options
        Passed to ``evolve`` (``head_features``, ``hidden``, ``padding_mask``, ...). With a
        ``padding_mask`` the error reads the real tokens only, with the controller's weights
        (padded tokens 0, each sequence's real tokens its total weight): a padded sequence
        is measured as that sequence alone.

    Returns
    -------
    WorkPrecision
        Its ``floor`` (left out of the slopes) is the states' rounding: ``1e-13`` in
        float64, ``10 * eps`` of a lower precision.

    Raises
    ------
    ValueError
        If a given ``reference`` holds NaN or inf, or its shape is not the solutions' shape.
    """
    grids = dict(tokens=tokens, features=features)
    ratio = real(atol_ratio, "atol_ratio", nonnegative=True)
    reference, described = _reference(model, u0, reference, grids, options)
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
                weights = _measured_weights(sol.grids, options.get("padding_mask"))
            levels.append(ToleranceLevel(
                scheme=solvers.get(name).label, rtol=rtol, atol=ratio * rtol,
                error=_relative_l2(sol.final, reference, weights),
                rhs_evaluations=float(sol.stats["rhs_evaluations"]),
                accepted=int(sol.stats["accepted"]), rejected=int(sol.stats["rejected"]),
                seconds=seconds))
    return WorkPrecision(levels=tuple(levels), reference=described, floor=_rounding_floor(u0))

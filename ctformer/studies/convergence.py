r"""Convergence studies: refine one variable, measure the error, fit the observed order.

A study solves the same model from the same initial state :math:`u_0(x, y)` on a sequence of
*levels* that refine one variable, the others fixed (design notes, section 7):

* ``refine="tokens"`` or ``"features"``: the levels are the sizes :math:`n` of the token
  (:math:`x`) or feature (:math:`y`) discretization, built as ``get(name, n)``;
* ``refine="hidden"``: the size of the FFN hidden variable :math:`r`;
* ``refine="time"``: the number of steps per layer :math:`k`, :math:`\Delta t = 1/k`.

The names become :class:`~ctformer.studies.TimeRefinement` and
:class:`~ctformer.studies.SpaceRefinement` objects (:mod:`ctformer.studies.refinement`), which
may also be passed as ``refine``.

Every solution :math:`u_h(T)` is brought to a common evaluation grid by
:meth:`ctformer.Grids.evaluate`: along a refined spatial variable, each discretization's
``interpolate`` evaluates its reconstruction at ``fine`` Gauss-Legendre points; along the fixed
variables the values are taken at their quadrature points. The error is the continuous norm
on that grid,

.. math::

    \|u_h - u_{\text{ref}}\|_{L^2} \approx \Big(\sum_{i,j} w_i v_j\,
    |u_h - u_{\text{ref}}|^2(x_i, y_j)\Big)^{1/2}, \qquad
    \|u_h - u_{\text{ref}}\|_{\max} \approx \max_{i,j} |u_h - u_{\text{ref}}|(x_i, y_j),

with the Gauss-Legendre and quadrature weights :math:`w_i, v_j`. The reference is the finest
level, the Richardson extrapolation
:math:`u_f + (u_f - u_c)/((h_c/h_f)^p - 1)` of the two finest levels with the expected order
:math:`p`, or a callable exact solution :math:`u(T, x, y)`.

A study is four steps, one function each: the arguments are checked once into a frozen
:class:`~ctformer.studies.StudySpec` (:mod:`ctformer.studies.spec`), the cases are built with
their identities
(:func:`_build`), run (:func:`ctformer.studies.execution.run_cases`), and measured
(:func:`_measure`).
"""
from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from .. import solvers
from ..backend import to_host
from ..validation import renamed
from .arguments import (DEFAULT_FIXED, check_fine_size, check_resolution, fixed_discretization,
                        level_discretization, resolving_fine)
from .cases import StudyCase, compute_case
from .execution import case_key, finite_or_none, run_cases
from .identity import array_identity, describe, model_identity
from .orders import fit_order, neighbour_orders
from .refinement import VARIABLES, scheme_problem
from .results import ConvergenceResult, Row, limited_order
from .spec import NORMS, StudySpec, smooth_initial_state

__all__ = ["convergence", "smooth_initial_state", "VARIABLES", "NORMS"]


@renamed(norm="error_norm")
def convergence(model, *, refine: str, levels, tokens=None, features=None, head_features=None,
                hidden=None, scheme="lie", steps_per_layer: int = 1, u0: Callable | None = None,
                reference="finest", error_norm: str | None = None, fine: int | None = None, window=None,
                evaluate: str = "interpolate", expected_order=None,
                fit_levels: int | None = None, executor=None, store=None,
                progress: bool = True, context_length=None) -> ConvergenceResult:
    r"""Refine one variable of ``model`` and measure the error and the observed order.

    Parameters
    ----------
    model : ContinuousTransformer
        Anything with ``solve(u0, *, tokens, features, head_features, hidden, scheme,
        steps_per_layer, trajectory)`` returning the layer-boundary states; ``grids(...)`` and
        ``parameters()`` are used when present.
    refine : {"tokens", "features", "hidden", "time"} or Refinement
        The variable to refine: a name, or :class:`TimeRefinement()
        <ctformer.studies.TimeRefinement>` / :class:`SpaceRefinement(variable)
        <ctformer.studies.SpaceRefinement>`.
    levels : sequence of int
        Strictly increasing sizes :math:`n` of the refined variable, or steps per layer for
        ``refine="time"``; at least two (four or more for a meaningful fitted order).
    tokens, features : Discretization, str or tuple, optional
        The token and feature discretizations. The refined one is a name (``"midpoint"``;
        ``"midpoint:16"`` is refused, the sizes are ``levels``) or an object whose name and
        domain are kept; a fixed one is an object, ``"name:n"`` or
        ``(name, n)``. Defaults: ``gauss-legendre``, fixed sizes 16 tokens and 12 features.
    head_features, hidden : Discretization, str or tuple, optional
        Discretizations of the per-head feature and FFN hidden variables; ``None`` leaves the
        model's own rule (for :meth:`ContinuousTransformer.random_smooth` they follow
        ``features``). ``hidden`` is the refined family when ``refine="hidden"``.
    scheme : str or Scheme, optional
        Time integrator (:func:`ctformer.solvers.get`); default ``"lie"``.
    steps_per_layer : int, optional
        Fixed steps per layer when not refining time (with ``refine="time"`` the levels are
        the steps per layer, and a value other than the default 1 is refused).
    u0 : callable, optional
        Initial state :math:`u_0(x, y)`, sampled on every grid; default
        :func:`smooth_initial_state`. An array of shape (tokens, features) is accepted for
        ``refine`` in ``("hidden", "time")`` (the token and feature grids are fixed then); a
        batch of states is refused (one study measures one solution).
    reference : {"finest", "richardson"} or callable, optional
        The finest level (it gets no error), the Richardson extrapolation of the two finest
        levels with the expected order (:math:`2q` for Galerkin elements in the hidden
        variable, the composite Gauss rule's), or the exact :math:`u(T, x, y)` (broadcasting; it
        must return finite values).
    error_norm : {"l2", "max"}, optional
        Continuous :math:`L^2` norm or maximum over the evaluation grid (default ``"l2"``).
    fine : int, optional
        Gauss-Legendre points along a refined token or feature axis. A rule with a piecewise
        reconstruction needs 6 or more per mesh width at every measured level
        (:math:`\mathrm{fine}\, h / L \ge 6`, :math:`L` the window or domain length); by
        default 200, or :math:`\lceil 6 L / h \rceil` for the finest measured level where
        that is more. A smaller ``fine`` given here is used, with a warning. Refused where no
        evaluation points are read: ``refine`` in ``("hidden", "time")``, or
        ``evaluate="coarsest-nodes"``.
    evaluate : {"interpolate", "coarsest-nodes"}, optional
        Where a refined token or feature variable is compared: at ``fine`` Gauss-Legendre
        points through each level's ``interpolate`` (default), or at the quadrature points of
        the coarsest level with its weights (a discrete norm that leaves out the
        reconstruction error; exact comparison when the levels' nodes are nested, e.g.
        midpoint with levels :math:`n, 3n, 9n, \dots`). Only a refined token or feature
        variable is compared this way: with ``refine`` in ``("hidden", "time")`` a value
        other than the default is refused.
    window : tuple of float, optional
        Measure the error only on the subinterval ``(a, b)`` of a refined token or feature
        variable (the ``fine`` points are placed there). For example, causal attention
        normalizes by :math:`\int_0^x`, so quadrature errors near :math:`x = 0` are divided
        by :math:`x`; ``window=(0.25, 1)`` shows the interior order.
    expected_order : float, optional
        Theoretical order for Richardson and the plot; default the refined discretization's
        ``order``, or ``scheme.order(model)`` when refining time: the scheme's order on this
        model, 1 for every scheme on a post-norm model (give it for causal attention, whose
        full-diagonal rule is first order whatever the discretization).
    fit_levels : int, optional
        Fit the observed order over only this many finest asymptotic levels.
    executor : None, concurrent.futures.Executor or dask.distributed.Client, optional
        Where cases run (see :mod:`ctformer.studies.execution`); default: this process.
    store : str or os.PathLike, optional
        Directory where each finished case is written; a re-run reuses a stored case only
        when it is exactly the same computation (:mod:`ctformer.studies.identity`).
    progress : bool, optional
        Show a progress bar.
    context_length : float or tuple of float, optional
        The reference length :math:`L` of positions :math:`p(x) = L x - 1/2`, as for
        :meth:`~ctformer.ContinuousTransformer.solve`; default the model's own
        ``context_length``. A model whose operators read positions (a converted GPT-2, Llama,
        any RoPE or ALiBi network) needs one: ``N`` for a network run on ``N`` tokens, kept
        fixed while the tokens are refined.

    Returns
    -------
    ConvergenceResult
        The table, observed order, and export and plot methods.

    Raises
    ------
    ValueError
        For an unknown ``refine``, ``error_norm``, ``reference`` or discretization name, bad
        ``levels``, an array ``u0`` that is not one (tokens, features) state, an argument
        the study would not read (``fine``, ``evaluate``, ``steps_per_layer``, as above), Richardson
        extrapolation of a spectral (infinite-order) method or of an
        expected order 0 (a periodic rule on data that are not, in the maximum norm), or a
        ``reference`` that returns NaN or inf.
    SizeTooLargeError
        (a ValueError) Before any case runs, for a ``fine`` whose dense interpolation matrix
        (``fine`` points x the largest level's values, 8 bytes each) exceeds the memory budget;
        the message names ``fine`` and the largest that fits.
    TypeError
        For arguments of the wrong type, or a ``store`` with a model or scheme that has no
        stable identity (a lambda, a local function or class, an object that does not
        pickle): a stored case could belong to another computation.
    PermissionError
        Before anything is computed, when the store is not writable or a directory stands
        where a record is to be written (the message names the path).

    FloatingPointError
        When a level's solution is not finite, or so large that its error overflows float64
        (the message names the level).

    Warns
    -----
    InconsistentDepthLimitWarning
        When refining time in a post-norm model with per-feature affine LayerNorm.
    UnderResolvedErrorWarning
        Before anything is computed, when ``fine`` gives a measured level fewer than 6
        evaluation points per mesh width (its error and neighbour order would drift); the
        message names the ``fine`` that suffices.
    """
    spec = StudySpec.checked(
        refine=refine, levels=levels, tokens=tokens, features=features,
        head_features=head_features, hidden=hidden, scheme=scheme, steps_per_layer=steps_per_layer,
        u0=u0, reference=reference, error_norm=error_norm, fine=fine, window=window,
        evaluate=evaluate, expected_order=expected_order, fit_levels=fit_levels,
        context_length=context_length)
    study, keys, summary = _build(model, spec, store)
    start = time.perf_counter()
    records = run_cases(compute_case, study, keys, executor=executor, store=store,
                        progress=progress, description=f"{spec.refinement.variable} study",
                        costs=[spec.refinement.cost(level) for _, level in keys],
                        required=_READ_FIELDS)
    return _measure(study, keys, records, spec, summary, time.perf_counter() - start)


def _build(model, spec: StudySpec, store):
    """The shared case, the keyed levels, and what the result carries (expected order, ...)."""
    refinement, levels = spec.refinement, spec.levels
    fixed, family = {}, refinement.family(spec.specs)
    for var, given in spec.specs.items():
        fixed[var] = None if var == refinement.variable else \
            fixed_discretization(given, var, DEFAULT_FIXED.get(var))
    expected, limitation = spec.expected_order, None
    if expected is None:
        expected = refinement.expected_order(spec.scheme, model, family, levels[0])
        if not refinement.refines_depth:  # the contracts the problem breaks (results.order_limits)
            expected, limitation = limited_order(
                expected, model, refinement.variable, level_discretization(family, levels[0]),
                spec.u0, error_norm=spec.error_norm, evaluate=spec.evaluate, stacklevel=4)
    gauss_points = refinement.gauss_points(family, levels[0])
    extrapolated = _richardson_order(spec, expected, limitation, gauss_points)
    consistent = not (refinement.refines_depth and _warns_inconsistent_depth(model))
    if not consistent:
        solvers.warn_inconsistent_depth("refining time in a post-norm model whose LayerNorm has "
                                        "per-feature affine parameters", stacklevel=4)

    measured = levels[:-1] if spec.reference == "finest" else levels
    fine = spec.fine
    if fine is None:  # enough points for every measured level's error
        fine = resolving_fine(refinement.variable, family, measured, spec.window, spec.evaluate)
    # refused before any case runs, naming fine (not GaussLegendre's n, nor a later matrix)
    check_fine_size(refinement.variable, family, levels[-1], fine, spec.evaluate)
    points, weights = refinement.evaluation_points(family, levels[0], fine, spec.window,
                                                   spec.evaluate)
    # warned before anything is computed: a larger fine is the remedy
    check_resolution(refinement.variable, family, measured, fine, spec.window, spec.evaluate,
                     stacklevel=3)
    study = StudyCase(model, spec.u0, spec.scheme, refinement, family, fixed, spec.steps_per_layer,
                      points, weights, spec.context_length)
    identified = store is not None
    shared = {
        "model": model_identity(model) if identified else None, "refine": refinement.variable,
        "family": None if family is None else _described(family, identified),
        "fixed": {k: None if v is None else _described(v, identified) for k, v in fixed.items()},
        "scheme": repr(spec.scheme),
        # the scheme's full state, not its repr (a parameter its repr leaves out)
        "scheme_state": describe(spec.scheme, "the scheme") if identified else None,
        "steps_per_layer": spec.steps_per_layer, "fine": fine,
        "window": None if spec.window is None else list(spec.window), "evaluate": spec.evaluate,
        "points": None if points is None else array_identity(points),
    }
    if spec.context_length is not None:  # absent otherwise: the keys of earlier studies hold
        shared["context_length"] = describe(spec.context_length, "context_length")
    keys = [(case_key({**shared, "level": n,
                       "u0": study.initial_identity(n) if identified else None}), n)
            for n in levels]
    summary = {"expected": expected, "consistent": consistent, "limitation": limitation,
               "gauss_points": gauss_points, "extrapolated": extrapolated,
               "method": refinement.method(spec.scheme, family),
               "parameters": dict(shared, scheme_order=spec.scheme.order(scheme_problem(model)))}
    return study, keys, summary


def _richardson_order(spec, expected, limitation, gauss_points):
    """The order Richardson extrapolates with (None without Richardson): the expected one, or
    the composite Gauss rule's 2q of Galerkin elements refined in the hidden variable, the
    order their errors fall with (with the element order 2 the reference of P1 was off by
    1e-11 and the fit read 4.90 instead of 6); refused where no finite order > 0 exists."""
    if spec.reference != "richardson":
        return None
    if gauss_points and spec.expected_order is None and not limitation:
        return 2.0 * gauss_points
    if math.isinf(expected):
        raise ValueError("reference='richardson' needs a finite expected order; the refined "
                         "method is spectral, use reference='finest' or pass expected_order")
    if not expected > 0:  # (h_c/h_f)^0 - 1 divides by 0
        raise ValueError(f"reference='richardson' needs an expected order > 0, and this study "
                         f"expects {expected:g}" + (f" ({limitation})" if limitation else "")
                         + "; an error that does not fall cannot be extrapolated: use "
                         "reference='finest' or an exact reference")
    return expected


#: The record fields :func:`_measure` reads: a stored record without them (consistent in
#: itself, checksum included) is reported and recomputed, not read.
_READ_FIELDS = {"values": "array", "seconds": "number", "min_feature_std": "number"}


def _described(obj, identified: bool):
    """:func:`describe` of ``obj``; without a store (nothing needs an identity) its ``repr``
    where it has no stable description (a local class, a lambda)."""
    try:
        return describe(obj)
    except TypeError:
        if identified:
            raise
        return repr(obj)


def _warns_inconsistent_depth(model) -> bool:
    model = scheme_problem(model)
    return model is not None and model.warns_inconsistent_depth


def _reference(spec, summary, values, h, x, y):
    """The reference values, the index of the level that is the reference (or None), its name."""
    reference = spec.reference
    if callable(reference):
        ref = to_host(reference(x[:, None], y[None, :]), np.float64)
        if not np.all(np.isfinite(ref)):
            raise ValueError("reference(x, y) returned NaN or inf; it must be the exact solution "
                             "u(T, x, y), finite on the evaluation grid")
        return np.broadcast_to(ref, values[-1].shape), None, "exact"
    if reference == "richardson":
        ratio = (h[-2] / h[-1]) ** summary["extrapolated"]
        return values[-1] + (values[-1] - values[-2]) / (ratio - 1.0), None, "richardson"
    return values[-1], len(values) - 1, "finest"


def _measure(study, keys, records, spec, summary, wall) -> ConvergenceResult:
    """Errors against the reference, neighbour and fitted orders, the result table."""
    levels = [n for _, n in keys]
    values = [np.asarray(records[key]["values"], dtype=np.float64) for key, _ in keys]
    grids = study.grids(levels[-1])
    (x, w_x), (y, w_y) = study.evaluation_axes(grids)
    h = [study.h(n) for n in levels]
    ref, skip, reference_name = _reference(spec, summary, values, h, x, y)

    def measure(diff):
        if spec.error_norm == "max":
            return float(np.max(np.abs(diff)))
        return float(np.sqrt(np.einsum("...ij,i,j->", diff ** 2, w_x, w_y)))

    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is named below, by level
        errors = [None if i == skip else measure(v - ref) for i, v in enumerate(values)]
        # float64's 1e-12, or 100 units of roundoff of a lower precision (float32 errors
        # stall near 5e-6 = 44 eps after 256 rk4 steps, and the fit read their plateau)
        eps = max(float(records[key].get("eps", np.finfo(np.float64).eps)) for key, _ in keys)
        floor = max(1e-12, 100.0 * eps) * max(1.0, measure(ref))
    _refuse_overflow(errors, levels, values, spec.refinement.variable)
    orders = neighbour_orders(h, errors)
    table = [Row(level=i, n=n, h=float(h[i]), error=finite_or_none(errors[i]),
                 order=finite_or_none(orders[i]), seconds=float(records[key]["seconds"]))
             for i, (key, n) in enumerate(keys)]
    return ConvergenceResult(
        table=table, observed_order=fit_order(h, errors, floor, spec.fit_levels),
        expected_order=summary["expected"], refine=spec.refinement.variable,
        method=summary["method"], reference=reference_name, norm=spec.error_norm,
        min_feature_std=min(float(records[key]["min_feature_std"]) for key, _ in keys),
        wall_seconds=wall, parameters=summary["parameters"],
        consistent_limit=summary["consistent"], gauss_points=summary["gauss_points"],
        limitation=summary["limitation"], floor=floor, rounding=eps)


def _refuse_overflow(errors, levels, values, variable):
    """Refuse a level whose error overflowed: its values are finite (a NaN or inf solution
    is refused where it is computed) but too large to square in float64."""
    bad = [i for i, e in enumerate(errors) if e is not None and not math.isfinite(e)]
    if bad:
        sizes = ", ".join(f"{levels[i]} (max |u| = {np.max(np.abs(values[i])):.3g})" for i in bad)
        raise FloatingPointError(
            f"the error at {variable} level(s) {sizes} overflows float64: the solution there "
            "is finite but has blown up, so no order can be measured; take more steps per "
            "layer or finer levels, or check that the model stays bounded")

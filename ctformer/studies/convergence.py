r"""Convergence studies: refine one variable, measure the error, fit the observed order.

A study solves the same model from the same initial state :math:`u_0(x, y)` on a sequence of
*levels* that refine one variable, the others fixed (design notes, section 7):

* ``refine="tokens"`` or ``"features"``: the levels are the sizes :math:`n` of the token
  (:math:`x`) or feature (:math:`y`) discretization, built as ``get(name, n)``;
* ``refine="hidden"``: the size of the FFN hidden variable :math:`r`;
* ``refine="time"``: the number of steps per layer :math:`k`, :math:`\Delta t = 1/k`.

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

A study is four steps, one function each: the arguments are checked
(:mod:`ctformer.studies.arguments`), the cases are built with their identities
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
from ..model_inputs import renamed_keyword
from .arguments import (DEFAULT_FIXED, check_levels, check_positive_int, check_window,
                        evaluation_points, fixed_discretization, level_discretization,
                        refined_family)
from .cases import VARIABLES, StudyCase, compute_case
from .execution import case_key, finite_or_none, run_cases
from .identity import array_identity, describe, model_identity
from .results import ConvergenceResult, Row, fit_order, neighbour_orders

__all__ = ["convergence", "smooth_initial_state", "VARIABLES"]

NORMS = ("l2", "max")


def smooth_initial_state(x, y):
    r"""The default initial state of studies (design notes, section 1).

    .. math::  u_0(x, y) = \cos\big(4 y + 1.5 \sin(\pi x + 0.5)\big) + 0.3 \sin(\pi x y).

    Its feature variance is bounded below uniformly in :math:`x`, so LayerNorm stays smooth.
    """
    return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def _disc_spec(d):
    return None if d is None else describe(d)


def _scheme_label(scheme) -> str:
    substep = getattr(scheme, "substep", None)
    return scheme.name if substep is None else f"{scheme.name} ({substep})"


def convergence(model, *, refine: str, levels, tokens=None, features=None, head_features=None,
                hidden=None, scheme="lie", steps_per_layer: int = 1, u0: Callable | None = None,
                reference="finest", error_norm: str | None = None, fine: int = 200, window=None,
                evaluate: str = "interpolate", expected_order=None,
                fit_levels: int | None = None, executor=None, store=None,
                progress: bool = True, norm: str | None = None) -> ConvergenceResult:
    r"""Refine one variable of ``model`` and measure the error and the observed order.

    Parameters
    ----------
    model : ContinuousTransformer
        Anything with ``solve(u0, *, tokens, features, head_features, hidden, scheme,
        steps_per_layer, trajectory)`` returning the layer-boundary states; ``grids(...)`` and
        ``parameters()`` are used when present.
    refine : {"tokens", "features", "hidden", "time"}
        The variable to refine.
    levels : sequence of int
        Strictly increasing sizes :math:`n` of the refined variable, or steps per layer for
        ``refine="time"``; at least two (four or more for a meaningful fitted order).
    tokens, features : Discretization, str or tuple, optional
        The token and feature discretizations. The refined one is a name (``"midpoint"``) or
        an object whose name and domain are kept; a fixed one is an object, ``"name:n"`` or
        ``(name, n)``. Defaults: ``gauss-legendre``, fixed sizes 16 tokens and 12 features.
    head_features, hidden : Discretization, str or tuple, optional
        Discretizations of the per-head feature and FFN hidden variables; ``None`` leaves the
        model's own rule (for :meth:`ContinuousTransformer.random_smooth` they follow
        ``features``). ``hidden`` is the refined family when ``refine="hidden"``.
    scheme : str or Scheme, optional
        Time integrator (:func:`ctformer.solvers.get`); default ``"lie"``.
    steps_per_layer : int, optional
        Fixed steps per layer when not refining time.
    u0 : callable, optional
        Initial state :math:`u_0(x, y)`, sampled on every grid; default
        :func:`smooth_initial_state`. An array is accepted for ``refine`` in
        ``("hidden", "time")`` (the token and feature grids are fixed then).
    reference : {"finest", "richardson"} or callable, optional
        The finest level (it gets no error), the Richardson extrapolation of the two finest
        levels with the expected order, or the exact :math:`u(T, x, y)` (broadcasting; it
        must return finite values).
    error_norm : {"l2", "max"}, optional
        Continuous :math:`L^2` norm or maximum over the evaluation grid (default ``"l2"``;
        ``norm`` is a deprecated name).
    fine : int, optional
        Gauss-Legendre points along a refined token or feature axis (default 200).
    evaluate : {"interpolate", "coarsest-nodes"}, optional
        Where a refined token or feature variable is compared: at ``fine`` Gauss-Legendre
        points through each level's ``interpolate`` (default), or at the quadrature points of
        the coarsest level with its weights (a discrete norm that leaves out the
        reconstruction error; exact comparison when the levels' nodes are nested, e.g.
        midpoint with levels :math:`n, 3n, 9n, \dots`).
    window : tuple of float, optional
        Measure the error only on the subinterval ``(a, b)`` of a refined token or feature
        variable (the ``fine`` points are placed there). For example, causal attention
        normalizes by :math:`\int_0^x`, so quadrature errors near :math:`x = 0` are divided
        by :math:`x`; ``window=(0.25, 1)`` shows the interior order.
    expected_order : float, optional
        Theoretical order for Richardson and the plot; default the discretization's or
        scheme's ``order`` (give it for causal attention, whose full-diagonal rule is first
        order whatever the discretization).
    fit_levels : int, optional
        Fit the observed order over only this many finest asymptotic levels.
    executor : None, concurrent.futures.Executor or dask.distributed.Client, optional
        Where cases run (see :mod:`ctformer.studies.execution`); default: this process.
    store : str or os.PathLike, optional
        Directory where each finished case is written; a re-run reuses a stored case only
        when it is exactly the same computation (:mod:`ctformer.studies.identity`).
    progress : bool, optional
        Show a progress bar.

    Returns
    -------
    ConvergenceResult
        The table, observed order, and export and plot methods.

    Raises
    ------
    ValueError
        For an unknown ``refine``, ``error_norm``, ``reference`` or discretization name, bad
        ``levels``, Richardson extrapolation of a spectral (infinite-order) method, or a
        ``reference`` that returns NaN or inf.
    TypeError
        For arguments of the wrong type, or a ``store`` with a model or scheme that has no
        stable identity (a lambda, a local function or class, an object that does not
        pickle): a stored case could belong to another computation.
    PermissionError
        Before anything is computed, when the store is not writable or a directory stands
        where a record is to be written (the message names the path).

    Warns
    -----
    InconsistentDepthLimitWarning
        When refining time in a post-norm model with per-feature affine LayerNorm.
    """
    error_norm = renamed_keyword("norm", norm, "error_norm", error_norm, where="convergence")
    study, keys, expected, options = _build(
        model, refine=refine, levels=levels, tokens=tokens, features=features,
        head_features=head_features, hidden=hidden, scheme=scheme, steps_per_layer=steps_per_layer,
        u0=u0, reference=reference, error_norm="l2" if error_norm is None else error_norm,
        fine=fine, window=window, evaluate=evaluate, expected_order=expected_order,
        fit_levels=fit_levels, store=store)
    start = time.perf_counter()
    records = run_cases(compute_case, study, keys, executor=executor, store=store,
                        progress=progress, description=f"{refine} study")
    return _measure(study, keys, records, expected, options, time.perf_counter() - start)


def _build(model, *, refine, levels, tokens, features, head_features, hidden, scheme,
           steps_per_layer, u0, reference, error_norm, fine, window, evaluate, expected_order,
           fit_levels, store):
    """Check the arguments; return the shared case, the keyed levels and the options."""
    if refine not in VARIABLES:
        raise ValueError(f"refine must be one of {', '.join(VARIABLES)}, got {refine!r}")
    levels = check_levels(levels)
    if error_norm not in NORMS:
        raise ValueError(f"error_norm must be 'l2' or 'max', got {error_norm!r}")
    if not (callable(reference) or reference in ("finest", "richardson")):
        raise ValueError(f"reference must be 'finest', 'richardson' or a callable u(x, y), got {reference!r}")
    fine = check_positive_int(fine, "fine", minimum=2)
    steps_per_layer = check_positive_int(steps_per_layer, "steps_per_layer")
    if fit_levels is not None:
        fit_levels = check_positive_int(fit_levels, "fit_levels", minimum=2)
    scheme = solvers.get(scheme)
    window = check_window(window, refine)
    if evaluate not in ("interpolate", "coarsest-nodes"):
        raise ValueError(f"evaluate must be 'interpolate' or 'coarsest-nodes', got {evaluate!r}")
    u0 = smooth_initial_state if u0 is None else u0
    if not callable(u0) and refine in ("tokens", "features"):
        raise ValueError("u0 must be a callable u0(x, y) when refining tokens or features "
                         "(it is sampled on every grid)")

    fixed, family = {}, None
    for var, spec in (("tokens", tokens), ("features", features),
                      ("head_features", head_features), ("hidden", hidden)):
        if var == refine:
            family, fixed[var] = refined_family(spec, var), None
        else:
            fixed[var] = fixed_discretization(spec, var, DEFAULT_FIXED.get(var))
    if expected_order is not None:
        expected = float(expected_order)
    else:
        expected = float(scheme.order) if refine == "time" else \
            float(level_discretization(family, levels[0]).order)
    if reference == "richardson" and math.isinf(expected):
        raise ValueError("reference='richardson' needs a finite expected order; the refined "
                         "method is spectral, use reference='finest' or pass expected_order")
    consistent = not (refine == "time" and getattr(model, "warns_inconsistent_depth", False))
    if not consistent:
        solvers.warn_inconsistent_depth("refining time in a post-norm model whose LayerNorm has "
                                        "per-feature affine parameters", stacklevel=4)

    points, weights = evaluation_points(refine, family, levels[0], fine, window, evaluate)
    study = StudyCase(model, u0, scheme, refine, family, fixed, steps_per_layer, points, weights)
    shared = {
        "model": model_identity(model) if store is not None else None, "refine": refine,
        "family": None if family is None else describe(family),
        "fixed": {k: _disc_spec(v) for k, v in fixed.items()}, "scheme": repr(scheme),
        # the scheme's full state, not its repr (a parameter its repr leaves out)
        "scheme_state": describe(scheme, "the scheme") if store is not None else None,
        "steps_per_layer": steps_per_layer, "fine": fine,
        "window": None if window is None else list(window), "evaluate": evaluate,
        "points": None if points is None else array_identity(points),
    }
    keys = [(case_key({**shared, "level": n,
                       "u0": study.initial_identity(n) if store is not None else None}), n)
            for n in levels]
    options = {"reference": reference, "error_norm": error_norm, "fit_levels": fit_levels,
               "consistent": consistent, "parameters": shared}
    return study, keys, expected, options


def _measure(study, keys, records, expected, options, wall) -> ConvergenceResult:
    """Errors against the reference, neighbour and fitted orders, the result table."""
    levels = [n for _, n in keys]
    values = [np.asarray(records[key]["values"], dtype=np.float64) for key, _ in keys]
    grids = study.grids(levels[-1])
    (x, w_x), (y, w_y) = study.evaluation_axes(grids)
    h = [1.0 / n for n in levels] if study.refine == "time" else \
        [study.discretizations(n)[study.refine].h for n in levels]

    reference = options["reference"]
    if callable(reference):
        ref = to_host(reference(x[:, None], y[None, :]), np.float64)
        if not np.all(np.isfinite(ref)):
            raise ValueError("reference(x, y) returned NaN or inf; it must be the exact solution "
                             "u(T, x, y), finite on the evaluation grid")
        ref, skip, reference_name = np.broadcast_to(ref, values[-1].shape), None, "exact"
    elif reference == "richardson":
        ratio = (h[-2] / h[-1]) ** expected
        ref, skip, reference_name = values[-1] + (values[-1] - values[-2]) / (ratio - 1.0), None, "richardson"
    else:
        ref, skip, reference_name = values[-1], len(levels) - 1, "finest"

    def measure(diff):
        if options["error_norm"] == "max":
            return float(np.max(np.abs(diff)))
        return float(np.sqrt(np.einsum("...ij,i,j->", diff ** 2, w_x, w_y)))

    errors = [None if i == skip else measure(v - ref) for i, v in enumerate(values)]
    orders = neighbour_orders(h, errors)
    table = [Row(level=i, n=n, h=float(h[i]), error=finite_or_none(errors[i]),
                 order=finite_or_none(orders[i]), seconds=float(records[key]["seconds"]))
             for i, (key, n) in enumerate(keys)]
    if study.refine == "time":
        method = _scheme_label(study.scheme)
    else:
        method = study.family[0] if isinstance(study.family, tuple) else study.family.label
    parameters = dict(options["parameters"], scheme_order=float(study.scheme.order))
    floor = 1e-12 * max(1.0, measure(ref))
    return ConvergenceResult(
        table=table, observed_order=fit_order(h, errors, floor, options["fit_levels"]),
        expected_order=expected, refine=study.refine, method=method, reference=reference_name,
        norm=options["error_norm"],
        min_feature_std=min(float(records[key]["min_feature_std"]) for key, _ in keys),
        wall_seconds=wall, parameters=parameters, consistent_limit=options["consistent"])

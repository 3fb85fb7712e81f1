r"""Convergence studies: refine one variable, measure the error, fit the observed order.

A study solves the same model from the same initial state :math:`u_0(x, y)` on a sequence of
*levels* that refine one variable, the others fixed (DESIGN.md section 7):

* ``refine="tokens"`` or ``"features"``: the levels are the sizes :math:`n` of the token
  (:math:`x`) or feature (:math:`y`) discretization, built as ``get(name, n)``;
* ``refine="hidden"``: the size of the FFN hidden variable :math:`r`;
* ``refine="time"``: the number of steps per layer :math:`k`, :math:`\Delta t = 1/k`.

Every solution :math:`u_h(T)` is brought to a common evaluation grid: along a refined spatial
variable, each discretization's ``interpolate`` evaluates its reconstruction at ``fine``
Gauss-Legendre points; along the fixed variables the values are taken at their quadrature
points (``to_quadrature``). The error is the continuous norm on that grid,

.. math::

    \|u_h - u_{\text{ref}}\|_{L^2} \approx \Big(\sum_{i,j} w_i v_j\,
    |u_h - u_{\text{ref}}|^2(x_i, y_j)\Big)^{1/2}, \qquad
    \|u_h - u_{\text{ref}}\|_{\max} \approx \max_{i,j} |u_h - u_{\text{ref}}|(x_i, y_j),

with the Gauss-Legendre and quadrature weights :math:`w_i, v_j`. The reference is the finest
level, the Richardson extrapolation
:math:`u_f + (u_f - u_c)/((h_c/h_f)^p - 1)` of the two finest levels with the expected order
:math:`p`, or a callable exact solution :math:`u(T, x, y)`.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import Callable

import numpy as np

from ..discretizations import Discretization, GaussLegendre, available, get
from .. import solvers
from .cases import (AXIS, StudyCase, compute_case, depth_warning_category, initial_fingerprint,
                    model_fingerprint, to_host)
from .execution import case_key, finite_or_none, run_cases
from .results import ConvergenceResult, Row, fit_order, neighbour_orders

__all__ = ["convergence", "smooth_initial_state", "VARIABLES"]

VARIABLES = ("tokens", "features", "hidden", "time")
DEFAULT_FIXED = {"tokens": ("gauss-legendre", 16), "features": ("gauss-legendre", 12)}
DEFAULT_REFINED = "gauss-legendre"


def smooth_initial_state(x, y):
    r"""The default initial state of studies (DESIGN.md section 1).

    .. math::  u_0(x, y) = \cos\big(4 y + 1.5 \sin(\pi x + 0.5)\big) + 0.3 \sin(\pi x y).

    Its feature variance is bounded below uniformly in :math:`x`, so LayerNorm stays smooth.
    """
    return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def _fixed(spec, argname: str, default):
    """A fixed discretization from an object, ``"name:n"``, ``(name, n)`` or ``None``."""
    if spec is None:
        return None if default is None else get(*default)
    if isinstance(spec, Discretization):
        return spec
    if isinstance(spec, str):
        name, sep, n = spec.partition(":")
        if not sep:
            raise ValueError(f"{argname}={spec!r} is not refined, so it needs a size: "
                             f"write '{spec}:N' or pass a Discretization")
        try:
            size = int(n)
        except ValueError:
            raise ValueError(f"{argname}={spec!r}: the size after ':' must be an integer") from None
        return get(name.strip(), size)
    if isinstance(spec, tuple) and len(spec) == 2:
        return get(spec[0], spec[1])
    raise TypeError(f"{argname} must be a Discretization, 'name:n', (name, n) or None, "
                    f"got {type(spec).__name__}")


def _refined(spec, argname: str):
    """The (name, domain) of a refined variable's discretization family."""
    if spec is None:
        spec = DEFAULT_REFINED
    if isinstance(spec, Discretization):
        return spec.name, spec.domain
    if isinstance(spec, str):
        name = spec.partition(":")[0].strip()
        if name not in available():
            raise ValueError(f"unknown discretization {name!r} for {argname}; "
                             f"known: {', '.join(available())}")
        return name, (0.0, 1.0)
    raise TypeError(f"{argname} is refined, so it must be a discretization name or object, "
                    f"got {type(spec).__name__}")


def _levels(levels) -> list[int]:
    try:
        values = list(levels)
    except TypeError:
        raise TypeError(f"levels must be a sequence of positive integers, got {levels!r}") from None
    if len(values) < 2:
        raise ValueError(f"levels needs at least two values, got {values!r}")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"levels must be positive integers, got {values!r}")
    values = [int(v) for v in values]
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"levels must be strictly increasing, got {values!r}")
    return values


def _window(window, refine):
    if window is None:
        return None
    if refine not in AXIS:
        raise ValueError(f"window applies when refining tokens or features, not {refine!r}")
    try:
        a, b = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair (a, b) of numbers, got {window!r}") from None
    if not (math.isfinite(a) and math.isfinite(b) and a < b):
        raise ValueError(f"window must be a finite interval (a, b) with a < b, got {window!r}")
    return (a, b)


def _evaluation_points(refine, family, coarsest, fine, window, evaluate):
    """Points and weights along the refined token or feature axis (None otherwise)."""
    if refine not in AXIS:
        return None, None
    name, domain = family
    if window is not None and not (domain[0] <= window[0] and window[1] <= domain[1]):
        raise ValueError(f"window {window} must lie in the domain {domain} of {refine}")
    if evaluate == "interpolate":
        rule = GaussLegendre(fine, domain=domain if window is None else window)
        return rule.nodes, rule.weights
    rule = get(name, coarsest, domain=domain)
    nodes = np.asarray(rule.quadrature_nodes)
    weights = np.asarray(rule.quadrature_weights)
    if window is not None:
        keep = (nodes >= window[0]) & (nodes <= window[1])
        if not keep.any():
            raise ValueError(f"no node of the coarsest level lies in window {window}")
        nodes, weights = nodes[keep], weights[keep]
    return nodes, weights


def _disc_spec(d: Discretization | None):
    return None if d is None else [d.name, d.n, list(d.domain)]


def _expected_order(refine, family, scheme, expected_order, first_level):
    if expected_order is not None:
        return float(expected_order)
    if refine == "time":
        return float(scheme.order)
    return float(get(family[0], first_level, domain=family[1]).order)


def _scheme_label(scheme) -> str:
    substep = getattr(scheme, "substep", None)
    return scheme.name if substep is None else f"{scheme.name} ({substep})"


def _depth_warning(model):
    if not getattr(model, "warns_inconsistent_depth", False):
        return
    category = depth_warning_category()
    warnings.warn("refining time in a post-norm model whose LayerNorm has per-feature affine "
                  "parameters: the scheme has no consistent continuous-depth limit (DESIGN.md "
                  "section 1), so the observed order is meaningless", category, stacklevel=3)


def convergence(model, *, refine: str, levels, tokens=None, features=None, head_features=None,
                hidden=None, scheme="lie", steps_per_layer: int = 1, u0: Callable | None = None,
                reference="finest", norm: str = "l2", fine: int = 200, window=None,
                evaluate: str = "interpolate", expected_order=None,
                fit_levels: int | None = None, executor=None, store=None,
                progress: bool = True) -> ConvergenceResult:
    r"""Refine one variable of ``model`` and measure the error and the observed order.

    Parameters
    ----------
    model : ContinuousTransformer
        Anything with ``solve(u0, *, tokens, features, head_features, hidden, scheme,
        steps_per_layer, trajectory)`` returning the layer-boundary states.
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
        levels with the expected order, or the exact :math:`u(T, x, y)` (broadcasting).
    norm : {"l2", "max"}, optional
        Continuous :math:`L^2` norm or maximum over the evaluation grid.
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
        Directory where each finished case is written; a re-run skips stored cases.
    progress : bool, optional
        Show a progress bar.

    Returns
    -------
    ConvergenceResult
        The table, observed order, and export and plot methods.

    Raises
    ------
    ValueError
        For an unknown ``refine``, ``norm``, ``reference`` or discretization name, bad
        ``levels``, or Richardson extrapolation of a spectral (infinite-order) method.
    TypeError
        For arguments of the wrong type.

    Warns
    -----
    InconsistentDepthLimitWarning
        When refining time in a post-norm model with per-feature affine LayerNorm.
    """
    if refine not in VARIABLES:
        raise ValueError(f"refine must be one of {', '.join(VARIABLES)}, got {refine!r}")
    levels = _levels(levels)
    if norm not in ("l2", "max"):
        raise ValueError(f"norm must be 'l2' or 'max', got {norm!r}")
    if not (callable(reference) or reference in ("finest", "richardson")):
        raise ValueError(f"reference must be 'finest', 'richardson' or a callable u(x, y), got {reference!r}")
    if isinstance(fine, bool) or not isinstance(fine, (int, np.integer)) or fine < 2:
        raise ValueError(f"fine must be an integer >= 2, got {fine!r}")
    if isinstance(steps_per_layer, bool) or not isinstance(steps_per_layer, (int, np.integer)) \
            or steps_per_layer < 1:
        raise ValueError(f"steps_per_layer must be a positive integer, got {steps_per_layer!r}")
    if fit_levels is not None and (not isinstance(fit_levels, int) or fit_levels < 2):
        raise ValueError(f"fit_levels must be an integer >= 2, got {fit_levels!r}")
    scheme = solvers.get(scheme)
    window = _window(window, refine)
    if evaluate not in ("interpolate", "coarsest-nodes"):
        raise ValueError(f"evaluate must be 'interpolate' or 'coarsest-nodes', got {evaluate!r}")
    if u0 is None:
        u0 = smooth_initial_state
    if not callable(u0) and refine in ("tokens", "features"):
        raise ValueError("u0 must be a callable u0(x, y) when refining tokens or features "
                         "(it is sampled on every grid)")

    fixed, family = {}, None
    for var, spec in (("tokens", tokens), ("features", features),
                      ("head_features", head_features), ("hidden", hidden)):
        if var == refine:
            family = _refined(spec, var)
            fixed[var] = None
        else:
            fixed[var] = _fixed(spec, var, DEFAULT_FIXED.get(var))
    p = _expected_order(refine, family, scheme, expected_order, levels[0])
    if reference == "richardson" and math.isinf(p):
        raise ValueError("reference='richardson' needs a finite expected order; the refined "
                         "method is spectral, use reference='finest' or pass expected_order")
    if refine == "time":
        _depth_warning(model)

    points, point_weights = _evaluation_points(refine, family, levels[0], fine, window, evaluate)
    study = StudyCase(model, u0, scheme, refine, family, fixed, int(steps_per_layer), points,
                   point_weights)
    parameters = {
        "model": model_fingerprint(model), "u0": initial_fingerprint(u0), "refine": refine,
        "family": None if family is None else [family[0], list(family[1])],
        "fixed": {k: _disc_spec(v) for k, v in fixed.items()}, "scheme": repr(scheme),
        "steps_per_layer": int(steps_per_layer), "fine": int(fine),
        "window": None if window is None else list(window), "evaluate": evaluate,
    }
    cases = [(case_key({**parameters, "level": n}), n) for n in levels]
    start = time.perf_counter()
    records = run_cases(compute_case, study, cases, executor=executor, store=store,
                        progress=progress, description=f"{refine} study")
    wall = time.perf_counter() - start
    values = [np.asarray(records[key]["values"], dtype=np.float64) for key, _ in cases]

    grids = [study.grids(n)[0] for n in levels]
    points, weights = zip(*(study.evaluation_axes(grids[-1])[v] for v in ("tokens", "features")))
    if refine == "time":
        h = [1.0 / n for n in levels]
    else:
        h = [g[refine].h for g in grids]

    if callable(reference):
        ref = to_host(reference(points[0][:, None], points[1][None, :]))
        ref = np.broadcast_to(ref, values[-1].shape)
        skip, reference_name = None, "exact"
    elif reference == "richardson":
        ratio = (h[-2] / h[-1]) ** p
        ref = values[-1] + (values[-1] - values[-2]) / (ratio - 1.0)
        skip, reference_name = None, "richardson"
    else:
        ref, skip, reference_name = values[-1], len(levels) - 1, "finest"

    def measure(diff):
        if norm == "max":
            return float(np.max(np.abs(diff)))
        return float(np.sqrt(np.einsum("...ij,i,j->", diff ** 2, weights[0], weights[1])))

    errors = [None if i == skip else measure(v - ref) for i, v in enumerate(values)]
    orders = neighbour_orders(h, errors)
    floor = 1e-12 * max(1.0, measure(ref))
    table = [Row(level=i, n=n, h=float(h[i]), error=finite_or_none(errors[i]),
                 order=finite_or_none(orders[i]), seconds=float(records[key]["seconds"]))
             for i, (key, n) in enumerate(cases)]
    method = _scheme_label(scheme) if refine == "time" else family[0]
    parameters["scheme_order"] = float(scheme.order)
    return ConvergenceResult(
        table=table, observed_order=fit_order(h, errors, floor, fit_levels), expected_order=p,
        refine=refine, method=method, reference=reference_name, norm=norm,
        min_feature_std=min(float(records[key]["min_feature_std"]) for key, _ in cases),
        wall_seconds=wall, parameters=parameters)

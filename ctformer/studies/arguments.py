r"""Arguments of a convergence study: checked once, where they enter.

Each helper turns one user argument into what the study needs or raises a clear
:class:`ValueError` / :class:`TypeError` naming the argument and what was expected.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..discretizations import Discretization, GaussLegendre, available, get
from ..discretizations.memory import check_allocation, memory_budget, surely_within
from ..discretizations.product import at_size
from ..state import AXES
from ..validation import is_integer

__all__ = ["fixed_discretization", "refined_family", "check_levels", "check_window",
           "evaluation_points", "level_discretization", "DEFAULT_FIXED", "DEFAULT_REFINED",
           "check_resolution", "resolving_fine", "UnderResolvedErrorWarning",
           "MIN_POINTS_PER_WIDTH", "DEFAULT_FINE", "check_fine_size"]

DEFAULT_FIXED = {"tokens": ("gauss-legendre", 16), "features": ("gauss-legendre", 12)}
DEFAULT_REFINED = "gauss-legendre"

#: Evaluation points per mesh width a measured level needs (``fine * h / length``): below it
#: the error of a piecewise reconstruction is sampled too coarsely. Measured on two-layer
#: models against ``fine = 4000``: at 1.6 points the neighbour orders of midpoint, trapezoid,
#: P1 and P2 tokens are off by 0.2 to 0.5, at 3 by 0.03 (P1: 0.2 to 0.4), at 6 by 0.02
#: (P1: 0.06 to 0.08), at 12 by 0.015 or less.
MIN_POINTS_PER_WIDTH = 6


class UnderResolvedErrorWarning(UserWarning):
    """The evaluation grid of a study has too few points per mesh width at some measured level
    to resolve its error (:data:`MIN_POINTS_PER_WIDTH`); pass a larger ``fine``."""


def fixed_discretization(spec, argname: str, default):
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


def _is_composite(family) -> bool:
    """A family given by an object that refines itself (a product, atoms): not (name, domain)."""
    return isinstance(family, Discretization)


def level_discretization(family, n: int):
    """The discretization of ``family`` at size ``n`` (per axis for a product)."""
    if _is_composite(family):
        return at_size(family, n)
    name, domain = family
    return get(name, n, domain=domain)


def refined_family(spec, argname: str):
    """The (name, domain) of a refined variable's discretization family.

    A product or a discretization with atoms is kept as the object itself: its levels are
    ``spec.at(n)`` (``n`` values per axis of a product; the atoms are kept).
    """
    if spec is None:
        spec = DEFAULT_REFINED
    if isinstance(spec, Discretization) and hasattr(spec, "at"):
        return spec
    if isinstance(spec, Discretization):
        return spec.name, spec.domain
    if isinstance(spec, str):
        name, sep, _ = spec.partition(":")
        name = name.strip()
        if sep:  # the size was dropped silently: the levels are the sizes
            raise ValueError(f"{argname}={spec!r} is refined, so its sizes are the levels: give "
                             f"the name only ({name!r}), or refine another variable")
        if name not in available():
            raise ValueError(f"unknown discretization {name!r} for {argname}; "
                             f"known: {', '.join(available())}")
        return name, (0.0, 1.0)
    raise TypeError(f"{argname} is refined, so it must be a discretization name or object, "
                    f"got {type(spec).__name__}")


def check_levels(levels) -> list[int]:
    """At least two strictly increasing positive integers."""
    try:
        values = list(levels)
    except TypeError:
        raise TypeError(f"levels must be a sequence of positive integers, got {levels!r}") from None
    if len(values) < 2:
        raise ValueError(f"levels needs at least two values, got {values!r}")
    if not all(is_integer(v) and v >= 1 for v in values):
        raise ValueError(f"levels must be positive integers, got {values!r}")
    values = [int(v) for v in values]
    if any(b <= a for a, b in zip(values, values[1:])):
        raise ValueError(f"levels must be strictly increasing, got {values!r}")
    return values


def check_window(window, refine):
    """A finite interval ``(a, b)``, ``a < b``, for a refined token or feature axis, or None."""
    if window is None:
        return None
    if refine not in AXES:
        raise ValueError(f"window applies when refining tokens or features, not {refine!r}")
    try:
        a, b = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair (a, b) of numbers, got {window!r}") from None
    if not (math.isfinite(a) and math.isfinite(b) and a < b):
        raise ValueError(f"window must be a finite interval (a, b) with a < b, got {window!r}")
    return (a, b)


def evaluation_points(refine, family, coarsest, fine, window, evaluate):
    """Points and weights along the refined token or feature axis (None otherwise)."""
    if refine not in AXES:
        return None, None
    if _is_composite(family):
        return _composite_points(family, coarsest, fine, window, evaluate)
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




def _composite_points(family, coarsest, fine, window, evaluate):
    """Evaluation points of a product (a Gauss-Legendre grid) and of atoms (themselves first)."""
    if window is not None or evaluate != "interpolate":
        raise ValueError(f"window and evaluate='coarsest-nodes' apply to interval discretizations, "
                         f"not to {family!r}")
    atoms = family.atoms
    base = family.base if atoms else family
    if base.dimension == 2:
        per_axis = max(2, int(round(math.sqrt(fine))))
        (d1, d2) = base.domain
        g1, g2 = GaussLegendre(per_axis, domain=d1), GaussLegendre(per_axis, domain=d2)
        x1, x2 = np.meshgrid(g1.nodes, g2.nodes, indexing="ij")
        points = np.stack([x1.ravel(), x2.ravel()], axis=-1)
        weights = np.outer(g1.weights, g2.weights).ravel()
    else:
        rule = GaussLegendre(fine, domain=base.domain)
        points, weights = rule.nodes, rule.weights
    # atoms are compared as themselves, each with weight 1 in the error norm
    return points, np.concatenate([np.ones(atoms), weights])


def _evaluation_count(family, largest: int, fine: int):
    """(evaluation points, values of the ``largest`` level) along a refined axis, unallocated."""
    if not _is_composite(family):
        return fine, largest
    base = family.base if family.atoms else family
    points = max(2, int(round(math.sqrt(fine)))) ** 2 if base.dimension == 2 else fine
    return points + family.atoms, at_size(family, largest).n


def check_fine_size(variable, family, largest: int, fine: int, evaluate) -> None:
    r"""Refuse a ``fine`` whose interpolation matrix would exceed the memory budget, before any case.

    Every level's values are interpolated to the :math:`P` evaluation points (``fine``, or its
    square grid on a product) by a dense :math:`P \times n` float64 matrix; the largest level's
    :math:`n` values give the largest, :math:`8 P n` bytes, plus :math:`16 P` for the
    Gauss-Legendre nodes and weights.

    Raises
    ------
    SizeTooLargeError
        (a ValueError) Naming ``fine``, the matrix, and the largest ``fine`` that fits.
    """
    if variable not in AXES or evaluate != "interpolate":
        return
    points, values = _evaluation_count(family, largest, fine)
    nbytes = 8.0 * points * values + 16.0 * points
    if surely_within(nbytes) or nbytes <= memory_budget():
        return
    fits = int(memory_budget() // (8.0 * values + 16.0))
    check_allocation(nbytes, f"fine={fine}: the {points} x {values} matrix interpolating the largest "
                     f"{variable} level ({largest}) to the evaluation points",
                     f"use fine <= {fits} (argument fine) or smaller levels, or raise CTFORMER_MEMORY_BUDGET")


#: Gauss-Legendre evaluation points of a study that does not give ``fine`` and needs no more.
DEFAULT_FINE = 200


def _piecewise_widths(variable, family, measured, evaluate):
    """Mesh widths of the measured levels whose error the ``fine`` points must resolve, and
    the length of the interval they sample; None where nothing is checked."""
    if variable not in AXES or evaluate != "interpolate" or _is_composite(family):
        return None
    name, domain = family
    widths = {n: get(name, n, domain=domain) for n in measured}
    return {n: disc.h for n, disc in widths.items() if math.isfinite(disc.order)}


def _length(family, window):
    a, b = window if window is not None else family[1]
    return b - a


def resolving_fine(variable, family, measured, window, evaluate) -> int:
    r"""The default ``fine``: :data:`DEFAULT_FINE` points, or more where a measured level
    needs them, :math:`\lceil 6 L / h_{\min} \rceil` (see :func:`check_resolution`)."""
    widths = _piecewise_widths(variable, family, measured, evaluate)
    if not widths:
        return DEFAULT_FINE
    needed = MIN_POINTS_PER_WIDTH * _length(family, window) / min(widths.values())
    return max(DEFAULT_FINE, math.ceil(needed - 1e-9))


def check_resolution(variable, family, measured, fine, window, evaluate, stacklevel=2):
    r"""Warn when ``fine`` Gauss-Legendre points under-resolve the error of a measured level.

    The error of a level with a piecewise reconstruction (finite order) varies on the scale of
    its mesh width :math:`h`; its :math:`L^2` norm over ``fine`` points on an interval of
    length :math:`L` (the window, or the domain) is resolved when
    :math:`\mathrm{fine}\, h / L \ge` :data:`MIN_POINTS_PER_WIDTH`. Spectral rules, the
    coarsest-nodes evaluation, refined variables other than tokens and features and composite
    families are not checked.

    Warns
    -----
    UnderResolvedErrorWarning
        Naming the levels, their points per mesh width and the ``fine`` that resolves them.
    """
    widths = _piecewise_widths(variable, family, measured, evaluate)
    if not widths:
        return
    length, name = _length(family, window), family[0]
    short = [n for n, h in widths.items() if fine * h / length < MIN_POINTS_PER_WIDTH]
    if short:
        needed = math.ceil(MIN_POINTS_PER_WIDTH * length / min(widths[n] for n in short) - 1e-9)
        per_width = ", ".join(f"{n}: {fine * widths[n] / length:.2g}" for n in short)
        warnings.warn(
            f"fine={fine} evaluation points under-resolve the error of {variable} levels "
            f"{short} of {name} (points per mesh width {per_width}; fewer than "
            f"{MIN_POINTS_PER_WIDTH}): their errors are sampled too coarsely and their "
            f"neighbour orders drift; pass fine={needed} or more, or leave fine out",
            UnderResolvedErrorWarning, stacklevel=stacklevel + 1)

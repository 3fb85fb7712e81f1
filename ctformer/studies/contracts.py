r"""Contracts that lower the order of a convergence study (:func:`order_limits`).

The expected order is the refined rule's own, lowered where the problem breaks an assumption
of that rule, and the study's summary says why (``limitation``):

* the causal mask with the full diagonal weights the diagonal key by its whole cell: a
  first-order rule for :math:`\int_0^x` (order 1 whatever the token rule; ``diagonal="half"``
  is second order);
* a periodic rule (``Fourier``) on data that is not periodic in the refined variable: its
  quadrature is a left Riemann sum (order 1), and the trigonometric interpolant of a function
  whose periodic extension jumps has Gibbs oscillations, an :math:`L^2` error
  :math:`O(h^{1/2})` and a maximum error that does not decrease (order 0). Token dynamics keep
  periodic data periodic only without a mask and without position encodings. In the features
  and the FFN hidden variable the model's own kernels decide: a smooth random or
  piecewise-constant kernel is not periodic, so the features of the state stop being periodic
  after the first step, and the integrand :math:`W_2(y, r)\, \phi(\dots)(r)` of the hidden
  variable, which is only ever integrated (never interpolated), gives order 1 in every norm;
* ALiBi without a causal mask adds :math:`-m |p(x) - p(x')|`, whose derivative jumps at
  :math:`x' = x`: a spectral token rule integrates that kink at order 2 (the finite-order
  rules keep their order on practical levels: the kink's constant is far below their own);
* a piecewise-constant kernel (a converted weight matrix) jumps at the boundaries of its
  cells in its input variable: a rule whose cells do not line up with those jumps, or with
  a node on one, integrates across them at first order
  (:meth:`ctformer.kernels.PiecewiseConstant.quadrature_order`).
"""
from __future__ import annotations

import math
import warnings

import numpy as np

__all__ = ["order_limits", "limited_order", "NonPeriodicDataWarning"]


class NonPeriodicDataWarning(UserWarning):
    """A periodic rule (``Fourier``) refines a variable in which the data are not periodic."""


_CAUSAL_FULL = ("the causal mask with the full diagonal weights the diagonal key by its whole "
                "cell, a first-order rule for the integral over x' <= x, whatever the token rule "
                "(diagonal='half' is second order)")
_CAUSAL_HALF = "the causal mask with the half diagonal is a second-order rule"


def _masks(model) -> list:
    """The attention masks of ``model``'s blocks, split into their parts."""
    parts = []
    for block in getattr(model, "blocks", ()):
        mask = getattr(getattr(block, "attention", None), "mask", None)
        if mask is not None:
            parts += list(mask.parts())
    return parts


def _has_positions(model) -> bool:
    from ..operators.positions import NoPositions

    return any(not isinstance(getattr(getattr(b, "attention", None), "positions", None),
                              (NoPositions, type(None))) for b in getattr(model, "blocks", ()))


_ALIBI_KINK = ("ALiBi without a causal mask adds -m |p(x) - p(x')| to the scores, whose "
               "derivative jumps at x' = x: a spectral token rule integrates the kink at order 2")

# the kernels that act on the features (all of them) or on the hidden variable r
_VARIABLE_KERNELS = {"features": (("attention", ("W_Q", "W_K", "W_V", "W_O")),
                                  ("feedforward", ("W_1", "W_gate", "W_up", "W_2"))),
                     "hidden": (("feedforward", ("W_1", "W_gate", "W_up", "W_2")),)}


def _has_alibi(model) -> bool:
    from ..operators import ALiBi

    return any(isinstance(getattr(getattr(b, "attention", None), "positions", None), ALiBi)
               for b in getattr(model, "blocks", ()))


def _kernels(model, table: dict, variable: str) -> list:
    """The kernels of ``model``'s blocks named in ``table[variable]``."""
    kernels = []
    for block in getattr(model, "blocks", ()):
        for operator, names in table.get(variable, ()):
            op = getattr(block, operator, None)
            for name in names:
                found = getattr(op, name, None)
                kernels += [k for k in (found if isinstance(found, list) else [found])
                            if k is not None]
    return kernels


def _periodic_kernels(model, variable: str) -> bool | None:
    """False when a kernel acting on ``variable`` is a smooth random or piecewise-constant
    kernel (neither is periodic); None when that cannot be told (a user's kernel, no model)."""
    from ..kernels import PiecewiseConstant, SmoothRandom

    kernels = _kernels(model, _VARIABLE_KERNELS, variable)
    return False if any(isinstance(k, (SmoothRandom, PiecewiseConstant)) for k in kernels) else None


# the kernels of each operator that integrate over the features, or over the hidden variable
_INPUT_KERNELS = {"features": (("attention", ("W_Q", "W_K", "W_V")), ("feedforward", ("W_1", "W_gate", "W_up"))),
                  "hidden": (("feedforward", ("W_2",)),)}


def _jump_order(model, variable: str, discretization) -> float | None:
    """The lowest order at which ``discretization`` integrates the piecewise-constant kernels
    of ``model`` whose input variable is ``variable`` (None: no such kernel)."""
    from ..kernels import PiecewiseConstant

    kernels = [k for k in _kernels(model, _INPUT_KERNELS, variable)
               if isinstance(k, PiecewiseConstant)]
    if not kernels or getattr(discretization, "dimension", 1) != 1 or getattr(discretization, "atoms", None):
        return None
    return min(k.quadrature_order(discretization) for k in kernels)


def _periodic_in(u0, variable: str, domain) -> bool | None:
    """Whether the callable ``u0(x, y)`` takes the same values at both ends of ``domain`` in
    ``variable`` (tokens: x, features: y), checked on 17 points of the other variable; None
    when it cannot tell (an array, or the hidden variable, which carries no data)."""
    if not callable(u0) or hasattr(u0, "shape") or variable not in ("tokens", "features"):
        return None
    ends, other = np.array([[domain[0]], [domain[1]]]), np.linspace(0.0, 1.0, 17)[None, :]
    values = np.asarray(u0(ends, other) if variable == "tokens" else u0(other.T, ends.T),
                        dtype=np.float64)
    a, b = (values[0], values[1]) if variable == "tokens" else (values[:, 0], values[:, 1])
    return bool(np.max(np.abs(a - b)) <= 1e-10 * max(1.0, float(np.max(np.abs(values)))))


def _periodic_limits(model, variable, discretization, u0, error_norm, evaluate,
                     masked: bool) -> list:
    """The limits of a periodic rule where the problem is not periodic in ``variable``."""
    name = discretization.name
    if variable == "hidden":  # only integrated: no interpolant, no Gibbs, in every norm
        if _periodic_kernels(model, variable) is False:
            return [(1.0, f"{name} is spectral only on periodic integrands; the model's "
                          f"kernels are not periodic in the hidden variable, so its "
                          f"quadrature is a left Riemann sum (order 1)")]
        return []
    if _periodic_in(u0, variable, discretization.domain) is False:
        why = "the data are not periodic in " + variable
    elif variable == "tokens" and (masked or _has_positions(model)):
        why = "a mask or position encoding makes the token dynamics non-periodic"
    elif variable == "features" and _periodic_kernels(model, variable) is False:
        why = ("the model's kernels are not periodic in the features, so the state is not "
               "after its first step")
    else:
        return []
    if evaluate == "coarsest-nodes":
        return [(1.0, f"{name} is spectral only on periodic data; {why}, so its quadrature "
                      f"is a left Riemann sum (order 1)")]
    return [(0.0 if error_norm == "max" else 0.5,
             f"{name} is spectral only on periodic data; {why}: the periodic extension "
             f"jumps at the ends and the trigonometric interpolant has Gibbs oscillations, "
             f"an L2 error O(h^1/2) and a maximum error that does not decrease")]


def order_limits(model, variable: str, discretization, u0=None, *, error_norm: str = "l2",
                 evaluate: str = "interpolate") -> list:
    r"""What the problem imposes on the order of the refined rule (module notes).

    Parameters
    ----------
    model : ContinuousTransformer or None
        Read for its attention masks, position encodings and kernels.
    variable : {"tokens", "features", "hidden"}
        The refined variable.
    discretization : Discretization
        The refined rule at one level (its ``order``, ``periodic`` and ``domain`` are read).
    u0 : callable, optional
        The initial state :math:`u_0(x, y)`, checked for periodicity at the domain's ends.
    error_norm, evaluate : str
        How the study measures the error: ``"max"`` sees the Gibbs oscillations undamped,
        ``"coarsest-nodes"`` avoids interpolation.

    Returns
    -------
    list of (float, str)
        ``(order, reason)`` for each assumption of the rule that the problem breaks; empty when
        the rule's own order holds.
    """
    limits = []
    masks = _masks(model) if variable == "tokens" else []
    for mask in masks:
        diagonal = getattr(mask, "diagonal", None)
        if diagonal == "full":
            limits.append((1.0, _CAUSAL_FULL))
        elif diagonal == "half":
            limits.append((2.0, _CAUSAL_HALF))
    if getattr(discretization, "periodic", False):
        limits += _periodic_limits(model, variable, discretization, u0, error_norm, evaluate,
                                   bool(masks))
    if variable == "tokens" and _has_alibi(model) and not any(
            getattr(m, "causal", False) for m in masks) and math.isinf(discretization.order):
        limits.append((2.0, _ALIBI_KINK))
    jumps = _jump_order(model, variable, discretization)
    if jumps is not None and jumps < discretization.order:
        limits.append((jumps, f"the model's piecewise-constant kernels (converted weight matrices) jump "
                              f"between their cells in the {variable}, inside the cells of "
                              f"{discretization.name} or under its nodes: a first-order rule for "
                              f"their integrals"))
    return limits


def limited_order(order: float, model, variable: str, discretization, u0=None, *,
                  error_norm: str = "l2", evaluate: str = "interpolate",
                  stacklevel: int = 3) -> tuple:
    """``min(order, limits)`` and the reason of the lowest limit below ``order`` (or None).

    Warns with :class:`NonPeriodicDataWarning` when a periodic rule meets non-periodic data.
    """
    limits = [(p, why) for p, why in order_limits(model, variable, discretization, u0,
                                                   error_norm=error_norm, evaluate=evaluate)
              if p < order]
    if not limits:
        return float(order), None
    p, why = min(limits, key=lambda item: item[0])
    if any(getattr(discretization, "periodic", False) and "periodic" in w for _, w in limits):
        warnings.warn(f"refining {variable} with {discretization.name} on non-periodic data: "
                      f"expect order {p:g}, not spectral convergence ({why.split('; ', 1)[-1]})",
                      NonPeriodicDataWarning, stacklevel=stacklevel)
    return float(p), why

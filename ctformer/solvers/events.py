r"""Events: depths where a scalar function of the state changes sign.

An :class:`Event` with condition :math:`g(t, u)` fires inside an accepted step from
:math:`t_n` to :math:`t_{n+1}` when :math:`g` changes sign between the step's ends (in the
chosen direction). The crossing is located on the step's dense output :math:`\tilde u(t)`
(:mod:`ctformer.solvers.solution`) by Brent's method on :math:`t \mapsto g(t, \tilde u(t))`
(``scipy.optimize.brentq``) to :math:`10^{-12}\max(1, |t|)` in :math:`t`; the located depth is
then as accurate as the interpolant, i.e. within the controller's tolerance. A terminal event
ends the solve there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.optimize import brentq

from .. import validation

__all__ = ["Event", "evaluate_condition", "locate"]


@dataclass(frozen=True)
class Event:
    r"""A depth at which ``condition(t, u)`` crosses zero.

    Parameters
    ----------
    condition : callable
        ``condition(t, u) -> float``: a real scalar (a Python or NumPy number, or an array of
        size one in any namespace).
    terminal : bool
        End the solve at the first crossing (default True). Not a count: ``solve_ivp``'s
        ``terminal=n`` (stop at the n-th crossing) is refused.
    direction : {0, 1, -1}
        0: any crossing; 1: only from negative to positive; -1: only from positive to negative
        (a crossing ends where :math:`g = 0`; a zero of :math:`g` at the start of a step is not
        one, so a solve that starts on :math:`g = 0` does not fire there, unlike ``solve_ivp``).

    Examples
    --------
    The first time the particles' diameter drops below 0.1 (cluster formation)::

        def diameter(t, x):
            return float(np.max(np.linalg.norm(x[:, None] - x[None], axis=-1))) - 0.1

        Event(diameter, direction=-1)
    """

    condition: Callable
    terminal: bool = True
    direction: int = 0

    def __post_init__(self):
        if not callable(self.condition):
            raise TypeError(f"Event: condition must be a callable condition(t, u) -> float, got "
                            f"{type(self.condition).__name__}")
        count = isinstance(self.terminal, (int, np.integer))
        if count and not isinstance(self.terminal, (bool, np.bool_)):
            # scipy's solve_ivp reads an integer as a count of occurrences; say so, not just "bool"
            raise TypeError(f"Event: terminal must be True or False, got {self.terminal!r}; a count "
                            f"of occurrences before stopping (scipy's terminal=n) is not supported: "
                            f"pass terminal=False and read the crossings in stats['events']")
        object.__setattr__(self, "terminal", validation.boolean(self.terminal, "terminal"))
        validation.one_of(self.direction, "direction", (0, 1, -1))


def evaluate_condition(event: Event, t: float, u, index: int) -> float:
    """``event.condition(t, u)`` as a float, refusing a non-scalar or non-real value by name."""
    value = event.condition(t, u)
    size = getattr(value, "size", None)
    size = size() if callable(size) else size  # torch's size is a method
    if size is None and hasattr(value, "shape"):
        size = math.prod(value.shape)
    if (size is not None and size != 1) or isinstance(value, (list, tuple, dict, str)):
        raise ValueError(f"events[{index}]: condition(t, u) must return a real scalar, got "
                         f"{type(value).__name__} of shape {getattr(value, 'shape', None)}")
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError):
        raise TypeError(f"events[{index}]: condition(t, u) must return a real scalar, got "
                        f"{type(value).__name__} {value!r}") from None
    if math.isnan(number):
        raise ValueError(f"events[{index}]: condition(t, u) returned NaN at t={t:.6g}")
    return number


def crossed(event: Event, g0: float, g1: float) -> bool:
    """Whether ``g`` crossed zero from ``g0`` to ``g1`` in the event's direction."""
    if g0 == 0.0 or np.sign(g0) == np.sign(g1):
        return False
    rising = g1 > g0
    return event.direction == 0 or (event.direction == 1) == rising


def locate(event: Event, index: int, interpolant: Callable, t0: float, t1: float,
           g0: float, g1: float) -> float:
    """The crossing depth in ``[t0, t1]`` on the dense output ``interpolant(t)``."""
    if g1 == 0.0:
        return t1

    def g(t):
        return evaluate_condition(event, t, interpolant(t), index)

    a, b = (t0, t1) if t0 < t1 else (t1, t0)
    return brentq(g, a, b, xtol=1e-12 * max(1.0, abs(t0), abs(t1)), rtol=4 * np.finfo(float).eps)

r"""Events: depths where a scalar function of the state changes sign.

An :class:`Event` with condition :math:`g(t, u)` fires inside an accepted step from
:math:`t_n` to :math:`t_{n+1}` when :math:`g` changes sign between the step's ends (in the
chosen direction). Only that sign change is looked at: a root pair inside one step, where
:math:`g` touches or crosses zero and returns to its sign before the step ends (a double
root; two crossings closer than a step), is missed without a word, as in ``solve_ivp``. With
``samples=m`` the condition is also evaluated at :math:`m` equally spaced depths inside each
step, on its dense output, and a sign change between any two neighbouring points counts: a
pair of crossings farther apart than :math:`h/(m+1)` is then found. The crossing is located
on the step's dense output :math:`\tilde u(t)` (:mod:`ctformer.solvers.solution`) by Brent's
method on :math:`t \mapsto g(t, \tilde u(t))` (``scipy.optimize.brentq``) to
:math:`10^{-12}\max(1, |t|)` in :math:`t`; the located depth is then as accurate as the
interpolant, i.e. within the controller's tolerance. As in ``scipy.integrate.solve_ivp``, a
solve that starts where :math:`g = 0` fires at its start when
the first step leaves zero in the event's direction (a restart, which continues a saved solve,
does not: that solve saw the zero already), and a terminal event ends the solve at its first
occurrence, or at its ``n``-th with ``terminal=n``. :class:`Tracker` keeps every occurrence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import array_api_compat
import numpy as np
from scipy.optimize import brentq

from .. import validation

__all__ = ["Event", "Tracker", "check_events", "evaluate_condition", "locate"]


@dataclass(frozen=True)
class Event:
    r"""A depth at which ``condition(t, u)`` crosses zero.

    Parameters
    ----------
    condition : callable
        ``condition(t, u) -> float``: a real scalar (a Python or NumPy number, or an array of
        size one in any namespace).
    terminal : bool or int
        True (default): end the solve at the first occurrence; False (or 0): never; an integer
        :math:`n \ge 1`: end it at the :math:`n`-th occurrence (``solve_ivp``'s meaning; a
        restart counts the occurrences of the solve it continues).
    direction : {0, 1, -1}
        0: any crossing; 1: only from negative to positive; -1: only from positive to negative.
        A crossing ends where :math:`g = 0`, so a zero at a step's end is one occurrence, not
        two; a zero at the very start of a solve is one when the first step moves :math:`g`
        in the event's direction (:math:`g \ge 0` after it for 1, :math:`g \le 0` for -1, as
        ``solve_ivp``).
    samples : int
        Depths inside each accepted step, :math:`t_n + k h/(m+1)` for :math:`k = 1..m`, where
        :math:`g` is also evaluated on the step's dense output (default 0: the step's ends
        only). A sign change is needed between two neighbouring points for an occurrence, so
        two crossings within :math:`h/(m+1)` of each other (a double root) can still be missed.
        Each sample costs one call of ``condition`` and one interpolation (with fixed steps and
        the schemes without stages, the step's two Hermite slopes: two right-hand sides, once).

    Examples
    --------
    The first time the particles' diameter drops below 0.1 (cluster formation)::

        def diameter(t, x):
            return float(np.max(np.linalg.norm(x[:, None] - x[None], axis=-1))) - 0.1

        Event(diameter, direction=-1)
    """

    condition: Callable
    terminal: bool | int = True
    direction: int = 0
    samples: int = 0

    def __post_init__(self):
        if not callable(self.condition):
            raise TypeError(f"Event: condition must be a callable condition(t, u) -> float, got "
                            f"{type(self.condition).__name__}")
        terminal = self.terminal
        if validation.is_integer(terminal):
            if terminal < 0:
                raise ValueError(f"Event: terminal must be True, False or a count n >= 1 of "
                                 f"occurrences before stopping, got {terminal!r}; pass a "
                                 f"positive count, or False never to stop")
            terminal = int(terminal) if terminal > 1 else bool(terminal)
        elif not isinstance(terminal, (bool, np.bool_)):
            raise TypeError(f"Event: terminal must be True, False or a count n >= 1 of "
                            f"occurrences before stopping, got {type(terminal).__name__} "
                            f"{terminal!r}")
        else:
            terminal = bool(terminal)
        object.__setattr__(self, "terminal", terminal)
        validation.one_of(self.direction, "direction", (0, 1, -1))
        if not validation.is_integer(self.samples) or self.samples < 0:
            raise ValueError(f"Event: samples must be a count m >= 0 of depths inside each step "
                             f"where the condition is also evaluated, got {self.samples!r}; pass "
                             f"0 to look at the step ends only")
        object.__setattr__(self, "samples", int(self.samples))

    @property
    def limit(self) -> float:
        """The occurrence that ends the solve (1, n, or infinity for a non-terminal event)."""
        return math.inf if self.terminal is False else float(self.terminal)


def check_events(events) -> tuple:
    """``events`` as a tuple of :class:`Event`, refusing by name anything else (a bare function
    would fail deep inside the solve, on its missing ``condition``)."""
    if isinstance(events, Event) or callable(events) or not hasattr(events, "__iter__"):
        raise TypeError(f"events must be a sequence of ctformer.Event, got "
                        f"{type(events).__name__}; pass events=[ctformer.Event(condition)]")
    events = tuple(events)
    for i, e in enumerate(events):
        if not isinstance(e, Event):
            name = getattr(e, "__name__", "")
            remedy = (f"wrap it: ctformer.Event({name if name.isidentifier() else 'condition'})"
                      if callable(e) else "pass ctformer.Event(condition)")
            raise TypeError(f"events[{i}] must be a ctformer.Event, got {type(e).__name__}; {remedy}")
    return events


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


def leaves_zero(event: Event, g1: float) -> bool:
    """From :math:`g = 0` at a solve's start to ``g1``: an occurrence (``solve_ivp``'s rule)."""
    return event.direction == 0 or event.direction * g1 >= 0.0


def locate(event: Event, index: int, interpolant: Callable, t0: float, t1: float,
           g0: float, g1: float) -> float:
    """The crossing depth in ``[t0, t1]`` on the dense output ``interpolant(t)``."""
    if g1 == 0.0:
        return t1

    def g(t):
        return evaluate_condition(event, t, interpolant(t), index)

    a, b = (t0, t1) if t0 < t1 else (t1, t0)
    return brentq(g, a, b, xtol=1e-12 * max(1.0, abs(t0), abs(t1)), rtol=4 * np.finfo(float).eps)


def _points(event: Event, index: int, record, t_new: float, g0: float, g1: float, count):
    """``(t, g)`` at the step's start, at ``event.samples`` equally spaced depths inside it (on
    the dense output ``record``) and at its end ``t_new``."""
    t0, m = record.t0, event.samples
    inside = [t0 + (t_new - t0) * k / (m + 1) for k in range(1, m + 1)]
    sampled = [(t, evaluate_condition(event, t, record(t, count), index)) for t in inside]
    return [(t0, g0)] + sampled + [(t_new, g1)]


class Tracker:
    """Every occurrence of ``events`` in one solve, and whether a terminal one ends it.

    ``before``: the occurrences of each event before this solve's start (a restart's, so that
    ``terminal=n`` counts those of the solve it continues); ``restart``: the solve continues a
    saved one, so a zero of :math:`g` at its start is not an occurrence.
    """

    def __init__(self, events, before=None, restart: bool = False):
        self.events = check_events(events)
        if before is not None and len(before) != len(self.events):
            if any(e.terminal is not True and e.terminal is not False for e in self.events):
                raise ValueError(f"events: the saved solve had {len(before)} events, this one "
                                 f"{len(self.events)}; terminal=n counts the occurrences of the "
                                 f"saved solve's events, so pass those events in their order")
            before = None  # other events: counted from this solve's start
        self.before = (0,) * len(self.events) if before is None else tuple(int(c) for c in before)
        self.counts = list(self.before)
        self.restart, self.fresh, self.g = restart, False, None
        self.fired, self.states = [], []  # (index, depth) and the state, in the order they happen
        self.first = None  # (depth, state, index, terminal): the one a Solution names

    def start(self, t: float, u) -> None:
        self.g = [evaluate_condition(e, t, u, i) for i, e in enumerate(self.events)]
        self.fresh = not self.restart

    def step(self, record, t_new: float, u_new, count) -> bool:
        """Occurrences in the step just accepted (``record``: its dense output); True when a
        terminal event ends the solve (nothing after it is kept)."""
        if not self.events:
            return False
        g_new = [evaluate_condition(e, t_new, u_new, i) for i, e in enumerate(self.events)]
        found = []
        for i, (e, g0, g1) in enumerate(zip(self.events, self.g, g_new)):
            points = _points(e, i, record, t_new, g0, g1, count)
            for k, ((ta, ga), (tb, gb)) in enumerate(zip(points, points[1:])):
                if k == 0 and self.fresh and ga == 0.0:
                    if leaves_zero(e, gb):
                        found.append((0.0, i, record.t0))
                elif crossed(e, ga, gb):
                    tc = locate(e, i, lambda s: record(s, count), ta, tb, ga, gb)
                    found.append((abs(tc - record.t0), i, tc))
        self.g, self.fresh = g_new, False
        for _, i, tc in sorted(found):  # in the order they happen (ties: by index)
            state = record(tc, count)
            self.fired.append((i, tc))
            self.states.append(state)
            self.counts[i] += 1
            if self.counts[i] >= self.events[i].limit:
                self.first = (tc, state, i, True)
                return True
            if self.first is None:
                self.first = (tc, state, i, False)
        return False

    def per_event(self, like):
        """``(t_events, y_events)`` as ``solve_ivp`` gives them: for each event its depths
        (float64) and its states stacked (shape ``(k,) + like.shape``, the namespace of
        ``like``); ``(None, None)`` without events."""
        if not self.events:
            return None, None
        xp = array_api_compat.array_namespace(like)
        times, states = [], []
        for i in range(len(self.events)):
            mine = [k for k, (j, _) in enumerate(self.fired) if j == i]
            times.append(np.array([self.fired[k][1] for k in mine], dtype=np.float64))
            states.append(xp.stack([self.states[k] for k in mine]) if mine else
                          xp.empty((0, *like.shape), dtype=like.dtype,
                                   device=array_api_compat.device(like)))
        return tuple(times), tuple(states)

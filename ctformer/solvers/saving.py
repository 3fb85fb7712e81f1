"""Which states a solve keeps, as the loop advances (:class:`~ctformer.solvers.solution.SaveAt`)."""
from __future__ import annotations

import array_api_compat
import numpy as np

from ..backend import all_finite

__all__ = ["Saver"]


class Saver:
    """Collects the states a :class:`SaveAt` asks for, step by step.

    ``out``, when given, is preallocated storage (its first axis the saved states) that the
    caller sized and checked against the free memory; otherwise the states are stacked at the end.
    """

    def __init__(self, save_at, problem, u0, *, every: int = 1, out=None, on_save=None):
        self.save_at, self.every, self.out, self.on_save = save_at, every, out, on_save
        self.boundaries = problem.boundaries
        self.t_end = problem.boundaries[-1]
        self.pending = list(save_at.times or ())
        lo, hi = self.boundaries[0], self.t_end
        outside = [t for t in self.pending if t < lo - 1e-12 * max(1, abs(lo))
                   or t > hi + 1e-12 * max(1, abs(hi))]
        if outside:
            raise ValueError(f"save_at: times {outside} lie outside the solved interval "
                             f"[{lo:.6g}, {hi:.6g}]")
        self.times, self.states, self.records = [], [], []
        self.last_time = problem.boundaries[0]
        self.kept_at_end = False  # whether the last step kept a requested time at its end
        self.final = u0

    @property
    def plain(self) -> bool:
        """Nothing inside a segment is looked at: only layers and the final state are kept."""
        s = self.save_at
        return s.times is None and not s.steps and not s.dense

    def _keep(self, t: float, u, check: bool = True):
        if self.on_save is not None and self.times:
            self.on_save(u, self.times[-1], t)
        if self.out is not None:
            self.out[len(self.times), ...] = u
        else:
            self.states.append(u)
        self.times.append(float(t))
        self.last_time = float(t)

    def start(self, t0: float, u0):
        s = self.save_at
        if s.steps or s.layers or (self.pending and self.pending[0] <= t0):
            if self.pending and abs(self.pending[0] - t0) <= 1e-12 * max(1.0, abs(t0)):
                self.pending.pop(0)
            self._keep(t0, u0)
        self.last_time = t0

    def boundary(self, t: float, u):
        """The end of a segment on the fast path."""
        self.final = u
        if self.save_at.layers or (self.save_at.final_only and t == self.t_end):
            self._keep(t, u)

    def wants_check(self, done: int, end: bool) -> bool:
        return end or (self.save_at.steps and done % self.every == 0)

    def step(self, record, t: float, u, *, end: bool, done: int, cut: float | None = None):
        """An accepted step from ``record.t0`` to ``t``; ``cut``: a terminal event at that depth."""
        self.final = u if cut is None else None
        if self.save_at.dense:
            self.records.append(record)
        limit = t if cut is None else cut
        scale = 1e-12 * max(1.0, abs(limit))
        last = None
        while self.pending and self.pending[0] <= limit + scale:
            last = self.pending.pop(0)
            self._keep(last, u if abs(last - t) <= scale else record(last))
        # a requested time at this step's end (or at the event) is not saved twice
        self.kept_at_end = last is not None and abs(last - limit) <= scale
        if cut is not None:
            return
        s = self.save_at
        at_boundary = end or t == self.t_end
        if not self.kept_at_end and ((s.steps and (done % self.every == 0 or t == self.t_end))
                         or (s.layers and at_boundary) or (s.final_only and t == self.t_end)):
            self._keep(t, u)

    def event(self, t: float, u):
        """A terminal event at ``t``: its state is the final one (and saved unless times-only).

        An event located at the start of its step (the root finder's tolerance) is the state
        saved there already, not a second one."""
        self.final = u
        again = self.kept_at_end or (bool(self.times) and t <= self.times[-1])
        if not again and (self.save_at.steps or self.save_at.layers or self.save_at.final_only):
            self._keep(t, u)

    def finish_interrupted(self, t: float, u) -> int:
        """Keep the last completed step too (when finite and not saved); return the count kept."""
        if u is not None and t > self.last_time:
            if all_finite(u):
                self._keep(t, u)
        self.final = u
        return len(self.times)

    def result(self):
        times = np.asarray(self.times, dtype=np.float64)
        if self.out is not None:
            return times, self.out[:len(self.times), ...]
        if not self.states:
            return times, None
        xp = array_api_compat.array_namespace(self.states[0])
        return times, xp.stack(self.states)

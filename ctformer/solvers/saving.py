r"""Which states a solve keeps, as the loop advances (:class:`~ctformer.solvers.solution.SaveAt`).

The kept states are stacked into ``Solution.states`` at the end, so that :math:`n` states of
:math:`S` bytes need :math:`2 n S` bytes at the peak. Given the memory-budget module
(:mod:`ctformer.discretizations.memory`), a solve whose count :math:`n` is known before the first
step (fixed steps, or depths requested with ``SaveAt(times=...)``) is refused then when
:math:`2 n S` exceeds the budget; one that keeps every controlled step is refused at the first
state beyond :math:`\lfloor B / 2S \rfloor` (budget :math:`B`), with the states kept so far.
"""
from __future__ import annotations

import math
import os

import array_api_compat
import numpy as np

from ..backend import all_finite

__all__ = ["Saver"]


class Saver:
    """Collects the states a :class:`SaveAt` asks for, step by step.

    ``out``, when given, is preallocated storage (its first axis the saved states) that the
    caller sized and checked against the free memory; otherwise the states are stacked at the end.
    """

    def __init__(self, save_at, problem, u0, *, every: int = 1, out=None, on_save=None, memory=None):
        self.save_at, self.every, self.out, self.on_save = save_at, every, out, on_save
        # preallocated storage was checked by its caller; only the final state needs no check
        self.memory = None if out is not None or save_at.final_only else memory
        if self.memory is not None and _on_device(u0) and not os.environ.get(memory.MEMORY_BUDGET_ENV):
            self.memory = None  # the budget is host memory: a GPU's states need it set to be checked
        self.state_bytes = 0 if self.memory is None else _nbytes(u0)
        self.room = None  # how many states may be kept before the budget is looked at again
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
        if self.room is not None and len(self.times) >= self.room and not self._fits(check, t):
            return
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
                self._keep(t, u, check=False)  # not kept where the budget has no room for it
        self.final = u
        return len(self.times)

    # -- the memory budget ---------------------------------------------------------------------
    def plan(self, steps: int | None, what: str) -> None:
        """Refuse before the first step the states this solve will keep beyond the budget.

        ``steps``: fixed steps per segment, or None for a controller (whose steps are counted
        as they are kept, :meth:`_fits`). The count is an upper bound: a requested depth that is
        a kept step's end is counted twice."""
        if self.memory is None:
            return
        s, segments = self.save_at, len(self.boundaries) - 1
        count = len(self.pending)
        if s.steps and steps is None:
            self.room = 0  # looked at as the states come
            return
        if s.steps:
            total = steps * segments
            count += 1 + -(-total // self.every)
            if s.layers:  # boundaries that are not a saved step
                count += sum(1 for m in range(1, segments) if m * steps % self.every)
        elif s.layers:
            count += segments + 1
        if not self.memory.surely_within(self._need(count)):
            budget = self.memory.memory_budget()
            if self._need(count) > budget:
                raise self.memory.SizeTooLargeError(
                    f"save_at={s!r} keeps {count} states of {_bytes(self.state_bytes)} ({what}), "
                    f"{_bytes(self._need(count))} at the peak while solution.states is stacked from them, more than "
                    f"the memory budget of {_bytes(budget)} ({self._budget_words()}); "
                    f"{self._fit(budget)} states fit: {self._remedy(budget)}")

    def _need(self, count: int) -> int:
        """Peak bytes of ``count`` states: the list and the stacked array."""
        return 2 * count * self.state_bytes

    def _fit(self, budget: int) -> int:
        return int(budget // (2 * max(1, self.state_bytes)))

    def _budget_words(self) -> str:
        return f"half the available memory, or {self.memory.MEMORY_BUDGET_ENV}"

    def _remedy(self, budget: int) -> str:
        return (f"keep fewer (SaveAt(times=...) with at most {self._fit(budget)} depths, "
                f"SaveAt(layers=True) or the final state only) or raise {self.memory.MEMORY_BUDGET_ENV}")

    def _fits(self, check: bool, t: float) -> bool:
        """Whether one more state fits; raises (``check``) or says no when it does not.

        The budget is read only past what surely fits: the room doubles while it does."""
        n = len(self.times) + 1
        room = max(1, 2 * self.room)
        while room < n:
            room *= 2
        if self.memory.surely_within(self._need(room)):
            self.room = room
            return True
        budget = self.memory.memory_budget()
        self.room = self._fit(budget)
        if n <= self.room:
            return True
        if not check:
            return False
        exc = self.memory.SizeTooLargeError(
            f"save_at={self.save_at!r} keeps a state of {_bytes(self.state_bytes)} at every "
            f"accepted step, and solution.states is stacked from them: the memory budget of "
            f"{_bytes(budget)} ({self._budget_words()}) holds {self.room}; kept {len(self.times)} "
            f"states up to t={self.last_time:.6g}, stopped at t={t:.6g} (the solution so far is "
            f"exc.solution); {self._remedy(budget)}")
        exc.solution = None  # filled in by the loop, which holds the step history
        raise exc

    def result(self):
        times = np.asarray(self.times, dtype=np.float64)
        if self.out is not None:
            return times, self.out[:len(self.times), ...]
        if not self.states:
            return times, None
        xp = array_api_compat.array_namespace(self.states[0])
        return times, xp.stack(self.states)


def _on_device(u) -> bool:
    return getattr(getattr(u, "device", None), "type", "cpu") != "cpu" or array_api_compat.is_cupy_array(u)


def _nbytes(u) -> int:
    """Bytes of one state (NumPy and CuPy ``nbytes``; torch's ``element_size``)."""
    nbytes = getattr(u, "nbytes", None)
    return int(nbytes) if nbytes is not None else math.prod(u.shape) * u.element_size()


def _bytes(nbytes: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"

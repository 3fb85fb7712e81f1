r"""Which states a solve keeps, as the loop advances (:class:`~ctformer.solvers.solution.SaveAt`).

The kept states are stacked into ``Solution.states`` at the end, so that :math:`n` states of
:math:`S` bytes need :math:`2 n S` bytes at the peak. The dense output (``SaveAt(dense=True)``)
keeps, per accepted step, the state at its end and the arrays its interpolant reads: an embedded
pair's stages not shared with the step before (FSAL: :math:`s - 1`), else the two end slopes of
the cubic Hermite interpolant, made when first evaluated; :math:`r_j S` bytes for step
:math:`j`. Given the memory-budget module (:mod:`ctformer.discretizations.memory`), a solve
whose counts are known before the first step (fixed steps, or depths requested with
``SaveAt(times=...)``) is refused then when :math:`2 n S + \sum_j r_j S` exceeds the budget
:math:`B`; one that keeps every controlled step, or the dense output of controlled steps, is
refused at the first state or record beyond :math:`B`, with the states and records kept so far.
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
        # preallocated storage was checked by its caller and the final state alone needs no
        # check; the dense output's records are counted wherever they are kept
        self.count_states = out is None and not save_at.final_only
        self.memory = memory if self.count_states or save_at.dense else None
        if self.memory is not None and _on_device(u0) and not os.environ.get(memory.MEMORY_BUDGET_ENV):
            self.memory = None  # the budget is host memory: a GPU's states need it set to be checked
        self.state_bytes = 0 if self.memory is None else _nbytes(u0)
        self.watch = False  # states or records looked at as they come (controlled steps)
        self.allowance = 0  # bytes known to fit: the budget is read only past them
        self.planned = None if self.count_states else 0  # bytes of the states counted in plan()
        self.record_bytes = 0  # bytes of the dense records kept so far
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
        if self.watch and self.planned is None and not self._fits(2 * self.state_bytes, check, t):
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
        if self.save_at.dense:  # first: a refused record leaves the solution at the step before
            cost = self._record_cost(record)
            if self.watch:
                self._fits(cost, True, t, record=True)
            self.records.append(record)
            self.record_bytes += cost
        self.final = u if cut is None else None
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
        """Refuse before the first step the states and records this solve will keep beyond the
        budget.

        ``steps``: fixed steps per segment, or None for a controller (whose kept steps and dense
        records are counted as they come, :meth:`_fits`). The count is an upper bound: a
        requested depth that is a kept step's end is counted twice, and so is a kept step's
        state that a dense record holds."""
        if self.memory is None:
            return
        s, segments = self.save_at, len(self.boundaries) - 1
        self.watch = steps is None and (s.steps or s.dense)
        count = self._count(steps, segments) if self.count_states else 0
        if count is None:  # every controlled step: looked at as the states come
            return
        self.planned = self._need(count)
        steps_kept = steps * segments if s.dense and steps is not None else 0
        need = self.planned + 3 * steps_kept * self.state_bytes  # Hermite records: u1 and 2 slopes
        if not self.memory.surely_within(need):
            budget = self.memory.memory_budget()
            if need > budget:
                dense = (f" and the dense output of {steps_kept} steps (3 states each: the step's "
                         f"end and the two slopes of its interpolant)" if steps_kept else "")
                raise self.memory.SizeTooLargeError(
                    f"save_at={s!r} keeps {count} states of {_bytes(self.state_bytes)} ({what}){dense}, "
                    f"{_bytes(need)} at the peak while solution.states is stacked from them, more than "
                    f"the memory budget of {_bytes(budget)} ({self._budget_words()}); "
                    f"{self._fit(budget)} states fit: {self._remedy(budget)}")
        self.allowance = need

    def _count(self, steps: int | None, segments: int) -> int | None:
        """States kept, known before the first step; None: every controlled step is kept."""
        s = self.save_at
        count = len(self.pending)
        if s.steps and steps is None:
            return None
        if s.steps:
            total = steps * segments
            count += 1 + -(-total // self.every)
            if s.layers:  # boundaries that are not a saved step
                count += sum(1 for m in range(1, segments) if m * steps % self.every)
        elif s.layers:
            count += segments + 1
        return count

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

    def _used(self) -> int:
        """Bytes kept so far: the states (or those planned) at the peak, and the dense records."""
        states = self.planned if self.planned is not None else self._need(len(self.times))
        return states + self.record_bytes

    def _record_cost(self, record) -> int:
        """Bytes a dense record adds: its end state and the arrays its interpolant reads that
        the record before does not hold (an FSAL pair's first stage is that one's last)."""
        if self.memory is None:
            return 0
        if record.ks is None or record.tableau is None or record.tableau.dense is None:
            return 3 * self.state_bytes  # u1 and the Hermite slopes, made when first evaluated
        prev = self.records[-1] if self.records else None
        held = set() if prev is None else {id(prev.u1), *(id(k) for k in prev.ks or ())}
        return self.state_bytes * sum(1 for x in (record.u1, *record.ks) if id(x) not in held)

    def _fits(self, extra: int, check: bool, t: float, record: bool = False) -> bool:
        """Whether ``extra`` bytes more fit; raises (``check``) or says no when they do not.

        The budget is read only past what surely fits: the allowance doubles while it does."""
        need = self._used() + extra
        if need <= self.allowance:
            return True
        allowance = max(1, 2 * self.allowance)
        while allowance < need:
            allowance *= 2
        if self.memory.surely_within(allowance):
            self.allowance = allowance
            return True
        budget = self.allowance = self.memory.memory_budget()
        if need <= budget:
            return True
        if not check:
            return False
        exc = self.memory.SizeTooLargeError(self._refusal(budget, t, extra) if record else (
            f"save_at={self.save_at!r} keeps a state of {_bytes(self.state_bytes)} at every "
            f"accepted step, and solution.states is stacked from them: the memory budget of "
            f"{_bytes(budget)} ({self._budget_words()}) holds "
            f"{self._fit(max(0, budget - self.record_bytes))}; kept {len(self.times)} "
            f"states up to t={self.last_time:.6g}, stopped at t={t:.6g} (the solution so far is "
            f"exc.solution); {self._remedy(budget)}"))
        exc.solution = None  # filled in by the loop, which holds the step history
        raise exc

    def _refusal(self, budget: int, t: float, cost: int) -> str:
        last = self.records[-1] if self.records else None
        upto = "" if last is None else f" up to t={last.t0 + last.h:.6g}"
        return (f"save_at={self.save_at!r} keeps the dense output of every accepted step (for "
                f"Solution.evaluate: the step's end state and the arrays its interpolant reads, "
                f"{_bytes(cost)} for the step ending at t={t:.6g}): with {_bytes(self._used())} "
                f"kept, the memory budget of {_bytes(budget)} ({self._budget_words()}) has no room "
                f"for it; kept the records of {len(self.records)} "
                f"step{'' if len(self.records) == 1 else 's'}{upto} (the solution so "
                f"far, with its dense output, is exc.solution); solve without dense=True "
                f"(SaveAt(times=...) at the depths you need) or raise {self.memory.MEMORY_BUDGET_ENV}")

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

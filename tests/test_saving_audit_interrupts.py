"""Saving audit: Ctrl-C at any point of a controlled step's bookkeeping leaves a solution whose
step history is consistent, and a restart from it gives the bits of the uninterrupted solve.

A signal handler raises ``KeyboardInterrupt`` at a call; here one is raised from each call of
the bookkeeping after an accepted step (the appends to ``step_times``, ``step_sizes`` and
``step_errors``, before and after they append, and the saver), at the third accepted step.
The reference is the uninterrupted solve.
"""
from __future__ import annotations

import numpy as np
import pytest

import ctformer
from ctformer import SaveAt, solvers
from ctformer.discretizations import GaussLegendre
from ctformer.solvers import loop, saving

MODEL = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2)
GRIDS = dict(tokens=GaussLegendre(8), features=GaussLegendre(6))
EVERY = SaveAt(steps=True)
AT = 3  # the accepted step whose bookkeeping is interrupted


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


class _Stopping(list):
    """A list whose ``AT``-th append raises KeyboardInterrupt, before or after appending."""

    def __init__(self, after: bool):
        super().__init__()
        self.after = after

    def append(self, value):
        if len(self) + 1 == AT and not self.after:
            raise KeyboardInterrupt
        super().append(value)
        if len(self) == AT and self.after:
            raise KeyboardInterrupt


def _interrupted_at_append(monkeypatch, name, after):
    init = loop._Run.__init__

    def patched(run, *args):
        init(run, *args)
        setattr(run, name, _Stopping(after))

    monkeypatch.setattr(loop._Run, "__init__", patched)
    with pytest.raises(solvers.SolveInterrupted) as info:
        MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, **GRIDS)
    monkeypatch.setattr(loop._Run, "__init__", init)
    return info.value.result


def _check_restart(part):
    stats = part.stats
    n = stats["accepted"]
    assert len(stats["step_times"]) == len(stats["step_sizes"]) == len(stats["step_errors"]) == n
    assert part.times[-1] == (stats["step_times"][-1] if n else 0.0)
    full = MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, **GRIDS)
    np.testing.assert_array_equal(part.states, full.states[:n + 1])
    np.testing.assert_array_equal(stats["step_sizes"], full.stats["step_sizes"][:n])
    rest = MODEL.evolve(None, rtol=1e-7, save_at=EVERY, initial=part, **GRIDS)
    np.testing.assert_array_equal(rest.times, full.times[n:])
    np.testing.assert_array_equal(rest.states, full.states[n:])
    np.testing.assert_array_equal(rest.final, full.final)


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize("name", ["step_times", "step_sizes", "step_errors"])
def test_interrupt_in_the_step_history_restarts_exactly(monkeypatch, name, after):
    part = _interrupted_at_append(monkeypatch, name, after)
    # the interrupted step is not counted: the solution ends at the step before it
    assert part.stats["accepted"] == AT - 1
    _check_restart(part)


def test_interrupt_in_the_saver_restarts_exactly(monkeypatch):
    step = saving.Saver.step
    calls = []

    def stopping(saver, *args, **kwargs):
        calls.append(1)
        if len(calls) == AT:
            raise KeyboardInterrupt
        return step(saver, *args, **kwargs)

    monkeypatch.setattr(saving.Saver, "step", stopping)
    with pytest.raises(solvers.SolveInterrupted) as info:
        MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, **GRIDS)
    monkeypatch.setattr(saving.Saver, "step", step)
    part = info.value.result
    assert part.stats["accepted"] == AT  # the step was counted; its state kept on the way out
    _check_restart(part)

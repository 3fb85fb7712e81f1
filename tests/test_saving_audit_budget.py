"""Saving audit: the states a solve keeps are refused beyond the memory budget.

``n`` kept states of ``S`` bytes take ``2 n S`` bytes at the peak (the list, then
``Solution.states`` stacked from it). A fixed-step solve or one that keeps requested depths
knows ``n`` before its first step and is refused then; a controlled solve that keeps every step
is refused at the first state beyond ``budget // 2S``, with the states so far on the exception.
Each case is measured with ``tracemalloc`` under a small ``CTFORMER_MEMORY_BUDGET``.
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import ctformer
from ctformer import SaveAt
from ctformer.discretizations import GaussLegendre, SizeTooLargeError

MODEL = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
GRIDS = dict(tokens=GaussLegendre(128), features=GaussLegendre(32))
STATE = 128 * 32 * 8  # bytes of one float64 state


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


@pytest.fixture(autouse=True)
def _warm():
    """One solve first: the grids' and the model's caches are not counted in the peaks."""
    MODEL.evolve(_u0, scheme="rk4", steps_per_layer=1, **GRIDS)


def _traced(call):
    """``(result or exception, peak bytes traced)`` of ``call()``."""
    tracemalloc.start()
    try:
        try:
            result = call()
        except SizeTooLargeError as exc:
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_fixed_steps_refused_before_the_first_step(monkeypatch):
    # 3 layers x 20 rk4 steps: 1 + 60 = 61 states, 2 * 61 * 32 KiB at the peak
    budget = 2 * 60 * STATE + STATE  # room for 60 states and a half: 61 do not fit
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(budget))
    err, peak = _traced(lambda: MODEL.evolve(_u0, scheme="rk4", steps_per_layer=20,
                                             save_at=SaveAt(steps=True), **GRIDS))
    assert isinstance(err, SizeTooLargeError)
    assert "save_at=SaveAt(" in str(err) and "keeps 61 states of 32 KiB" in str(err)
    assert "60 states fit" in str(err)
    assert peak < 8 * STATE  # no step taken: far below the 61 states


def test_fixed_steps_that_fit_exactly_give_the_same_bits(monkeypatch):
    free = MODEL.evolve(_u0, scheme="rk4", steps_per_layer=20, save_at=SaveAt(steps=True), **GRIDS)
    assert free.states.shape == (61, 128, 32)
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(2 * 61 * STATE))
    kept = MODEL.evolve(_u0, scheme="rk4", steps_per_layer=20, save_at=SaveAt(steps=True), **GRIDS)
    np.testing.assert_array_equal(kept.states, free.states)
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(2 * 61 * STATE - 1))
    with pytest.raises(SizeTooLargeError, match=r"keeps 61 states .* 60 states fit"):
        MODEL.evolve(_u0, scheme="rk4", steps_per_layer=20, save_at=SaveAt(steps=True), **GRIDS)


@pytest.mark.parametrize("control", [dict(steps_per_layer=2), dict(rtol=1e-6)])
def test_requested_depths_refused_before_the_first_step(monkeypatch, control):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(2 * 19 * STATE))
    times = np.linspace(0.0, 3.0, 20)
    err, peak = _traced(lambda: MODEL.evolve(_u0, save_at=SaveAt(times=times), **control, **GRIDS))
    assert isinstance(err, SizeTooLargeError)
    assert "keeps 20 states" in str(err) and "19 states fit" in str(err)
    assert "SaveAt(times=...) with at most 19 depths" in str(err)
    assert peak < 8 * STATE


def test_every_controlled_step_refused_at_the_first_beyond_the_budget(monkeypatch):
    full = MODEL.evolve(_u0, rtol=1e-9, save_at=SaveAt(steps=True), **GRIDS)
    assert len(full.times) > 12  # the uninterrupted solve keeps more than fit below
    _, plain_peak = _traced(lambda: MODEL.evolve(_u0, rtol=1e-9, **GRIDS))
    budget = 2 * 10 * STATE
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(budget))
    err, peak = _traced(lambda: MODEL.evolve(_u0, rtol=1e-9, save_at=SaveAt(steps=True), **GRIDS))
    assert isinstance(err, SizeTooLargeError)
    assert "holds 10; kept 10 states" in str(err) and "exc.solution" in str(err)
    part = err.solution
    np.testing.assert_array_equal(part.times, full.times[:10])
    np.testing.assert_array_equal(part.states, full.states[:10])
    # the kept states, stacked once, and the work of a step: no more than a solve keeping nothing
    assert peak <= plain_peak + budget
    monkeypatch.delenv("CTFORMER_MEMORY_BUDGET")
    rest = MODEL.evolve(None, rtol=1e-9, save_at=SaveAt(steps=True), initial=part, **GRIDS)
    np.testing.assert_array_equal(rest.states, full.states[9:])
    np.testing.assert_array_equal(rest.final, full.final)


def test_final_state_only_is_never_refused(monkeypatch):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(STATE // 2))  # not even one state
    free = MODEL.evolve(_u0, scheme="rk4", steps_per_layer=2, **GRIDS)
    assert free.states.shape == (1, 128, 32)

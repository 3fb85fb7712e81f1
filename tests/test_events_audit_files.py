"""A solution's event in its file: ``event_state`` (and where, which, whether terminal) round trip.

The reference is the Solution in memory: what ``labelled.open_dataset`` (netCDF, zarr) and
``labelled.from_xarray`` give back must hold the same bits; the condition vanishes at the event
state; a restart from the file continues with the bits of the uninterrupted solve.
"""
from __future__ import annotations

import numpy as np
import pytest

import ctformer
from ctformer import Event, SaveAt, labelled, solvers
from ctformer.discretizations import GaussLegendre, Midpoint, Product
from ctformer.particles import CircleMeanField

from .conftest import read_back_solution as _read_back, require

xr = require("xarray")
MODEL = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
GRIDS = dict(tokens=GaussLegendre(8), features=GaussLegendre(6))
EVERY = SaveAt(steps=True)
PEAK = Event(lambda t, u: float(np.max(u)) - 1.0, terminal=False)         # up near 0.35, down 1.05
MEAN = Event(lambda t, u: float(np.mean(u)) + 0.32, terminal=False)       # down near 1.9, up 2.5
DROP = Event(lambda t, u: float(np.mean(u)) + 0.25, direction=-1)         # terminal, near 1.2


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


def _same_event(back, sol, label):
    assert back.event_time == sol.event_time, label
    assert back.event_index == sol.event_index and back.event_terminal == sol.event_terminal, label
    assert back.event_state.dtype == np.asarray(sol.event_state).dtype, label
    assert back.event_state.tobytes() == np.asarray(sol.event_state).tobytes(), label


@pytest.mark.parametrize("case", ["none", "non-terminal", "terminal", "several"])
def test_model_event_round_trips_bit_for_bit(case, tmp_path):
    """Before: the files held event_time only; event_state came back as nothing."""
    events = {"none": [], "non-terminal": [PEAK], "terminal": [DROP],
              "several": [PEAK, MEAN, DROP]}[case]
    sol = MODEL.evolve(_u0, rtol=1e-8, save_at=EVERY, events=events, **GRIDS)
    for label, back in _read_back(sol, tmp_path).items():
        if case == "none":
            assert back.event_time is None and back.event_state is None, label
            assert not back.event_terminal and "event_state" not in back.dataset, label
            continue
        _same_event(back, sol, label)
        assert back.attrs["stats_events"] == [list(e) for e in sol.stats["events"]], label
        assert back.states.tobytes() == sol.states.tobytes(), label
    if case != "none":   # the state is the one at the event: its condition vanishes there
        event = events[sol.event_index]
        assert abs(event.condition(sol.event_time, sol.event_state)) <= 1e-9
    if case == "several":   # the peak rises and falls before the terminal drop; nothing after it
        assert [i for i, _ in sol.stats["events"]] == [0, 0, 2] and sol.event_index == 2
    if case in ("terminal", "several"):
        assert sol.times[-1] == sol.event_time == sol.stats["step_times"][-1]
        assert 1.0 < sol.event_time < 1.5


def test_product_tokens_and_complex_event_states(tmp_path):
    """event_state(token_x, token_y, feature) back in raster order; complex values on part."""
    grids = ctformer.Grids(Product(Midpoint(3), GaussLegendre(2)), Midpoint(4))
    rng = np.random.default_rng(1)
    states = rng.standard_normal((2, *grids.stored_shape))
    event = rng.standard_normal(grids.stored_shape)
    sol = ctformer.Solution(times=np.array([0.0, 0.4]), states=states, final=event,
                            stats={"accepted": 3}, scheme="tsit5", grids=grids, event_time=0.4,
                            event_state=event, event_index=0, event_terminal=True)
    ds = labelled.to_xarray(sol)
    assert ds["event_state"].dims == ("token_x", "token_y", "feature")
    np.testing.assert_array_equal(ds["event_state"].values[2, 1], event[5])  # token 2 * 2 + 1
    for label, back in _read_back(sol, tmp_path).items():
        _same_event(back, sol, label)
    field = CircleMeanField(beta=2.0, n_modes=32)
    rho0 = (lambda th: (1 + 0.1 * np.cos(th)) / (2 * np.pi))
    grow = Event(lambda t, c: abs(c[1]) - 0.5)
    sol = field.evolve(rho0, 3.0, rtol=1e-8, events=[grow])
    assert np.iscomplexobj(sol.event_state) and abs(abs(sol.event_state[1]) - 0.5) <= 1e-9
    for label, back in _read_back(sol, tmp_path).items():
        _same_event(back, sol, label)


def test_terminal_event_before_every_save_time_is_written(tmp_path):
    """SaveAt(times=[2.9]) and a terminal event near 1.2: no state saved. Before: to_xarray
    raised 'solution.states must have shape (T, ..., N, d) ... got ()', losing the event."""
    sol = MODEL.evolve(_u0, rtol=1e-8, save_at=SaveAt(times=[2.9]), events=[DROP], **GRIDS)
    assert sol.states is None and len(sol.times) == 0
    for label, back in _read_back(sol, tmp_path).items():
        _same_event(back, sol, label)
        assert back.states.shape == (0, 8, 6) and back.final is None, label
        with pytest.raises(ValueError, match="no saved state to restart from"):
            MODEL.evolve(None, rtol=1e-8, initial=back, **GRIDS)


def test_restarts_from_files_with_events(tmp_path):
    """After a non-terminal event: the restart continues bit for bit; at a terminal event it is
    refused by name (before: as 'an interpolated SaveAt time')."""
    full = MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, events=[PEAK], **GRIDS)
    with pytest.raises(solvers.MaxStepsReached) as info:
        MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, events=[PEAK], max_steps=6, **GRIDS)
    part = info.value.solution
    k = len(part.times) - 1
    assert part.event_time is not None and part.event_time < part.times[-1]
    for label, back in _read_back(part, tmp_path).items():
        _same_event(back, part, label)
        rest = MODEL.evolve(None, rtol=1e-7, save_at=EVERY, events=[PEAK], initial=back, **GRIDS)
        assert np.array_equal(rest.times, full.times[k:]), label
        assert rest.states.tobytes() == full.states[k:].tobytes(), label
    stopped = MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, events=[DROP], **GRIDS)
    for label, back in _read_back(stopped, tmp_path).items():
        with pytest.raises(ValueError, match=r"initial ended at a terminal event at t=1\.\d+"):
            MODEL.evolve(None, rtol=1e-7, save_at=EVERY, initial=back, **GRIDS)

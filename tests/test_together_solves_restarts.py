"""A restart together with positions: the reference length of the continued solve.

Positions :math:`p(x) = L x - 1/2` make ``context_length`` part of the right-hand side (RoPE,
ALiBi, sliding windows). A restart with another ``context_length`` than the saved solve's had
run, and ended 1.5e-4 off the uninterrupted solve (rope model below, L = 7 saved, 14 given):
another computation, continued silently. It is refused now, as another discretization is;
the same length (7 saved, 7.0 given, or read back from a file) continues bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import SaveAt
from ctformer.discretizations import Midpoint
from ctformer.labelled import open_dataset, to_netcdf
from ctformer.model import ContinuousTransformer
from ctformer.solvers import MaxStepsReached

N, D = 7, 8
GRIDS = dict(tokens=Midpoint(N), features=Midpoint(D))


@pytest.fixture(scope="module")
def rope():
    model = ContinuousTransformer.random_smooth(seed=3, layers=2, mask="causal", positions="rope",
                                                context_length=N)
    return model, np.random.default_rng(2).standard_normal((2, N, D))


def _stopped(model, u0, **options):
    with pytest.raises(MaxStepsReached) as stopped:
        model.evolve(u0, **GRIDS, save_at=SaveAt(steps=True), max_steps=3, **options)
    return stopped.value.solution


@pytest.mark.parametrize("control", [dict(), dict(scheme="rk4", steps_per_layer=2)])
def test_a_restart_with_another_context_length_is_refused(rope, control, tmp_path):
    model, u0 = rope
    part = (model.evolve(u0, **GRIDS, save_at=SaveAt(times=[1.0]), **control) if control
            else _stopped(model, u0))
    other = model.evolve(u0, **GRIDS, context_length=2 * N, **control)
    full = model.evolve(u0, **GRIDS, **control)
    assert np.abs(other.final - full.final).max() > 1e-5   # L matters to this model
    read = open_dataset(to_netcdf(part, tmp_path / "part.nc"))
    for initial in (part, read):
        with pytest.raises(ValueError, match=r"another computation \(context_length: saved '7\.0', "
                                             r"now '14\.0'\).*start a new solve"):
            model.evolve(None, **GRIDS, initial=initial, context_length=2 * N, **control)
        same = model.evolve(None, **GRIDS, initial=initial, context_length=float(N), **control)
        assert np.array_equal(same.final, full.final)
        default = model.evolve(None, **GRIDS, initial=initial, **control)  # the model's L = 7
        assert np.array_equal(default.final, full.final)


def test_a_model_without_positions_restarts_without_a_length(rope):
    """Without positions the grids have no length; nothing is compared, the restart continues."""
    _, u0 = rope
    plain = ContinuousTransformer.random_smooth(seed=3, layers=2, mask="causal")
    full = plain.evolve(u0, **GRIDS)
    rest = plain.evolve(None, **GRIDS, initial=_stopped(plain, u0))
    assert np.array_equal(rest.final, full.final)


def test_a_restart_from_a_stop_that_saved_nothing_names_the_remedy(rope):
    """MaxStepsReached with the default SaveAt (the final state only) keeps no state: the
    refusal said only "no saved state"; it now names the SaveAt that makes a restart possible."""
    model, u0 = rope
    with pytest.raises(MaxStepsReached) as stopped:
        model.evolve(u0, **GRIDS, max_steps=3)
    assert len(stopped.value.solution.times) == 0
    with pytest.raises(ValueError, match=r"no saved state to restart from .*SaveAt\(steps=True\) "
                                         r"or SaveAt\(layers=True\)"):
        model.evolve(None, **GRIDS, initial=stopped.value.solution)

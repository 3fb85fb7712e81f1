"""An error-controlled solve whose error estimate sits at the rounding level of a float32
state accepts and rejects steps by chance until ``max_steps``: the message says so, and what
to do. Reference: the same solve in float64 and with tsit5, which finish."""
import numpy as np
import pytest

import ctformer.discretizations as d
from ctformer import ContinuousTransformer
from ctformer.solvers import MaxStepsReached

GRIDS = dict(tokens=d.Midpoint(6), features=d.Midpoint(8))


def _model_and_state(dtype):
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    return model, np.random.default_rng(0).standard_normal((6, 8)).astype(dtype)


def test_a_float32_estimate_at_rounding_is_named_when_the_steps_run_out():
    model, u = _model_and_state(np.float32)
    with pytest.raises(MaxStepsReached, match=r"of the steps were rejected: the error estimate may be at "
                                              r"the rounding level of the float32 state .*tsit5.*float64") as info:
        model.evolve(u, scheme="lie", rtol=1e-4, atol=1e-6, max_steps=5000, **GRIDS)
    stats = info.value.solution.stats
    assert stats["rejected"] * 3 >= stats["accepted"] + stats["rejected"]
    # the remedies it names finish: float64 states, or a higher-order pair on float32
    model.evolve(u.astype(np.float64), scheme="lie", rtol=1e-4, atol=1e-6, **GRIDS)
    fast = model.evolve(u, scheme="tsit5", rtol=1e-4, atol=1e-6, **GRIDS)
    reference = model.evolve(u.astype(np.float64), scheme="tsit5", rtol=1e-10, atol=1e-12, **GRIDS)
    assert np.max(np.abs(fast.final - reference.final)) < 1e-3 * np.max(np.abs(reference.final))


def test_steps_running_out_with_few_rejections_say_nothing_of_rounding():
    model, u = _model_and_state(np.float64)
    with pytest.raises(MaxStepsReached) as info:
        model.evolve(u, scheme="tsit5", rtol=1e-8, atol=1e-10, max_steps=3, **GRIDS)
    assert "rounding level" not in str(info.value)

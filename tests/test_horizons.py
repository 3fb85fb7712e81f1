"""Long horizons are refused before the first step instead of hanging (issue 19, item 8).

A particle or mean-field solve on [0, t1] takes ceil(t1 / dt) steps; a model's solve takes
layers * steps_per_layer. More than 10**8 steps (``CTFORMER_MAX_STEPS``) is refused with a
ValueError naming the arguments; everything else takes exactly the documented number of steps.
"""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ctformer.solvers as solvers
from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.model_inputs import MAX_STEPS, check_steps, max_steps
from ctformer.particles import CircleMeanField, SelfAttentionDynamics
from ctformer.particles.timegrid import time_steps

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _sphere(n=4, d=3, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _refused_fast(call, match):
    start = time.perf_counter()
    with pytest.raises(ValueError, match=match):
        call()
    assert time.perf_counter() - start < 1.0  # before the first step, not after hours


def test_particle_horizon_of_1e12_steps_is_refused_at_once():
    # the user's reproducer: 1e12 steps with save_every=10**15 ran for ever
    _refused_fast(lambda: SelfAttentionDynamics(1.0).solve(_sphere(), 1e9, 1e-3, save_every=10**15),
                  r"t1 / dt = 1e\+09 / 0.001 asks for 1e\+12 time steps, more than the limit of "
                  r"100000000 steps per solve; use a larger dt or a shorter t1, or raise the limit "
                  r"with the environment variable CTFORMER_MAX_STEPS")


def test_overflowing_step_count_is_refused_not_an_overflow_error():
    # the user's reproducer: t1 / dt = inf ended in OverflowError from math.ceil
    _refused_fast(lambda: SelfAttentionDynamics(1.0).solve(_sphere(), 1e300, 1e-300),
                  r"t1 / dt = 1e\+300 / 1e-300 asks for an overflowing number of time steps")


def test_mean_field_horizon_is_refused_at_once():
    rho = np.full(16, 1.0 / (2 * np.pi))
    _refused_fast(lambda: CircleMeanField(1.0, 16).solve(rho, 1e9, 0.1, save_every=10**12),
                  r"t1 / dt = 1e\+09 / 0.1 asks for 1e\+10 time steps")


def test_steps_per_layer_beyond_the_limit_are_refused_over_all_layers():
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    grids = dict(tokens=Midpoint(4), features=GaussLegendre(4))
    _refused_fast(lambda: model.solve(np.ones((4, 4)), steps_per_layer=10**12, **grids),
                  r"steps_per_layer = 1000000000000 over 2 layers asks for 2e\+12 time steps, more "
                  r"than the limit of 100000000 steps per solve; use a smaller steps_per_layer")
    # the limit counts all layers: 10**8 per layer over 2 layers is 2e8
    _refused_fast(lambda: model.solve(np.ones((4, 4)), steps_per_layer=10**8, **grids), "2e\\+08")
    assert check_steps(5 * 10**7, 2) == 5 * 10**7  # exactly at the limit: accepted


def test_the_limit_is_exact_and_the_environment_overrides_it(monkeypatch):
    assert max_steps() == MAX_STEPS == 10**8
    assert time_steps(1.0, 1e-8, 1)[0] == 10**8
    with pytest.raises(ValueError, match="limit of 100000000"):
        time_steps(1.0, 0.99e-8, 1)
    monkeypatch.setenv("CTFORMER_MAX_STEPS", "10")
    assert time_steps(1.0, 0.1, 1) == (10, 0.1)
    with pytest.raises(ValueError, match=r"t1 / dt = 1.1 / 0.1 asks for 11 time steps, more than "
                                         r"the limit of 10 steps"):
        time_steps(1.1, 0.1, 1)
    with pytest.raises(ValueError, match="limit of 10 steps"):
        SelfAttentionDynamics(1.0).solve(_sphere(), 2.0, 0.1)
    assert len(SelfAttentionDynamics(1.0).solve(_sphere(), 1.0, 0.1)) == 11  # t = 0 and 10 steps
    for bad in ("0", "-3", "many", "1.5"):
        monkeypatch.setenv("CTFORMER_MAX_STEPS", bad)
        with pytest.raises(ValueError, match=f"CTFORMER_MAX_STEPS must be a positive integer, got '{bad}'"):
            max_steps()


class _Counting(solvers.Scheme):
    """Euler that counts its steps (and the step sizes)."""

    name = "counting"
    nominal_order = 1.0

    def __init__(self):
        self.sizes = []

    def step(self, problem, u, dt):
        self.sizes.append(dt)
        return u + dt * sum(f(u) for f in problem.flows)


_t1 = st.one_of(st.sampled_from([0.0, 1e-300, 5e-324, 1.0, 3.0, 1e9, 1e300, math.inf, math.nan, -1.0]),
                st.floats(0.0, 10.0))
_dt = st.one_of(st.sampled_from([1e-300, 5e-324, 1e-9, 0.1, 0.7, 1.0, 1e300, 0.0, -0.1, math.inf, math.nan]),
                st.floats(1e-3, 10.0))
_save = st.one_of(st.sampled_from([1, 2, 3, 10**15, 0, -1]), st.integers(1, 50))


def _steps_or_refusal(call, t1, dt, save_every, limit=200, other=None):
    """Either a ValueError naming the offending argument, or a solve with ceil(t1/dt) steps.

    ``other`` is a further refusal of a valid grid (the mean field's stable-step bound)."""
    try:
        result = call()
    except ValueError as exc:
        text = str(exc)
        ratio = t1 / dt if dt > 0 and math.isfinite(dt) and math.isfinite(t1) else math.nan
        if not (math.isfinite(t1) and t1 >= 0):
            assert text.startswith("t1 must be finite"), text
        elif not (math.isfinite(dt) and dt > 0):
            assert text.startswith("dt must be finite"), text
        elif save_every < 1:
            assert text.startswith("save_every must be a positive integer"), text
        elif other is not None and other in text:
            assert "dt" in text, text
        else:
            assert not ratio * (1 - 1e-12) <= limit, (t1, dt)
            assert "t1 / dt" in text and f"limit of {limit} steps" in text, text
        return None
    expected = math.ceil(t1 / dt * (1 - 1e-12)) if t1 > 0 else 0
    assert expected <= limit
    return result, expected


@given(t1=_t1, dt=_dt, save_every=_save)
@SETTINGS
def test_particle_grid_is_refused_naming_the_arguments_or_takes_the_documented_steps(
        t1, dt, save_every, monkeypatch):
    monkeypatch.setenv("CTFORMER_MAX_STEPS", "200")  # small enough to solve what is accepted
    scheme = _Counting()
    got = _steps_or_refusal(lambda: SelfAttentionDynamics(1.0).solve(_sphere(), t1, dt, scheme=scheme,
                                                                     save_every=save_every),
                            t1, dt, save_every)
    if got is None:
        assert scheme.sizes == []  # refused before the first step
        return
    path, expected = got
    assert len(scheme.sizes) == expected
    if expected:
        np.testing.assert_allclose(scheme.sizes, t1 / expected, rtol=1e-15)
        assert scheme.sizes[0] <= dt * (1 + 1e-12)
    saved = 1 + expected // save_every + (1 if expected % save_every else 0)
    assert len(path) == saved
    assert path.times[0] == 0.0 and path.times[-1] == pytest.approx(t1 if expected else 0.0, rel=1e-14)


@given(t1=_t1, dt=_dt, save_every=_save)
@SETTINGS
def test_mean_field_grid_is_refused_naming_the_arguments_or_takes_the_documented_steps(
        t1, dt, save_every, monkeypatch):
    monkeypatch.setenv("CTFORMER_MAX_STEPS", "200")
    field = CircleMeanField(1.0, 16)
    rho = np.full(16, 1.0 / (2 * np.pi))
    got = _steps_or_refusal(lambda: field.solve(rho, t1, dt, save_every=save_every), t1, dt,
                            save_every, other="stable")
    if got is None:
        return
    solution, expected = got
    saved = 1 + expected // save_every + (1 if expected % save_every else 0)
    assert len(solution.times) == saved
    # the uniform density is a steady state (X[rho] = 0): every saved density equals it
    np.testing.assert_allclose(np.asarray(solution.density), 1.0 / (2 * np.pi), rtol=1e-13)
    assert solution.times[-1] == pytest.approx(t1 if expected else 0.0, rel=1e-14)

"""Restarts continue one computation: the saved step, the saved system, the start of a solve.

* A fixed-step restart with another step was accepted: particles saved with dt=0.1 and
  continued with dt=0.05 ended 3.1e-11 from the uninterrupted dt=0.05 solve (3.2e-11 from the
  dt=0.1 one), a mean field 1.9e-13, and a model saved with steps_per_layer=3 continued with 5
  ended 1.3e-4 from the uninterrupted solve with 5. The step is now part of what a restart
  compares, refused by name with the saved value.
* A mean field with another beta or noise: refused through the system's fingerprint.
* A controlled solve saved with SaveAt(layers=True) that stopped inside layer 0 keeps only its
  initial state at t=0: restarting there is a new solve, the same bits as the uninterrupted one.
* The sphere classes' own ``to_xarray(attrs=...)`` let their attributes win silently.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import SaveAt, solvers
from ctformer.particles import CircleMeanField, SelfAttentionDynamics, ZonalMeanField

from .conftest import require
from .test_restart import EVERY, GRIDS, MODEL, _saved, _u0  # the same model, grids and files

require("xarray")
require("zarr")



def _sphere(x):
    x0 = 3.0 * np.random.default_rng(0).standard_normal((12, 3))
    return x0 / np.linalg.norm(x0, axis=1, keepdims=True)


def test_a_particle_restart_with_another_dt_is_refused(tmp_path):
    system, x0 = SelfAttentionDynamics(beta=2.0), _sphere(None)
    part = system.evolve(x0, 0.5, dt=0.1, save_at=EVERY)
    for initial in (part, _saved(part, tmp_path / "p.zarr")):
        with pytest.raises(ValueError, match=r"dt: saved '0.1', now '0.05'"):
            system.evolve(None, 1.0, dt=0.05, save_at=EVERY, initial=initial)
        # the same step h = t1 / ceil(t1 / dt) for another t1: the uninterrupted bits
        rest = system.evolve(None, 1.0, dt=0.1, save_at=EVERY, initial=initial)
        np.testing.assert_array_equal(rest.final, system.evolve(x0, 1.0, dt=0.1).final)


def test_a_mean_field_restart_with_another_dt_is_refused(tmp_path):
    field = CircleMeanField(beta=2.0, n_modes=32)

    def rho0(theta):
        return (1 + 0.1 * np.cos(theta)) / (2 * np.pi)

    part = field.evolve(rho0, 0.5, dt=0.1, save_at=EVERY)
    for initial in (part, _saved(part, tmp_path / "m.zarr")):
        with pytest.raises(ValueError, match=r"dt: saved '0.1', now '0.05'"):
            field.evolve(None, 1.0, dt=0.05, initial=initial)


def test_a_model_restart_with_other_steps_per_layer_is_refused(tmp_path):
    options = dict(scheme="strang", save_at=SaveAt(layers=True), **GRIDS)
    full = MODEL.evolve(_u0, steps_per_layer=3, **options)
    first = MODEL.evolve(_u0, steps_per_layer=3, **options)
    first.times, first.states = first.times[:2], first.states[:2]  # as if stopped at depth 1
    for initial in (first, _saved(first, tmp_path / "f.zarr")):
        with pytest.raises(ValueError, match=r"steps_per_layer: saved 3, now 5"):
            MODEL.evolve(None, steps_per_layer=5, initial=initial, **options)
        rest = MODEL.evolve(None, steps_per_layer=3, initial=initial, **options)
        np.testing.assert_array_equal(rest.states, full.states[1:])


def test_a_mean_field_restart_with_another_beta_or_noise_is_refused():
    require("ducc0")

    def rho0(s):
        return (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)

    part = ZonalMeanField(4.0, 3, 12, noise=0.05).evolve(rho0, 1.0, dt=0.05, save_at=EVERY)
    for other in (ZonalMeanField(4.5, 3, 12, noise=0.05), ZonalMeanField(4.0, 3, 12, noise=0.06)):
        with pytest.raises(ValueError, match="another computation .model_fingerprint: saved"):
            other.evolve(None, 2.0, dt=0.05, initial=part)


def test_a_controlled_solve_stopped_in_layer_zero_restarts_as_a_new_solve(tmp_path):
    options = dict(rtol=1e-7, save_at=SaveAt(layers=True), **GRIDS)
    full = MODEL.evolve(_u0, **options)
    with pytest.raises(solvers.MaxStepsReached) as info:
        MODEL.evolve(_u0, max_steps=1, **options)
    part = info.value.solution
    assert list(part.times) == [0.0] and part.stats["step_times"][-1] > 0.0
    for initial in (part, _saved(part, tmp_path / "z.zarr")):
        rest = MODEL.evolve(None, initial=initial, **options)
        np.testing.assert_array_equal(rest.states, full.states)
        np.testing.assert_array_equal(rest.stats["step_times"], full.stats["step_times"])


def test_sphere_to_xarray_refuses_attrs_naming_its_own():
    require("ducc0")
    solution = ZonalMeanField(2.0, 3, 6).solve(lambda s: (1 + 0.5 * s) / (4 * np.pi), 0.2, 0.1)
    with pytest.raises(ValueError, match=r"max_degree \(the result's: 6\).*'run_max_degree'"):
        solution.to_xarray(attrs={"max_degree": 3})
    with pytest.raises(ValueError, match=r"ctformer_result \(the result's: 'ZonalSolution'\)"):
        solution.to_xarray(attrs={"ctformer_result": "mine"})
    ds = solution.to_xarray(attrs={"run": "a"})
    assert ds.attrs["run"] == "a" and ds.attrs["max_degree"] == 6


def test_files_record_the_fixed_step_and_the_field(tmp_path):
    """A fixed-step solve's file says its step (dt = t1 / ceil(t1 / dt), or steps_per_layer) and
    where it began; a circle mean field's says beta (they were only in the fingerprint)."""
    system, x0 = SelfAttentionDynamics(beta=2.0), _sphere(None)
    part = system.evolve(x0, 0.5, dt=0.1, save_at=EVERY)
    rest = system.evolve(None, 1.0, dt=0.1, initial=part)
    for solution, t0 in ((part, 0.0), (rest, 0.5)):
        attrs = _saved(solution, tmp_path / f"s{t0}.zarr").attrs
        assert attrs["t0"] == t0 and attrs["dt"] == pytest.approx(0.1, rel=1e-15)
    model = MODEL.evolve(_u0, steps_per_layer=3, save_at=SaveAt(layers=True), **GRIDS)
    assert _saved(model, tmp_path / "m.zarr").attrs["steps_per_layer"] == 3
    controlled = _saved(MODEL.evolve(_u0, rtol=1e-6, **GRIDS), tmp_path / "c.zarr").attrs
    assert "steps_per_layer" not in controlled and "dt" not in controlled
    field = CircleMeanField(beta=2.5, n_modes=16, normalized=False)
    ds = field.solve(lambda theta: 1 + 0 * theta, 0.04, 0.02).to_xarray()
    assert ds.attrs["beta"] == 2.5 and ds.attrs["normalized"] == 0

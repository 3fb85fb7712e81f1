"""Exact restarts: a solve continued from a saved file gives the bits of the uninterrupted solve.

The reference is the uninterrupted solve itself; the interrupted one is a real early end
(``max_steps`` reached, with the solution so far on the exception), written to a zarr store or
a netCDF file and read back with ``ctformer.labelled.open_dataset``.
"""
from __future__ import annotations

import numpy as np
import pytest

import ctformer
from ctformer import SaveAt, labelled, solvers
from ctformer.discretizations import GaussLegendre
from ctformer.particles import CircleMeanField, SelfAttentionDynamics

from .conftest import require

require("xarray")
require("zarr")

MODEL = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
GRIDS = dict(tokens=GaussLegendre(8), features=GaussLegendre(6))
EVERY = SaveAt(steps=True)


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


def _saved(solution, path):
    """Write ``solution`` as a zarr store and read it back (the restart reads the file)."""
    labelled.to_zarr(solution, path)
    return labelled.open_dataset(path)


def _interrupted(run):
    with pytest.raises(solvers.MaxStepsReached) as info:
        run()
    return info.value.solution


def test_model_restart_after_max_steps_is_bit_identical(tmp_path):
    full = MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, **GRIDS)
    part = _interrupted(lambda: MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, max_steps=6, **GRIDS))
    k = len(part.times) - 1
    assert 0 < part.times[-1] < 3 and k == part.stats["accepted"]
    rest = MODEL.evolve(None, rtol=1e-7, save_at=EVERY, initial=_saved(part, tmp_path / "a.zarr"),
                        **GRIDS)
    np.testing.assert_array_equal(rest.times, full.times[k:])
    np.testing.assert_array_equal(rest.states, full.states[k:])
    np.testing.assert_array_equal(rest.final, full.final)


def test_fixed_step_restart_at_a_layer_boundary(tmp_path):
    full = MODEL.evolve(_u0, scheme="strang", steps_per_layer=3, save_at=SaveAt(layers=True), **GRIDS)
    first = MODEL.evolve(_u0, scheme="strang", steps_per_layer=3, save_at=SaveAt(layers=True),
                         **GRIDS)
    first.times, first.states = first.times[:2], first.states[:2]  # as if stopped at depth 1
    rest = MODEL.evolve(None, scheme="strang", steps_per_layer=3, save_at=SaveAt(layers=True),
                        initial=_saved(first, tmp_path / "f.zarr"), **GRIDS)
    np.testing.assert_array_equal(rest.states, full.states[1:])


def test_particle_and_mean_field_restarts(tmp_path):
    rng = np.random.default_rng(0)
    x0 = rng.standard_normal((32, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    dynamics = SelfAttentionDynamics(beta=4.0)
    full = dynamics.evolve(x0, 3.0, rtol=1e-8, save_at=EVERY)
    part = _interrupted(lambda: dynamics.evolve(x0, 3.0, rtol=1e-8, save_at=EVERY, max_steps=7))
    rest = dynamics.evolve(None, 3.0, rtol=1e-8, save_at=EVERY,
                           initial=_saved(part, tmp_path / "p.zarr"))
    np.testing.assert_array_equal(rest.states, full.states[len(part.times) - 1:])

    field = CircleMeanField(beta=2.0, n_modes=64)

    def rho0(theta):
        return (1 + 0.1 * np.cos(theta)) / (2 * np.pi)

    full = field.evolve(rho0, 2.0, rtol=1e-9, save_at=EVERY)
    part = _interrupted(lambda: field.evolve(rho0, 2.0, rtol=1e-9, save_at=EVERY, max_steps=4))
    rest = field.evolve(None, 2.0, rtol=1e-9, save_at=EVERY, initial=_saved(part, tmp_path / "m.zarr"))
    np.testing.assert_array_equal(rest.states, full.states[len(part.times) - 1:])


def test_restarts_that_cannot_be_exact_are_refused():
    times = np.array([0.3, 0.7])
    sol = MODEL.evolve(_u0, rtol=1e-6, save_at=SaveAt(times=times), **GRIDS)
    with pytest.raises(ValueError, match="not the end of an accepted step"):
        MODEL.evolve(None, rtol=1e-6, initial=sol, **GRIDS)
    fixed = MODEL.evolve(_u0, steps_per_layer=2, save_at=SaveAt(steps=True), **GRIDS)
    with pytest.raises(ValueError, match="no step history"):
        MODEL.evolve(None, rtol=1e-6, initial=fixed, **GRIDS)
    fixed.times, fixed.states = fixed.times[:2], fixed.states[:2]  # ends at depth 0.5
    with pytest.raises(ValueError, match="restarts at a layer boundary"):
        MODEL.evolve(None, steps_per_layer=2, initial=fixed, **GRIDS)
    with pytest.raises(ValueError, match="u0 and initial both given"):
        MODEL.evolve(_u0, steps_per_layer=2, initial=fixed, **GRIDS)
    with pytest.raises(TypeError, match="initial must be a ctformer.Solution"):
        MODEL.evolve(None, initial=3.0, **GRIDS)


def test_particles_and_circle_refuse_a_restart_by_another_scheme(rng):
    x0 = rng.standard_normal((12, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    dynamics = SelfAttentionDynamics(beta=4.0)
    part = dynamics.evolve(x0, 0.5, rtol=1e-8, scheme="tsit5")
    with pytest.raises(ValueError, match="solved with scheme 'tsit5'.*scheme='tsit5'"):
        dynamics.evolve(None, 1.0, rtol=1e-8, scheme="dopri5", initial=part)
    field = CircleMeanField(beta=2.0, n_modes=32)
    part = field.evolve(lambda th: (1 + 0.3 * np.cos(th)) / (2 * np.pi), 0.5, dt=0.01, scheme="rk4")
    with pytest.raises(ValueError, match="solved with scheme 'rk4'.*scheme='rk4'"):
        field.evolve(None, 1.0, dt=0.01, scheme="heun", initial=part)


@pytest.mark.parametrize("where", ["memory", "netcdf", "xarray"])
def test_a_model_restart_refuses_another_computation(where, tmp_path):
    """Another model (seed), grid, tolerance or control than the saved solve's is named; the same
    computation still continues with the bits of the uninterrupted solve."""
    xr = require("xarray")
    part = _interrupted(lambda: MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, max_steps=4, **GRIDS))
    if where != "memory":
        labelled.to_netcdf(part, tmp_path / "part.nc")
        part = (labelled.open_dataset(tmp_path / "part.nc") if where == "netcdf"
                else xr.open_dataset(tmp_path / "part.nc").load())
    other = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=3)
    cases = [(other, dict(rtol=1e-7, **GRIDS), "model_fingerprint"),
             (MODEL, dict(rtol=1e-7, tokens=ctformer.discretizations.Midpoint(8),
                          features=GaussLegendre(6)), "tokens: saved 'GaussLegendre"),
             (MODEL, dict(rtol=1e-6, **GRIDS), "rtol: saved 1e-07, now 1e-06"),
             (MODEL, dict(rtol=1e-7, atol=1e-10, **GRIDS), "atol: saved 1e-09, now 1e-10")]
    for model, options, named in cases:
        with pytest.raises(ValueError, match=f"another computation .*{named}"):
            model.evolve(None, save_at=EVERY, initial=part, **options)
    full = MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, **GRIDS)
    rest = MODEL.evolve(None, rtol=1e-7, save_at=EVERY, initial=part, **GRIDS)
    np.testing.assert_array_equal(rest.final, full.final)


def test_a_fixed_step_restart_of_a_controlled_solve_is_refused():
    part = MODEL.evolve(_u0, rtol=1e-7, save_at=SaveAt(layers=True), **GRIDS)
    part.times, part.states = part.times[:2], part.states[:2]  # as if stopped at depth 1
    with pytest.raises(ValueError, match=r"rtol: saved 1e-07, now 'none \(fixed steps\)'"):
        MODEL.evolve(None, scheme="tsit5", steps_per_layer=2, initial=part, **GRIDS)


def test_the_model_fingerprint_sees_other_weights_and_not_a_copy():
    from ctformer.solvers.restart_identity import model_fingerprint

    same = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
    assert model_fingerprint(same) == model_fingerprint(MODEL)
    assert model_fingerprint(ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2)) != \
        model_fingerprint(MODEL)
    changed = {name: values * (1 + 1e-15) for name, values in MODEL.parameters().items()}
    assert model_fingerprint(MODEL.with_parameters(changed)) != model_fingerprint(MODEL)

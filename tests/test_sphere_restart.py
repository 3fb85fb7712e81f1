"""Exact restarts of the sphere mean fields: ``ZonalMeanField.evolve`` and
``SphericalMeanField.evolve`` continued from a saved solve give the bits of the uninterrupted one.

The reference is the uninterrupted solve itself. An error-controlled solve is stopped for real
(``max_steps`` reached, the solution so far on the exception); a fixed-step one is cut after k
steps. The saved part goes through each form a restart accepts: the Solution, its
``to_xarray()`` dataset, a netCDF file and a zarr store read back (by xarray alone or by
``ctformer.labelled.open_dataset``).
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import SaveAt, labelled, solvers
from ctformer.particles import SphericalMeanField, ZonalMeanField

from .conftest import require

xr = require("xarray")
EVERY = SaveAt(steps=True)


def _zonal_rho(s):
    return (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)


def _sphere_rho(x):
    return (1 + 0.3 * x[..., 2] + 0.2 * x[..., 0] * x[..., 1]) / (4 * np.pi)


def _stopped(run):
    with pytest.raises(solvers.MaxStepsReached) as info:
        run()
    return info.value.solution


def _forms(solution, tmp_path):
    """The saved solve as a restart may be given it: the Solution, its dataset, two files."""
    require("h5netcdf")
    require("zarr")
    solution.to_netcdf(tmp_path / "part.nc")
    solution.to_zarr(tmp_path / "part.zarr")
    return {"solution": solution, "dataset": solution.to_xarray(),
            "netcdf (xarray)": xr.open_dataset(tmp_path / "part.nc", engine="h5netcdf"),
            "zarr (ctformer)": labelled.open_dataset(tmp_path / "part.zarr")}


def _assert_continues(rest, full, k, label):
    """``rest`` is ``full`` from its k-th saved state on, bit for bit (times, states, final)."""
    assert np.array_equal(rest.times, full.times[k:]), label
    assert np.array_equal(rest.states, full.states[k:]), label
    assert np.array_equal(rest.final, full.final), label
    assert rest.states.dtype == full.states.dtype, label


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_zonal_controlled_restart_is_bit_identical(tmp_path, noise):
    """d = 3, L = 16, tsit5 at rtol 1e-8 to t1 = 3 (19 accepted steps), stopped after 5: the
    continued solve from each saved form has the uninterrupted times and states (with noise the
    state ends with the integrating factor's clock, 0 after every step)."""
    field = ZonalMeanField(4.0, 3, 16, noise=noise)
    full = field.evolve(_zonal_rho, 3.0, rtol=1e-8, save_at=EVERY)
    part = _stopped(lambda: field.evolve(_zonal_rho, 3.0, rtol=1e-8, save_at=EVERY, max_steps=5))
    k = len(part.times) - 1
    assert k == 5 and len(full.times) > k + 5 and 0 < part.times[-1] < 3.0
    for label, initial in _forms(part, tmp_path).items():
        rest = field.evolve(None, 3.0, rtol=1e-8, save_at=EVERY, initial=initial)
        _assert_continues(rest, full, k, label)
        assert rest.stats["accepted"] == full.stats["accepted"] - k, label


def test_spherical_controlled_restart_is_bit_identical(tmp_path):
    """S^2, L = 8 (45 complex a_lm and the noise clock), stopped after 4 accepted steps: the
    complex coefficients come back from the files' (re, im) pairs exactly."""
    require("ducc0")
    field = SphericalMeanField(3.0, 8, noise=0.02)
    full = field.evolve(_sphere_rho, 2.0, rtol=1e-8, save_at=EVERY)
    part = _stopped(lambda: field.evolve(_sphere_rho, 2.0, rtol=1e-8, save_at=EVERY, max_steps=4))
    k = len(part.times) - 1
    assert k == 4 and full.states.shape[1] == 46 and np.iscomplexobj(full.states)
    for label, initial in _forms(part, tmp_path).items():
        _assert_continues(field.evolve(None, 2.0, rtol=1e-8, save_at=EVERY, initial=initial),
                          full, k, label)
    final_only = field.evolve(None, 2.0, rtol=1e-8, initial=part)
    assert np.array_equal(final_only.final, full.final)


def test_fixed_step_restarts_continue_the_same_grid(tmp_path):
    """rk4 with dt = 0.01 to t1 = 2 (200 steps), cut after k = 70 (t0 = 0.7): the remaining 130
    steps have the uninterrupted states and times (k + s) h; computed as k h + s h instead, 45 of
    those times would differ in the last bit."""
    require("ducc0")
    zonal, sphere = ZonalMeanField(4.0, 3, 12, noise=0.05), SphericalMeanField(3.0, 6)
    for field, rho in ((zonal, _zonal_rho), (sphere, _sphere_rho)):
        full = field.evolve(rho, 2.0, dt=0.01, scheme="rk4", save_at=EVERY)
        assert len(full.times) == 201
        part = field.evolve(rho, 2.0, dt=0.01, scheme="rk4", save_at=EVERY)
        part.times, part.states = part.times[:71], part.states[:71]
        for label, initial in _forms(part, tmp_path).items():
            rest = field.evolve(None, 2.0, dt=0.01, scheme="rk4", save_at=EVERY, initial=initial)
            _assert_continues(rest, full, 70, f"{field!r}: {label}")
    h = 2.0 / 200
    assert sum(70 * h + s * h != (70 + s) * h for s in range(1, 131)) == 45


def test_mismatched_restarts_are_refused(tmp_path):
    require("ducc0")
    field = ZonalMeanField(4.0, 3, 16, noise=0.05)
    part = _stopped(lambda: field.evolve(_zonal_rho, 3.0, rtol=1e-8, save_at=EVERY, max_steps=5))
    t0 = part.times[-1]
    with pytest.raises(ValueError, match=r"shape \(18,\) .*degree, noise"):
        ZonalMeanField(4.0, 3, 12, noise=0.05).evolve(None, 3.0, rtol=1e-8, initial=part)
    quiet = _stopped(lambda: ZonalMeanField(4.0, 3, 17).evolve(_zonal_rho, 3.0, rtol=1e-8,
                                                                 max_steps=5, save_at=EVERY))
    with pytest.raises(ValueError, match="not the noise clock"):  # 18 values, no clock
        field.evolve(None, 3.0, rtol=1e-8, initial=quiet)
    with pytest.raises(ValueError, match="complex states of shape"):
        SphericalMeanField(4.0, 4).evolve(None, 3.0, rtol=1e-8, initial=part)
    with pytest.raises(ValueError, match="solved with scheme 'tsit5'.*scheme='tsit5'"):
        field.evolve(None, 3.0, scheme="dopri5", rtol=1e-8, initial=part.to_xarray())
    with pytest.raises(ValueError, match="not before t1"):
        field.evolve(None, t0, rtol=1e-8, initial=part)
    with pytest.raises(ValueError, match="not before t1"):
        field.evolve(None, 0.5 * t0, rtol=1e-8, initial=part)
    with pytest.raises(ValueError, match="rho0 and initial both given"):
        field.evolve(_zonal_rho, 3.0, rtol=1e-8, initial=part)
    with pytest.raises(ValueError, match="no step history"):
        fixed = field.evolve(_zonal_rho, 1.0, dt=0.01, scheme="rk4", save_at=EVERY)
        fixed.times, fixed.states = fixed.times[:32], fixed.states[:32]
        field.evolve(None, 3.0, rtol=1e-8, initial=fixed)
    with pytest.raises(ValueError, match="not on it"):   # cut at 0.31 with dt 0.01, then dt 0.02
        field.evolve(None, 1.0, dt=0.02, scheme="rk4", initial=fixed)
    with pytest.raises(ValueError, match="not on it"):   # the same dt, another t1: another grid
        field.evolve(None, 1.0 + 1e-9, dt=0.01, scheme="rk4", initial=fixed)
    with pytest.raises(ValueError, match="solved with scheme 'rk4'"):
        field.evolve(None, 1.0, dt=0.01, scheme="heun", initial=fixed)

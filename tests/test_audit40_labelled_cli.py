"""Audit of labelled results and restarts from files: what a file says, and what it continues.

Each reference is independent of the code under test: the step the solve was asked for, the
uninterrupted solve's bits, or the attribute read back by xarray alone.
"""
from __future__ import annotations

import numpy as np
import pytest

import ctformer
from ctformer import SaveAt, labelled
from ctformer.particles import CircleMeanField, SelfAttentionDynamics
from ctformer.solvers import Event, PIController
from ctformer.solvers.restart_identity import recorded

from .conftest import require

xr = require("xarray")
require("h5netcdf")

EVERY = SaveAt(steps=True)
GRIDS = dict(tokens="midpoint", features="gauss-legendre")


def _sphere(n=5, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _dataset(solution, path):
    """The file read back by xarray alone (what a user may pass as initial)."""
    labelled.to_netcdf(solution, path)
    with xr.open_dataset(path, engine="h5netcdf") as opened:
        return opened.load()


def test_a_restart_from_an_xarray_dataset_refuses_another_step_or_controller(tmp_path):
    # before: recorded() read the Dataset's raw attributes (control_json, no step_times), so
    # dt=0.2 or another PI controller continued a dt=0.1 / default-controller solve unrefused
    system, x0 = SelfAttentionDynamics(beta=1.0), _sphere()
    part = system.evolve(x0, 1.0, dt=0.1, save_at=EVERY)
    ds = _dataset(part, tmp_path / "fixed.nc")
    assert recorded(ds) == recorded(part) == {"model_fingerprint": part.model_fingerprint, "dt": "0.1"}
    with pytest.raises(ValueError, match=r"another computation \(dt: saved '0.1', now '0.2'\)"):
        system.evolve(None, 2.0, dt=0.2, initial=ds)
    rest = system.evolve(None, 2.0, dt=0.1, initial=ds)
    np.testing.assert_array_equal(rest.final, system.evolve(x0, 2.0, dt=0.1).final)

    adaptive = system.evolve(x0, 1.0, save_at=EVERY)
    ds = _dataset(adaptive, tmp_path / "adaptive.nc")
    with pytest.raises(ValueError, match=r"another computation .*pcoeff: saved 0.4, now 0.0"):
        system.evolve(None, 2.0, controller=PIController(pcoeff=0.0, icoeff=1.0), initial=ds)

    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    u0 = np.random.default_rng(0).standard_normal((8, 6))
    first = model.evolve(u0, steps_per_layer=3, save_at=SaveAt(layers=True), **GRIDS)
    first.times, first.states = first.times[:2], first.states[:2]  # as if stopped at depth 1
    with pytest.raises(ValueError, match=r"steps_per_layer: saved 3, now 5"):
        model.evolve(None, steps_per_layer=5, initial=labelled.to_xarray(first), **GRIDS)


def test_a_fixed_step_solve_stopped_by_a_terminal_event_records_its_own_step(tmp_path):
    # before: the event's depth 0.6 was read as the end of the third step: dt 0.6 / 3 = 0.2
    # and steps_per_layer round(3 / 0.6) = 5 were written for steps of 0.25
    stop = Event(lambda t, u: t - 0.6)
    part = SelfAttentionDynamics(beta=1.0).evolve(_sphere(), 1.0, dt=0.25, events=[stop], save_at=EVERY)
    assert part.event_terminal and part.stats["step_times"][-1] == 0.6
    labelled.to_netcdf(part, tmp_path / "p.nc")
    with xr.open_dataset(tmp_path / "p.nc", engine="h5netcdf") as saved:
        assert float(saved.attrs["dt"]) == 0.25
    assert recorded(labelled.open_dataset(tmp_path / "p.nc"))["dt"] == recorded(part)["dt"] == "0.25"

    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    sol = model.evolve(np.random.default_rng(0).standard_normal((8, 6)), steps_per_layer=4,
                       events=[stop], **GRIDS)
    assert sol.event_time == 0.6 and sol.stats["accepted"] == 3
    assert labelled.to_xarray(sol).attrs["steps_per_layer"] == 4
    assert recorded(sol)["steps_per_layer"] == 4


def test_a_restart_from_a_saved_solve_result_is_refused(tmp_path):
    # before: a Trajectory or mean-field file of solve (no fingerprint, dt or scheme) continued
    # under beta=5 where it was solved with beta=2, and with any dt; in memory it was refused
    field = CircleMeanField(beta=2.0, n_modes=16)
    solved = field.solve(lambda th: (1 + 0.2 * np.cos(2 * th)) / (2 * np.pi), 1.0, dt=0.1)
    labelled.to_netcdf(solved, tmp_path / "m.nc")
    for initial in (labelled.open_dataset(tmp_path / "m.nc"), _dataset(solved, tmp_path / "n.nc")):
        with pytest.raises(TypeError, match="saved MeanFieldSolution, the result of solve"):
            CircleMeanField(beta=5.0, n_modes=16).evolve(None, 2.0, dt=0.1, initial=initial)
    system = SelfAttentionDynamics(beta=1.0)
    trajectory = system.solve(_sphere(), 1.0, dt=0.1)
    labelled.to_zarr(trajectory, tmp_path / "t.zarr")
    with pytest.raises(TypeError, match=r"saved Trajectory.*must be a saved ctformer.Solution"):
        system.evolve(None, 2.0, dt=0.1, initial=labelled.open_dataset(tmp_path / "t.zarr"))
    with pytest.raises(TypeError, match="initial must be a ctformer.Solution"):  # as in memory
        system.evolve(None, 2.0, dt=0.1, initial=trajectory)


def test_an_extra_attribute_named_json_must_hold_json(tmp_path):
    # before: attrs={"note_json": "hello"} was written, and open_dataset of that file failed
    # with a bare JSONDecodeError
    part = SelfAttentionDynamics(beta=1.0).evolve(_sphere(), 0.5, dt=0.25)
    with pytest.raises(ValueError, match=r"attrs: 'note_json' ends in '_json'.*e.g. 'note'"):
        labelled.to_netcdf(part, tmp_path / "a.nc", attrs={"note_json": "hello"})
    assert not (tmp_path / "a.nc").exists()
    labelled.to_netcdf(part, tmp_path / "b.nc", attrs={"note_json": '{"seed": 3}'})
    assert labelled.open_dataset(tmp_path / "b.nc").attrs["note"] == {"seed": 3}
    with xr.open_dataset(tmp_path / "b.nc", engine="h5netcdf") as saved:
        assert saved.attrs["note_json"] == '{"seed": 3}'


def test_a_converter_called_directly_keeps_the_results_own_attributes():
    # before: labelled.solution_to_xarray(s, attrs={"rtol": 1e-3}) wrote 0.001 over the solve's
    # 1e-06 (only to_xarray checked); the file then misreported the tolerance
    part = SelfAttentionDynamics(beta=1.0).evolve(_sphere(), 0.5, rtol=1e-6)
    with pytest.raises(ValueError, match=r"rtol \(the result's: 1e-06\).*'run_rtol'"):
        labelled.solution_to_xarray(part, attrs={"rtol": 1e-3})
    ds = labelled.solution_to_xarray(part, attrs={"run_rtol": 1e-3})
    assert (ds.attrs["rtol"], ds.attrs["run_rtol"]) == (1e-6, 1e-3)
    trajectory = SelfAttentionDynamics(beta=1.0).solve(_sphere(), 0.5, dt=0.25)
    with pytest.raises(ValueError, match=r"ctformer_result \(the result's: 'Trajectory'\)"):
        labelled.trajectory_to_xarray(trajectory, attrs={"ctformer_result": "mine"})


@pytest.mark.parametrize("name", ["rtol", "atol", "norm", "control", "steps_per_layer", "event_time"])
def test_names_a_restart_reads_are_refused_even_where_the_result_writes_none(tmp_path, name):
    # a fixed-step solve writes no rtol: attrs={"rtol": 1e-3} was written, and the file then
    # claimed error control (a restart from it was refused with a confusing message)
    system = SelfAttentionDynamics(beta=1.0)
    fixed = system.evolve(_sphere(), 0.5, dt=0.1)
    assert "rtol" not in fixed.to_xarray().attrs
    with pytest.raises(ValueError, match=rf"{name}(_json)? \(read by a restart from the file\)"):
        fixed.to_xarray(attrs={name: {"a": 1} if name == "control" else 1e-3})
    ds = fixed.to_xarray(attrs={"run_rtol": 1e-3})   # another name is written as given
    assert ds.attrs["run_rtol"] == 1e-3 and ds.attrs["dt"] == 0.1


def test_an_attribute_and_its_json_twin_are_refused(tmp_path):
    # open_dataset reads "x_json" back as "x": writing both kept one of them on reading
    fixed = SelfAttentionDynamics(beta=1.0).evolve(_sphere(), 0.5, dt=0.1)
    with pytest.raises(ValueError, match=r"both 'note' and 'note_json'.*keep one"):
        fixed.to_xarray(attrs={"note": "a", "note_json": '{"b": 2}'})
    with pytest.raises(ValueError, match=r"stats_rejected_json \(read back as the result's 'stats_rejected'\)"):
        fixed.to_xarray(attrs={"stats_rejected_json": "[7]"})
    back = labelled.open_dataset(labelled.to_netcdf(fixed, tmp_path / "f.nc", attrs={"note_json": '{"b": 2}'}))
    assert back.attrs["note"] == {"b": 2} and back.attrs["stats_rejected"] == fixed.stats["rejected"]


def test_an_integer_beyond_int64_is_written_and_read_back_exactly(tmp_path):
    # no netCDF type holds 2**70: h5py had failed ("Object dtype has no native HDF5 equivalent")
    fixed = SelfAttentionDynamics(beta=1.0).evolve(_sphere(), 0.5, dt=0.1)
    big, small = 2 ** 70 + 1, -(2 ** 63)
    path = labelled.to_netcdf(fixed, tmp_path / "big.nc", attrs={"seed": big, "offset": small})
    back = labelled.open_dataset(path)
    assert back.attrs["seed"] == big and type(back.attrs["seed"]) is int
    assert back.attrs["offset"] == small

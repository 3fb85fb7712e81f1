"""Edge cases of labelled files and the command line: each against an independent reference.

The references are the in-memory results (and the uninterrupted solve, for a restart), the
files that were there before a refused write, and the exit status and one line of the
command line.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

import ctformer
from ctformer import SaveAt, atomic, cli, cli_demo, labelled, solvers
from ctformer.discretizations import GaussLegendre
from ctformer.particles import CircleMeanField, SphericalMeanField, ZonalMeanField

from .conftest import require

xr = require("xarray")
MODEL = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2)
GRIDS = dict(tokens=GaussLegendre(8), features=GaussLegendre(6))
EVERY = SaveAt(steps=True)


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


def test_restart_from_netcdf_after_one_accepted_step(tmp_path):
    """netCDF reads a 1-D attribute of one value back as a number: the step history of a solve
    stopped after one step (stats_step_sizes, stats_step_errors) must come back as arrays, and
    the restart must give the uninterrupted solve's bits (before: IndexError)."""
    require("h5netcdf")
    require("zarr")
    full = MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, **GRIDS)
    with pytest.raises(solvers.MaxStepsReached) as info:
        MODEL.evolve(_u0, rtol=1e-7, save_at=EVERY, max_steps=1, **GRIDS)
    part = info.value.solution
    assert part.stats["accepted"] == 1 and part.stats["step_sizes"].shape == (1,)
    part.to_netcdf(tmp_path / "part.nc")
    part.to_zarr(tmp_path / "part.zarr")
    forms = {"netcdf": labelled.open_dataset(tmp_path / "part.nc"),
             "netcdf (xarray)": xr.open_dataset(tmp_path / "part.nc", engine="h5netcdf"),
             "zarr": labelled.open_dataset(tmp_path / "part.zarr")}
    back = forms["netcdf"].attrs
    for name in ("step_sizes", "step_errors"):
        assert back[f"stats_{name}"].shape == (1,)
        assert back[f"stats_{name}"].tobytes() == part.stats[name].tobytes()
    assert forms["zarr"].attrs["stats_step_sizes"].tobytes() == part.stats["step_sizes"].tobytes()
    assert back["stats_accepted"] == 1   # a number stays a number
    for label, initial in forms.items():
        rest = MODEL.evolve(None, rtol=1e-7, save_at=EVERY, initial=initial, **GRIDS)
        assert np.array_equal(rest.times, full.times[1:]), label
        assert rest.states.tobytes() == full.states[1:].tobytes(), label


def _zonal_rho(s):
    return (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)


def _sphere_rho(x):
    return (1 + 0.3 * x[..., 2] + 0.2 * x[..., 0] * x[..., 1]) / (4 * np.pi)


@pytest.mark.parametrize("kind", ["ZonalSolution", "SphericalSolution"])
def test_sphere_mean_fields_open_with_ctformer(tmp_path, kind):
    """A sphere mean field written by to_netcdf / to_zarr reads back through open_dataset
    (before: ValueError, 'expected one of ...'), the coefficients exactly (complex on S^2)."""
    require("h5netcdf")
    require("zarr")
    if kind == "ZonalSolution":
        solution = ZonalMeanField(4.0, 3, 12).solve(_zonal_rho, 0.2, dt=0.05)
    else:
        require("ducc0")
        solution = SphericalMeanField(3.0, 6).solve(_sphere_rho, 0.2, dt=0.05)
    reference = np.asarray(solution.coefficients)
    assert type(solution).__name__ == kind
    for path in (solution.to_netcdf(tmp_path / "s.nc"), solution.to_zarr(tmp_path / "s.zarr")):
        back = labelled.open_dataset(path)
        assert back.kind == kind
        assert back.states.dtype == reference.dtype and back.states.tobytes() == reference.tobytes()
        assert back.times.tobytes() == np.asarray(solution.times, dtype=np.float64).tobytes()
        assert back.final.tobytes() == reference[-1].tobytes()
        assert back.arrays["density"].tobytes() == np.asarray(solution.density).tobytes()


def test_missing_directory_and_a_directory_target_are_named(tmp_path, capsys):
    """The message names the missing directory (before: a temporary file's name), nothing is
    written; to_netcdf onto a zarr store refuses before writing and leaves the store."""
    require("h5netcdf")
    require("zarr")
    solution = MODEL.evolve(_u0, steps_per_layer=1, **GRIDS)
    missing = tmp_path / "no such dir"
    for write, name in ((labelled.to_netcdf, "a.nc"), (labelled.to_zarr, "a.zarr")):
        with pytest.raises(FileNotFoundError, match=f"{write.__name__}: the directory .*no such "
                                                    "dir.* does not exist; create it first"):
            write(solution, missing / name)
    with pytest.raises(FileNotFoundError, match="write_atomic: the directory"):
        atomic.write_atomic(missing / "a.txt", "text")
    assert sorted(os.listdir(tmp_path)) == []
    store = labelled.to_zarr(solution, tmp_path / "s.zarr")
    before = sorted(p.name for p in store.rglob("*"))
    with pytest.raises(IsADirectoryError, match="is a directory.*to_zarr"):
        labelled.to_netcdf(solution, store)
    assert sorted(p.name for p in store.rglob("*")) == before
    assert sorted(os.listdir(tmp_path)) == ["s.zarr"]
    back = labelled.open_dataset(store)
    assert back.states.tobytes() == np.asarray(solution.states).tobytes()


STUDY = ["study", "--refine", "tokens", "--levels", "4,8,16", "--no-progress"]


@pytest.mark.parametrize("timeout", ["nan", "inf", "-1", "0"])
def test_connect_timeout_must_be_positive(tmp_path, capsys, timeout):
    """Before: 'nan' and 'inf' ended in a KeyError traceback (status 1), '-1' in 'could not
    convert string to float: 1-1.0'."""
    status = cli.main(STUDY + ["--out", str(tmp_path / "o"), "--scheduler", "tcp://127.0.0.1:1",
                               "--connect-timeout", timeout])
    err = capsys.readouterr().err
    assert status == 2
    assert err == ("ctformer: error: argument --connect-timeout: must be a positive finite "
                   f"number, got {timeout!r}\n")


def test_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    """Before: --out '' wrote the study into the current directory, status 0."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(STUDY + ["--out", ""]) == 2
    assert capsys.readouterr().err == ("ctformer: error: --out is empty; give a directory (it is "
                                       "created if missing)\n")
    assert os.listdir(tmp_path) == []


def test_demo_tables_are_written_atomically(tmp_path, capsys, monkeypatch):
    """Ctrl-C while the demo writes tokens.txt: the old file stays whole, no temporary is left,
    status 130 (before: the table was written in place, no rename)."""
    monkeypatch.setattr(cli_demo, "DEMO_TOKENS", [4, 8, 16])
    monkeypatch.setattr(cli_demo, "DEMO_STEPS", [1, 2, 4])
    (tmp_path / "tokens.txt").write_text("old\n")
    replace = os.replace

    def interrupted(src, dst):
        if str(dst).endswith("tokens.txt"):
            raise KeyboardInterrupt
        return replace(src, dst)

    monkeypatch.setattr(atomic.os, "replace", interrupted)
    status = cli.main(["demo", "--no-limit", "--no-progress", "--out", str(tmp_path)])
    monkeypatch.undo()
    assert status == 130
    assert (tmp_path / "tokens.txt").read_text() == "old\n"
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []
    assert capsys.readouterr().err.startswith("ctformer: interrupted")


def test_sphere_mean_field_attributes_follow_the_rules_of_every_result(tmp_path):
    """Extra attributes went to h5netcdf as they were (a bool or a dict failed); the S^2 file's
    complex parts were labelled real / imaginary where every other file says re / im."""
    require("h5netcdf")
    xr = require("xarray")
    solution = ZonalMeanField(4.0, 3, 8).solve(_zonal_rho, 0.1, dt=0.05)
    path = solution.to_netcdf(tmp_path / "z.nc", attrs={"flag": True, "skip": None, "run": {"seed": 3}})
    with xr.open_dataset(path) as ds:
        assert ds.attrs["flag"] == 1 and "skip" not in ds.attrs and ds.attrs["run_json"] == '{"seed": 3}'
    assert labelled.open_dataset(path).attrs["run"] == {"seed": 3}
    require("ducc0")
    sphere = SphericalMeanField(3.0, 4).solve(_sphere_rho, 0.1, dt=0.05).to_xarray()
    assert list(sphere["part"].values) == list(labelled.to_xarray(
        CircleMeanField(2.0, 16).solve(lambda x: 1 + 0.1 * np.cos(x), 0.1, dt=0.05))["part"].values) == ["re", "im"]

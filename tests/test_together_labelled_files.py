"""Labelled files with the features they meet: the sphere's mean fields through the module's
functions, a torch float32 padded solve saved and restarted, the studies' rounding floors and
a time study's column names.

Before: ``labelled.to_xarray`` of a zonal solution used the circle's layout (its mass from the
file 0.5 where the solution's is 1.0) and of an S^2 solution raised NumPy's "inhomogeneous
shape"; a torch solve's file did not say torch, and its restart went on in NumPy (1.2e-6 off the
uninterrupted float32 solve, 4.4e-16 in float64); a study's file had no rounding floor (a
float32 work-precision file hid its 1.19e-6); a time study's file said n, h where its CSV says
steps, dt.
"""
import csv
import dataclasses
import subprocess
import sys

import numpy as np
import pytest
import torch

import ctformer as ct
from ctformer import SaveAt, labelled
from ctformer import discretizations as d
from ctformer.particles import SphericalMeanField, ZonalMeanField
from ctformer.solvers import MaxStepsReached
from ctformer.studies import convergence, work_precision

from .conftest import require

GRIDS = dict(tokens=d.get("midpoint:8"), features=d.get("gauss-legendre:6"))


def _xarray_alone(code: str) -> str:
    """Run ``code`` in a fresh interpreter that imports xarray and not ctformer."""
    done = subprocess.run([sys.executable, "-c", "import sys, numpy as np, xarray as xr\n" + code
                           + "\nassert 'ctformer' not in sys.modules"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_zonal_solution_through_the_module_keeps_its_layout(tmp_path):
    require("h5netcdf")
    sol = ZonalMeanField(beta=1.0, dimension=3, degree=8, noise=0.1).solve(
        lambda s: (1 + 0.3 * s) / (4 * np.pi), t1=0.5, dt=0.05, save_every=5)
    ds = labelled.to_xarray(sol)
    assert ds.identical(sol.to_xarray())
    # the mass of a density 1/(4 pi) + 0.3 s/(4 pi) on S^2 is 1 (the odd part integrates to 0)
    mass = (ds.density * ds.node_weight).sum("node").values
    np.testing.assert_allclose(mass, 1.0, rtol=1e-13)
    path = labelled.to_netcdf(sol, tmp_path / "zonal.nc")
    back = labelled.open_dataset(path)
    assert back.kind == "ZonalSolution"
    assert back.states.tobytes() == np.asarray(sol.coefficients).tobytes()
    out = _xarray_alone(f"ds = xr.open_dataset({str(path)!r}, engine='h5netcdf')\n"
                        "print(float((ds.density * ds.node_weight).sum('node')[-1]))")
    assert abs(float(out) - 1.0) < 1e-13


def test_spherical_solution_through_the_module_writes_and_reads(tmp_path):
    require("zarr")
    sol = SphericalMeanField(beta=1.0, degree=4, noise=0.1).solve(
        lambda p: (1 + 0.3 * p[..., 2]) / (4 * np.pi), t1=0.2, dt=0.05, save_every=2)
    assert labelled.to_xarray(sol).identical(sol.to_xarray())
    back = labelled.open_dataset(labelled.to_zarr(sol, tmp_path / "s2.zarr"))
    assert back.kind == "SphericalSolution"
    assert back.states.tobytes() == np.asarray(sol.coefficients, dtype=np.complex128).tobytes()


@pytest.fixture(scope="module")
def torch_solves():
    model = ct.ContinuousTransformer.random_smooth(seed=0, layers=2)
    mask = torch.ones((2, 8), dtype=torch.bool)
    mask[1, 5:] = False
    kw = dict(GRIDS, rtol=1e-6, atol=1e-9, padding_mask=mask)
    x = torch.tensor(np.random.default_rng(0).standard_normal((2, 8, 6)), dtype=torch.float32)
    full = model.evolve(x, **kw)
    with pytest.raises(MaxStepsReached) as stopped:
        model.evolve(x, max_steps=4, save_at=SaveAt(steps=True), **kw)
    return model, kw, full, stopped.value.solution


def test_a_torch_float32_padded_file_says_torch_and_restarts_in_it(torch_solves, tmp_path):
    require("h5netcdf")
    model, kw, full, part = torch_solves
    path = labelled.to_netcdf(part, tmp_path / "part.nc")
    saved = labelled.open_dataset(path)
    assert (saved.attrs["array_namespace"], saved.attrs["device"]) == ("torch", "cpu")
    assert saved.states.dtype == np.float32
    assert saved.states.tobytes() == part.states.numpy().tobytes()
    states = saved.as_solved(saved.states)
    assert isinstance(states, torch.Tensor) and torch.equal(states, part.states)
    rest = model.evolve(None, initial=dataclasses.replace(saved, states=states), **kw)
    assert isinstance(rest.final, torch.Tensor) and torch.equal(rest.final, full.final)
    rest = model.evolve(None, initial=saved, **kw)  # the file as it is: also in torch
    assert isinstance(rest.final, torch.Tensor) and torch.equal(rest.final, full.final)
    out = _xarray_alone(f"ds = xr.open_dataset({str(path)!r}, engine='h5netcdf')\n"
                        "print(ds.attrs['array_namespace'], ds.state.dtype, ds.state.dims)")
    assert out.split() == ["torch", "float32", "('depth',", "'batch',", "'token',", "'feature')"]


def test_a_numpy_file_as_solved_is_its_own_values(tmp_path):
    require("h5netcdf")
    model = ct.ContinuousTransformer.random_smooth(seed=0, layers=1)
    sol = model.evolve(np.random.default_rng(1).standard_normal((8, 6)), **GRIDS)
    saved = labelled.open_dataset(labelled.to_netcdf(sol, tmp_path / "np.nc"))
    assert saved.attrs["array_namespace"] == "numpy"
    assert saved.as_solved(saved.states) is saved.states


def test_a_float32_work_precision_file_keeps_its_floor(tmp_path):
    require("h5netcdf")
    model = ct.ContinuousTransformer.random_smooth(seed=0, layers=1)
    x = np.random.default_rng(0).standard_normal((2, 8, 6)).astype(np.float32)
    mask = np.ones((2, 8), bool)
    mask[1, 5:] = False
    wp = work_precision(model, x, **GRIDS, schemes=("bosh3",), rtols=(1e-3, 1e-4),
                        padding_mask=mask)
    back = labelled.open_dataset(labelled.to_netcdf(wp, tmp_path / "wp.nc"))
    assert back.attrs["floor"] == 10 * 2.0 ** -23          # ten units of float32 roundoff
    assert back.arrays["error"].tobytes() == np.array([[lv.error for lv in wp.levels]]).tobytes()


@pytest.fixture(scope="module")
def time_study():
    model = ct.ContinuousTransformer.random_smooth(seed=0, layers=1)
    return convergence(model, refine="time", levels=[1, 2, 4, 8], tokens="gauss-legendre:6",
                       features="gauss-legendre:6", scheme="rk4", progress=False)


def test_a_time_study_file_names_its_columns_as_its_csv(time_study, tmp_path):
    require("h5netcdf")
    with open(time_study.to_csv(tmp_path / "c.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    back = labelled.open_dataset(labelled.to_netcdf(time_study, tmp_path / "c.nc"))
    assert (back.attrs["size_name"], back.attrs["step_name"]) == ("steps", "dt")
    assert back.dataset["n"].attrs["long_name"] == "steps"
    assert back.arrays["steps"].tolist() == [int(r["steps"]) for r in rows] == [1, 2, 4, 8]
    assert back.arrays["dt"].tolist() == [float(r["dt"]) for r in rows] == [1.0, 0.5, 0.25, 0.125]
    assert back.attrs["rounding"] == np.finfo(np.float64).eps == 2.0 ** -52
    assert back.attrs["floor"] == time_study.floor


def test_study_rows_named_steps_dt_read_as_n_h(time_study):
    rows = [time_study._row_dict(r) for r in time_study.table]   # what the JSON writes
    assert "steps" in rows[0] and "n" not in rows[0]
    renamed = dataclasses.replace(time_study, table=rows)
    assert labelled.to_xarray(renamed).identical(labelled.to_xarray(time_study))


def test_extra_attrs_may_not_replace_the_results_own(tmp_path):
    # before: attrs={"rtol": 1e-3} wrote rtol 0.001 over the solve's 1e-06, and the restart
    # with the solve's own tolerance was refused as "another computation"
    model = ct.ContinuousTransformer.random_smooth(seed=0, layers=1)
    sol = model.evolve(np.random.default_rng(2).standard_normal((8, 6)), **GRIDS, rtol=1e-6)
    with pytest.raises(ValueError, match=r"rtol \(the result's: 1e-06\).*other names"):
        labelled.to_netcdf(sol, tmp_path / "s.nc", attrs={"rtol": 1e-3, "run": "a"})
    assert not (tmp_path / "s.nc").exists()
    ds = labelled.to_xarray(sol, attrs={"run_rtol": 1e-3})
    assert (ds.attrs["rtol"], ds.attrs["run_rtol"]) == (1e-6, 1e-3)

"""Labelled results: datasets, netCDF and zarr files read without ctformer, exact round trips."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import ctformer
from ctformer import labelled
from ctformer.discretizations import GaussLegendre, Midpoint, P1, Product, WithAtoms
from ctformer.particles import CircleMeanField, SelfAttentionDynamics
from ctformer.studies import convergence

from .conftest import require
from .test_studies import RankOneModel

xr = require("xarray")
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class StandInSolution:
    """The attributes of ``ctformer.Solution`` (the adaptive depth solve's result)."""

    times: np.ndarray
    states: object
    grids: object = None
    scheme: str = "dopri5"
    rtol: float | None = 1e-6
    atol: float | None = 1e-9
    stats: dict = field(default_factory=dict)
    event_time: float | None = None

    @property
    def final(self):
        return self.states[-1]


@pytest.fixture
def stand_in(monkeypatch):
    """Register the Solution converter for the stand-in, as the lead will for Solution."""
    monkeypatch.setitem(labelled._CONVERTERS, StandInSolution, labelled.solution_to_xarray)
    return StandInSolution


def _solution(tokens, features, batch=(), context_length=None, seed=0, **kw):
    grids = ctformer.Grids(tokens, features, context_length=context_length)
    times = np.array([0.0, 0.25, 0.8125, 2.0])
    states = np.random.default_rng(seed).standard_normal((4, *batch, *grids.stored_shape))
    stats = {"accepted": 7, "rejected": 2, "rhs_evaluations": 55, "next_step": math.pi / 7 / 3,
             "step_times": np.cumsum(np.full(7, 2.0 / 7))}
    return StandInSolution(times=times, states=states, grids=grids, stats=stats, **kw)


@pytest.fixture(scope="module")
def trajectory():
    x0 = np.random.default_rng(0).standard_normal((2, 6, 3))
    return SelfAttentionDynamics(beta=1.0).solve(x0, t1=1.0, dt=0.1, save_every=2, normalize=True)


@pytest.fixture(scope="module")
def mean_field():
    return CircleMeanField(beta=2.0, n_modes=16).solve(
        lambda th: (1 + 0.2 * np.cos(th)) / (2 * np.pi), t1=0.5, dt=0.1, tracers=[0.1, 1.0, 2.5])


@pytest.fixture(scope="module")
def study():
    return convergence(RankOneModel(exact_time=True), refine="tokens", levels=[4, 8, 16, 256],
                       tokens="midpoint", features="gauss-legendre:6", progress=False)


def _legal(value) -> bool:
    """netCDF attribute types: a string, a number (not bool), a 1-D numeric array."""
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, (str, int, float, np.integer, np.floating)):
        return True
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "iuf"


def _assert_legal(ds):
    bad = {k: v for k, v in ds.attrs.items() if not _legal(v)}
    assert not bad, bad
    assert ds.attrs["ctformer_version"] == ctformer.__version__


# -- layout ---------------------------------------------------------------------------------------
def test_solution_layout_interval_tokens_galerkin_features(stand_in):
    sol = _solution(GaussLegendre(6), P1(5), context_length=6.0)
    ds = labelled.to_xarray(sol)
    assert ds["state"].dims == ("depth", "token", "feature")
    g = sol.grids
    np.testing.assert_array_equal(ds["token"].values, g.tokens.nodes)
    np.testing.assert_array_equal(ds["feature"].values, g.features.nodes)
    np.testing.assert_array_equal(ds["token_weight"].values, g.tokens.weights)
    np.testing.assert_array_equal(ds["feature_weight"].values, g.features.weights)
    # the weights integrate: Gauss-Legendre(6) is exact for x^5, P1 coefficients of y are y_j
    assert float(ds.token_weight @ ds.token ** 5) == pytest.approx(1 / 6, rel=1e-14)
    assert float(ds.feature_weight @ ds.feature) == pytest.approx(0.5, rel=1e-14)
    np.testing.assert_array_equal(ds["depth"].values, sol.times)
    np.testing.assert_array_equal(ds["state"].values, sol.states)
    a = ds.attrs
    assert (a["scheme"], a["rtol"], a["atol"]) == ("dopri5", 1e-6, 1e-9)
    assert (a["stats_accepted"], a["stats_rejected"], a["stats_rhs_evaluations"]) == (7, 2, 55)
    np.testing.assert_array_equal(ds["step_times"].values, sol.stats["step_times"])
    assert a["tokens"] == "GaussLegendre(6)" and a["features_label"] == "p1"
    assert (a["tokens_nodal"], a["features_nodal"], a["tokens_n"]) == (1, 0, 6)
    assert a["context_length"] == 6.0 and "event_time" not in a
    _assert_legal(ds)


def test_solution_layout_product_tokens_batch(stand_in):
    tokens = Product(Midpoint(3), GaussLegendre(2))
    sol = _solution(tokens, Midpoint(4), batch=(2,), context_length=(3.0, 2.0), scheme="rk4",
                    rtol=None, atol=None)
    ds = labelled.to_xarray(sol)
    assert ds["state"].dims == ("depth", "batch", "token_x", "token_y", "feature")
    assert dict(ds.sizes) == {"depth": 4, "batch": 2, "token_x": 3, "token_y": 2, "feature": 4, "step": 7}
    np.testing.assert_array_equal(ds["token_x"].values, Midpoint(3).nodes)
    np.testing.assert_array_equal(ds["token_y"].values, GaussLegendre(2).nodes)
    # raster order, first factor slow: state[..., i, j, :] is stored token i * n2 + j
    np.testing.assert_array_equal(ds["state"].values[:, :, 2, 1], sol.states[:, :, 5])
    np.testing.assert_array_equal(ds["token_weight"].values.ravel(), tokens.weights)
    assert float(ds.token_weight.sum()) == pytest.approx(1.0, rel=1e-15)
    assert "rtol" not in ds.attrs and "atol" not in ds.attrs   # fixed steps: absent, not None
    np.testing.assert_array_equal(ds.attrs["context_length"], [3.0, 2.0])
    back = labelled.from_xarray(ds)
    assert back.states.tobytes() == sol.states.tobytes() and back.final.shape == (2, 6, 4)


def test_solution_layout_atoms_and_several_batch_axes(stand_in):
    tokens = WithAtoms(Product(Midpoint(2), Midpoint(2)))
    sol = _solution(tokens, Midpoint(3), batch=(2, 3), event_time=1.5)
    ds = labelled.to_xarray(sol)
    assert ds["state"].dims == ("depth", "batch_0", "batch_1", "token", "feature")
    np.testing.assert_array_equal(ds["token_x"].values, tokens.nodes[:, 0])
    np.testing.assert_array_equal(ds["token_y"].values, tokens.nodes[:, 1])
    np.testing.assert_array_equal(ds["token_weight"].values, tokens.weights)
    assert ds.attrs["tokens_atoms"] == 1 and ds.attrs["event_time"] == 1.5
    # a class token has weight 1/(P + 1) with P = 4 patches
    assert ds["token_weight"].values[0] == pytest.approx(1 / 5, rel=1e-15)


def test_solution_complex_and_torch_states(stand_in):
    torch = require("torch")
    grids = ctformer.Grids(Midpoint(3), Midpoint(2))
    rng = np.random.default_rng(3)
    z = rng.standard_normal((2, 3, 2)) + 1j * rng.standard_normal((2, 3, 2))
    z[0, 0, 0] = complex(-0.0, 5e-324)  # a signed zero and a subnormal survive
    ds = labelled.to_xarray(StandInSolution(times=np.array([0.0, 1.0]), states=z, grids=grids))
    assert ds["state"].dims[-1] == "part" and list(ds["part"].values) == ["re", "im"]
    assert labelled.from_xarray(ds).states.tobytes() == z.tobytes()
    t = torch.from_numpy(rng.standard_normal((2, 3, 2)))
    ds = labelled.to_xarray(StandInSolution(times=np.array([0.0, 1.0]), states=t, grids=grids))
    assert type(ds["state"].values) is np.ndarray
    assert ds["state"].values.tobytes() == t.numpy().tobytes()
    t.add_(1.0)  # a copy: the dataset does not follow the tensor
    assert ds["state"].values.tobytes() != t.numpy().tobytes()


def test_trajectory_layout(trajectory):
    ds = labelled.to_xarray(trajectory)
    assert ds["positions"].dims == ("time", "batch", "particle", "dimension")
    assert dict(ds.sizes) == {"time": 6, "batch": 2, "particle": 6, "dimension": 3}
    np.testing.assert_array_equal(ds["time"].values, np.arange(0, 11, 2) * (1.0 / 10))  # s h
    norms = np.sqrt((ds.positions ** 2).sum("dimension"))
    assert float(abs(norms - 1).max()) < 1e-13   # on the sphere
    assert ds.attrs["ctformer_result"] == "Trajectory"
    _assert_legal(ds)


def test_mean_field_layout(mean_field):
    ds = labelled.to_xarray(mean_field)
    assert ds["density"].dims == ("time", "angle")
    assert ds["coefficients"].dims == ("time", "wavenumber", "part")
    assert ds["tracers"].dims == ("time", "tracer")
    np.testing.assert_array_equal(ds["angle"].values, mean_field.grid)
    c = mean_field.coefficients
    np.testing.assert_array_equal(ds.coefficients.sel(part="re").values, c.real)
    np.testing.assert_array_equal(ds.coefficients.sel(part="im").values, c.imag)
    mass = (ds.density * ds.angle_weight).sum("angle").values
    np.testing.assert_allclose(mass, 1.0, rtol=1e-13)   # mass one, conserved
    # rfft normalization: c_k = N rho_hat_k, rho_hat_1 = 0.2 / (4 pi) at t = 0
    assert ds.coefficients.sel(part="re", wavenumber=1, time=0.0) == pytest.approx(16 * 0.2 / (4 * np.pi))
    assert (ds.attrs["n_modes"], ds.attrs["max_wavenumber"]) == (16, 5)
    back = labelled.from_xarray(ds)
    assert back.states.dtype == np.complex128 and back.states.tobytes() == c.tobytes()
    assert back.arrays["tracers"].tobytes() == mean_field.tracers.tobytes()
    _assert_legal(ds)


def test_convergence_layout(study):
    ds = labelled.to_xarray(study)
    assert ds["error"].dims == ("level",)
    np.testing.assert_array_equal(ds["n"].values, [4, 8, 16, 256])
    np.testing.assert_array_equal(ds["h"].values, [1 / 4, 1 / 8, 1 / 16, 1 / 256])
    errors = ds["error"].values
    assert np.isnan(errors[-1]) and np.isnan(ds["order"].values[0])   # reference; no order
    np.testing.assert_array_equal(errors[:-1], [r.error for r in study.table[:-1]])
    h, order = ds["h"].values, ds["order"].values
    np.testing.assert_allclose(order[1:3], np.log(errors[:2] / errors[1:3]) / np.log(h[:2] / h[1:3]),
                               rtol=1e-12)
    assert order[2] == pytest.approx(2.0, abs=0.15)   # midpoint: second order (2.17, 2.11 -> 2)
    a = ds.attrs
    assert (a["refine"], a["method"], a["reference"], a["norm"]) == ("tokens", "midpoint", "finest", "l2")
    assert a["expected_order"] == 2 and a["consistent_limit"] == 1 and "gauss_points" not in a
    params = json.loads(a["study_parameters_json"])
    assert params["refine"] == "tokens" and params["fixed"]["features"] == study.parameters["fixed"]["features"]
    assert a["study_identity"] == hashlib.sha256(a["study_parameters_json"].encode()).hexdigest()
    _assert_legal(ds)


def test_unknown_result_and_missing_grids(stand_in):
    with pytest.raises(TypeError, match="no converter for dict.*Trajectory"):
        labelled.to_xarray({})
    ds = labelled.to_xarray(StandInSolution(times=np.zeros(1), states=np.zeros((1, 2, 3)), grids=None))
    assert ds["state"].dims == ("depth", "token", "feature") and "token" not in ds.coords
    with pytest.raises(ValueError, match="n = 6"):
        labelled.to_xarray(StandInSolution(times=np.zeros(1), states=np.zeros((1, 5, 3)),
                                           grids=ctformer.Grids(Midpoint(6), Midpoint(3))))
    with pytest.raises(ValueError, match="ctformer_result"):
        labelled.from_xarray(xr.Dataset())


# -- files ---------------------------------------------------------------------------------------
BARE = textwrap.dedent("""
    import json, sys
    import numpy as np
    try:
        import ctformer
    except ImportError:
        pass
    else:
        raise SystemExit("ctformer is importable: " + ctformer.__file__)
    import xarray as xr
    for path in sys.argv[1:]:
        ds = xr.open_zarr(path) if path.endswith(".zarr") else xr.open_dataset(path, engine="h5netcdf")
        ds = ds.load()
        np.savez(path + ".npz", **{k: v.values for k, v in ds.variables.items() if v.dtype.kind != "O"})
        meta = {"dims": {k: list(v.dims) for k, v in ds.variables.items()}, "sizes": dict(ds.sizes),
                "attrs": ds.attrs, "part": [str(p) for p in ds["part"].values] if "part" in ds else None}
        with open(path + ".json", "w") as f:
            json.dump(meta, f, default=lambda o: o.tolist())
    print("ctformer" in sys.modules)
""")


def _bare_python(paths, cwd):
    """Run BARE in a fresh interpreter that has xarray and the file libraries but not ctformer.

    ``-I`` ignores PYTHON* variables and the current directory, ``-S`` the site directory (whose
    .pth files would install the editable ctformer); the libraries' own folders are put on
    sys.path by hand, and none of them holds ctformer (asserted in the child).
    """
    import h5netcdf, h5py, zarr  # noqa: E401 - the libraries the child may use
    folders = [str(Path(m.__file__).resolve().parents[1]) for m in (np, xr, h5netcdf, h5py, zarr)]
    folders = list(dict.fromkeys(folders))
    prelude = f"import sys; sys.path[:0] = {folders!r}\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = ""
    return subprocess.run([sys.executable, "-I", "-S", "-c", prelude + BARE, *map(str, paths)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def _same_attrs(mine, theirs):
    normal = json.loads(json.dumps(dict(mine), default=lambda o: o.tolist()))
    assert normal == theirs


def test_files_open_without_ctformer_bit_for_bit(tmp_path, stand_in, trajectory, mean_field, study):
    require("h5py")
    results = {"solution": _solution(Product(Midpoint(3), P1(3)), P1(4), batch=(2,),
                                     context_length=(3.0, 3.0)),
               "trajectory": trajectory, "meanfield": mean_field, "study": study}
    paths, datasets = [], {}
    for name, result in results.items():
        ds = labelled.to_xarray(result)
        for ext, write in (("nc", labelled.to_netcdf), ("zarr", labelled.to_zarr)):
            path = write(result, tmp_path / f"{name}.{ext}")
            paths.append(path)
            datasets[path] = ds
    run = _bare_python(paths, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False"]
    for path, ds in datasets.items():
        meta = json.loads(Path(f"{path}.json").read_text())
        assert meta["sizes"] == dict(ds.sizes), path
        assert meta["dims"] == {k: list(v.dims) for k, v in ds.variables.items()}, path
        _same_attrs(ds.attrs, meta["attrs"])
        saved = np.load(f"{path}.npz")
        for name, var in ds.variables.items():
            if var.dtype.kind != "O":
                assert saved[name].dtype == var.dtype and saved[name].tobytes() == var.values.tobytes(), (path, name)
        assert meta["part"] in (None, ["re", "im"])
    # and back through ctformer: the arrays a restart needs, exactly
    for path in paths:
        back = labelled.open_dataset(path)
        result = results[path.stem]
        if back.kind == "ConvergenceResult":
            assert back.states is None and back.arrays["n"].tolist() == [4, 8, 16, 256]
            continue
        if back.kind == "Solution":   # a float attribute is exact too (a restart's next step)
            assert back.attrs["stats_next_step"] == result.stats["next_step"]
            assert back.arrays["step_times"].tobytes() == result.stats["step_times"].tobytes()
        states = {"Solution": "states", "Trajectory": "positions", "MeanFieldSolution": "coefficients"}[back.kind]
        assert back.times.tobytes() == np.asarray(result.times).tobytes()
        assert back.states.tobytes() == np.asarray(getattr(result, states)).tobytes()
        assert back.final.tobytes() == np.asarray(getattr(result, states))[-1].tobytes()


def test_writes_are_atomic(tmp_path, trajectory, monkeypatch):
    require("h5py")
    nc, store = tmp_path / "t.nc", tmp_path / "t.zarr"
    labelled.to_netcdf(trajectory, nc)
    labelled.to_zarr(trajectory, store)
    before = nc.read_bytes(), sorted(p.name for p in store.rglob("*"))
    bad = labelled.to_xarray(trajectory)
    bad.attrs["nested"] = {"not": "legal"}   # netCDF refuses it while writing
    with pytest.raises(TypeError, match="nested"):
        labelled.to_netcdf(bad, nc)

    def interrupted(original):   # Ctrl-C after the temporary copy is complete, before the rename
        def write(self, *args, **kwargs):
            original(self, *args, **kwargs)
            raise KeyboardInterrupt
        return write

    monkeypatch.setattr(xr.Dataset, "to_netcdf", interrupted(xr.Dataset.to_netcdf))
    monkeypatch.setattr(xr.Dataset, "to_zarr", interrupted(xr.Dataset.to_zarr))
    second = labelled.to_xarray(trajectory, attrs={"note": "second"})
    for write, path in ((labelled.to_netcdf, nc), (labelled.to_zarr, store)):
        with pytest.raises(KeyboardInterrupt):
            write(second, path)
    assert nc.read_bytes() == before[0] and sorted(p.name for p in store.rglob("*")) == before[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.nc", "t.zarr"]   # no temporaries
    monkeypatch.undo()
    assert "note" not in labelled.open_dataset(store).attrs
    labelled.to_zarr(second, store)
    assert labelled.open_dataset(store).attrs["note"] == "second"   # an old store is replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.nc", "t.zarr"]
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileExistsError, match="not a zarr store"):
        labelled.to_zarr(trajectory, tmp_path / "plain")


def test_attributes_made_legal(stand_in):
    sol = _solution(Midpoint(2), Midpoint(2))
    ds = labelled.to_xarray(sol, attrs={"flag": True, "none": None, "nested": {"a": [1, math.inf]},
                                        "pair": (1.0, 2.0)})
    a = ds.attrs
    assert a["flag"] == 1 and "none" not in a and list(a["pair"]) == [1.0, 2.0]
    assert json.loads(a["nested_json"]) == {"a": [1, "inf"]}
    assert labelled.from_xarray(ds).attrs["nested"] == {"a": [1, "inf"]}
    _assert_legal(ds)


def _python_blocks(page: str) -> list:
    """The bodies of the ``.. code-block:: python`` directives of ``docs/PAGE``, dedented."""
    lines, out, i = (ROOT / "docs" / page).read_text().splitlines(), [], 0
    while i < len(lines):
        i += 1
        if lines[i - 1].strip() == ".. code-block:: python":
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(" ")):
                body.append(lines[i])
                i += 1
            out.append(textwrap.dedent("\n".join(body)))
    return out


def test_docs_page_example_runs(tmp_path, monkeypatch):
    require("h5py")
    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks("labelled.rst")
    assert blocks
    namespace = {}
    for block in blocks:
        exec(compile(block, "docs/labelled.rst", "exec"), namespace)


def test_every_result_has_the_methods(tmp_path):
    # the methods delegate to ctformer.labelled: the same datasets as the functions
    import ctformer
    from ctformer.particles import SelfAttentionDynamics

    x0 = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    trajectory = SelfAttentionDynamics(beta=1.0).solve(x0, 0.5, 0.1)
    solution = SelfAttentionDynamics(beta=1.0).evolve(x0, 0.5, save_at=ctformer.SaveAt(steps=True))
    for result in (trajectory, solution):
        assert result.to_xarray().identical(labelled.to_xarray(result))
    assert solution.to_xarray()["state"].dims == ("time", "particle", "dimension")
    back = labelled.open_dataset(solution.to_zarr(tmp_path / "s.zarr"))
    np.testing.assert_array_equal(back.states, solution.states)

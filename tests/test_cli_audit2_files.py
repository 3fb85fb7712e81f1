"""The first hour, second audit: what the command line refuses instead of ignoring, and what
the labelled files of the two studies say. The references are the Python API's results
(bit for bit), the in-memory study, and the HuggingFace bridge table."""
import csv
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import ctformer
from ctformer import cli, labelled
from ctformer.discretizations import GaussLegendre
from ctformer.studies import convergence, work_precision

from .conftest import require
from .test_cli_audit_errors import STUDY as TOKENS, _one_error_line

ROOT = Path(__file__).resolve().parents[1]
TIME = ["study", "--refine", "time", "--levels", "1,2,4", "--no-progress"]


@pytest.mark.parametrize("extra, message", [
    (["--steps-per-layer", "3"], r"--steps-per-layer 3 fixes the steps when time is not refined; "
                                 r"with --refine time the steps per layer are the --levels"),
    (["--window", "0.2,0.5"], r"--window 0.2,0.5 .* with --refine time leave it out"),
])
def test_a_time_study_refuses_the_options_it_would_ignore(tmp_path, capsys, extra, message):
    """Before: --steps-per-layer 3 with --refine time ran the study of levels 1, 2, 4 (the value
    dropped without a word) and exited 0."""
    assert cli.main([*TIME, *extra, "--out", str(tmp_path / "out")]) == 2
    line = _one_error_line(capsys)
    assert re.search(message, line), line
    assert not (tmp_path / "out" / "convergence.csv").exists()


@pytest.mark.parametrize("steps", [None, 2])
def test_steps_per_layer_of_a_token_study_is_the_python_argument(tmp_path, capsys, steps):
    """The command's errors are those of convergence(..., steps_per_layer=k), bit for bit
    (k = 1 when the option is left out)."""
    option = [] if steps is None else ["--steps-per-layer", str(steps)]
    assert cli.main([*TOKENS, *option, "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    with open(tmp_path / "convergence.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2)
    expected = convergence(model, refine="tokens", levels=[4, 8, 16], tokens="midpoint",
                           steps_per_layer=steps or 1, progress=False)
    assert [float(r["error"]) for r in rows[:-1]] == list(expected.errors)


@pytest.mark.parametrize("window", ["0.5,0.2", "nan,1", "0,inf"])
def test_a_bad_window_is_named_by_its_option(tmp_path, capsys, window):
    """Before: 'window must be a finite interval (a, b) ...', without the option's name."""
    assert cli.main([*TOKENS, "--window", window, "--out", str(tmp_path)]) == 2
    line = _one_error_line(capsys)
    assert line == (f"ctformer: error: --window must be two finite numbers a,b with a < b (a "
                    f"sub-interval of the refined variable's domain), got {window!r}")


def test_a_work_precision_file_reads_back_with_open_dataset(tmp_path):
    """Before: open_dataset raised 'ctformer_result is 'WorkPrecision', expected one of ...',
    and to_zarr wrote the scheme names as fixed-width strings, which zarr 3 warns have no
    specification (a store other zarr libraries may not read)."""
    xr = require("xarray")
    require("h5netcdf")
    require("zarr")
    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2)
    study = work_precision(model, lambda x, y: np.cos(3 * y + np.sin(np.pi * x)),
                           tokens=GaussLegendre(6), features=GaussLegendre(4),
                           schemes=("bosh3", "strang"), rtols=(1e-3, 1e-4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        study.to_netcdf(tmp_path / "wp.nc")
        study.to_zarr(tmp_path / "wp.zarr")
    assert not [str(w.message) for w in caught if "specification" in str(w.message)]
    for path in (tmp_path / "wp.nc", tmp_path / "wp.zarr"):
        back = labelled.open_dataset(path)
        assert back.kind == "WorkPrecision" and back.times is None and back.states is None
        assert list(back.arrays["scheme"]) == ["bosh3", "strang (heun)"]
        assert back.attrs["reference"] == study.reference
        for name in ("error", "rhs_evaluations", "seconds"):
            table = np.array([[getattr(lv, name) for lv in study.of(s)] for s in study.schemes])
            assert back.arrays[name].tobytes() == table.tobytes(), (path, name)
    with xr.open_zarr(tmp_path / "wp.zarr") as plain:
        assert list(plain["scheme"].values) == ["bosh3", "strang (heun)"]


def test_a_study_file_says_why_its_expected_order_is_lowered(tmp_path):
    """Under a causal mask the expected order of refined tokens is 1 (the diagonal cell), and
    the study says why in ``limitation``; before, the dataset and its files had
    expected_order 1 and no reason (KeyError)."""
    xr = require("xarray")
    require("h5netcdf")
    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2, mask="causal")
    study = convergence(model, refine="tokens", levels=[8, 16, 32], tokens="gauss-legendre",
                        progress=False)
    assert study.expected_order == 1.0 and "causal mask" in study.limitation
    assert study.to_xarray().attrs["limitation"] == study.limitation
    study.to_netcdf(tmp_path / "study.nc")
    with xr.open_dataset(tmp_path / "study.nc", engine="h5netcdf") as plain:
        assert plain.attrs["limitation"] == study.limitation
        assert plain["error"].values[:-1].tobytes() == study.errors.tobytes()
    free = convergence(ctformer.ContinuousTransformer.random_smooth(seed=0, layers=2),
                       refine="tokens", levels=[8, 16, 32], tokens="midpoint", progress=False)
    assert free.limitation is None and "limitation" not in free.to_xarray().attrs


def test_getting_started_names_every_bridge_family():
    """Before: the page listed BERT, GPT-2, Llama, Mistral, Qwen2, ALBERT and ViT as the table
    of bridges, which also holds DeiT, Phi-3, GPT-NeoX, Gemma and Gemma2."""
    from ctformer.bridges.hf import BRIDGES

    page = (ROOT / "docs" / "getting_started.rst").read_text()
    start = page.index(":data:`ctformer.bridges.hf.BRIDGES`")
    listed = page[start: page.index(")", start)].lower().replace("-", "").replace(" ", "")
    classes = [c for bridge in BRIDGES.values() for c in bridge.classes if c.endswith("Model")]
    missing = [c for c in classes if c[: -len("Model")].lower() not in listed]
    assert not missing, missing


def test_open_dataset_names_a_path_that_is_not_a_saved_result(tmp_path):
    """Before: h5py's 'Unable to synchronously open file (file signature not found)' for a CSV
    file, zarr's GroupNotFoundError for a plain directory, h5py's errno text for a missing
    path."""
    require("h5netcdf")
    require("zarr")
    (tmp_path / "table.csv").write_text("level,n\n0,4\n")
    (tmp_path / "plain").mkdir()
    with pytest.raises(FileNotFoundError, match=r"open_dataset: '.*missing\.nc' does not exist; "
                                                r"give a netCDF file written by to_netcdf"):
        labelled.open_dataset(tmp_path / "missing.nc")
    with pytest.raises(ValueError, match=r"'.*plain' is a directory but not a zarr store"):
        labelled.open_dataset(tmp_path / "plain")
    with pytest.raises(ValueError, match=r"'.*table\.csv' is not a netCDF-4 \(HDF5\) file; give"):
        labelled.open_dataset(tmp_path / "table.csv")


def test_a_particle_solve_file_keeps_its_error_norm(tmp_path):
    """An error-controlled particle solve has norm 'l2' (Solution.norm); before, its dataset
    and file left the attribute out, as if it were a fixed-step solve."""
    xr = require("xarray")
    require("h5netcdf")
    from ctformer.particles import SelfAttentionDynamics

    x0 = np.random.default_rng(0).standard_normal((6, 3))
    x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)
    solve = SelfAttentionDynamics(beta=1.0).evolve(x0, t1=1.0, rtol=1e-6)
    assert solve.norm == "l2"
    solve.to_netcdf(tmp_path / "particles.nc")
    with xr.open_dataset(tmp_path / "particles.nc", engine="h5netcdf") as plain:
        assert plain.attrs["norm"] == "l2" and plain.attrs["rtol"] == 1e-6
        assert plain["state"].dims == ("time", "particle", "dimension")
        assert plain["state"].values.tobytes() == np.asarray(solve.states).tobytes()
    fixed = SelfAttentionDynamics(beta=1.0).evolve(x0, t1=1.0, dt=0.1)
    assert fixed.norm is None and "norm" not in fixed.to_xarray().attrs


@pytest.mark.parametrize("name, levels, message", [
    ("p2", "1,2,4", "--levels 1,2,4: level 1 of --discretization p2: P2 needs n >= 3, got n = 1"),
    ("Midpoint", "4,8,16", "--discretization 'Midpoint': unknown discretization 'Midpoint' "
                           "(did you mean 'midpoint'?); known: midpoint, "),
])
def test_the_refined_rule_is_checked_at_every_level_naming_its_option(tmp_path, capsys, name,
                                                                      levels, message):
    """Before: 'P2 needs n >= 3, got n = 1' (which option, which level?) and 'unknown
    discretization 'Midpoint' for tokens' without --discretization or a suggestion."""
    argv = ["study", "--refine", "tokens", "--discretization", name, "--levels", levels]
    assert cli.main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert _one_error_line(capsys).startswith(f"ctformer: error: {message}")
    assert not (tmp_path / "out" / "cases").exists()   # refused before any case ran

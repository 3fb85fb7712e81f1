"""The ``ctformer`` command line: studies, listings, demo, one-line user errors."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ctformer import cli

ROOT = Path(__file__).resolve().parents[1]
STUDY = ["study", "--refine", "tokens", "--discretization", "midpoint", "--levels", "4,8,16,32,256",
         "--features", "gauss-legendre:12", "--model-seed", "1"]


def run_module(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ctformer", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_study_command_writes_table_and_resumes(tmp_path):
    out = tmp_path / "study"
    proc = run_module(*STUDY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "convergence in tokens (midpoint)" in proc.stdout
    assert "5/5" in proc.stderr                                  # the progress bar
    data = json.loads((out / "convergence.json").read_text())
    assert abs(data["observed_order"] - 2.0) < 0.3               # midpoint quadrature: order 2
    assert [r["n"] for r in data["table"]] == [4, 8, 16, 32, 256]
    header = (out / "convergence.csv").read_text().splitlines()[0]
    assert header == "level,n,h,error,order,seconds"
    assert (out / "convergence.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list((out / "cases").glob("*.json"))) == 5

    # a second run finds every case in the store: same table, nothing recomputed
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cases").glob("*.json")}
    assert cli.main([*STUDY, "--out", str(out), "--no-progress"]) == 0
    again = json.loads((out / "convergence.json").read_text())
    assert [r["error"] for r in again["table"]] == [r["error"] for r in data["table"]]
    assert {p: p.stat().st_mtime_ns for p in (out / "cases").glob("*.json")} == stamps


def test_study_on_a_dask_scheduler_matches_in_process(tmp_path, capsys):
    distributed = pytest.importorskip("distributed")
    args = ["study", "--refine", "time", "--scheme", "strang", "--levels", "1,2,4,8",
            "--tokens", "gauss-legendre:8", "--features", "gauss-legendre:8", "--no-progress"]
    assert cli.main([*args, "--out", str(tmp_path / "local")]) == 0
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address=None) as cluster:
        assert cli.main([*args, "--out", str(tmp_path / "dask"),
                         "--scheduler", cluster.scheduler_address]) == 0
    local, remote = (json.loads((tmp_path / d / "convergence.json").read_text())
                     for d in ("local", "dask"))
    np.testing.assert_allclose([r["error"] for r in remote["table"][:-1]],
                               [r["error"] for r in local["table"][:-1]], rtol=1e-12)
    assert abs(local["observed_order"] - 2.0) < 0.3                # Strang: order 2


def test_list_names_every_discretization_and_scheme(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    # orders of DESIGN.md sections 3 and 4
    for name, order in [("midpoint", "2"), ("trapezoid", "2"), ("gauss-legendre", "spectral"),
                        ("clenshaw-curtis", "spectral"), ("fourier", "spectral"),
                        ("chebyshev", "spectral"), ("legendre", "spectral"), ("p1", "2"),
                        ("p2", "3"), ("euler", "1"), ("lie", "1"), ("strang", "2"),
                        ("parallel", "1"), ("rk4", "4")]:
        assert re.search(rf"^\s+{re.escape(name)}\s+(\w+\s+)?{order}\b", out, re.M), name


def test_demo_prints_both_tables_quickly(capsys):
    start = time.perf_counter()
    assert cli.main(["demo", "--no-limit", "--no-progress"]) == 0
    assert time.perf_counter() - start < 30
    out = capsys.readouterr().out
    assert "refining tokens" in out and "refining depth" in out
    observed = [line.split()[2:] for line in out.splitlines() if "observed order" in line]
    (midpoint, gauss), (lie, strang) = ([float(v) for v in row] for row in observed)
    assert abs(midpoint - 2) < 0.3 and gauss > 4          # spectral: far above any fixed order
    assert abs(lie - 1) < 0.3 and abs(strang - 2) < 0.3


def test_limit_and_cluster_print_the_reports(monkeypatch, capsys):
    import ctformer.bridges.minilm as bridges
    import ctformer.particles.minilm as particles

    monkeypatch.setattr(bridges, "discrete_limit_report", lambda: "limit report: 1e-16")
    monkeypatch.setattr(particles, "cluster_report", lambda text=None: f"clusters of {text!r}")
    assert cli.main(["limit"]) == 0
    assert capsys.readouterr().out == "limit report: 1e-16\n"
    assert cli.main(["cluster", "--text", "the cat sat"]) == 0
    assert capsys.readouterr().out == "clusters of 'the cat sat'\n"


@pytest.mark.parametrize("args,message", [
    (["study", "--refine", "tokens", "--levels", "4,x", "--out", "OUT"], "--levels must be"),
    (["study", "--refine", "tokens", "--levels", "8", "--out", "OUT"], "at least two"),
    (["study", "--refine", "tokens", "--levels", "8,4", "--out", "OUT"], "strictly increasing"),
    (["study", "--refine", "tokens", "--discretization", "simpson", "--levels", "4,8", "--out", "OUT"],
     "unknown discretization 'simpson'"),
    (["study", "--refine", "time", "--scheme", "leapfrog", "--levels", "1,2", "--out", "OUT"],
     "unknown scheme 'leapfrog'"),
    (["study", "--refine", "tokens", "--features", "midpoint", "--levels", "4,8", "--out", "OUT"],
     "needs a size"),
    (["study", "--refine", "depth", "--levels", "1,2", "--out", "OUT"], "invalid choice"),
    (["study", "--refine", "tokens", "--levels", "4,8", "--out", "OUT",
      "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "1"], "cannot reach the Dask scheduler"),
    ([], "required: COMMAND"),
])
def test_user_errors_are_one_line(tmp_path, capsys, args, message):
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    assert cli.main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctformer: error: "), captured.err
    assert message in lines[0]


def test_entry_points_report_user_errors_without_traceback():
    for command in ([sys.executable, "-m", "ctformer"], [str(Path(sys.executable).parent / "ctformer")]):
        proc = subprocess.run([*command, "study", "--refine", "tokens", "--levels", "4,x",
                               "--out", "unused"], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            "ctformer: error: --levels must be a comma-separated list of positive integers, "
            "got '4,x'"]
        assert "Traceback" not in proc.stderr and not Path(ROOT / "unused").exists()

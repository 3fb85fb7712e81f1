"""The command line as a new user meets it: bad numbers named by their option, a figure path
checked before the model runs, a closed standard output, and the evaluation grid option."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ctformer import cli

ROOT = Path(__file__).resolve().parents[1]
STUDY = ["study", "--refine", "tokens", "--discretization", "midpoint", "--levels", "4,8,16",
         "--no-progress"]


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctformer: error: "), lines
    return lines[0]


@pytest.mark.parametrize("argv,message", [
    (STUDY + ["--layers", "0"], "argument --layers: must be a positive integer, got '0'"),
    (STUDY + ["--heads", "x"], "argument --heads: must be a positive integer, got 'x'"),
    (STUDY + ["--steps-per-layer", "0"],
     "argument --steps-per-layer: must be a positive integer, got '0'"),
    (STUDY + ["--model-seed", "-1"],
     "argument --model-seed: must be a non-negative integer, got '-1'"),
    (STUDY + ["--beta", "nan"], "argument --beta: must be a finite number, got 'nan'"),
    (STUDY + ["--connect-timeout", "0"],
     "argument --connect-timeout: must be a positive finite number, got '0'"),
    (STUDY + ["--fine", "0"], "argument --fine: must be a positive integer, got '0'"),
    (["limit", "--seed", "-1"], "argument --seed: must be a non-negative integer, got '-1'"),
])
def test_a_bad_number_is_refused_naming_its_option(tmp_path, capsys, argv, message):
    argv = [*argv, "--out", str(tmp_path / "out")] if argv[0] == "study" else argv
    assert cli.main(argv) == 2
    assert message in _one_error_line(capsys)


@pytest.mark.parametrize("option,value,message", [
    ("--features", "gauss-legendre:0", "--features 'gauss-legendre:0': GaussLegendre needs n >= 1"),
    ("--hidden", "p2:1", "--hidden 'p2:1': P2 needs n >= 3, got n = 1"),
    ("--features", "nope:12", "--features 'nope:12': unknown discretization name 'nope'"),
])
def test_a_bad_fixed_discretization_names_its_option(tmp_path, capsys, option, value, message):
    assert cli.main(STUDY + [option, value, "--out", str(tmp_path)]) == 2
    assert message in _one_error_line(capsys)


def test_a_size_on_the_refined_discretization_is_refused_not_ignored(tmp_path, capsys):
    # it was dropped: 'midpoint:100' ran the levels 4, 8, 16 of midpoint and said nothing
    argv = ["study", "--refine", "tokens", "--discretization", "midpoint:100", "--levels",
            "4,8,16", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert ("--discretization 'midpoint:100': give the name only (e.g. 'midpoint'); the sizes "
            "of the refined variable are --levels") in _one_error_line(capsys)


def test_cluster_checks_the_plot_directory_before_the_model_runs(tmp_path, capsys, monkeypatch):
    import ctformer.particles.minilm as minilm

    def never(*args, **kwargs):
        raise AssertionError("the model ran although the figure cannot be written")

    monkeypatch.setattr(minilm, "minilm_clustering", never)
    target = tmp_path / "missing" / "clusters.png"
    assert cli.main(["cluster", "--plot", str(target)]) == 2
    line = _one_error_line(capsys)
    assert f"--plot {str(target)!r}: the directory {str(target.parent)!r} does not exist" in line
    assert "create it first" in line


def _closed_stdout(argv, cwd):
    """Run ``python -m ctformer`` with a standard output whose reader has gone (``| head``)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", MPLBACKEND="Agg")
    proc = subprocess.Popen([sys.executable, "-m", "ctformer", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    proc.stderr.close()
    return proc.wait(timeout=300), err


def test_a_closed_standard_output_is_not_a_user_error_and_loses_no_file(tmp_path):
    # it was "ctformer: error: [Errno 32] Broken pipe", status 2, and no convergence.* written
    status, err = _closed_stdout(["list"], tmp_path)
    assert (status, err) == (cli.EXIT_BROKEN_PIPE, "")
    assert cli.EXIT_BROKEN_PIPE == 128 + 13                    # 128 + SIGPIPE, as shells say

    out = tmp_path / "study"
    status, err = _closed_stdout([*STUDY, "--out", str(out)], tmp_path)
    assert (status, err) == (cli.EXIT_BROKEN_PIPE, "")
    from ctformer.model import ContinuousTransformer
    from ctformer.studies import convergence

    expected = convergence(ContinuousTransformer.random_smooth(seed=0, layers=2),
                           refine="tokens", levels=[4, 8, 16], tokens="midpoint", progress=False)
    written = json.loads((out / "convergence.json").read_text())
    errors = [row["error"] for row in written["table"][:-1]]
    np.testing.assert_allclose(errors, expected.errors, rtol=1e-12)
    assert (out / "convergence.csv").is_file()


def test_fine_sets_the_evaluation_grid_as_the_python_argument_does(tmp_path, capsys):
    from ctformer.model import ContinuousTransformer
    from ctformer.studies import convergence

    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    levels = [8, 16, 32, 64]
    argv = ["study", "--refine", "tokens", "--discretization", "midpoint", "--levels",
            ",".join(map(str, levels)), "--no-progress", "--fine", "512", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    capsys.readouterr()
    written = json.loads((tmp_path / "convergence.json").read_text())
    errors = [row["error"] for row in written["table"][:-1]]
    at_512 = convergence(model, refine="tokens", levels=levels, tokens="midpoint", fine=512,
                         progress=False).errors
    at_200 = convergence(model, refine="tokens", levels=levels, tokens="midpoint", fine=200,
                         progress=False).errors
    np.testing.assert_allclose(errors, at_512, rtol=1e-12)
    assert np.max(np.abs(np.asarray(at_512) / np.asarray(at_200) - 1)) > 1e-6   # fine is used

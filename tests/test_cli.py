"""The ``ctformer`` command line, through its real entry points.

Numbers are checked against theory: observed orders against the orders of the design notes
(sections 3 and 4), error-reduction factors against the errors of the written table, cluster
statistics against an independent computation from HuggingFace's hidden states.
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import numpy as np
import pytest

from ctformer import cli, solvers

from .conftest import require

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}
STUDY = ["study", "--refine", "tokens", "--discretization", "midpoint", "--levels", "4,8,16,32,256",
         "--features", "gauss-legendre:12", "--model-seed", "1"]
SMALL = ["--tokens", "gauss-legendre:8", "--features", "gauss-legendre:6"]


def run_module(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "ctformer", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=ENV)


def run_on_terminal(*args, timeout=120) -> str:
    """Run ``python -m ctformer ARGS`` with standard error on a pseudo-terminal; return it."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "ctformer", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.DEVNULL, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=timeout) == 0
    return b"".join(chunks).decode()


def test_study_command_writes_table_and_resumes(tmp_path):
    out = tmp_path / "study"
    proc = run_module(*STUDY, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "convergence in tokens (midpoint)" in proc.stdout
    assert proc.stderr == ""                                     # no progress bar in a log
    data = json.loads((out / "convergence.json").read_text())
    assert abs(data["observed_order"] - 2.0) < 0.3               # midpoint quadrature: order 2
    assert [r["n"] for r in data["table"]] == [4, 8, 16, 32, 256]
    header = (out / "convergence.csv").read_text().splitlines()[0]
    assert header == "level,n,h,error,order,seconds"
    assert (out / "convergence.png").read_bytes()[:4] == b"\x89PNG"
    assert len(list((out / "cases").glob("*.json"))) == 5
    assert not [p for p in out.rglob("*") if p.name.startswith(".")]   # no temporary files left

    # a second run finds every case in the store: same table, nothing recomputed
    stamps = {p: p.stat().st_mtime_ns for p in (out / "cases").glob("*.json")}
    assert cli.main([*STUDY, "--out", str(out), "--no-progress"]) == 0
    again = json.loads((out / "convergence.json").read_text())
    assert [r["error"] for r in again["table"]] == [r["error"] for r in data["table"]]
    assert {p: p.stat().st_mtime_ns for p in (out / "cases").glob("*.json")} == stamps


def test_progress_bar_only_on_a_terminal_and_once(tmp_path):
    levels = ["--levels", "4,8,16,32"]
    args = ["study", "--refine", "tokens", "--discretization", "midpoint", *levels,
            "--features", "gauss-legendre:6", "--out", str(tmp_path / "tty")]
    screen = run_on_terminal(*args)
    # redraws overwrite one line (carriage returns); the finished bar ends in one newline
    assert screen.count("\n") == 1 and screen.endswith("\r\n")
    final = screen.rstrip("\r\n").split("\r")[-1]
    assert "4/4" in final and "100%" in final
    # --no-progress on a terminal: nothing at all
    assert run_on_terminal(*args[:-1], str(tmp_path / "quiet"), "--no-progress") == ""


def test_study_on_a_dask_scheduler_matches_in_process(tmp_path, capsys):
    distributed = require("distributed")
    args = ["study", "--refine", "time", "--scheme", "strang", "--levels", "1,2,4,8",
            "--tokens", "gauss-legendre:8", "--features", "gauss-legendre:8", "--no-progress"]
    assert cli.main([*args, "--out", str(tmp_path / "local")]) == 0
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address=":0") as cluster:
        assert cli.main([*args, "--out", str(tmp_path / "dask"),
                         "--scheduler", cluster.scheduler_address]) == 0
    local, remote = (json.loads((tmp_path / d / "convergence.json").read_text())
                     for d in ("local", "dask"))
    np.testing.assert_allclose([r["error"] for r in remote["table"][:-1]],
                               [r["error"] for r in local["table"][:-1]], rtol=1e-12)
    assert abs(local["observed_order"] - 2.0) < 0.3                # Strang: order 2


def test_spectral_study_reports_error_reduction_not_an_order(tmp_path):
    out = tmp_path / "gl"
    proc = run_module("study", "--refine", "tokens", "--discretization", "gauss-legendre",
                      "--levels", "4,8,16,32,128", "--features", "gauss-legendre:12",
                      "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    errors = [r["error"] for r in json.loads((out / "convergence.json").read_text())["table"][:-1]]
    line = next(ln for ln in proc.stdout.splitlines() if "per refinement" in ln)
    factors = [float(f) for f in re.findall(r"x([\d.e+]+)", line.split("(")[0])]
    expected = [a / b for a, b in zip(errors, errors[1:])]
    np.testing.assert_allclose(factors, expected, rtol=5e-3)      # printed with 3 digits
    assert factors[-1] > factors[0] > 1                           # faster than any power of h
    assert "means nothing" in line and "(expected spectral)" not in proc.stdout


def test_galerkin_hidden_study_names_the_composite_gauss_order(tmp_path):
    out = tmp_path / "p1"
    proc = run_module("study", "--refine", "hidden", "--discretization", "p1",
                      "--levels", "5,9,17,33,129", *SMALL, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    observed = json.loads((out / "convergence.json").read_text())["observed_order"]
    assert abs(observed - 6.0) < 0.5              # 3 Gauss points per element: order 2 * 3
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("observed order"))
    assert f"observed order {observed:.2f} (expected 6:" in line
    assert "composite Gauss rule" in line and "3 Gauss points per element" in line


def test_inconsistent_depth_limit_is_one_warning_line_and_no_expected_order(tmp_path):
    proc = run_module("study", "--refine", "time", "--placement", "post", "--levels", "1,2,4,16",
                      *SMALL, "--out", str(tmp_path / "post"))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctformer: warning: "), proc.stderr
    assert "consistent" in lines[0] and ".py:" not in lines[0]
    summary = next(ln for ln in proc.stdout.splitlines() if ln.startswith("observed order"))
    assert "no expected order" in summary and "(expected" not in summary
    data = json.loads((tmp_path / "post" / "convergence.json").read_text())
    assert data["consistent_limit"] is False


def test_removed_norm_option_is_refused_in_one_line(tmp_path, capsys):
    """``--norm`` (deprecated in 0.1) is gone: one error line, and ``--placement`` works."""
    assert cli.main(["study", "--refine", "time", "--norm", "pre", "--levels", "1,2,8", *SMALL,
                     "--out", str(tmp_path / "old")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["ctformer: error: unrecognized arguments: --norm pre (--norm was renamed "
                     "--placement in 0.2: use --placement pre)"]
    assert not (tmp_path / "old").exists()


class TwinEuler(solvers.Euler):
    """Explicit Euler under another name (module level: a stored study describes it by name)."""

    name = "test-twin-euler"


def _study_help() -> str:
    """``ctformer study --help`` of a parser built now, on one line."""
    study = cli.build_parser()._subparsers._group_actions[0].choices["study"]
    return " ".join(study.format_help().split())


def _registry_study(tmp_path, name, *options):
    """Run a small time-refinement study in this process; return the errors of its table."""
    out = tmp_path / name
    assert cli.main(["study", "--refine", "time", "--levels", "1,2,4,8,64", *SMALL,
                     *options, "--out", str(out)]) == 0
    return [row["error"] for row in json.loads((out / "convergence.json").read_text())["table"]]


def test_a_registered_scheme_and_tableau_reach_the_study_command(tmp_path, capsys):
    """Registering is all it takes: no edit of cli.py.

    A copy of explicit Euler registered under a new name gives Euler's errors bit for bit;
    Ralston's second-order tableau (a = 2/3, b = (1/4, 3/4)) as Strang's sub-step gives
    observed order 2 on the pre-norm model (design notes, section 4).
    """
    from ctformer import solvers
    from ctformer.solvers import base

    ralston = solvers.ButcherTableau("test-ralston", a=((), (2.0 / 3.0,)), b=(0.25, 0.75),
                                     order=2.0)
    base.register(TwinEuler)
    solvers.register_tableau(ralston)
    try:
        help_text = _study_help()
        assert "test-twin-euler" in help_text and "test-ralston" in help_text
        twin = _registry_study(tmp_path, "twin", "--scheme", "test-twin-euler")
        assert twin == _registry_study(tmp_path, "euler", "--scheme", "euler")
        errors = _registry_study(tmp_path, "ralston", "--scheme", "strang", "--substep", "test-ralston")
        heun = _registry_study(tmp_path, "heun", "--scheme", "strang", "--substep", "heun")
    finally:  # the registries as they were (register_tableau also registers a scheme)
        for name in ("test-twin-euler", "test-ralston"):
            base._REGISTRY.pop(name, None)
        solvers.TABLEAUS.pop("test-ralston", None)
    capsys.readouterr()
    order = math.log2(errors[2] / errors[3])  # k = 4 -> 8 steps per layer, against 64
    assert abs(order - 2.0) < 0.2, errors
    assert errors != heun  # another method, the same order
    assert "test-twin-euler" not in _study_help() and "test-ralston" not in _study_help()


def test_ctrl_c_prints_one_line_exits_130_and_resumes(tmp_path):
    out = tmp_path / "big"
    # the last case takes ~1 s here (AMD EPYC family 26; 4096 steps took 0.29 s, less than
    # the wait below, so the signal came after the study)
    args = ["study", "--refine", "time", "--levels", "1,2,4,8,16384", *SMALL, "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "ctformer", *args], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list((out / "cases").glob("*.json"))) < 4:
        assert proc.poll() is None and time.monotonic() < deadline, "the study ended too early"
        time.sleep(0.02)
    time.sleep(0.1)                                 # inside the long last case
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    cases = out / "cases"
    counted = rf"^ctformer: interrupted; 4 of 5 cases stored in {re.escape(str(cases))}; "
    fallback = rf"^ctformer: interrupted; finished cases are stored in {re.escape(str(cases))}; "
    import ctformer.studies as studies
    allowed = [counted] if hasattr(studies, "StudyInterrupted") else [counted, fallback]
    assert any(re.match(p + "rerun the same command to resume$", lines[0]) for p in allowed), lines
    assert len(list(cases.glob("*.json"))) == 4

    stamps = {p: p.stat().st_mtime_ns for p in cases.glob("*.json")}
    again = run_module(*args)
    assert again.returncode == 0, again.stderr
    assert len(list(cases.glob("*.json"))) == 5
    assert all(p.stat().st_mtime_ns == t for p, t in stamps.items())    # not recomputed
    data = json.loads((out / "convergence.json").read_text())
    assert abs(data["observed_order"] - 1.0) < 0.3                       # Lie: order 1


def test_a_ctrl_c_python_re_raised_as_another_error_still_ends_the_command(monkeypatch, capsys):
    """Python 3.11 turns a KeyboardInterrupt raised in a class's ``__set_name__`` (a Ctrl-C while
    Numba's lowering loads at a first compile) into ``RuntimeError: Error calling __set_name__``:
    the command reports the interrupt it carries (one line, status 130), not a crash. Errors that
    carry none keep their own handling."""
    class Lowering:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    def interrupted_compile(args):
        type("PyLower", (), {"typobj": Lowering()})  # raises RuntimeError from KeyboardInterrupt

    def wrapped_twice(args):
        try:
            interrupted_compile(args)
        except RuntimeError as exc:
            raise ImportError("cannot import the lowering") from exc

    for command in (interrupted_compile, wrapped_twice):
        monkeypatch.setitem(cli.COMMANDS, "list", command)
        assert cli.main(["list"]) == 130
        assert capsys.readouterr().err == "ctformer: interrupted\n"

    def bad_value(args):
        raise ValueError("levels must   increase")

    def crash(args):
        raise RuntimeError("a defect")

    monkeypatch.setitem(cli.COMMANDS, "list", bad_value)
    assert cli.main(["list"]) == 2
    assert capsys.readouterr().err == "ctformer: error: levels must increase\n"
    monkeypatch.setitem(cli.COMMANDS, "list", crash)
    with pytest.raises(RuntimeError, match="a defect"):
        cli.main(["list"])


def test_list_names_every_discretization_and_scheme(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    # orders of the design notes, sections 3 and 4
    for name, order in [("midpoint", "2"), ("trapezoid", "2"), ("gauss-legendre", "spectral"),
                        ("clenshaw-curtis", "spectral"), ("fourier", "spectral"),
                        ("chebyshev", "spectral"), ("legendre", "spectral"), ("p1", "2"),
                        ("p2", "3"), ("euler", "1"), ("lie", "1"), ("strang", "2"),
                        ("parallel", "1"), ("rk4", "4")]:
        assert re.search(rf"^\s+{re.escape(name)}\s+(\w+\s+)?{order}\b", out, re.M), name


def _comparison_rows(text: str, label: str) -> list[list[str]]:
    return [line.split()[2:] for line in text.splitlines() if line.strip().startswith(label)]


def test_demo_writes_tables_and_plots_and_says_what_next(tmp_path, capsys):
    out = tmp_path / "demo"
    start = time.perf_counter()
    assert cli.main(["demo", "--no-limit", "--no-progress", "--out", str(out)]) == 0
    assert time.perf_counter() - start < 40
    text = capsys.readouterr().out
    assert "refining tokens" in text and "refining depth" in text
    (midpoint, gauss), (lie, strang) = _comparison_rows(text, "observed order")
    assert abs(float(midpoint) - 2) < 0.3 and gauss == "-"        # spectral: no algebraic order
    assert abs(float(lie) - 1) < 0.3 and abs(float(strang) - 2) < 0.3
    (mid_red, gauss_red), _ = _comparison_rows(text, "last reduction")
    assert float(gauss_red.lstrip("x")) > 100 > float(mid_red.lstrip("x"))

    # the files: tables and plots, and the JSON orders agree with the printed ones
    for stem in ("tokens", "depth"):
        assert (out / f"{stem}.txt").read_text().startswith(f"refining {stem}")
        png = (out / f"{stem}.png").read_bytes()
        assert png[:4] == b"\x89PNG" and len(png) > 10_000
    data = json.loads((out / "depth-strang.json").read_text())
    assert f"{data['observed_order']:.2f}" == strang
    assert (out / "tokens-midpoint.csv").read_text().splitlines()[0] == "level,n,h,error,order,seconds"

    # the ending: next commands that work, and where the docs are
    tail = text[text.index("\nnext:"):].splitlines()
    commands = [line.strip() for line in tail if line.startswith("  ctformer ")]
    assert len(commands) >= 2 and "ctformer list" in commands
    assert tail[-1].startswith("docs: ") and "docs" in tail[-1]
    parser = cli.build_parser()
    for command in commands:                                   # every suggestion parses
        parser.parse_args(command.split()[1:])


def test_limit_prints_the_report(monkeypatch, capsys):
    import ctformer.bridges.minilm as bridges

    monkeypatch.setattr(bridges, "discrete_limit_report", lambda: "limit report: 1e-16")
    assert cli.main(["limit"]) == 0
    assert capsys.readouterr().out == "limit report: 1e-16\n"


def test_cluster_says_what_it_measures_and_plots(tmp_path, capsys):
    require("transformers")
    torch = require("torch")
    from ctformer.particles.minilm import load_minilm

    text = "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun."
    figure = tmp_path / "clusters.png"
    assert cli.main(["cluster", "--text", text, "--plot", str(figure)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^measured: .*inner products", out, re.M)
    assert re.search(r"^theory: .*cluster", out, re.M)
    rows = [line.split() for line in out.splitlines() if re.match(r"^\s+\d+\s+-?\d\.\d{4}\s", line)]
    means = np.array([float(r[1]) for r in rows])

    # independent reference: HuggingFace's own hidden states, put on the sphere
    model, tokenizer = load_minilm()
    batch = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch, output_hidden_states=True).hidden_states
    reference = []
    for h in hidden:
        x = h[0].double().numpy()
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        gram = x @ x.T
        reference.append(gram[np.triu_indices(len(x), 1)].mean())
    np.testing.assert_allclose(means, reference, atol=6e-5)      # printed with 4 decimals
    assert len(means) == 7 and means[-1] > means[0]               # tokens cluster with depth
    assert f"rises from {reference[0]:.3f}" in out

    from matplotlib import image

    pixels = image.imread(figure)
    assert figure.stat().st_size > 20_000 and np.ptp(pixels[..., :3]) > 0.5
    assert f"wrote {figure}" in out


def test_help_shows_defaults_and_every_option_is_explained():
    proc = run_module("study", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    for option, default in [("--layers LAYERS", "2"), ("--heads HEADS", "2"),
                            ("--placement {pre,post,post-projection,none}", "pre"),
                            ("--beta BETA", "4.0"),
                            ("--scheme {lie,strang,parallel,euler,heun,rk4,bosh3,dopri5,tsit5}", "lie"),
                            ("--error-norm {l2,max}", "l2")]:
        assert re.search(re.escape(option) + r" [^-]*\(default: " + re.escape(default) + r"\)",
                         text), option
    cluster = run_module("cluster", "--help")
    assert re.search(r"--text TEXT\s+the text to encode", cluster.stdout)
    assert re.search(r"--plot FILE\s+write", cluster.stdout)
    for parser_action in cli.build_parser()._subparsers._group_actions[0].choices.values():
        for action in parser_action._actions:
            assert action.help, (parser_action.prog, action.dest)


def test_bare_command_prints_usage_and_the_commands():
    proc = run_module()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("usage: ctformer")
    for command in cli.COMMANDS:
        assert re.search(rf"^\s+{command}\s+\w", proc.stderr, re.M), command


@pytest.mark.parametrize("args,message", [
    (["study", "--refine", "tokens", "--levels", "4,x", "--out", "OUT"], "--levels must be"),
    (["study", "--refine", "tokens", "--levels", "8", "--out", "OUT"], "at least two"),
    (["study", "--refine", "tokens", "--levels", "8,4,16", "--out", "OUT"], "strictly increasing"),
    (["study", "--refine", "tokens", "--levels", "-4,8,16", "--out", "OUT"],
     "every level must be a positive integer, and -4 is not (got '-4,8,16')"),
    (["study", "--refine", "tokens", "--levels", "4,-8,16", "--out", "OUT"],
     "every level must be a positive integer, and -8 is not (got '4,-8,16')"),
    (["study", "--refine", "tokens", "--levels", "4,8", "--out", "OUT"],
     "--levels 4,8: the finest level is the reference (--reference finest), so two levels "
     "leave one error and no order; give three or more levels"),
    (["study", "--refine", "tokens", "--discretization", "simpson", "--levels", "4,8,16",
      "--out", "OUT"], "unknown discretization 'simpson'"),
    (["study", "--refine", "time", "--scheme", "leapfrog", "--levels", "1,2,4", "--out", "OUT"],
     "argument --scheme: invalid choice: 'leapfrog' (choose from "),
    (["study", "--refine", "tokens", "--features", "midpoint", "--levels", "4,8,16", "--out", "OUT"],
     "needs a size"),
    (["study", "--refine", "depth", "--levels", "1,2,4", "--out", "OUT"], "invalid choice"),
    (["study", "--refine", "tokens", "--levels", "4,8,16", "--out", "FILE"],
     "is a file; give a directory"),
    (["study", "--refine", "tokens", "--levels", "4,8,16", "--out", "OUT",
      "--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "1"], "cannot reach the Dask scheduler"),
    (["cluster", "--plot", "clusters.txt"], "must end in .png, .pdf or .svg"),
])
def test_user_errors_are_one_line(tmp_path, capsys, args, message):
    (tmp_path / "afile").write_text("not a directory")
    args = [str(tmp_path / "out") if a == "OUT" else str(tmp_path / "afile") if a == "FILE" else a
            for a in args]
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


def test_a_bridge_added_to_the_registry_is_a_limit_model(monkeypatch, capsys):
    """``ctformer limit --model NAME`` reads the bridge registry: a copy of the GPT-2 entry under
    another name is a choice, and its report is GPT-2's, number for number."""
    require("torch")
    require("transformers")
    from ctformer.bridges import hf

    monkeypatch.setitem(hf.BRIDGES, "test-gpt2", hf.BRIDGES["gpt2"])
    assert "test-gpt2" in " ".join(cli.build_parser()._subparsers._group_actions[0]
                                   .choices["limit"].format_help().split())
    assert cli.main(["limit", "--model", "test-gpt2"]) == 0
    report = capsys.readouterr().out.strip()
    assert report == hf.limit_report("gpt2")
    errors = [float(e) for e in re.findall(r"layer \d+: max relative error ([0-9.e+-]+)", report)]
    assert len(errors) == 3 and max(errors) < 1e-12


def test_limit_for_a_network_class_reports_exactness_and_depth_orders():
    """``ctformer limit --model gpt2``: per-layer errors at rounding, lie order 1, strang 2."""
    proc = run_module("limit", "--model", "gpt2", timeout=300)
    assert proc.returncode == 0, proc.stderr
    errors = [float(m) for m in re.findall(r"layer \d+: max relative error ([0-9.e+-]+)", proc.stdout)]
    assert len(errors) == 3 and max(errors) < 1e-12
    orders = dict(re.findall(r"(lie|strang): [^\n]*\n\s+observed order ([0-9.]+)", proc.stdout))
    assert abs(float(orders["strang"]) - 2.0) < 0.2
    assert 0.6 < float(orders["lie"]) < 1.2          # first order (pre-asymptotic at k = 1)
    bad = run_module("limit", "--model", "gpt2", "--pretrained")
    assert bad.returncode == 2 and "--pretrained applies to --model bert" in bad.stderr


def test_cluster_says_when_the_text_was_cut(capsys):
    """Before: a text of 600 words was reported as "512 tokens" with no word that the rest was
    left out. The reference is HuggingFace's tokenizer, which counts the whole text."""
    require("transformers")
    require("torch")
    from ctformer.particles.minilm import load_minilm

    text = " ".join(["word"] * 600)
    _, tokenizer = load_minilm()
    assert len(tokenizer(text)["input_ids"]) == 602 > 512
    assert cli.main(["cluster", "--text", text]) == 0
    out = capsys.readouterr().out
    assert ": 512 tokens, 6 layers" in out
    assert "a longer --text was cut to its first 512" in out
    assert cli.main(["cluster", "--text", "a short text"]) == 0
    assert "was cut" not in capsys.readouterr().out

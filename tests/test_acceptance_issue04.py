"""Acceptance of issue 4 (solvers and convergence studies) where no earlier test asserts it.

References: closed forms of the schemes' steps on linear sub-flows (matrix polynomials), the
issue's spectral criterion (the error falls by at least 100x per doubling until below 1e-10),
and the Python API for the command line's table.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ctformer import cli, solvers
from ctformer.solvers import SplitProblem
from ctformer.studies import convergence

RNG = np.random.default_rng(4)
A = RNG.standard_normal((4, 4)) / 2       # the first sub-flow ("attention")
B = RNG.standard_normal((4, 4)) / 2       # the second ("FFN")
U0 = RNG.standard_normal((4, 3))
PROBLEM = SplitProblem([lambda u: A @ u, lambda u: B @ u])


def _heun(M, tau):
    """Heun's step of u' = M u over tau: I + tau M + (tau M)^2 / 2."""
    step = tau * M
    return np.eye(4) + step + step @ step / 2


def test_strang_default_is_macaron_with_heun_substeps():
    """Issue 4: "Strang (Macaron order: half FFN, full attention, half FFN; sub-flows by a
    second-order method, Heun by default, selectable)"."""
    dt = 0.3
    expected = _heun(B, dt / 2) @ _heun(A, dt) @ _heun(B, dt / 2) @ U0
    scheme = solvers.get("strang")
    assert scheme.substep == "heun" and scheme.order() == 2.0
    np.testing.assert_allclose(scheme.step(PROBLEM, U0, dt), expected, rtol=1e-14, atol=1e-14)


def test_parallel_is_the_average_of_sub_flows_run_with_k_dt():
    """Issue 4: "Parallel (additive splitting: the average of K sub-flows each run with K dt)"
    (here K = 2, each sub-flow by Heun over 2 dt)."""
    dt = 0.3
    expected = 0.5 * (_heun(A, 2 * dt) + _heun(B, 2 * dt)) @ U0
    got = solvers.Parallel(substep="heun").step(PROBLEM, U0, dt)
    np.testing.assert_allclose(got, expected, rtol=1e-14, atol=1e-14)


def test_get_maps_the_five_names_to_the_scheme_objects_and_orders():
    """Issue 4: "each has order, and get(name) maps "euler", "lie", "strang", "parallel", "rk4"
    to them" (``order`` became the method ``order(problem=None)`` in 0.2)."""
    classes = {"euler": (solvers.Euler, 1.0), "lie": (solvers.Lie, 1.0),
               "strang": (solvers.Strang, 2.0), "parallel": (solvers.Parallel, 1.0),
               "rk4": (solvers.RK4, 4.0)}
    for name, (cls, order) in classes.items():
        scheme = solvers.get(name)
        assert type(scheme) is cls and scheme.order() == order


def _smooth_in_x(x, y):
    """A milder x-dependence than the default u0 (phase amplitude 0.5), as the issue 4 studies."""
    return np.cos(4.0 * y + 0.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


@pytest.fixture(scope="module")
def smooth_model():
    from ctformer.model import ContinuousTransformer

    return ContinuousTransformer.random_smooth(seed=0, layers=2, placement="pre")


@pytest.mark.parametrize("refine,name,levels", [
    ("features", "clenshaw-curtis", [9, 17, 33, 65]), ("features", "legendre", [8, 16, 32, 64]),
    ("hidden", "chebyshev", [5, 9, 17, 33]), ("hidden", "legendre", [4, 8, 16, 32]),
])
def test_spectral_families_in_features_and_hidden(smooth_model, refine, name, levels):
    """Issue 4: "gauss-legendre, clenshaw-curtis, chebyshev and legendre spectral (error falls by
    at least 100x per doubling until below 1e-10) ... Features and FFN hidden variable: the same
    families" (the families tests/test_studies.py does not run in these variables)."""
    kw = {refine: name, **{v: "gauss-legendre:12" for v in ("tokens", "features") if v != refine}}
    res = convergence(smooth_model, refine=refine, levels=levels, u0=_smooth_in_x,
                      progress=False, **kw)
    e = res.errors
    for coarse, fine in zip(e, e[1:]):
        assert fine <= max(coarse / 100, 1e-10), e
    assert e[-1] < 1e-8


def test_the_issues_study_command_prints_and_writes_the_table(tmp_path, capsys):
    """Issue 4: "ctformer study --refine tokens --discretization gauss-legendre --levels
    4,8,16,32 --scheme strang --out DIR ... prints the table and writes CSV, JSON and a PNG
    plot", with the numbers of ``convergence`` called with the same choices."""
    out = tmp_path / "study"
    code = cli.main(["study", "--refine", "tokens", "--discretization", "gauss-legendre",
                     "--levels", "4,8,16,32", "--scheme", "strang", "--out", str(out),
                     "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "convergence in tokens (gauss-legendre)" in printed
    table = json.loads((out / "convergence.json").read_text())["table"]
    assert [r["n"] for r in table] == [4, 8, 16, 32]
    assert (out / "convergence.csv").read_text().splitlines()[0] == "level,n,h,error,order,seconds"
    assert (out / "convergence.png").read_bytes()[:4] == b"\x89PNG"
    from ctformer.model import ContinuousTransformer

    api = convergence(ContinuousTransformer.random_smooth(seed=0, layers=2), refine="tokens",
                      levels=[4, 8, 16, 32], tokens="gauss-legendre", scheme="strang",
                      progress=False)
    np.testing.assert_allclose([r["error"] for r in table[:-1]], api.errors, rtol=1e-12)

"""Convergence studies: orders against closed forms, export, executors, Dask, resume."""
from __future__ import annotations

import concurrent.futures
import csv
import functools
import json
import math
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from scipy.integrate import quad_vec

import ctformer.solvers as solvers
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.studies import convergence, smooth_initial_state

from .conftest import fitted_order, require

ROOT = Path(__file__).resolve().parents[1]


# -- a toy model with a closed-form solution ---------------------------------------------------
def a(x):
    return 0.5 * np.cos(x)


def b(x):
    return np.exp(x)


def alpha(y):
    return 0.5 * np.sin(2 * y + 0.3)


def beta(y):
    return 1.0 + y**2


LAMBDA = (math.e * (math.sin(1.0) + math.cos(1.0)) - 1.0) / 4.0   # int_0^1 a b dx
KAPPA = quad_vec(lambda y: alpha(y) * beta(y), 0.0, 1.0, epsabs=1e-14)[0]  # int_0^1 alpha beta dy


class RankOneModel:
    r"""u' = a(x) \int b u dx' + alpha(y) \int beta u d eta on [0, 1] (one layer, T = 1).

    The two flows act on different variables and commute, so u(1) = e^{A} e^{B} u0 with
    e^{A} = I + (e^{lambda} - 1)/lambda a (b, .) (rank one), likewise for B. ``solve`` follows
    the ContinuousTransformer signature; integrals use each discretization's quadrature.
    With ``exact_time=True`` the semi-discrete system is integrated exactly in time.
    """

    layers = 1

    def __init__(self, exact_time=False, log=None):
        self.exact_time, self.log = exact_time, log

    def solve(self, u0, *, tokens, features, head_features=None, hidden=None, scheme="lie",
              steps_per_layer=1, trajectory=False):
        x, y = tokens.nodes, features.nodes
        u = np.asarray(u0(x[:, None], y[None, :]), dtype=float)
        bx, by = tokens.weights * b(x), features.weights * beta(y)
        flows = [lambda v: a(x)[:, None] * (bx @ v)[None, :],
                 lambda v: alpha(y)[None, :] * (v @ by)[:, None]]
        start = u
        if self.exact_time:
            lam, kap = bx @ a(x), by @ alpha(y)
            u = u + (np.exp(lam) - 1) / lam * flows[0](u)
            u = u + (np.exp(kap) - 1) / kap * flows[1](u)
        else:
            problem, method = solvers.SplitProblem(flows), solvers.get(scheme)
            for _ in range(steps_per_layer):
                u = method.step(problem, u, 1.0 / steps_per_layer)
        if self.log is not None:
            with open(self.log, "a") as handle:
                handle.write(f"{tokens.name} {tokens.n} {features.n} {steps_per_layer}\n")
        return [start, u] if trajectory else u


@functools.lru_cache
def _double_integral(u0):
    """int int b(x) beta(y) u0(x, y) dx dy: quad_vec in x, numpy's 60-point Gauss rule in y."""
    t, w = np.polynomial.legendre.leggauss(60)
    t, w = (t + 1) / 2, w / 2
    return float(w @ (beta(t) * quad_vec(lambda s: b(s) * u0(s, t), 0, 1, epsabs=1e-14)[0]))


def exact_solution(x, y, u0=smooth_initial_state):
    """u(1, x, y) of RankOneModel, with the integrals of u0 by scipy quad_vec."""
    x, y = np.broadcast_arrays(x, y)
    xs, ys = x[:, 0], y[0, :]
    c0 = quad_vec(lambda s: b(s) * u0(s, ys), 0, 1, epsabs=1e-14)[0]          # (Q,)
    d0 = quad_vec(lambda s: beta(s) * u0(xs, s), 0, 1, epsabs=1e-14)[0]       # (P,)
    e0 = _double_integral(u0)
    ca, cb = (math.exp(LAMBDA) - 1) / LAMBDA, (math.exp(KAPPA) - 1) / KAPPA
    return (u0(x, y) + ca * a(x) * c0[None, :] + cb * alpha(y) * d0[:, None]
            + ca * cb * e0 * a(x) * alpha(y))


@pytest.fixture(scope="module")
def exact_model():
    return RankOneModel(exact_time=True)


# -- orders against the closed form ----------------------------------------------------------
def test_token_order_midpoint_and_spectral_gauss(exact_model):
    mid = convergence(exact_model, refine="tokens", levels=[4, 8, 16, 32], tokens="midpoint",
                      features="gauss-legendre:12", reference=exact_solution, progress=False)
    assert mid.reference == "exact" and len(mid.table) == 4
    assert abs(mid.observed_order - 2.0) < 0.3
    assert abs(fitted_order(mid.h, mid.errors) - mid.observed_order) < 1e-12
    gl = convergence(exact_model, refine="tokens", levels=[6, 12, 24], tokens="gauss-legendre",
                     features="gauss-legendre:12", reference=exact_solution, progress=False)
    e = gl.errors
    assert e[1] < e[0] / 100 and e[2] < 1e-10


def test_feature_order_in_max_norm(exact_model):
    res = convergence(exact_model, refine="features", levels=[4, 8, 16, 32], features="trapezoid",
                      tokens="gauss-legendre:12", reference=exact_solution, error_norm="max",
                      progress=False)
    assert res.norm == "max"
    assert abs(res.observed_order - 2.0) < 0.3


@pytest.mark.parametrize("scheme,order", [("euler", 1.0), ("strang", 2.0), ("rk4", 4.0)])
def test_time_order_against_exact(scheme, order):
    res = convergence(RankOneModel(), refine="time", levels=[4, 8, 16, 32], scheme=scheme,
                      tokens="gauss-legendre:12", features="gauss-legendre:12",
                      reference=exact_solution, progress=False)
    assert res.table[0].h == 0.25 and res.expected_order == order
    assert abs(res.observed_order - order) < 0.3


def test_richardson_and_finest_references_agree_with_exact(exact_model):
    kw = dict(refine="tokens", levels=[8, 16, 32, 64], tokens="midpoint",
              features="gauss-legendre:12", progress=False)
    exact = convergence(exact_model, reference=exact_solution, **kw)
    rich = convergence(exact_model, reference="richardson", **kw)
    np.testing.assert_allclose(rich.errors[:2], exact.errors[:2], rtol=0.05)
    finest = convergence(exact_model, **kw)
    assert finest.table[-1].error is None and finest.reference == "finest"
    # e_h - e_ref with e_ref ~ (h/8)^2: within 1/16 + O(h) of the true error at the coarsest
    assert abs(finest.errors[0] / exact.errors[0] - 1.0) < 0.1


def test_table_orders_min_std_and_exports(exact_model, tmp_path):
    res = convergence(exact_model, refine="tokens", levels=[4, 8, 16, 32], tokens="midpoint",
                      features="gauss-legendre:12", reference=exact_solution, progress=False)
    rows = res.table
    for prev, row in zip(rows, rows[1:]):
        assert row.order == pytest.approx(math.log(prev.error / row.error) / math.log(prev.h / row.h))
    assert rows[0].order is None and [r.n for r in rows] == [4, 8, 16, 32]
    assert rows[1].h == 1 / 8 and all(r.seconds >= 0 for r in rows)

    # smallest feature std over the token nodes of u0 and u(1), by a 100-point Gauss rule in y
    def std(f, x):
        rule = GaussLegendre(100)
        v = f(x[:, None], rule.nodes[None, :])
        mean = v @ rule.weights
        return np.sqrt(((v - mean[:, None]) ** 2) @ rule.weights)

    x = np.concatenate([res_grid.nodes for res_grid in map(Midpoint, (4, 8, 16, 32))])
    lower = min(std(smooth_initial_state, x).min(), std(exact_solution, x).min())
    assert res.min_feature_std == pytest.approx(lower, rel=0.02)

    csv_path, json_path = res.to_csv(tmp_path / "t.csv"), res.to_json(tmp_path / "t.json")
    with open(csv_path) as handle:
        table = list(csv.DictReader(handle))
    assert list(table[0]) == ["level", "n", "h", "error", "order", "seconds"]
    assert [float(r["error"]) for r in table] == [r.error for r in rows]
    data = json.loads(json_path.read_text())
    assert data["observed_order"] == res.observed_order and data["refine"] == "tokens"
    assert [r["error"] for r in data["table"]] == [r.error for r in rows]
    text = str(res)
    assert "convergence in tokens (midpoint)" in text and "observed order" in text

    fig = res.plot(tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    slope = [ln for ln in fig.axes[0].lines if ln.get_linestyle() == "--"][0]
    hs, es = slope.get_data()
    assert math.log(es[0] / es[1]) / math.log(hs[0] / hs[1]) == pytest.approx(2.0)


def test_bad_input(exact_model):
    kw = dict(refine="tokens", levels=[4, 8], progress=False)
    with pytest.raises(ValueError, match="refine must be one of"):
        convergence(exact_model, refine="depth", levels=[1, 2])
    with pytest.raises(ValueError, match="strictly increasing"):
        convergence(exact_model, refine="tokens", levels=[8, 4])
    with pytest.raises(ValueError, match="at least two"):
        convergence(exact_model, refine="tokens", levels=[8])
    with pytest.raises(ValueError, match="positive integers"):
        convergence(exact_model, refine="tokens", levels=[0, 4])
    with pytest.raises(ValueError, match="error_norm must be"):
        convergence(exact_model, error_norm="l1", **kw)
    with pytest.raises(TypeError, match=r"convergence\(norm=\) was renamed error_norm="):   # removed in 0.2
        convergence(exact_model, norm="l2", **kw)
    with pytest.raises(ValueError, match="reference must be"):
        convergence(exact_model, reference="best", **kw)
    with pytest.raises(ValueError, match="richardson"):
        convergence(exact_model, reference="richardson", tokens="gauss-legendre", **kw)
    with pytest.raises(ValueError, match="needs a size"):
        convergence(exact_model, features="midpoint", **kw)
    with pytest.raises(ValueError, match="unknown discretization 'simpson'"):
        convergence(exact_model, tokens="simpson", **kw)
    with pytest.raises(ValueError, match="unknown scheme"):
        convergence(exact_model, scheme="leapfrog", **kw)
    with pytest.raises(ValueError, match="u0 must be a callable"):
        convergence(exact_model, u0=np.ones((4, 4)), **kw)
    with pytest.raises(ValueError, match="window"):
        convergence(exact_model, window=(0.5, 2.0), **kw)
    with pytest.raises(TypeError, match="executor must be"):
        convergence(exact_model, executor="threads", **kw)


# -- the real model: orders in every variable ------------------------------------------------
def smooth_in_x(x, y):
    """The default study u0 with a milder x-dependence.

    The default u0 has a feature variance whose continuation to complex x vanishes close to
    the real axis, so LayerNorm makes the solution analytic only in a thin strip: spectral
    rules then converge geometrically but slowly (about 30x per doubling from n = 16), and
    high-order rules reach their asymptotic regime late. A phase amplitude 0.5 instead of 1.5
    widens the strip.
    """
    return np.cos(4.0 * y + 0.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


@pytest.fixture(scope="module")
def smooth_model():
    from ctformer.model import ContinuousTransformer

    return ContinuousTransformer.random_smooth(seed=0, layers=2, placement="pre")


def _fixed_others(refine, name):
    kw = {refine: name}
    for var in ("tokens", "features"):
        if var != refine:
            kw[var] = "gauss-legendre:12"
    return kw


# The finest level is the reference; it is 4-8x finer than the last measured level, so that
# e_h - e_ref is within a few per cent of e_h (a reference only 2x finer biases the last
# order upwards: log2(2^p + 1) for p = 1 reads 1.58).
ALGEBRAIC = [
    ("tokens", "midpoint", [4, 8, 16, 32, 256], 2), ("tokens", "trapezoid", [5, 9, 17, 33, 257], 2),
    ("tokens", "p1", [5, 9, 17, 33, 257], 2), ("tokens", "p2", [9, 17, 33, 65, 257], 3),
    ("features", "midpoint", [4, 8, 16, 32, 256], 2), ("features", "trapezoid", [5, 9, 17, 33, 257], 2),
    ("features", "p1", [5, 9, 17, 33, 129], 2), ("features", "p2", [9, 17, 33, 65, 257], 3),
    ("hidden", "midpoint", [4, 8, 16, 32, 256], 2), ("hidden", "trapezoid", [5, 9, 17, 33, 257], 2),
]


@pytest.mark.parametrize("refine,name,levels,order", ALGEBRAIC)
def test_algebraic_orders_on_random_smooth_model(smooth_model, refine, name, levels, order):
    res = convergence(smooth_model, refine=refine, levels=levels, u0=smooth_in_x, progress=False,
                      **_fixed_others(refine, name))
    assert res.expected_order == order and len(res.errors) == 4
    assert abs(res.observed_order - order) < 0.3
    assert res.min_feature_std > 0.3


@pytest.mark.parametrize("name", ["p1", "p2"])
def test_galerkin_hidden_variable_is_a_composite_gauss_rule(smooth_model, name):
    # The state has no r-dependence: r only enters through the FFN integral, evaluated at the
    # elements' Gauss points, so the error is that of a composite Gauss rule, far above the
    # L2 order of the elements.
    res = convergence(smooth_model, refine="hidden", levels=[3, 5, 9, 17, 65], u0=smooth_in_x,
                      progress=False, **_fixed_others("hidden", name))
    assert res.observed_order > res.expected_order + 2


SPECTRAL = [
    ("tokens", "gauss-legendre", [8, 16, 32, 64]), ("tokens", "clenshaw-curtis", [9, 17, 33, 65]),
    ("tokens", "chebyshev", [9, 17, 33, 65]), ("tokens", "legendre", [8, 16, 32, 64]),
    ("features", "gauss-legendre", [8, 16, 32, 64]), ("features", "chebyshev", [9, 17, 33, 65]),
    ("hidden", "gauss-legendre", [4, 8, 16, 32]), ("hidden", "clenshaw-curtis", [5, 9, 17, 33]),
]


@pytest.mark.parametrize("refine,name,levels", SPECTRAL)
def test_spectral_convergence_on_random_smooth_model(smooth_model, refine, name, levels):
    res = convergence(smooth_model, refine=refine, levels=levels, u0=smooth_in_x, progress=False,
                      **_fixed_others(refine, name))
    assert math.isinf(res.expected_order)
    e = res.errors
    for coarse, fine in zip(e, e[1:]):           # >= 100x per doubling until below 1e-10
        assert fine <= max(coarse / 100, 1e-10)
    assert e[-1] < 1e-8


@pytest.mark.parametrize("diagonal,order", [("full", 1.0), ("half", 2.0)])
def test_causal_diagonal_rule_orders(diagonal, order):
    """Causal attention on midpoint tokens: the full diagonal cell is first order, half second.

    Levels n, 3n, 9n, ... nest the midpoint nodes, and the error is measured at the nodes of
    the coarsest level, so no reconstruction error (O(h^2) for midpoint) hides the O(h) term.
    """
    from ctformer.model import ContinuousTransformer

    model = ContinuousTransformer.random_smooth(seed=0, layers=2, mask="causal", diagonal=diagonal)
    res = convergence(model, refine="tokens", levels=[4, 12, 36, 108, 972], tokens="midpoint",
                      features="gauss-legendre:12", evaluate="coarsest-nodes",
                      expected_order=order, progress=False)
    assert abs(res.observed_order - order) < 0.3


def test_time_study_of_post_norm_affine_model_warns():
    from ctformer.model import ContinuousTransformer, InconsistentDepthLimitWarning

    model = ContinuousTransformer.random_smooth(seed=0, layers=1, placement="post")
    with pytest.warns(InconsistentDepthLimitWarning) as record:
        convergence(model, refine="time", levels=[1, 2], tokens="midpoint:6",
                    features="midpoint:6", progress=False)
    assert len(record) == 1           # once per study, not once per case


# -- execution: executors, Dask, resume ---------------------------------------------------------
STUDY = dict(refine="tokens", levels=[4, 8, 16, 32, 64], tokens="midpoint",
             features="gauss-legendre:8", progress=False)


def test_executors_give_the_same_table(exact_model):
    serial = convergence(exact_model, **STUDY)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        threads = convergence(exact_model, executor=pool, **STUDY)
    with concurrent.futures.ProcessPoolExecutor(2) as pool:
        processes = convergence(exact_model, executor=pool, **STUDY)
    for other in (threads, processes):
        assert [r.error for r in other.table] == [r.error for r in serial.table]
    assert serial.table[0].error > 0

    locked = RankOneModel(exact_time=True)
    locked.lock = threading.Lock()           # does not pickle
    with concurrent.futures.ProcessPoolExecutor(1) as pool, \
            pytest.raises(TypeError, match="cannot be sent to other processes"):
        convergence(locked, executor=pool, **STUDY)


FORKED_AFTER_TORCH = textwrap.dedent("""
    import concurrent.futures, multiprocessing
    import numpy as np, torch
    from ctformer.model import ContinuousTransformer
    from ctformer.studies import convergence
    torch.set_num_threads(2)
    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    u0 = torch.from_numpy(np.random.default_rng(0).standard_normal((6, 6))).float()
    study = dict(refine="time", levels=[1, 2, 4, 8], tokens="midpoint:6", features="midpoint:6",
                 progress=False, u0=u0)
    here = convergence(model, **study)          # torch computes on its two threads here
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        forked = convergence(model, executor=pool, **study)
    print(repr([r.error for r in here.table]), "|", repr([r.error for r in forked.table]),
          "|", torch.get_num_threads())
""")


def test_a_forking_pool_after_torch_computed_here_finishes_with_the_same_errors():
    """torch's OpenMP team does not survive a fork: the cases of a torch-state study on a forking
    process pool, after the same study here, waited for ever in their first threaded torch call.
    A forked child now runs torch on one thread; the errors are those of the study here."""
    require("torch")
    proc = subprocess.run([sys.executable, "-c", FORKED_AFTER_TORCH], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    here, forked, threads = proc.stdout.strip().split("|")
    assert eval(here) == eval(forked) and eval(here)[0] > 1e-4
    assert int(threads) == 2   # the parent keeps its own count


def test_dask_local_cluster_matches_in_process():
    distributed = require("distributed")
    from ctformer.model import ContinuousTransformer

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)
    study = dict(refine="tokens", levels=[4, 8, 16, 32], tokens="midpoint",
                 features="gauss-legendre:8", progress=False)
    serial = convergence(model, **study)
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  host="127.0.0.1", dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        remote = convergence(model, executor=client, **study)
        assert len(client.scheduler_info()["workers"]) == 2
    np.testing.assert_allclose([r.error for r in remote.table[:-1]],
                               [r.error for r in serial.table[:-1]], rtol=1e-12)


KILLED_STUDY = textwrap.dedent("""
    import os, signal, sys
    from tests.test_studies import RankOneModel, STUDY
    from ctformer.studies import convergence

    # the model and its class are untouched (a class's code is part of its identity); the
    # task that computes a case dies during case 3
    running = sys.modules["ctformer.studies.convergence"]
    solves, original = [0], running.compute_case
    def dying(study, level):
        solves[0] += 1
        if solves[0] > int(sys.argv[3]):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(study, level)
    running.compute_case = dying

    convergence(RankOneModel(exact_time=True, log=sys.argv[2]), store=sys.argv[1], **STUDY)
""")


def test_killed_study_resumes_without_loss_or_duplication(tmp_path, exact_model):
    store, log = tmp_path / "store", tmp_path / "solves.log"
    proc = subprocess.run([sys.executable, "-c", KILLED_STUDY, str(store), str(log), "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr          # killed by SIGKILL during case 3
    assert len(list(store.glob("*.json"))) == 2
    assert not [p for p in store.iterdir() if p.suffix != ".json"]  # no temporary leftovers

    resumed = convergence(RankOneModel(exact_time=True, log=str(log)), store=store, **STUDY)
    fresh = convergence(exact_model, **STUDY)
    assert [r.error for r in resumed.table] == [r.error for r in fresh.table]
    solved = [int(line.split()[1]) for line in log.read_text().split("\n")
              if line.startswith("midpoint") and int(line.split()[1]) in STUDY["levels"]]
    assert sorted(solved) == STUDY["levels"]      # every case exactly once over both runs
    again = convergence(RankOneModel(exact_time=True, log=str(log)), store=store, **STUDY)
    assert [r.error for r in again.table] == [r.error for r in fresh.table]
    assert len([ln for ln in log.read_text().split("\n") if ln.startswith("midpoint 4 ")]) == 1
    assert len(list(store.glob("*.json"))) == 5


def test_progress_bar_on_stderr(exact_model, capsys):
    convergence(exact_model, refine="tokens", levels=[4, 8], tokens="midpoint",
                features="gauss-legendre:8", progress=True)
    err = capsys.readouterr().err
    assert "tokens study" in err and "2/2" in err

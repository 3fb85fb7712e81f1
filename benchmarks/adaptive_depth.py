r"""Benchmark: right-hand-side evaluations of error-controlled depth at equal achieved error.

Run ``python benchmarks/adaptive_depth.py`` (about 10 s; ``--quick``: rtol 1e-4..1e-8 and
L <= 4; ``--peers-only``: the references and the peers without ctformer's side).

Two problems, each with an independent reference (``tests/depth_reference.py``:
``solve_ivp(method="DOP853", rtol=1e-13, atol=1e-15)``):

- a pre-norm ``torch.nn.TransformerEncoder`` (4 layers, d_model 16, 2 heads, d_ff 32, float64)
  on 16 tokens: ctformer evolves ``from_torch(encoder)`` on ``Midpoint`` grids; the peers
  integrate the right-hand side :math:`SA_l(LN^1_l u) + FFN_l(LN^2_l u)` written from the
  module's own layers, layer by layer (they are told where the layers end, as ctformer knows);
- self-attention particles (n = 32, d = 3, beta = 4, Q = K = V = I, t in [0, 4]).

1. **Work at equal error.** ctformer ``tsit5`` and ``dopri5`` against ``solve_ivp`` ``RK45``
   and ``DOP853`` and ``torchdiffeq.odeint(method="dopri5")``, each over rtol = 1e-4 .. 1e-10
   (atol = 1e-3 rtol). The achieved error is the relative :math:`L^2` error
   :math:`\|u - u_{ref}\| / \|u_{ref}\|` (midpoint and particle weights are uniform, so it is
   the same in every norm used here). For each pair the evaluations are interpolated in
   log-log at common errors (inside both ranges) and the ratio ctformer / peer is printed; the
   goal "no more evaluations" is **met** when every ratio is <= 1.
2. **Layer boundaries.** ``solve_ivp`` RK45 / DOP853 on ``[0, L]``, unaware of the layer
   boundaries (a right-hand side that switches layer at each integer depth), against
   ctformer's ``tsit5`` / ``dopri5`` which never step across one: rejected steps and
   evaluations for L = 1, 2, 4, 8 at rtol 1e-8; the goal "ctformer's rejections do not grow
   with L" is met when its rejections on L layers are at most those on one layer plus one.

Evaluations are counted by a wrapper around each peer's right-hand side (``solve_ivp``'s own
``nfev`` agrees); ctformer's are ``Solution.stats["rhs_evaluations"]``. No timings are
claimed: the counts do not depend on the machine. The CPU model is printed for the record.
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

from tests import depth_reference as R  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import header, summary, verdict  # noqa: E402

N_TOKENS, D_MODEL, LAYERS = 16, 16, 4
BETA, T1 = 4.0, 4.0
RTOLS = [10.0 ** -k for k in range(4, 11)]


def relative_l2(u, ref) -> float:
    return float(np.linalg.norm(np.asarray(u) - ref) / np.linalg.norm(ref))


# -- the problems: (initial state, reference final state, layer right-hand sides, spans) ---------
def encoder_problem(layers=LAYERS):
    import torch

    torch.set_num_threads(1)
    encoder = R.make_encoder(layers=layers, d_model=D_MODEL, heads=2, d_ff=32, seed=0)
    u0 = R.smooth_tokens(N_TOKENS, D_MODEL, seed=0)
    pieces = [(float(l), float(l + 1), R.layer_rhs(layer), R.layer_rhs_torch(layer))
              for l, layer in enumerate(encoder.layers)]
    return encoder, u0, R.layerwise_reference(encoder, u0).final, pieces


def particle_problem():
    x0 = R.sphere_points(32, 3, seed=0)
    ref = R.sa_reference(x0, BETA, T1)[1][-1]
    pieces = [(0.0, T1, lambda x: R.sa_velocity(x, BETA), lambda x: R.sa_velocity_torch(x, BETA))]
    return x0, ref, pieces


# -- the peers -----------------------------------------------------------------------------------
def scipy_run(u0, pieces, method, rtol, atol):
    """solve_ivp piece by piece: (final state, evaluations)."""
    u, calls = np.asarray(u0, float), 0
    for t0, t1, rhs, _ in pieces:
        f = R.Counted(lambda _, v, rhs=rhs: rhs(v), u.shape)
        sol = solve_ivp(f, (t0, t1), u.ravel(), method=method, rtol=rtol, atol=atol)
        assert sol.success and sol.nfev == f.calls, sol.message
        u, calls = sol.y[:, -1].reshape(u.shape), calls + f.calls
    return u, calls


def torchdiffeq_run(u0, pieces, rtol, atol):
    """torchdiffeq.odeint(method="dopri5") piece by piece: (final state, evaluations)."""
    import torch
    from torchdiffeq import odeint

    u, calls = torch.from_numpy(np.array(u0, dtype=np.float64)), [0]
    for t0, t1, _, rhs in pieces:
        def f(_, v, rhs=rhs):
            calls[0] += 1
            return rhs(v)

        with torch.no_grad():
            u = odeint(f, u, torch.tensor([t0, t1], dtype=torch.float64), rtol=rtol, atol=atol,
                       method="dopri5")[-1]
    return u.numpy(), calls[0]


# -- ctformer ------------------------------------------------------------------------------------
def ctformer_encoder(encoder, u0, scheme, rtol, atol):
    from ctformer.bridges.torch import from_torch
    from ctformer.discretizations import Midpoint

    sol = from_torch(encoder).evolve(u0, tokens=Midpoint(N_TOKENS), features=Midpoint(D_MODEL),
                                     context_length=N_TOKENS, scheme=scheme, rtol=rtol, atol=atol)
    return np.asarray(sol.final), sol.stats


def ctformer_particles(x0, scheme, rtol, atol):
    from ctformer.particles import SelfAttentionDynamics

    sol = SelfAttentionDynamics(BETA).evolve(x0, T1, scheme=scheme, rtol=rtol, atol=atol)
    return np.asarray(sol.final), sol.stats


# -- work at equal error -------------------------------------------------------------------------
def sweep(run, ref, rtols):
    """[(rtol, achieved error, evaluations)] of ``run(rtol, atol) -> (state, evaluations)``."""
    rows = []
    for rtol in rtols:
        u, calls = run(rtol, 1e-3 * rtol)
        rows.append((rtol, relative_l2(u, ref), calls))
    return rows


def evaluations_at(rows, errors):
    """Evaluations interpolated in log-log at ``errors`` (NaN outside the measured range)."""
    err = np.log([r[1] for r in rows])
    work = np.log([r[2] for r in rows])
    order = np.argsort(err)
    err, work = err[order], np.maximum.accumulate(work[order][::-1])[::-1]
    out = np.exp(np.interp(np.log(errors), err, work, left=np.nan, right=np.nan))
    return out


def equal_error_ratios(ours, peer):
    """Ratios ours/peer of evaluations at 5 common errors inside both ranges."""
    lo = max(min(r[1] for r in ours), min(r[1] for r in peer))
    hi = min(max(r[1] for r in ours), max(r[1] for r in peer))
    if not lo < hi:
        return np.array([]), np.array([])
    errors = np.geomspace(lo, hi, 5)
    return errors, evaluations_at(ours, errors) / evaluations_at(peer, errors)


def work_table(name, u0, ref, pieces, ctformer_run, rtols, peers_only):
    print(f"\n== {name}: work at equal error (relative L2 error vs DOP853 rtol 1e-13) ==")
    runs = {"scipy RK45": lambda r, a: scipy_run(u0, pieces, "RK45", r, a),
            "scipy DOP853": lambda r, a: scipy_run(u0, pieces, "DOP853", r, a),
            "torchdiffeq dopri5": lambda r, a: torchdiffeq_run(u0, pieces, r, a)}
    ours = {}
    if not peers_only:
        for scheme in ("tsit5", "dopri5"):
            def run(r, a, scheme=scheme):
                u, stats = ctformer_run(scheme, r, a)
                return u, stats["rhs_evaluations"]
            ours[f"ctformer {scheme}"] = run
    results = {label: sweep(run, ref, rtols) for label, run in {**ours, **runs}.items()}
    print(f"{'method':<20}" + "".join(f"{'rtol %.0e' % r:>18}" for r in rtols))
    for label, rows in results.items():
        print(f"{label:<20}" + "".join(f"{'%.1e / %d' % (e, c):>18}" for _, e, c in rows))
    print("(each cell: achieved error / evaluations)")
    verdicts = []
    for mine in ours:
        for peer in runs:
            errors, ratios = equal_error_ratios(results[mine], results[peer])
            if not len(ratios):
                print(f"{mine} vs {peer}: no common error range")
                continue
            met = verdict(f"{name.split(',')[0]}: {mine} / {peer} evaluations (worst at equal error)",
                          float(np.max(ratios)), 1.0, show=False)
            verdicts.append(met)
            cells = ", ".join(f"{e:.0e}: {q:.2f}" for e, q in zip(errors, ratios))
            print(f"{mine} / {peer} evaluations at error {cells} -> "
                  f"{'met' if met else 'not met'} (no more evaluations)")
    return verdicts


# -- layer boundaries ----------------------------------------------------------------------------
def boundary_table(layer_counts, rtol, peers_only):
    import torch

    print(f"\n== layer boundaries: rejected steps (evaluations), rtol {rtol:.0e}, "
          f"atol {1e-3 * rtol:.0e} ==")
    print(f"{'L':>3}{'RK45 on [0, L]':>20}{'DOP853 on [0, L]':>20}"
          + ("" if peers_only else f"{'ctformer tsit5':>20}{'ctformer dopri5':>20}"))
    deep = R.make_encoder(layers=max(layer_counts), d_model=D_MODEL, heads=2, d_ff=32, seed=0)
    u0 = R.smooth_tokens(N_TOKENS, D_MODEL, seed=0)
    ours = {"tsit5": [], "dopri5": []}
    for layers in layer_counts:
        encoder = R.truncated(deep, layers)
        cells = []
        for method in ("RK45", "DOP853"):
            f = R.Counted(R.depth_rhs(encoder), u0.shape)
            sol = solve_ivp(f, (0.0, float(layers)), u0.ravel(), method=method, rtol=rtol,
                            atol=1e-3 * rtol)
            cells.append(f"{R.scipy_rejections(sol, method)} ({sol.nfev})")
        if not peers_only:
            for scheme in ours:
                _, stats = ctformer_encoder(encoder, u0, scheme, rtol, 1e-3 * rtol)
                ours[scheme].append(stats["rejected"])
                cells.append(f"{stats['rejected']} ({int(stats['rhs_evaluations'])})")
        print(f"{layers:>3}" + "".join(f"{c:>20}" for c in cells))
    del torch
    verdicts = []
    for scheme, rejected in ([] if peers_only else ours.items()):
        met = verdict(f"ctformer {scheme} rejections on L layers - on one layer", max(rejected) - rejected[0],
                      1, unit="rejections", show=False)
        verdicts.append(met)
        print(f"ctformer {scheme}: rejections {rejected} -> {'met' if met else 'not met'} "
              f"(do not grow with L)")
    return verdicts


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="rtol 1e-4..1e-8, L <= 4")
    parser.add_argument("--peers-only", action="store_true",
                        help="the references and the peers only (no ctformer evolve)")
    args = parser.parse_args(argv)
    rtols = RTOLS[:5] if args.quick else RTOLS
    layer_counts = (1, 2, 4) if args.quick else (1, 2, 4, 8)
    import scipy
    import torch

    header(f"error-controlled depth: evaluations at equal error (scipy {scipy.__version__}); counts, not times")
    encoder, u0, ref, pieces = encoder_problem()
    verdicts = work_table(f"pre-norm TransformerEncoder, {LAYERS} layers, {N_TOKENS} tokens x "
                          f"{D_MODEL} features", u0, ref, pieces,
                          lambda s, r, a: ctformer_encoder(encoder, u0, s, r, a), rtols,
                          args.peers_only)
    x0, ref_x, pieces_x = particle_problem()
    verdicts += work_table(f"SA particles n=32, d=3, beta={BETA:g}, t in [0, {T1:g}]", x0, ref_x,
                           pieces_x, lambda s, r, a: ctformer_particles(x0, s, r, a), rtols,
                           args.peers_only)
    verdicts += boundary_table(layer_counts, 1e-8, args.peers_only)
    summary()


if __name__ == "__main__":
    main()

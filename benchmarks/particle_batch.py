r"""Benchmark: a batch of SA particle systems against the authors' own torch loop.

Run ``python benchmarks/particle_batch.py`` (a few minutes on 2 cores; ``--quick``: batch 256,
20 steps, a smoke test whose ratios are not the goal's). The workload is the phase-diagram
sweep of Geshkovski et al.'s published script: ``--batch`` 2048 independent systems of n = 32
particles on the circle (d = 2), Q = K = V = I, beta in {1, 4}, explicit Euler with dt = 0.1,
100 steps, from uniform random starts. Timed in one process after a 0.5 s warm-up, medians
over ``--repeats`` (5) alternating rounds (:func:`_environment.rounds`; a ratio is the median
of the rounds' ratios), 2 threads each side:

* ``authors``: the loop of the published script (the peer of the goal), in torch, on the
  (batch, n, d) tensor M:

  .. math::  A = \mathrm{softmax}(\beta M M^T),\quad V = A M,\quad
             M \leftarrow \frac{M + \Delta t\,V}{\|M + \Delta t\,V\|}\ \text{(rows)};

* ``projected``: the same loop with the tangent projection :math:`V \leftarrow V - \langle M,
  V\rangle M` that ctformer's SA velocity applies, so that it does ctformer's arithmetic per
  step: the reference of the output checks below (and its time, for information);
* ``ctformer``: ``SelfAttentionDynamics(beta).solve(x0, t1, dt, scheme="euler")`` on the NumPy
  array (float64 and float32); ``ctformer torch``: the same call on a torch tensor.

The goal's ratio is ctformer over ``authors``, the loop as published: the projection is work
ctformer does and the published loop does not, so up to the noise of the rounds this ratio is
above the same-arithmetic ratio ctformer / ``projected`` (also printed).

Without the projection the step is :math:`(1 + \Delta t\,c_i)\,x_i + \Delta t\,P^\perp v_i`
with :math:`c_i = \langle x_i, v_i\rangle`, which after normalizing is the projected step with
:math:`\Delta t / (1 + \Delta t\,c_i)` in place of :math:`\Delta t`: the two differ at
:math:`O(\Delta t^2)` per step, so only the projected loop can agree to rounding.

Checks: one step and the whole run of ctformer against ``projected`` in the same dtype
(relative max difference, float64 <= 1e-12, float32 <= 1e-5). One step agrees to rounding
(3e-16, 2e-7). Over 100 steps, some of 2048 random systems sit near an unstable balance of
clusters and amplify a perturbation of the start by 10^3 and more (the script prints the
measured factor, float64): the rounding differences of each step grow by as much, so two
correct implementations differ by ~1e-12 in float64 and ~1e-3 in float32 on those systems,
and no implementation can match another to the tolerance there. Where the whole-run
difference exceeds the tolerance, the check is instead that ctformer is as accurate as the
projected loop: against the same loop in NumPy ``longdouble``, the 99th percentile over systems
of ctformer's error is at most twice the loop's (the worst system alone is a sample of one;
measured at batch 2048: medians 2-3e-16 / 1-2e-7 and 99th percentiles within 1.5x for both). Exit status 1 if a check fails; a goal whose check fails is not met. Goal (issue 25):
ctformer / authors <= 0.8 in both dtypes.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import (TOLERANCE, add_run_options, header, limit_threads, prepare, rounds,  # noqa: E402
                          summary, verdict)

if __name__ == "__main__":
    prepare(sys.argv[1:], __file__)

import argparse  # noqa: E402

import numpy as np  # noqa: E402

GOAL = 0.8


def uniform_start(batch, n, d, seed=0):
    """``batch`` systems of ``n`` points uniform on the unit sphere of R^d, float64."""
    x = np.random.default_rng(seed).standard_normal((batch, n, d))
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def authors_loop(M, beta, dt, steps, project=False):
    """The published script's Euler loop in torch on (batch, n, d); ``project`` adds the
    tangent projection of ctformer's SA velocity."""
    import torch

    with torch.no_grad():
        for _ in range(steps):
            A = torch.softmax(beta * (M @ M.transpose(-1, -2)), dim=-1)
            V = A @ M
            if project:
                V = V - (M * V).sum(dim=-1, keepdim=True) * M
            M = M + dt * V
            M = M / torch.linalg.vector_norm(M, dim=-1, keepdim=True)
    return M


def relative(a, b) -> float:
    a, b = (np.asarray(x, dtype=np.float64) for x in (a, b))
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def amplification(x0, beta, dt, steps, size=1e-8, seed=1):
    """Largest growth of a random start perturbation of size ``size`` over the run, float64."""
    import torch

    bump = x0 + size * np.random.default_rng(seed).standard_normal(x0.shape)
    bump /= np.linalg.norm(bump, axis=-1, keepdims=True)
    runs = [authors_loop(torch.from_numpy(x), beta, dt, steps, project=True).numpy() for x in (x0, bump)]
    return float(np.max(np.abs(runs[1] - runs[0])) / np.max(np.abs(bump - x0)))


def calls(x0, beta, dt, steps, torch_input=True):
    """name -> zero-argument call returning the final positions (host or torch)."""
    import torch

    from ctformer.particles import SelfAttentionDynamics

    dynamics = SelfAttentionDynamics(beta)
    t1 = steps * dt
    tx = torch.from_numpy(x0)
    out = {"authors": lambda: authors_loop(tx, beta, dt, steps),
           "projected": lambda: authors_loop(tx, beta, dt, steps, project=True),
           "ctformer": lambda: dynamics.solve(x0, t1, dt, scheme="euler", save_every=steps).final}
    if torch_input:
        out["ctformer torch"] = lambda: dynamics.solve(tx, t1, dt, scheme="euler", save_every=steps).final
    return out


def precise_loop(x0, beta, dt, steps):
    """The projected loop in NumPy ``longdouble`` (64-bit mantissa on x86): the reference for
    the accuracy of both float64 and float32 runs where rounding cannot be matched."""
    M = np.asarray(x0, dtype=np.longdouble)
    for _ in range(steps):
        S = beta * (M @ np.swapaxes(M, -1, -2))
        A = np.exp(S - S.max(axis=-1, keepdims=True))
        V = (A @ M) / A.sum(axis=-1, keepdims=True)
        M = M + dt * (V - (M * V).sum(axis=-1, keepdims=True) * M)
        M = M / np.sqrt((M * M).sum(axis=-1, keepdims=True))
    return M


def agreement(x0, beta, dt, steps, dtype, finals):
    """The checks of the docstring; returns (one-step diff, whole-run diff, ok, note)."""
    import torch

    from ctformer.particles import SelfAttentionDynamics

    one = relative(SelfAttentionDynamics(beta).step(x0, dt, "euler"),
                   authors_loop(torch.from_numpy(x0), beta, dt, 1, project=True))
    whole = relative(finals["ctformer"], finals["projected"])
    tol = TOLERANCE[dtype]
    ok = one <= tol and whole <= tol
    note = ""
    if not whole <= tol:
        if np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps:
            return one, whole, False, "   (no longdouble wider than float64 here: no precise reference)"
        reference = precise_loop(x0, beta, dt, steps)
        # per system: the worst one alone is a sample of one (its rounding is chance)
        ours, peer = (np.quantile(np.abs(finals[k] - reference).max(axis=(-2, -1)).astype(float), 0.99)
                      for k in ("ctformer", "projected"))
        gaps = np.abs(finals["ctformer"] - finals["projected"]).max(axis=(-2, -1))
        ok = bool(one <= tol and ours <= 2 * peer)
        note = (f"   {int(np.sum(gaps <= tol))} of {gaps.size} systems within {tol:.0e}; 99th percentile of the error against a "
                f"longdouble loop: ctformer {ours:.1e}, projected loop {peer:.1e} "
                f"({'as accurate' if ours <= 2 * peer else 'LESS accurate'})")
    return one, whole, ok, note


def run_case(beta, dtype, args):
    """Time every side for one beta and dtype; print the row; returns whether the checks pass."""
    x0 = uniform_start(args.batch, args.n, args.d).astype(dtype)
    cases = calls(x0, beta, args.dt, args.steps, not args.no_torch_input)
    finals = {name: np.asarray(call()) for name, call in cases.items()}
    timed = rounds(cases, args.repeats)
    times = {name: timed[name] for name in cases}
    one, whole, ok, note = agreement(x0, beta, args.dt, args.steps, dtype, finals)
    print(f"{beta:>5g} {dtype:>8} " + " ".join(f"{times[name] * 1e3:>10.1f}" for name in cases)
          + f" {timed.ratio('ctformer', 'authors'):>7.2f} "
          + (f"{timed.ratio('ctformer torch', 'authors'):>7.2f} " if "ctformer torch" in times else f"{'-':>7} ")
          + f"{timed.ratio('ctformer', 'projected'):>7.2f} {one:>9.1e} {whole:>9.1e}"
          + ("" if ok else "  <- outputs differ beyond tolerance") + note, flush=True)
    verdict(f"particles beta={beta:g} {dtype} ctformer / authors' loop", timed.ratio("ctformer", "authors"), GOAL,
            show=False, spread=timed.spread("ctformer", "authors"), agrees=ok, rounds=timed.count)
    return ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--n", type=int, default=32, help="particles per system")
    parser.add_argument("--d", type=int, default=2, help="dimension (the sphere of R^d)")
    parser.add_argument("--betas", type=float, nargs="+", default=[1.0, 4.0])
    parser.add_argument("--dt", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    parser.add_argument("--no-torch-input", action="store_true", help="skip ctformer on torch tensors")
    add_run_options(parser, quick="batch 256, 20 steps, 3 repeats (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.steps, args.repeats = 256, 20, 3

    limit_threads(args.threads)
    header(f"SA particles: {args.batch} systems, n = {args.n}, d = {args.d}, Euler dt = {args.dt}, "
           f"{args.steps} steps; medians of {args.repeats} alternating rounds")
    print(f"{'beta':>5} {'dtype':>8} {'authors':>10} {'projected':>10} {'ctformer':>10}"
          + ("" if args.no_torch_input else f" {'ct torch':>10}")
          + f" {'ct/auth':>7} {'ctT/aut':>7} {'ct/proj':>7} {'1 step':>9} {'100 st' if args.steps == 100 else 'run':>9}"
          + "   (ms; ct/auth is the goal's ratio; relative differences ctformer vs the projected loop)")
    ok = True
    for beta in args.betas:
        for dtype in args.dtypes:
            ok &= run_case(beta, dtype, args)
        x0 = uniform_start(args.batch, args.n, args.d)
        print(f"      beta={beta:g}: a start perturbation grows by up to "
              f"{amplification(x0, beta, args.dt, args.steps):.0f}x over the run (float64)")
    summary()
    print(f"outputs {'agree' if ok else 'DIFFER'} (float64 <= 1e-12, float32 <= 1e-5 relative, see the docstring)")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

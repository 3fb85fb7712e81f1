"""Benchmark: the per-step cost of a small solve against a plain NumPy loop of the same arithmetic.

Run ``python benchmarks/small_solve.py`` (about a minute). The problem: 16 tokens, 16 features,
2 heads (16 head features, 16 hidden), one pre-norm layer,
``ContinuousTransformer.random_smooth(layers=1, heads=2, placement="pre")`` on ``Midpoint``
grids, 1024 steps per layer, schemes ``euler`` (2 operator evaluations per step) and
``strang`` (Heun sub-steps: 6 evaluations per step). The peer is written inline below: the
model's kernel matrices and biases are read once, then a loop of plain NumPy does the same
arithmetic (LayerNorm, packed Q/K/V product, softmax, output product, erf GELU feed-forward,
the scheme's update). The script checks that both compute the same final state (relative
difference <= 1e-12 after the 1024 steps, the issue's float64 tolerance; it prints the number,
about 3e-16, and stops with exit status 1 beyond it) and prints the time per step
of each and their ratio (medians over ``--repeats`` alternating rounds,
:func:`_environment.rounds`), and "met" / "not met" against the goal <= 1.1 (issue 25), after
the CPU and the BLAS kernel.

BLAS runs on one thread for both (the products are 16 x 16: threads only add overhead): the
script sets every thread variable to 1 (``OPENBLAS``/``OMP``/``MKL``/``CTFORMER_NUM_THREADS``)
before NumPy loads and, unless ``--keep-env`` is given, re-executes itself without
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, as the other goal scripts do.
``--profile`` prints a cProfile of ctformer's ``euler`` solve instead, by own time.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import (TOLERANCE, add_emulation_option, header, limit_threads, prepare, rounds,  # noqa: E402
                          summary, verdict)

if __name__ == "__main__":  # one thread for every library, before NumPy loads
    prepare(sys.argv[1:], __file__, default_threads="1")

import argparse  # noqa: E402
import math  # noqa: E402

import numpy as np  # noqa: E402
from scipy.special import erf  # noqa: E402

N_TOKENS = N_FEATURES = 16
STEPS = 1024
GOAL = 1.1


def initial_state(n, d):
    """u0 with feature variance bounded away from zero (design notes, section 1)."""
    x = (np.arange(n)[:, None] + 0.5) / n
    y = (np.arange(d)[None, :] + 0.5) / d
    return np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def model_and_grids():
    from ctformer.discretizations import Midpoint
    from ctformer.model import ContinuousTransformer

    model = ContinuousTransformer.random_smooth(layers=1, heads=2, placement="pre")
    grids = model.grids(Midpoint(N_TOKENS), Midpoint(N_FEATURES))
    return model, grids


def plain_parameters(model, grids):
    """Every matrix and vector the plain loop needs, read once from the model (host float64)."""
    block = model.blocks[0]
    y, r = grids.features, grids.hidden
    host = block.attention.host_arrays(grids)
    heads, d_h = host["Q"].shape[:2]
    scale = host["w_sigma"][None, :, None] * host["beta"][:, None, None]  # head-feature weights, beta
    q_mat, q_bias = host["Q"] * scale, (host["b_Q"] if host["b_Q"] is not None else 0.0) * scale[:, None, 0, :]
    ff = block.feedforward

    def layer_norm(op):
        return op.gain.evaluate(y), op.shift.evaluate(y)

    return dict(
        heads=heads, d_h=d_h,
        QKV_t=np.concatenate([q_mat, host["K"], host["V"]]).reshape(-1, q_mat.shape[-1]).T.copy(),
        b_QKV=np.concatenate([np.broadcast_to(q_bias, (heads, 1, d_h)), host["b_K"], host["b_V"]]).reshape(-1),
        O=host["O"], b_O=host["b_O"],
        W1_t=ff.W_1.matrix(r, y).T.copy(), b1=ff.b_1.evaluate(r),
        W2_t=ff.W_2.matrix(y, r).T.copy(), b2=ff.b_2.evaluate(y),
        ln1=layer_norm(block.normalization1), ln2=layer_norm(block.normalization2),
        final=layer_norm(model.final_normalization),
    )


def plain_solve(u, p, scheme, steps=STEPS):
    """The same solve in plain NumPy: one pre-norm layer, ``steps`` steps of ``scheme``."""
    heads, d_h = p["heads"], p["d_h"]
    n = u.shape[0]
    QKV_t, b_QKV, O, b_O = p["QKV_t"], p["b_QKV"], p["O"], p["b_O"]
    W1_t, b1, W2_t, b2 = p["W1_t"], p["b1"], p["W2_t"], p["b2"]
    (g1, c1), (g2, c2) = p["ln1"], p["ln2"]
    sqrt_half = math.sqrt(0.5)

    def layer_norm(u, g, c):
        z = u - u.mean(axis=-1, keepdims=True)
        return z / np.sqrt((z * z).mean(axis=-1, keepdims=True)) * g + c

    def attention(u):
        qkv = (layer_norm(u, g1, c1) @ QKV_t + b_QKV).reshape(n, 3, heads, d_h).transpose(1, 2, 0, 3)
        s = qkv[0] @ qkv[1].transpose(0, 2, 1)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        o = (s @ qkv[2]) / s.sum(axis=-1, keepdims=True)
        return o.transpose(1, 0, 2).reshape(n, heads * d_h) @ O + b_O

    def feedforward(u):
        z = layer_norm(u, g2, c2) @ W1_t + b1
        return (z * 0.5 * (1.0 + erf(z * sqrt_half))) @ W2_t + b2

    dt = 1.0 / steps
    if scheme == "euler":
        for _ in range(steps):
            u = u + dt * (attention(u) + feedforward(u))
    elif scheme == "strang":  # Heun sub-steps: half feed-forward, attention, half feed-forward
        def heun(f, u, h):
            k1 = f(u)
            k2 = f(u + h * k1)
            return u + (0.5 * h) * k1 + (0.5 * h) * k2

        for _ in range(steps):
            u = heun(feedforward, u, 0.5 * dt)
            u = heun(attention, u, dt)
            u = heun(feedforward, u, 0.5 * dt)
    else:
        raise ValueError(f"unknown scheme {scheme!r}")
    return layer_norm(u, *p["final"])


def agreement(scheme: str, got, ref) -> float:
    """The relative difference max |got - ref| / max |ref| of the final states; stops the run
    (exit status 1) where it exceeds the issue's float64 tolerance, ``TOLERANCE["float64"]``:
    the two sides do the same arithmetic, so their difference is rounding."""
    diff = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    if not diff <= TOLERANCE["float64"]:
        raise SystemExit(f"{scheme}: ctformer and the plain loop differ by {diff:.1e} "
                         f"(> {TOLERANCE['float64']:g}, the float64 tolerance)")
    return diff


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemes", nargs="+", default=["euler", "strang"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile ctformer's euler solve")
    parser.add_argument("--quick", action="store_true", help="euler only, 3 repeats (a smoke test)")
    parser.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    add_emulation_option(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.schemes, args.repeats = ["euler"], 3

    limit_threads(1, with_torch=False)
    from ctformer.discretizations import Midpoint

    model, grids = model_and_grids()
    u0 = initial_state(N_TOKENS, N_FEATURES)
    params = plain_parameters(model, grids)

    def ours(scheme):
        return model.solve(u0, tokens=Midpoint(N_TOKENS), features=Midpoint(N_FEATURES), scheme=scheme,
                           steps_per_layer=STEPS)

    if args.profile:
        return profile(lambda: ours("euler"))
    header(f"small solve against a plain NumPy loop: BLAS 1 thread; {N_TOKENS} tokens x {N_FEATURES} features, "
           f"2 heads, 1 pre-norm layer, {STEPS} steps; medians of {args.repeats} alternating rounds")
    titles = f"{'scheme':>8} {'plain us/step':>14} {'ctformer us/step':>17} {'ratio':>7} {'rel. diff':>10} {'goal':>8}"
    print(titles)
    print("-" * len(titles))
    for scheme in args.schemes:
        diff = agreement(scheme, np.asarray(ours(scheme)), plain_solve(u0, params, scheme))
        timed = rounds({"plain": lambda: plain_solve(u0, params, scheme), "ctformer": lambda: ours(scheme)},
                       args.repeats, warmup_s=0.3)
        t_plain, t_ours, ratio = timed["plain"], timed["ctformer"], timed.ratio("ctformer", "plain")
        met = verdict(f"small solve {scheme} / plain loop", ratio, GOAL, show=False,
                      spread=timed.spread("ctformer", "plain"), rounds=timed.count)
        print(f"{scheme:>8} {t_plain / STEPS * 1e6:>14.1f} {t_ours / STEPS * 1e6:>17.1f} {ratio:>7.2f} {diff:>10.1e} "
              f"{'met' if met else 'not met':>8}", flush=True)
    summary()


def profile(call):
    import cProfile
    import pstats

    call()
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    print(f"cProfile of one euler solve ({STEPS} steps):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()

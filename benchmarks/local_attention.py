r"""Sliding-window attention: the banded path against torch SDPA with the window mask.

The window keeps the keys :math:`0 \le p_i - p_j < W` of each query. ctformer's banded path
(:func:`ctformer.operators.local_attention` with the sparse
:func:`ctformer.operators.window_pattern`) visits only the key slab of each block of query
rows, so its time and extra memory grow like :math:`N W`. Without it, a user passes the
:math:`N \times N` boolean window mask to torch's ``scaled_dot_product_attention`` (the peer;
HuggingFace's eager sliding-window models build that mask too) or to ctformer's dense
``quadrature_attention`` (shown for information): both grow like :math:`N^2`.

Run::

    python benchmarks/local_attention.py [--window 256] [--sizes 2048 4096 8192 16384 32768]
        [--peer-max 8192] [--dense-max 8192] [--heads 4] [--head-dim 32]
        [--dtypes float64 float32] [--repeats 5] [--threads 2] [--quick] [--emulate avx2]

Per dtype and N it prints the banded and SDPA times (medians of alternating rounds,
:func:`_environment.rounds`, for N up to ``--peer-max``), their ratio with the quartiles of
the rounds' ratios, the traced peak of the banded path's allocations (``tracemalloc``), the
dense path's time and traced peak (N up to ``--dense-max``, best of 2), and the banded
output's relative difference from SDPA's.

A second table times causal ALiBi attention without a window (``--alibi-sizes``, 8 heads of 64
features, slopes :math:`2^{-8h/H}`): :func:`ctformer.operators.local_attention` with ``slopes``
and ``causal=True``, whose blocks of query rows run on the dense engine's kernels with the
score term :math:`-m_h |p_i - p_j|`, against SDPA given that term and the causal mask as one
:math:`H \times N \times N` float mask (what HuggingFace's ALiBi models build); the mask is made
once, outside the timing.

Goals: banded / SDPA <= 0.9 at every N where both run (the attention goal of issue 25), and
ALiBi / SDPA <= 0.9;
linear growth, i.e. the fitted exponents of the banded time and traced peak in N over
N >= 4096 at most 1.2. Outputs agree with SDPA's (float64 1e-12, float32 1e-5 relative);
exit status 1 if not.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import (TOLERANCE, add_run_options, growth_exponent, header, limit_threads,  # noqa: E402
                          prepare, rounds, summary, timed_block, verdict)

if __name__ == "__main__":
    prepare(sys.argv[1:], __file__)

import argparse  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

GOAL = 0.9  # banded / SDPA with the window mask
GROWTH = 1.2  # fitted exponent of time and memory in N
GROWTH_FROM = 4096  # the fit's smallest N (below, fixed costs still show)


def problem(n, heads, head_dim, dtype, seed=0):
    """Queries, keys and values (heads, n, head_dim) and the token positions 0 .. n-1."""
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((heads, n, head_dim)).astype(dtype) for _ in range(3))
    return q, k, v, np.arange(n, dtype=np.float64)


def window_mask(positions, window):
    """The dense (N, N) window: True where 0 <= p_i - p_j < window."""
    d = positions[:, None] - positions[None, :]
    return (d >= 0) & (d < window)


def calls(q, k, v, positions, window, with_peer=True, with_dense=False):
    """name -> zero-argument call returning the (heads, N, head_dim) output as a NumPy array."""
    from ctformer.operators import local_attention, quadrature_attention, window_pattern

    beta = 1.0 / np.sqrt(q.shape[-1])
    pattern = window_pattern(positions, window)
    out = {"banded": lambda: local_attention(q, k, v, beta=beta, pattern=pattern)}
    if with_peer:
        import torch

        # (batch, heads, N, d) as HuggingFace calls it: on 3-d inputs SDPA took 3x longer
        tq, tk, tv = (torch.from_numpy(a)[None] for a in (q, k, v))
        mask = torch.from_numpy(window_mask(positions, window))

        def sdpa():
            with torch.no_grad():
                return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask,
                                                                        scale=beta)[0].numpy()
        out["SDPA"] = sdpa
    if with_dense:
        out["dense"] = lambda: quadrature_attention(q, k, v, beta=beta, mask=window_mask(positions, window))
    return out


def alibi_calls(n, dtype, heads=8, head_dim=64):
    """``{"ALiBi": ctformer, "SDPA": torch with the float mask}`` for causal ALiBi attention."""
    import torch

    from ctformer.operators import local_attention

    q, k, v, p = problem(n, heads, head_dim, dtype)
    slopes = 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)
    beta = 1.0 / np.sqrt(head_dim)
    term = -slopes[:, None, None] * np.abs(p[:, None] - p[None, :])
    # (batch, heads, N, d) as HuggingFace calls it: SDPA's fused CPU kernel takes 4-d inputs
    mask = torch.from_numpy(np.where(p[None, :] <= p[:, None], term, -np.inf).astype(dtype))[None]
    tq, tk, tv = (torch.from_numpy(a)[None] for a in (q, k, v))

    def sdpa():
        with torch.no_grad():
            return torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask, scale=beta)[0].numpy()
    return {"ALiBi": lambda: local_attention(q, k, v, beta=beta, slopes=slopes, positions=p, causal=True),
            "SDPA": sdpa}


def run_alibi(n, dtype, args) -> bool:
    """Time causal ALiBi against SDPA with its float mask at one N; print the row."""
    sides = alibi_calls(n, dtype)
    timed = rounds(sides, args.repeats)
    ratio, spread = timed.ratio("ALiBi", "SDPA"), timed.spread("ALiBi", "SDPA")
    diff = relative(sides["ALiBi"](), sides["SDPA"]())
    verdict(f"ALiBi causal N={n} {dtype} / SDPA with the ALiBi mask", ratio, GOAL, show=False, spread=spread,
            agrees=diff <= TOLERANCE[dtype], rounds=timed.count)
    print(f"{dtype:>8} {n:7d} {timed['ALiBi'] * 1e3:10.1f} {timed['SDPA'] * 1e3:10.1f} {ratio:7.3f} "
          f"{f'[{spread[0]:.2f}-{spread[1]:.2f}]':>13} {diff:9.1e}", flush=True)
    return diff <= TOLERANCE[dtype]


def traced_peak(call) -> float:
    """The peak of the allocations traced while ``call()`` runs, in MiB."""
    tracemalloc.start()
    try:
        call()
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def relative(a, b) -> float:
    a, b = (np.asarray(x, dtype=np.float64) for x in (a, b))
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def best(call, repeat=2) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def run_size(n, dtype, args):
    """Time and check one N; print its row; returns (time of banded, its traced MiB, ok)."""
    q, k, v, p = problem(n, args.heads, args.head_dim, dtype)
    peer, dense = n <= args.peer_max, n <= args.dense_max
    sides = calls(q, k, v, p, args.window, with_peer=peer, with_dense=dense)
    banded = sides["banded"]
    t_banded = timed_block(banded, args.repeats)[0]
    m_banded = traced_peak(banded)
    cells, ok = [f"{t_banded * 1e3:10.1f} {m_banded:9.1f}"], True
    if peer:
        timed = rounds({"banded": banded, "SDPA": sides["SDPA"]}, args.repeats)
        ratio, spread = timed.ratio("banded", "SDPA"), timed.spread("banded", "SDPA")
        diff = relative(banded(), sides["SDPA"]())
        ok = diff <= TOLERANCE[dtype]
        cells.append(f"{timed['SDPA'] * 1e3:10.1f} {ratio:7.3f} {f'[{spread[0]:.2f}-{spread[1]:.2f}]':>13} {diff:9.1e}")
        verdict(f"local attention W={args.window} N={n} {dtype} / SDPA with the window mask", ratio, GOAL,
                show=False, spread=spread, agrees=ok, rounds=timed.count)
    else:
        cells.append(f"{'-':>10} {'-':>7} {'-':>13} {'-':>9}")
    if dense:
        cells.append(f"{best(sides['dense']) * 1e3:10.1f} {traced_peak(sides['dense']):10.1f}")
    print(f"{dtype:>8} {n:7d} " + " ".join(cells) + ("" if ok else "  <- differs from SDPA beyond tolerance"),
          flush=True)
    return t_banded, m_banded, ok


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 4096, 8192, 16384, 32768])
    parser.add_argument("--peer-max", type=int, default=8192, help="largest N timed against SDPA")
    parser.add_argument("--dense-max", type=int, default=8192, help="largest N of the dense masked path (information)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"], choices=["float64", "float32"])
    parser.add_argument("--alibi-sizes", type=int, nargs="*", default=[1024, 2048, 4096],
                        help="N of the causal ALiBi table (none: skip it)")
    add_run_options(parser, quick="N = 1024, 2048, 4096; 3 repeats (a smoke test)")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats, args.peer_max, args.dense_max = [1024, 2048, 4096], 3, 4096, 4096
        args.alibi_sizes = [1024]

    limit_threads(args.threads)
    header(f"sliding-window attention, banded against SDPA with the window mask: W = {args.window}, "
           f"{args.heads} heads, d_h = {args.head_dim}; medians of {args.repeats} alternating rounds")
    print(f"{'dtype':>8} {'N':>7} {'banded ms':>10} {'band MiB':>9} {'SDPA ms':>10} {'ratio':>7} {'quartiles':>13} "
          f"{'rel. diff':>9} {'dense ms':>10} {'dense MiB':>10}")
    ok = True
    for dtype in args.dtypes:
        rows = [(n, *run_size(n, dtype, args)) for n in args.sizes]
        ok &= all(row[3] for row in rows)
        fitted = [row for row in rows if row[0] >= GROWTH_FROM]
        if len(fitted) >= 2:
            sizes = [row[0] for row in fitted]
            for what, column in (("time", 1), ("traced memory", 2)):
                verdict(f"local attention {dtype}: exponent of the banded {what} in N (N >= {GROWTH_FROM})",
                        growth_exponent(sizes, [row[column] for row in fitted]), GROWTH, unit="(power of N)")
    if args.alibi_sizes:
        print(f"\ncausal ALiBi, 8 heads, d_h = 64, against SDPA with the ALiBi float mask\n"
              f"{'dtype':>8} {'N':>7} {'ALiBi ms':>10} {'SDPA ms':>10} {'ratio':>7} {'quartiles':>13} {'rel. diff':>9}")
        for dtype in args.dtypes:
            ok &= all([run_alibi(n, dtype, args) for n in args.alibi_sizes])
    summary()
    print(f"outputs {'agree' if ok else 'DIFFER'} (float64 <= 1e-12, float32 <= 1e-5 relative)")
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

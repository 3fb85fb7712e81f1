"""Sliding-window attention: the banded path against the dense masked path.

At a fixed window W the banded path (:func:`ctformer.operators.local_attention` with the
sparse :func:`ctformer.operators.window_pattern`) visits only the key slab of each block of
query rows, so its time and extra memory grow linearly in N; the dense path
(``quadrature_attention`` with the N x N boolean mask) grows quadratically.

Run::

    python benchmarks/local_attention.py [--window 256] [--sizes 2048,4096,8192,16384,32768]
                                         [--dense-max 16384] [--heads 4] [--head-dim 32]

Prints, per N, the wall time (best of ``--repeat``) and the peak of traced allocations
(``tracemalloc``: NumPy buffers, including the pattern and the mask), and checks that both
paths agree where both run.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import header, summary  # noqa: E402

from ctformer.operators import local_attention, quadrature_attention, window_pattern


def _measure(fn, repeat):
    """Best wall time of ``repeat`` untraced calls, then the traced peak of one more call."""
    best, out = np.inf, None
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    tracemalloc.start()
    fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, peak, out


def run(sizes, window, heads, head_dim, dense_max, repeat, seed=0):
    """Rows (N, banded s, banded MiB, dense s or None, dense MiB or None, max difference)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((heads, 64, head_dim))
    local_attention(q, q, q, beta=1.0, pattern=window_pattern(np.arange(64.0), 8))  # imports, warm-up
    rows = []
    for n in sizes:
        q, k, v = (rng.standard_normal((heads, n, head_dim)) for _ in range(3))
        p = np.arange(n, dtype=np.float64)
        beta = 1.0 / np.sqrt(head_dim)

        def banded():
            return local_attention(q, k, v, beta=beta, pattern=window_pattern(p, window))

        t_b, m_b, out_b = _measure(banded, repeat)
        t_d = m_d = diff = None
        if n <= dense_max:
            def dense():
                d = p[:, None] - p[None, :]
                return quadrature_attention(q, k, v, beta=beta, mask=(d >= 0) & (d < window))

            t_d, m_d, out_d = _measure(dense, repeat)
            diff = float(np.abs(out_b - out_d).max())
        rows.append((n, t_b, m_b / 2**20, t_d, None if m_d is None else m_d / 2**20, diff))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--sizes", default="2048,4096,8192,16384,32768")
    parser.add_argument("--dense-max", type=int, default=16384)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    header(f"sliding-window attention, banded against dense: W = {args.window}, {args.heads} heads, "
           f"d_h = {args.head_dim}, float64, best of {args.repeat}")
    print(f"{'N':>7} {'banded s':>9} {'banded MiB':>11} {'dense s':>9} {'dense MiB':>10} {'max diff':>9}")
    for n, t_b, m_b, t_d, m_d, diff in run(sizes, args.window, args.heads, args.head_dim, args.dense_max,
                                            args.repeat):
        dense = f"{t_d:9.3f} {m_d:10.1f} {diff:9.1e}" if t_d is not None else f"{'-':>9} {'-':>10} {'-':>9}"
        print(f"{n:7d} {t_b:9.3f} {m_b:11.1f} {dense}")
    summary()


if __name__ == "__main__":
    main()

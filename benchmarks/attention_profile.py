"""Where the time of streamed quadrature attention goes, against this machine's limits.

Run ``python benchmarks/attention_profile.py`` (under a minute). On one thread, for N = M
queries and keys (default 8192) and head dimension 64, it takes one query chunk of the size
the library uses and times each phase of its work, in ns per score entry:

* ``Q K^T``: the score product (r x d) (d x M), and its GFLOP/s;
* ``max/exp/sum``: the row maximum, the exponentials and the row sums, fused in one pass
  (the Numba kernel; ``--engine numpy`` for the NumPy passes), and its bandwidth over the
  score block (one read and one write of each entry);
* ``P V``: the weighted sum (r x M) (M x d), and its GFLOP/s;
* ``divide``: the division by the row sums.

Against them it prints the limits it measures here: the GEMM rate of OpenBLAS on a large
square product (one thread; the practical peak of this core), and the bandwidth of a copy of a
block the size of the score chunk (it sits in the last-level cache) and of one 16x larger
(main memory). The sum of the phases is checked against a whole single-threaded call. Where
torch is installed it also times torch's (MKL's) two products on the same chunk, the provider
the library picks on most Intel CPUs, and SDPA's whole call on one thread: the ratio of the
two whole calls, without threads, is the kernel-level gap to the peer.

Environment: as the other benchmarks, it re-executes itself without OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE unless ``--keep-env`` is given.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import add_emulation_option, header, prepare  # noqa: E402

if __name__ == "__main__":
    prepare(sys.argv[1:], __file__, default_threads="1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402


def best(call, seconds=0.3, at_least=3):
    """Best time of ``call`` over ``seconds`` (at least ``at_least`` calls) after one warm-up."""
    call()
    times, start = [], time.perf_counter()
    while len(times) < at_least or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return min(times)


def limits(dtype, chunk_bytes):
    """(GEMM GFLOP/s on a 2048^2 product, copy GB/s in cache, copy GB/s from memory)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2048, 2048)).astype(dtype)
    c = np.empty_like(a)
    gemm = 2 * 2048**3 / best(lambda: np.matmul(a, a, out=c)) / 1e9
    rates = []
    for size in (chunk_bytes, 16 * chunk_bytes):
        x = np.ones(size // 8)
        y = np.empty_like(x)
        rates.append(2 * x.nbytes / best(lambda: np.copyto(y, x)) / 1e9)
    return gemm, *rates


def phases(n, d, dtype, engine):
    """Seconds per phase for one chunk, the chunk's rows, and one whole call's seconds."""
    os.environ["CTFORMER_LOOP_ENGINE"] = engine
    from ctformer._numerics import compiled, measured_blocks, streamed as attention_numpy
    from ctformer.operators import quadrature_attention

    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((n, d)).astype(dtype) for _ in range(3))
    beta = 1 / np.sqrt(d)
    r = attention_numpy.stream_chunk(n, n, np.dtype(dtype).itemsize, 1, False, measured_blocks.geometry(dtype))  # (chunk, M)
    scores, out, sums = np.empty((r, n), dtype), np.empty((r, d), dtype), np.empty((r, 1), dtype)
    qs = (q[:r] * beta).astype(dtype)
    made = compiled.kernels()
    no_weights = np.empty(0, dtype)

    def exp_rows():
        np.matmul(qs, k.T, out=scores)  # fresh scores each time (the pass works in place)
        if made is not None:
            made.exp_rows(scores, no_weights, -1, 1 << 62, dtype(0), sums[:, 0])
        else:
            np.subtract(scores, scores.max(axis=1, keepdims=True), out=scores)
            np.exp(scores, out=scores)
            np.sum(scores, axis=1, out=sums[:, 0])

    t_qk = best(lambda: np.matmul(qs, k.T, out=scores))
    t = {"Q K^T": t_qk, "max/exp/sum": best(exp_rows) - t_qk,
         "P V": best(lambda: np.matmul(scores, v, out=out)),
         "divide": best(lambda: np.divide(out, sums, out=out))}
    whole = best(lambda: quadrature_attention(q, k, v, beta=beta))
    return t, r, whole, peer_times(q, k, v, qs, scores, out, beta)


def peer_times(q, k, v, qs, scores, out, beta):
    """torch's (MKL's) two products on the same chunk and SDPA's whole call, one thread each
    (best times, seconds); empty where torch is not installed."""
    try:
        import torch
    except ImportError:
        return {}
    torch.set_num_threads(1)
    tq, tk, tv, tqs, ts, to = (torch.from_numpy(a) for a in (q, k, v, qs, scores, out))
    with torch.no_grad():
        return {"Q K^T (torch)": best(lambda: torch.mm(tqs, tk.T, out=ts)),
                "P V (torch)": best(lambda: torch.mm(ts, tv, out=to)),
                "SDPA": best(lambda: torch.nn.functional.scaled_dot_product_attention(
                    tq[None, None], tk[None, None], tv[None, None], scale=beta))}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8192, help="N = M, queries and keys")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--engine", default="auto", choices=["auto", "numba", "numpy"])
    parser.add_argument("--threads", default="1")
    parser.add_argument("--keep-env", action="store_true")
    add_emulation_option(parser)
    args = parser.parse_args(argv)
    try:  # loaded before the header, so that it names torch's BLAS too: SDPA is the peer
        import torch  # noqa: F401
    except ImportError:
        pass
    header(f"phases of streamed attention: one thread, N = M = {args.size}, head dim {args.dim}")
    n, d = args.size, args.dim
    for name in args.dtypes:
        dtype = np.dtype(name).type
        t, r, whole, peer = phases(n, d, dtype, args.engine)
        gemm, cache_bw, memory_bw = limits(dtype, r * n * np.dtype(dtype).itemsize)
        entries = r * n
        print(f"{name}: chunk {r} x {n} ({r * n * np.dtype(dtype).itemsize / 2**20:.0f} MiB of scores); "
              f"limits here: GEMM {gemm:.0f} GFLOP/s, copy {cache_bw:.0f} GB/s in cache, "
              f"{memory_bw:.0f} GB/s from memory")
        for phase, seconds in t.items():
            note = ""
            if phase in ("Q K^T", "P V"):
                rate = 2 * entries * d / seconds / 1e9
                note = f"{rate:6.1f} GFLOP/s = {rate / gemm:4.0%} of the GEMM rate"
            elif phase == "max/exp/sum":
                rate = 2 * entries * np.dtype(dtype).itemsize / seconds / 1e9
                note = f"{rate:6.1f} GB/s  = {rate / cache_bw:4.0%} of the in-cache copy"
            print(f"  {phase:>12}: {seconds / entries * 1e9:6.3f} ns/entry  {note}")
        total = sum(t.values()) / entries
        call = whole / (n * n)
        print(f"  {'sum':>12}: {total * 1e9:6.3f} ns/entry; a whole call {call * 1e9:.3f} ns/entry "
              f"({call / total:.2f}x the sum of its phases)")
        for phase in ("Q K^T (torch)", "P V (torch)"):
            if phase in peer:
                rate = 2 * entries * d / peer[phase] / 1e9
                print(f"  {phase:>12}: {peer[phase] / entries * 1e9:6.3f} ns/entry  {rate:6.1f} GFLOP/s = "
                      f"{rate / gemm:4.0%} of the GEMM rate")
        if "SDPA" in peer:
            print(f"  {'SDPA':>12}: {peer['SDPA'] / (n * n) * 1e9:6.3f} ns/entry, a whole call on one thread: "
                  f"quadrature / SDPA = {whole / peer['SDPA']:.2f}")
        print()


if __name__ == "__main__":
    main()

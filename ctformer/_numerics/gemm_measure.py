"""The measurements behind :mod:`ctformer._numerics.gemm`'s choices: NumPy's and torch's
one-thread products on the shapes attention and the feature maps use, and the row kernel of
streamed attention against torch's softmax. Each is a best-of-5 time per side; torch is chosen
only where it takes less than ``_MARGIN`` of NumPy's time, so that a close call keeps NumPy's
BLAS (and its bits) rather than flipping with the machine's moment.
"""
from __future__ import annotations

import time
from contextlib import nullcontext

import numpy as np

from .threads import single_thread_blas
from .torch_threads import _one_torch_thread, _torch

# The products measured, (m, k, n) and whether b is a transposed view: attention's scores
# (q k^T, K^T a view) and weighted sums for a query chunk, and a feature map's rows; their sum
# decides gemm_provider. Attention's own two products, as its worker tasks lay them out, decide
# attention_products. torch must win by this margin to be chosen.
_SHAPES = {"scores": (256, 64, 4096, True), "sums": (256, 4096, 64, True), "rows": (256, 384, 1536, True),
           "weighted sums": (256, 4096, 64, False)}
_SUMMED = ("scores", "sums", "rows")
_PRODUCTS_CHECKED = "numpy and torch, one thread: " + ", ".join(
    f"{kind} {m}x{k}x{n}{' b^T' if t else ''}" for kind, (m, k, n, t) in _SHAPES.items())
_MARGIN = 0.92


def _measure_products(dtype) -> dict:
    """Best-of-5 times of NumPy's and torch's single-threaded products on ``_SHAPES``: the
    provider of their sum, and of each of attention's two products on its own."""
    torch = _torch()
    rng = np.random.default_rng(0)
    times = {"numpy": 0.0, "torch": 0.0}
    chosen = {}
    limiter = single_thread_blas()
    with limiter if limiter is not None else nullcontext(), _one_torch_thread(torch):
        for kind, (m, k, n, transposed) in _SHAPES.items():
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((n, k)).astype(dtype).T if transposed else \
                rng.standard_normal((k, n)).astype(dtype)
            out = np.empty((m, n), dtype)
            ta, tb, tout = (torch.from_numpy(x) for x in (a, b, out))
            these = {"numpy": _best(lambda: np.matmul(a, b, out=out)),
                     "torch": _best(lambda: torch.mm(ta, tb, out=tout))}
            chosen[kind] = _verdict(these)["provider"]
            if kind in _SUMMED:
                times = {side: times[side] + these[side] for side in times}
    return {**_verdict(times), "scores": chosen["scores"], "weighted sums": chosen["weighted sums"]}


def _measure_softmax(dtype) -> dict:
    """Best-of-5 times of the row kernel of streamed attention and of torch's softmax, in
    place on a (256, 4096) block of scores, one thread each."""
    from .compiled import kernels

    torch = _torch()
    scores = np.random.default_rng(0).standard_normal((256, 4096)).astype(dtype)
    work, sums = scores.copy(), np.empty(256, dtype)
    made = kernels()
    if made is not None:
        empty, shift, big = np.empty(0, dtype), dtype.type(0), np.iinfo(np.int64).max
        ours = lambda s, start, out: made.exp_rows(s, empty, -1, big, shift, out)  # noqa: E731
    else:  # the NumPy passes of streamed attention
        def ours(s, start, out):
            np.subtract(s, s.max(axis=1, keepdims=True), out=s)
            np.exp(s, out=s)
            np.sum(s, axis=1, out=out)
    copy = _best(lambda: np.copyto(work, scores))
    times = {"numpy": _best(lambda: (np.copyto(work, scores), ours(work, 0, sums))) - copy}
    with _one_torch_thread(torch):
        t = torch.from_numpy(work)
        times["torch"] = _best(lambda: (np.copyto(work, scores),
                                        torch.ops.aten._softmax.out(t, -1, False, out=t))) - copy
    return _verdict(times)


def _verdict(times) -> dict:
    provider = "torch" if times["torch"] < _MARGIN * times["numpy"] else "numpy"
    return {"provider": provider, "numpy_s": times["numpy"], "torch_s": times["torch"]}


def _best(call, repeats=5) -> float:
    call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best

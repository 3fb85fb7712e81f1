"""The attention products of a whole network alone: the second part of ``model.py``'s floor.

Bidirectional attention over ``n`` tokens with head dimension ``e`` multiplies, for every
layer, sequence and head, the scores :math:`Q K^T` (``2 n^2 e`` flops) and the weighted sums
:math:`P V` (``2 n^2 e`` more). :func:`attention_products` runs exactly these products the way
the library's streamed attention runs them (its query chunks for this machine's block
geometry, :func:`ctformer._numerics.chunking.stream_chunk`; each chunk a task on the worker
threads with a one-thread BLAS, the BLAS this machine chose for each product,
:func:`ctformer._numerics.gemm.attention_products`), with nothing between them: no
exponentials, sums or divisions. Its time over HuggingFace's is what no faster softmax can
remove. Causal networks compute a share of the scores that depends on the chunks (and
short sequences take a batched path with other products), so the floor is given where the
library streams bidirectional attention (at least 2^16 scores a head) and nowhere else.
"""
from __future__ import annotations

import itertools

import numpy as np


def streamed(tokens: int) -> bool:
    """Whether the library streams the attention of sequences of ``tokens`` (the floor's domain)."""
    from ctformer._numerics import dense

    return tokens * tokens >= dense._STREAM_MIN_ENTRIES


def attention_products(batch: int, tokens: int, heads: int, head_dim: int, layers: int, dtype: str):
    """A call that runs every attention product of one forward pass of ``layers`` layers of
    ``heads`` heads on ``batch`` sequences of ``tokens`` tokens, as the streamed path's tasks do."""
    from ctformer._numerics import chunking, gemm, measured_blocks, streamed as streamed_path, threads

    dtype = np.dtype(dtype)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((batch * heads, tokens, head_dim)).astype(dtype) for _ in range(3))
    shape = measured_blocks.geometry(dtype)
    blocked = chunking.key_blocked(tokens, None, dtype, False, shape.key_block)
    chunk = chunking.stream_chunk(tokens, tokens, dtype.itemsize, batch * heads, blocked, shape)
    width = shape.key_block if blocked and not chunking.whole_rows(tokens, dtype.itemsize, shape) else tokens
    score, weighted = gemm.attention_products(dtype)
    tasks = list(itertools.product(range(layers), range(0, tokens, chunk), range(batch * heads)))

    def worker(next_task):
        scores = np.empty(chunk * width, dtype=dtype)
        sums = np.empty((chunk, head_dim), dtype=dtype)
        while (task := next_task()) is not None:
            _, start, problem = task
            rows = q[problem, start:start + chunk]
            for col0 in range(0, tokens, width):
                keys, values = k[problem, col0:col0 + width], v[problem, col0:col0 + width]
                s = scores[: len(rows) * len(keys)].reshape(len(rows), len(keys))
                score(rows, keys.T, out=s)
                weighted(s, values, out=sums[: len(rows)])

    entries = tokens * tokens * batch * heads
    return lambda: threads.run_blas_tasks(worker, tasks, entries >= streamed_path._PARALLEL_MIN_ENTRIES)


def seconds(call, repeats: int = 5) -> float:
    """The median time of ``call`` over ``repeats`` calls after one untimed call."""
    import time

    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))

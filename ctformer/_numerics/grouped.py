r"""Causal attention of grouped queries: the query heads of one key/value head in one product.

With grouped queries (Llama, Mistral, Qwen2) the :math:`G` query heads :math:`q^{(1)}, \dots,
q^{(G)}` of a group share the keys :math:`k` and values :math:`v`,

.. math::

    \mathrm{out}^{(g)}_i = \frac{\sum_{j \le i} e^{s^{(g)}_{ij} - \mu^{(g)}_i} v_j}
                                {\sum_{j \le i} e^{s^{(g)}_{ij} - \mu^{(g)}_i}},
    \qquad s^{(g)}_{ij} = \beta q^{(g)}_i \cdot k_j + \log w_j,

so a chunk of queries :math:`i \in [a, b)` of all :math:`G` heads meets the keys
:math:`j < b` in one product of :math:`G (b - a)` rows: the score product and the weighted sum
run :math:`G` times fewer, larger, BLAS calls, and the chunks can be shorter, which skips more
of the keys after each query (a chunk computes the rectangle :math:`[a, b) \times [0, b)`, of
which the causal triangle needs about :math:`[a, b) \times [0, i]`).

The tasks (a key/value head and a chunk of queries) depend on the shape only: the result has
the same bits for every thread count. They are other products than the streamed engine's (one
per query head), so the last bits differ from it.
"""
from __future__ import annotations

import math

import numpy as np

from . import blocks as _blocks
from . import chunking as _chunking
from . import compiled as _compiled
from . import gemm as _gemm
from . import streamed as _streamed
from .row_exponentials import log_weights as _log_weights

__all__ = ["applies", "chunk_rows", "stream_groups"]

# A chunk stacks about this many query rows over the heads of a group (at least
# _chunking._MIN_CHUNK_ROWS queries a head). 12 query heads on 4 key/value heads, 4 x 512 tokens,
# head dimension 32, two threads, against the streamed engine's chunks of 192 queries a head
# (AMD EPYC, family 23 model 49): 128 queries a head (384 rows) took 0.81 of its time in float32
# and 0.79 in float64; 64 a head 0.87 and 0.85, 192 a head 0.87 (float32).
_GROUP_ROWS = 384


def chunk_rows(groups: int, n: int, itemsize: int) -> int:
    """Queries a head in a chunk of ``groups`` query heads over ``n`` keys: about
    ``_GROUP_ROWS`` rows in all, at least ``_chunking._MIN_CHUNK_ROWS`` a head, and no more
    scores than the streamed engine's chunks hold (the default chunk bytes of
    :mod:`ctformer._numerics.blocks`); 0 where those bytes leave fewer than
    ``_MIN_CHUNK_ROWS`` a head (the streamed engine then takes the problem). A constant of the
    shape, never of the thread count."""
    least = _chunking._MIN_CHUNK_ROWS
    fits = _blocks.DEFAULT.chunk_bytes // max(1, groups * n * itemsize)
    return min(max(least, _GROUP_ROWS // max(1, groups)), fits) if fits >= least else 0


def applies(q, k, v, lead, keep, causal, chunk, terms) -> bool:
    """Whether :func:`stream_groups` takes a NumPy problem: causal, no other mask or score
    term, no chunk asked for, a grouped layout (``q`` (..., H_kv, G, N, d) against ``k`` and
    ``v`` (..., H_kv, 1, N, .), G > 1), float32 or float64 with the compiled row kernel
    normalizing the scores, and at least two chunks of queries (:func:`chunk_rows`)."""
    if not causal or keep is not None or terms is not None or chunk is not None:
        return False
    if _streamed.head_axes(q, k, lead) != 2 or v.ndim != q.ndim or v.shape[-3] != 1 or k.shape[-2] != q.shape[-2]:
        return False
    if q.dtype not in (np.float32, np.float64) or _compiled.kernels() is None:
        return False
    chunk = chunk_rows(lead[-1], q.shape[-2], q.dtype.itemsize)
    return chunk > 0 and q.shape[-2] >= 2 * chunk and _gemm.softmax_provider(q.dtype) == "numpy"


def stream_groups(q, beta, k, v, log_w, diag_shift, lead):
    """Causal attention of grouped queries (see :func:`applies`): for each key/value head and
    chunk of :func:`chunk_rows` queries, the chunk of every query head of the group scaled by
    ``beta`` (a float, or an array broadcasting to ``(*lead, 1, 1)``) into one buffer, one
    score product against the keys up to the chunk's last query, the compiled row kernel
    (the causal order of each head's rows, ``log_w``, ``diag_shift``), one weighted sum, and
    the division by the row sums into the output (laid out as :func:`~ctformer._numerics.
    streamed.output_array` with the groups next to their key/value head)."""
    dtype = q.dtype
    n, d, e, groups = q.shape[-2], q.shape[-1], v.shape[-1], lead[-1]
    chunk = chunk_rows(groups, n, dtype.itemsize)
    out = _streamed.output_array(lead, n, e, dtype, 2)
    q = np.broadcast_to(q, (*lead, n, d))
    # one key and value matrix a group: (*lead[:-1], M, .) views
    k, v = (np.broadcast_to(np.ascontiguousarray(a, dtype=dtype), (*lead[:-1], 1, *a.shape[-2:]))[..., 0, :, :]
            for a in (k, v))
    if isinstance(beta, (int, float)):
        scale = lambda idx, b=float(beta): b  # noqa: E731
    else:
        scale = lambda idx, b=np.broadcast_to(beta, (*lead, 1, 1)): b[idx]  # noqa: E731
    kernel, log_w = _compiled.kernels().exp_rows, _log_weights(log_w, dtype)
    shift = dtype.type(diag_shift or 0)
    product, weighted_product = _gemm.attention_products(dtype)
    # the last chunks meet the most keys: handed out first
    tasks = [(idx, start) for start in reversed(range(0, n, chunk)) for idx in np.ndindex(*lead[:-1])]

    def worker(next_task):
        rows = groups * chunk
        scores, queries = np.empty(rows * n, dtype=dtype), np.empty((rows, d), dtype=dtype)
        sums, weighted = np.empty(rows, dtype=dtype), np.empty((rows, e), dtype=dtype)
        while (task := next_task()) is not None:
            idx, start = task
            stop = min(n, start + chunk)
            r = stop - start
            qs = queries[: groups * r]
            np.multiply(q[idx][:, start:stop], scale(idx), out=qs.reshape(groups, r, d))
            s = scores[: groups * r * stop].reshape(groups * r, stop)
            product(qs, k[idx][:stop].T, out=s)
            # row g r + i is query start + i of head g: the kernel's period r
            kernel(s, log_w, start, r, shift, sums[: groups * r])
            into = weighted[: groups * r]
            weighted_product(s, v[idx][:stop], out=into)
            np.divide(into.reshape(groups, r, e), sums[: groups * r].reshape(groups, r, 1),
                      out=out[idx][:, start:stop])

    _streamed._run_tasks(worker, tasks, n * n * math.prod(lead))
    return out

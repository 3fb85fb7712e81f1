r"""Quadrature attention on NumPy arrays: a batched pass for small problems, streamed query
chunks on worker threads for large ones.

Both compute, for each query row :math:`i`, the numerator weights
:math:`p_{ij} = \exp(s_{ij} - \max_l s_{il})` of the scores
:math:`s_{ij} = \beta q_i \cdot k_j + \log w_j` (masked entries 0), then
:math:`\mathrm{out}_i = \sum_j p_{ij} v_j / \sum_j p_{ij}`. The exponentials and the row
sums run in one fused pass per row when the Numba loops are available
(:mod:`ctformer._numerics.compiled`), else as NumPy passes over cache-sized row blocks
(:mod:`ctformer._numerics.row_exponentials`). The streamed path keeps only the output and,
per worker, one block of scores and one of scaled queries: no copy of ``q``, ``k`` or ``v``.

The work is split into tasks that depend on the problem's shape and dtype only, never on the
number of threads (:mod:`ctformer._numerics.chunking`), so results are bit-identical for any
``CTFORMER_NUM_THREADS``.
"""
from __future__ import annotations

import itertools
import math
from contextlib import nullcontext
from functools import lru_cache

import numpy as np

from . import blocks as _blocks
from . import compiled as _compiled
from . import gemm as _gemm
from . import threads as _threads
# the chunking rules (their own module); stream looks them up here, where tests replace them
from .chunking import key_blocked, stream_chunk, whole_rows
from .row_exponentials import exp_rows_kernel as _exp_rows_kernel, fused_exp_rows as _fused_exp_rows, \
    log_weights as _log_weights, numpy_exp_rows as _numpy_exp_rows, torch_softmax_rows as _torch_softmax_rows

# Small problems: at most this many score entries per task.
_SMALL_TASK_ELEMENTS = 1 << 20
# ... and at most this many where the pass runs on one thread (inside a task of sequence
# groups, or one thread in all): there the tasks only cost their NumPy calls (about 45 us
# each), so they are as large as the caches allow. 48 heads of 128 tokens (float32, head
# dimension 32) took 2.56 ms in 8 tasks, 2.17 in blocks of 24 heads and 2.24 in one block
# of 48 (whose 3 MB of scores leave the 512 KiB L2); float64 4.88, 4.56 and 4.72 (AMD EPYC,
# family 23 model 49).
_ALONE_TASK_ELEMENTS = 1 << 19
# A batch of small problems is split into at least this many tasks (for balance over a few
# threads). A constant, not the thread count: the tasks, hence the rounding, never depend on
# the threads.
_MIN_TASKS = 8
# Below this many score entries in all, a call is not worth spreading over threads (2^20
# left a 256-token, 12-head attention, 0.8 M entries, on one thread: with its products on
# one thread too, float32 networks of 256 tokens took 1.4-2.7 of HuggingFace's time; AMD
# EPYC, family 26 model 2).
_PARALLEL_MIN_ENTRIES = 1 << 18
# The batched pass of small problems multiplies on one BLAS thread from this many
# multiply-adds per problem: OpenBLAS threads such products (a 128-token head, 128 x 32 x 128),
# and its worker, spinning after the call, then shared the cores with the OpenMP threads of
# the next passes; a 128-token float32 MiniLM took 48 ms instead of 11 (AMD EPYC, family 26
# model 2). Below it OpenBLAS multiplies on one thread anyway, and the limit (9 us) is skipped.
_ONE_BLAS_THREAD_MIN = 1 << 17


# -- small problems: one batched pass ------------------------------------------------------------
def small(qs, k, v, log_w, keep, causal, diag_shift, out=None, terms=None):
    """All (batch, head) problems at once, a few NumPy calls; returns (..., N, e), written
    into ``out`` when it is given. Problems of at least ``_ONE_BLAS_THREAD_MIN`` multiply-adds
    each multiply on one BLAS thread (see there). ``terms``: the scores'
    :class:`~ctformer._numerics.score_terms.ScoreTerms`, or None."""
    if qs.shape[-2] * k.shape[-2] * qs.shape[-1] < _ONE_BLAS_THREAD_MIN:
        return _small(qs, k, v, log_w, keep, causal, diag_shift, out, terms)
    limit = _threads.single_thread_blas()
    with limit if limit is not None else nullcontext():
        return _small(qs, k, v, log_w, keep, causal, diag_shift, out, terms)


def _small(qs, k, v, log_w, keep, causal, diag_shift, out, terms=None):
    # C order asked for: a broadcast product of Fortran-ordered queries came out in another
    # layout, whose flattened rows were then a copy that the row kernel wrote in vain
    s = np.matmul(qs, k.swapaxes(-1, -2), order="C")
    if terms is not None:
        terms.apply(s)
    n, m = s.shape[-2:]
    kernel = _exp_rows_kernel() if s.dtype in (np.float32, np.float64) else None
    if kernel is not None and s.size:
        if keep is not None:
            s = _masked(s, keep)
        sums = np.empty(s.shape[:-1], dtype=s.dtype)
        kernel(s.reshape(-1, m), _log_weights(log_w, s.dtype), 0 if causal else -1, n,
               s.dtype.type(diag_shift or 0), sums.reshape(-1))
    else:
        if log_w is not None:
            s += log_w
        if causal:
            s += _causal_bias(m, s.dtype.str, diag_shift)
        elif keep is not None:
            s = _masked(s, keep)
        s -= s.max(axis=-1, keepdims=True)
        np.exp(s, out=s)
        sums = s.sum(axis=-1)
    out = np.matmul(s, v, out=out)
    _divide_rows(out, sums)
    return out


def _divide_rows(out, sums) -> None:
    """``out /= sums[..., None]``, iterated in the memory order of ``out``: where the heads lie
    side by side in the output (:func:`output_array`) NumPy's own order took twice the time
    (24 heads of 128 x 32: 83 against 39 us in float32, 137 against 71 in float64; AMD EPYC,
    family 23 model 49). ``sums`` broadcasts to ``out.shape[:-1]``: values with more leading
    axes than the queries and keys give more outputs than score rows."""
    lead = out.ndim - 1
    if sums.ndim != lead:  # the axes the values add, as ones (np.divide broadcasts them)
        sums = sums.reshape((1,) * (lead - sums.ndim) + sums.shape)
    order = sorted(range(lead), key=lambda axis: -abs(out.strides[axis])) + [lead]
    rows = out.transpose(order)
    np.divide(rows, sums[..., None].transpose(order), out=rows)


def _masked(s, keep):
    """The new scores ``s`` with -inf where ``keep`` is False: in place where ``keep``
    broadcasts to their shape (half the time of ``np.where``'s new array), else ``np.where``."""
    if np.broadcast_shapes(keep.shape, s.shape) != s.shape:
        return np.where(keep, s, -np.inf)
    np.copyto(s, -np.inf, where=np.logical_not(keep))
    return s


def small_blocks(qs, k, v, log_w, causal, diag_shift, lead, terms=None, keep=None):
    """Many small (batch, head) problems: :func:`small` on blocks of problems
    (:func:`_head_blocks`; views: the operands are never gathered into one stack), each block's scores at most
    ``_SMALL_TASK_ELEMENTS`` entries, at least ``_MIN_TASKS`` blocks when there are that many
    problems, shared by the worker threads. The blocks depend on the shapes only, except
    where the pass runs on one thread: there they are as few as ``_ALONE_TASK_ELEMENTS``
    allows, with the same bits (each problem is computed alike in any block). ``keep``:
    None, or a boolean mask broadcasting to ``(*lead, n, m)`` (every row keeps a key)."""
    n, m, e = qs.shape[-2], k.shape[-2], v.shape[-1]
    out = output_array(lead, n, e, np.result_type(qs.dtype, v.dtype), head_axes(qs, k, lead))
    qs, k, v = (_to_lead(a, lead) for a in (qs, k, v))
    keep = None if keep is None else np.broadcast_to(keep, (*lead, n, m))
    count = math.prod(lead)
    dtype = out.dtype
    # BLAS is limited once for the pass, not per task (8 us each): by the parallel pass, else
    # here where one problem is large enough to be threaded by OpenBLAS (see ``small``)
    batch = _small_torch if terms is None and keep is None and dtype in (np.float32, np.float64) and \
        _gemm.softmax_provider(dtype) == "torch" else _small
    parallel = n * m * count >= _PARALLEL_MIN_ENTRIES
    if batch is _small and (not parallel or _threads.runs_alone()):
        # each problem's numbers are the same in any block (one product, row kernel and
        # division each), so the blocks may depend on the threads here
        tasks = _head_blocks(lead, _ALONE_TASK_ELEMENTS // (n * m))
    else:
        tasks = _head_blocks(lead, min(_SMALL_TASK_ELEMENTS // (n * m), -(-count // _MIN_TASKS)))
    limit = None if parallel or n * m * qs.shape[-1] < _ONE_BLAS_THREAD_MIN else _threads.single_thread_blas()

    terms = None if terms is None else terms.spread(lead, n, m)

    def worker(next_task):
        while (block := next_task()) is not None:
            sliced = None if terms is None else terms.at(block)
            batch(qs[block], k[block], v[block], log_w, None if keep is None else keep[block],
                  causal, diag_shift, out[block], sliced)

    with limit if limit is not None else nullcontext():
        _threads.run_blas_tasks(worker, tasks, parallel)
    return out


def _to_lead(a, lead):
    """``a`` (read only) as an array of shape ``(*lead, *a.shape[-2:])``: ``a`` itself where it
    has that shape (``np.broadcast_to`` costs about 3 us a call, three a call of attention)."""
    return a if a.shape[:-2] == lead else np.broadcast_to(a, (*lead, *a.shape[-2:]))


def _head_blocks(lead, most) -> list:
    """The tasks of :func:`small_blocks`: indices into the leading axes ``lead``, each a block
    of at most ``most`` (>= 1) problems. A block is a run of the last axis; where a whole run
    fits, it is runs of the last two axes (all of a grouped-query layout's groups for several
    key/value heads): 8 x 128 tokens of 4 key/value heads of 3 queries each made 32 tasks of
    3 heads, each with its own fixed costs (a dozen NumPy calls), where 8 tasks of 12 do."""
    inner, most = lead[-1], max(1, most)
    if most < inner or len(lead) < 2:
        step = min(inner, most)
        return [(*idx, slice(start, start + step)) for idx in np.ndindex(*lead[:-1])
                for start in range(0, inner, step)]
    outer = lead[-2]
    step = min(outer, most // inner)
    return [(*idx, slice(start, start + step), slice(None)) for idx in np.ndindex(*lead[:-2])
            for start in range(0, outer, step)]


def _small_torch(qs, k, v, log_w, keep, causal, diag_shift, out, terms=None):
    """:func:`small` by torch's batched products and softmax on one thread (``keep`` and
    ``terms`` None, one dtype); writes ``out``."""
    m = k.shape[-2]
    bias = None
    if causal:
        bias = _causal_bias(m, qs.dtype.str, diag_shift)
    if log_w is not None:
        bias = log_w if bias is None else bias + log_w
    _gemm.attention_block(qs, k, v, bias, out)
    return out


def output_array(lead, n, e, dtype, head_axes=1):
    """An uninitialised (*lead, n, e) result laid out as (*lead[:-h], n, *lead[-h:], e) in
    memory, ``h = head_axes``: with the heads as the last leading axis (``h = 1``), or as
    (key/value head, group) for grouped queries (``h = 2``), the caller's concatenation of
    the heads along the features, (..., n, heads * e), is then a view rather than a copy."""
    if not lead:
        return np.empty((n, e), dtype=dtype)
    h = min(head_axes, len(lead))
    out = np.empty((*lead[:-h], n, *lead[-h:], e), dtype=dtype)
    return np.moveaxis(out, -2 - h, -2) if h > 1 else out.swapaxes(-3, -2)


def head_axes(q, k, lead) -> int:
    """2 for grouped queries (``q`` (..., H_kv, G, N, d) against ``k`` (..., H_kv, 1, M, d):
    :func:`output_array` then lays the groups next to their key/value head), else 1."""
    return 2 if (len(lead) >= 2 and lead[-1] > 1 and k.ndim == q.ndim and k.shape[-3] == 1
                 and q.shape[-3] == lead[-1]) else 1


def _run_tasks(worker, tasks, entries):
    """The attention ``worker`` over ``tasks``: threaded, with a single-threaded BLAS per
    worker for every thread count (one included), from ``_PARALLEL_MIN_ENTRIES`` score
    entries in all (else on the calling thread)."""
    _threads.run_blas_tasks(worker, tasks, entries >= _PARALLEL_MIN_ENTRIES)


@lru_cache(maxsize=64)
def _causal_bias(n, dtype, diag_shift):
    """(n, n) additive mask: -inf above the diagonal, ``diag_shift`` (or 0) on it (read-only)."""
    bias = np.zeros((n, n), dtype=np.dtype(dtype))
    bias[np.triu_indices(n, 1)] = -np.inf
    if diag_shift is not None:
        bias[np.diag_indices(n)] = diag_shift
    bias.setflags(write=False)
    return bias


# -- large problems: streamed query chunks -------------------------------------------------------
def stream(q, beta, k, v, log_w, keep, causal, diag_shift, lead, chunk, geometry=None, packs=None, terms=None):
    """Query chunks of every (batch, head), each done by one worker with its own buffers, in
    blocks of ``geometry`` (None: :data:`ctformer._numerics.blocks.DEFAULT`; this machine's is
    :func:`ctformer._numerics.measured_blocks.geometry`). Where the keys come in blocks,
    ``packs`` (a :class:`ctformer._numerics.packed_attention.packed_blocks` of the geometry's
    key block, float32; None: the worker tasks' BLAS) multiplies by packed blocks.

    ``beta`` (a float, or an array broadcasting to ``(*lead, 1, 1)``) scales each chunk of
    queries in the worker's buffer: no scaled copy of ``q`` is made. ``terms``: the scores'
    :class:`~ctformer._numerics.score_terms.ScoreTerms` (before the weights and masks), or None."""
    dtype = q.dtype
    n, m, e = q.shape[-2], k.shape[-2], v.shape[-1]
    geometry = _blocks.DEFAULT if geometry is None else geometry
    blocked = key_blocked(m, keep, dtype, causal, geometry.key_block, geometry.chunk_bytes)
    if chunk is None:  # whole rows instead of key blocks keep the blocks' chunks
        chunk = stream_chunk(n, m, dtype.itemsize, math.prod(lead), blocked, geometry, causal)
    blocked = blocked and (packs is not None or not whole_rows(m, dtype.itemsize, geometry))
    chunk = int(min(chunk, n))
    out = output_array(lead, n, e, dtype, head_axes(q, k, lead))
    # BLAS-friendly strides and one dtype (no-ops for the usual inputs)
    k, v = (np.ascontiguousarray(a, dtype=dtype) for a in (k, v))
    q, k, v = (_to_lead(a, lead) for a in (q, k, v))
    scale = (lambda idx, b=float(beta): b) if isinstance(beta, (int, float)) else \
        (lambda idx, b=np.broadcast_to(beta, (*lead, 1, 1)): b[idx])
    keep = None if keep is None else np.broadcast_to(keep, (*lead, *keep.shape[-2:]))
    kernel = _exp_rows_kernel()
    if keep is None and _gemm.softmax_provider(dtype) == "torch":  # every row has a key
        exp_rows = _torch_softmax_rows(log_w, causal, diag_shift, chunk)
    elif kernel:
        exp_rows = _fused_exp_rows(kernel, log_w, causal, diag_shift, dtype)
    else:
        exp_rows = _numpy_exp_rows(log_w, causal, diag_shift, chunk)
    terms = None if terms is None else terms.spread(lead, n, m)
    starts = range(0, n, chunk)
    if causal:  # the last chunks cost the most: hand them out first
        starts = reversed(starts)
    problems = list(itertools.product(*map(range, lead)))  # np.ndindex's order, a fifth of its cost
    tasks = [(idx, start) for start in starts for idx in problems]

    # each product by this machine's faster BLAS for it (torch's lands in a buffer, then divides)
    product, weighted_product = _gemm.attention_products(dtype)
    if blocked:
        if packs is not None and (dtype != np.float32 or packs.key_block != geometry.key_block):
            raise ValueError(f"packs: packed blocks of {packs.key_block} keys for float32, got {dtype} "
                             f"attention in blocks of {geometry.key_block}")
        if packs is not None:
            packs.prepare(k, v, lead)
        worker = _blocked_worker(q, scale, k, v, _log_weights(log_w, dtype), causal, diag_shift, chunk, out,
                                 (product, weighted_product), geometry.key_block, packs, terms)
    else:
        worker = _chunk_worker(q, scale, k, v, keep, causal, chunk, out, (product, weighted_product), exp_rows,
                               terms)
    _run_tasks(worker, tasks, n * m * (math.prod(lead) or 1))
    return out


def _chunk_worker(q, scale, k, v, keep, causal, chunk, out, products, exp_rows, terms=None):
    """The worker of :func:`stream` with each chunk of queries meeting its keys at once: the
    chunk's scores (``keep``: a boolean mask broadcasting to the problems' scores, or None),
    their row exponentials and sums (``exp_rows``), the weighted sums of values, divided.
    ``products``: the scores' and the weighted sums'
    (:func:`~ctformer._numerics.gemm.attention_products`); one not NumPy's writes into a
    buffer of the worker, then divides into ``out``."""
    product, weighted_product = products
    dtype, n, m = q.dtype, q.shape[-2], k.shape[-2]
    d, e = q.shape[-1], v.shape[-1]

    def worker(next_task):
        scores = np.empty(chunk * m, dtype=dtype)
        queries = np.empty((chunk, d), dtype=dtype)
        sums = np.empty((chunk, 1), dtype=dtype)
        weighted = np.empty((chunk, e), dtype=dtype) if weighted_product is not np.matmul else None
        drop = None if keep is None else np.empty(chunk * m, dtype=bool)
        while (task := next_task()) is not None:
            idx, start = task
            stop = min(n, start + chunk)
            r = stop - start
            cols = stop if causal else m  # causal: keys after the chunk never count
            s = scores[: r * cols].reshape(r, cols)
            qs = np.multiply(q[idx][start:stop], scale(idx), out=queries[:r])
            product(qs, k[idx][:cols].T, out=s)
            if terms is not None:
                terms.apply(s, idx, slice(start, stop), slice(0, cols))
            if keep is not None:
                kb = keep[idx]
                drop_s = drop[: s.size].reshape(s.shape)
                np.logical_not(kb[start:stop] if kb.shape[0] > 1 else kb, out=drop_s)
                np.copyto(s, -np.inf, where=drop_s)
            exp_rows(s, start, sums[:r, 0])
            result = out[idx][start:stop]
            into = result if weighted is None else weighted[:r]
            weighted_product(s, v[idx][:cols], out=into)
            np.divide(into, sums[:r], out=result)
    return worker


def _blocked_worker(q, scale, k, v, log_w, causal, diag_shift, chunk, out, products, key_block, packs=None,
                    terms=None):
    """The worker of :func:`stream` with the keys in blocks of ``key_block``: for each chunk
    of queries, the running row maxima, sums of exponentials and weighted sums of values are
    updated one key block at a time (online softmax), then divided. ``products``: the scores'
    and the weighted sums' (:func:`~ctformer._numerics.gemm.attention_products`)."""
    product, weighted_product = products
    made = _compiled.kernels()
    dtype, n, m = q.dtype, q.shape[-2], k.shape[-2]
    d, e = q.shape[-1], v.shape[-1]
    shift = dtype.type(diag_shift or 0)

    def worker(next_task):
        scores = np.empty(chunk * key_block, dtype=dtype)
        queries = np.empty((chunk, d), dtype=dtype)
        acc, part = np.empty((chunk, e), dtype=dtype), np.empty((chunk, e), dtype=dtype)
        top, alpha = np.empty(chunk, dtype=dtype), np.empty(chunk, dtype=dtype)
        sums = np.empty(chunk, dtype=np.float64)
        while (task := next_task()) is not None:
            idx, start = task
            stop = min(n, start + chunk)
            r = stop - start
            qs = np.multiply(q[idx][start:stop], scale(idx), out=queries[:r])
            keys, values = k[idx], v[idx]
            acc[:r], top[:r], sums[:r] = 0, -np.inf, 0
            cols = stop if causal else m  # causal: keys after the chunk never count
            for col0 in range(0, cols, key_block):
                col1 = min(cols, col0 + key_block)
                if packs is None:
                    s = scores[: r * (col1 - col0)].reshape(r, col1 - col0)
                    product(qs, keys[col0:col1].T, out=s)
                else:  # the block's K and V packed once per call: new arrays, read as they are
                    packed_k, packed_v = packs(keys, values, col0)
                    s = packed_k(qs)
                if terms is not None:
                    terms.apply(s, idx, slice(start, stop), slice(col0, col1))
                made.exp_rows_online(s, log_w, col0, start if causal else -1, shift, top[:r], sums[:r], alpha[:r])
                weighted = weighted_product(s, values[col0:col1], out=part[:r]) if packs is None else packed_v(s)
                made.rescale_add(acc[:r], weighted, alpha[:r])
            np.divide(acc[:r], sums[:r, None], out=out[idx][start:stop], casting="same_kind")
    return worker

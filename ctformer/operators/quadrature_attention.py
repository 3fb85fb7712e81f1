r"""Quadrature attention: the functional core of self-attention as an integral operator.

For queries :math:`q_i`, keys :math:`k_j`, values :math:`v_j` at token nodes :math:`x_j` with
quadrature weights :math:`w_j` and a mask :math:`m_{ij} \in \{0, 1\}`,

.. math::

    \mathrm{out}_i = \frac{\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j} v_j}
                          {\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j}},

the quadrature of :math:`\int_X \gamma(x_i, x') v(x') dx'` with the state-dependent kernel
:math:`\gamma` of the design notes, section 1 (Tai, Liu, Li, Chan 2025, arXiv 2510.03989). Uniform
weights cancel (ordinary softmax attention); other weights enter as a log-weight bias,
:math:`\mathrm{softmax}_j(\beta q_i\cdot k_j + \log w_j)`.

The sum is computed in query chunks with the row maximum subtracted (log-sum-exp), so memory
is :math:`O(\text{chunk} \times N)` and the result is finite in float32 and for very large
:math:`\beta`. The code is written once against the array namespace (NumPy, CuPy,
``array_api_strict``); large NumPy problems take a streaming path that reuses one score buffer,
works in place, and spreads the chunks over a few threads.
"""
from __future__ import annotations

import itertools
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import array_api_compat
import numpy as np

__all__ = ["quadrature_attention"]

# Scores per chunk (elements of one (chunk, M) block) for the generic path: ~8 MiB in
# float64 on the host; on a GPU larger blocks amortize the kernel launches.
_CHUNK_ELEMENTS = 1 << 20
_CHUNK_ELEMENTS_DEVICE = 1 << 27
# NumPy streaming path: a (chunk, M) score block of ~8 MiB keeps BLAS efficient (chunk >= 128
# rows at M = 8192 in float64) while the extra memory stays far below an N x N matrix.
_CHUNK_BYTES_NUMPY = 8 << 20
_MIN_CHUNK_ROWS = 64
# Problems with fewer score entries per (batch, head) than this are done batched in one go.
_STREAM_MIN_ENTRIES = 1 << 16
# Below this many score entries in all, a call is not worth spreading over threads.
_PARALLEL_MIN_ENTRIES = 1 << 20
# Rows of a score chunk are exponentiated in blocks of this size (L2 cache).
_ELEMENTWISE_BLOCK_BYTES = 1 << 20


def quadrature_attention(q, k, v, *, beta, weights=None, mask=None, diagonal="full", chunk=None):
    r"""Softmax attention as a quadrature of a nonlocal integral operator.

    .. math::

        \mathrm{out}_i = \frac{\sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)\, v_j}
                              {\sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)}

    Parameters
    ----------
    q : array, shape (..., N, d)
        Queries at the N query nodes.
    k : array, shape (..., M, d)
        Keys at the M key nodes.
    v : array, shape (..., M, e)
        Values at the M key nodes.
    beta : float or array
        Inverse temperature; a scalar or an array broadcasting against the leading (batch,
        head) axes, e.g. shape ``(H,)`` for one value per head when ``q`` is ``(B, H, N, d)``.
        Must be finite.
    weights : array, shape (M,), optional
        Positive quadrature weights of the key nodes. Default: uniform (plain softmax).
    mask : None, "causal" or bool array broadcasting to (..., N, M), optional
        ``"causal"`` keeps :math:`x_j \le x_i` (requires N == M). A boolean array keeps the
        entries that are True; its last axis has length M, the one before it N or 1 (a key
        mask), and every row must keep at least one entry.
    diagonal : {"full", "half"}
        With ``mask="causal"``: weight of the diagonal cell. ``"full"`` is the standard causal
        mask (first-order quadrature of :math:`\int_0^{x_i}`); ``"half"`` gives it weight
        :math:`w_i / 2` (second order on midpoint nodes, design notes, section 2).
    chunk : int, optional
        Number of query rows processed at once. Default: chosen so that one block of scores
        stays small (a few MiB on the CPU), never an N x M matrix for large N.

    Returns
    -------
    array, shape (..., N, e)
        Same array library and dtype as the inputs (float32 stays float32).

    Raises
    ------
    ValueError
        For mismatched shapes, non-positive weights, non-finite ``beta``, a mask of the wrong
        shape or one that removes every key of some query, or a bad ``chunk``.
    TypeError
        For non-floating inputs or a non-boolean mask.

    Notes
    -----
    With :math:`s_{ij} = \beta q_i \cdot k_j + \log w_j` and the row maximum
    :math:`\mu_i = \max_{j: m_{ij}=1} s_{ij}`, the code evaluates

    .. math::

        \mathrm{out}_i = \frac{\sum_j m_{ij} e^{s_{ij} - \mu_i} v_j}{\sum_j m_{ij} e^{s_{ij} - \mu_i}},

    where every exponent is :math:`\le 0` and the largest is exactly 0, so nothing overflows and
    the denominator is at least 1, for any finite :math:`\beta`. The denominator is obtained in
    the same matrix product as the numerator (a column of ones appended to :math:`v`). With a
    causal mask only the keys :math:`j \le i` are computed (half the work) and only the
    diagonal block of each chunk is masked.

    Large NumPy problems are split into (batch, head, query chunk) tasks shared by
    ``CTFORMER_NUM_THREADS`` worker threads (default: the thread count of the BLAS library),
    each with its own score buffer of about 8 MiB, while the BLAS library is limited to one
    thread through ``threadpoolctl`` (OpenBLAS threads busy-wait between calls and would take
    the cores the element-wise work needs). Without ``threadpoolctl`` one worker runs and BLAS
    keeps its threads. Extra memory is about ``threads x 8 MiB`` plus copies of ``q`` and
    ``v`` and the output. Set ``CTFORMER_NUM_THREADS=1`` when calling from several threads at
    once (e.g. a threaded Dask worker).
    """
    xp = array_api_compat.array_namespace(q, k, v)
    q, k, v, beta, log_w, keep, diag_shift, lead = _validate(xp, q, k, v, beta, weights, mask, diagonal)
    n, m = q.shape[-2], k.shape[-2]
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1):
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    causal = isinstance(mask, str)
    if n == 0:
        return xp.zeros((*lead, 0, v.shape[-1]), dtype=q.dtype)
    if (array_api_compat.is_numpy_array(q) and q.dtype in (np.float32, np.float64)
            and n * m >= _STREAM_MIN_ENTRIES):
        return _stream_numpy(q, k, v, beta, log_w, keep, causal, diag_shift, lead, chunk)
    if chunk is None:
        target = _CHUNK_ELEMENTS_DEVICE if array_api_compat.is_cupy_array(q) else _CHUNK_ELEMENTS
        chunk = max(1, min(n, target // max(1, m * (math.prod(lead) or 1))))
    return _stream_generic(xp, q, k, v, beta, log_w, keep, causal, diag_shift, int(chunk))


# -- generic path (any array namespace) ------------------------------------------------------
def _stream_generic(xp, q, k, v, beta, log_w, keep, causal, diag_shift, chunk):
    """Query chunks with functional array-API operations; returns (..., N, e)."""
    n, e = q.shape[-2], v.shape[-1]
    q = q * beta  # O(N d): cheaper than scaling every score
    # the column of ones gives the denominator from the same product as the numerator
    ones = xp.ones((*v.shape[:-1], 1), dtype=v.dtype)
    v1 = xp.concat([v, ones], axis=-1)
    blocks = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        cols = stop if causal else k.shape[-2]  # causal: keys after the chunk never count
        s = q[..., start:stop, :] @ xp.matrix_transpose(k[..., :cols, :])
        if log_w is not None:
            s = s + log_w[:cols]
        if causal:
            s = _mask_diagonal_block(xp, s, start, stop, diag_shift)
        elif keep is not None:
            rows = keep[..., start:stop, :] if keep.shape[-2] > 1 else keep
            s = xp.where(rows, s, -xp.inf)
        p = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        num = p @ v1[..., :cols, :]
        blocks.append(num[..., :e] / num[..., e:])
    return xp.concat(blocks, axis=-2) if len(blocks) > 1 else blocks[0]


def _mask_diagonal_block(xp, s, start, stop, diag_shift):
    """Mask keys j > i inside the diagonal block s[..., :, start:stop] (and halve j == i)."""
    r = stop - start
    i = xp.arange(r)[:, None]
    j = xp.arange(r)[None, :]
    block = xp.where(j <= i, s[..., start:], -xp.inf)
    if diag_shift is not None:
        block = block + xp.astype(j == i, s.dtype) * diag_shift
    return xp.concat([s[..., :start], block], axis=-1) if start else block


# -- NumPy streaming path ------------------------------------------------------------------
def _stream_numpy(q, k, v, beta, log_w, keep, causal, diag_shift, lead, chunk):
    """Query chunks of every (batch, head), each done by one worker with its own buffers."""
    dtype = q.dtype
    n, m, e = q.shape[-2], k.shape[-2], v.shape[-1]
    threads = _num_threads()
    if chunk is None:
        chunk = max(_MIN_CHUNK_ROWS, _CHUNK_BYTES_NUMPY // (m * dtype.itemsize))
        # at least two tasks per worker thread, for balance
        per_problem = -(-2 * threads // (math.prod(lead) or 1))
        chunk = min(chunk, max(_MIN_CHUNK_ROWS, -(-n // per_problem)))
    chunk = int(min(chunk, n))
    qs = np.multiply(q, beta, dtype=dtype)  # beta folded into the queries: O(N d)
    v1 = np.empty((*v.shape[:-1], e + 1), dtype=dtype)
    v1[..., :e] = v
    v1[..., e] = 1  # the last output column is the denominator
    out = np.empty((*lead, n, e), dtype=dtype)
    k = np.ascontiguousarray(k)  # BLAS-friendly strides (a no-op for the usual inputs)
    qs, k, v1 = (np.broadcast_to(a, (*lead, *a.shape[-2:])) for a in (qs, k, v1))
    keep = None if keep is None else np.broadcast_to(keep, (*lead, *keep.shape[-2:]))
    upper = np.triu(np.ones((chunk, chunk), dtype=bool), 1) if causal else None
    starts = range(0, n, chunk)
    if causal:  # the last chunks cost the most: hand them out first
        starts = reversed(starts)
    tasks = [(idx, start) for start in starts for idx in np.ndindex(*lead)]

    def worker(next_task):
        scores = np.empty(chunk * m, dtype=dtype)
        num = np.empty((chunk, e + 1), dtype=dtype)
        row_max = np.empty((chunk, 1), dtype=dtype)
        drop = None if keep is None else np.empty(chunk * m, dtype=bool)
        while (task := next_task()) is not None:
            idx, start = task
            stop = min(n, start + chunk)
            r = stop - start
            cols = stop if causal else m  # causal: keys after the chunk never count
            s = scores[: r * cols].reshape(r, cols)
            np.matmul(qs[idx][start:stop], k[idx][:cols].T, out=s)
            # exp(s - row max) in place, in row blocks that stay in cache
            block_rows = max(1, _ELEMENTWISE_BLOCK_BYTES // (cols * dtype.itemsize))
            for a in range(0, r, block_rows):
                b = min(r, a + block_rows)
                sa = s[a:b]
                if log_w is not None:
                    np.add(sa, log_w[:cols], out=sa)
                if causal:  # only the diagonal block has keys after the query
                    diag = sa[:, start:]
                    np.copyto(diag, -np.inf, where=upper[a:b, :r])
                    if diag_shift is not None:
                        i = np.arange(a, b)
                        diag[i - a, i] += diag_shift
                elif keep is not None:
                    kb = keep[idx]
                    d = drop[: sa.size].reshape(sa.shape)
                    np.logical_not(kb[start + a:start + b] if kb.shape[0] > 1 else kb, out=d)
                    np.copyto(sa, -np.inf, where=d)
                mx = row_max[: b - a]
                np.max(sa, axis=1, keepdims=True, out=mx)
                np.subtract(sa, mx, out=sa)
                np.exp(sa, out=sa)
            nb = num[:r]
            np.matmul(s, v1[idx][:cols], out=nb)
            np.divide(nb[:, :e], nb[:, e:], out=out[idx][start:stop])

    threads = min(threads, len(tasks))
    big = n * m * (math.prod(lead) or 1) >= _PARALLEL_MIN_ENTRIES
    limiter = _single_thread_blas() if threads > 1 and big else None
    if limiter is None:  # one worker; the BLAS library uses its own threads
        remaining = iter(tasks)
        worker(lambda: next(remaining, None))
        return out
    # Several workers, each with a single-threaded BLAS: OpenBLAS threads busy-wait after a
    # call, so interleaving threaded BLAS with threaded element-wise work wastes a core.
    counter = itertools.count()

    def next_task():
        i = next(counter)  # atomic in CPython
        return tasks[i] if i < len(tasks) else None

    with limiter:
        futures = [_pool(threads).submit(worker, next_task) for _ in range(threads - 1)]
        try:
            worker(next_task)
        finally:
            for f in futures:
                f.result()
    return out


_POOL_LOCK = threading.Lock()
_POOL: dict = {}
_CONTROLLER: list = []


def _pool(threads):
    """A shared worker pool, rebuilt after a fork (threads do not survive one)."""
    key = (os.getpid(), threads)
    with _POOL_LOCK:
        if key not in _POOL:
            _POOL.clear()
            _POOL[key] = ThreadPoolExecutor(max_workers=max(1, threads - 1),
                                            thread_name_prefix="ctformer-attention")
        return _POOL[key]


def _blas_controller():
    """threadpoolctl's controller of the loaded BLAS libraries, or None without threadpoolctl."""
    with _POOL_LOCK:
        if not _CONTROLLER:
            try:
                from threadpoolctl import ThreadpoolController

                _CONTROLLER.append(ThreadpoolController())
            except Exception:  # not installed, or an unknown library layout
                _CONTROLLER.append(None)
        return _CONTROLLER[0]


def _single_thread_blas():
    """A context limiting BLAS to one thread for the duration of a call (None if impossible)."""
    controller = _blas_controller()
    if controller is None:
        return None
    return controller.limit(limits=1, user_api="blas")


def _num_threads():
    """Worker threads: CTFORMER_NUM_THREADS, else the BLAS library's current thread count."""
    value = os.environ.get("CTFORMER_NUM_THREADS", "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise ValueError(f"CTFORMER_NUM_THREADS must be a positive integer, got {value!r}") from None
    controller = _blas_controller()
    if controller is not None:
        counts = [info.get("num_threads") or 1 for info in controller.info() if info.get("user_api") == "blas"]
        if counts:
            return max(counts)
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        try:
            return max(1, int(os.environ.get(name, "").split(",")[0]))
        except ValueError:
            pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# -- validation ------------------------------------------------------------------------------
def _validate(xp, q, k, v, beta, weights, mask, diagonal):
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., tokens, features), got shape {tuple(a.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of tokens, got {k.shape[-2]} and {v.shape[-2]}")
    n, m = q.shape[-2], k.shape[-2]
    if m == 0:
        raise ValueError("k and v must hold at least one key token, got 0")
    shapes = [("q", q.shape[:-2]), ("k", k.shape[:-2]), ("v", v.shape[:-2])]
    dtype = xp.result_type(q, k, v)
    if not xp.isdtype(dtype, "real floating"):
        raise TypeError(f"q, k, v must be real floating arrays, got dtype {dtype}")
    q, k, v = (xp.astype(a, dtype, copy=False) for a in (q, k, v))

    # beta: scalar or array over the leading axes -> shape (..., 1, 1)
    if isinstance(beta, (int, float, np.floating, np.integer)) and not isinstance(beta, bool):
        if not math.isfinite(float(beta)):
            raise ValueError(f"beta must be finite, got {beta!r}")
        beta = float(beta)
    else:
        try:
            beta = xp.asarray(beta, dtype=dtype)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"beta must be a real number or an array of them, got {beta!r}") from exc
        if not bool(xp.all(xp.isfinite(beta))):
            raise ValueError("beta must be finite")
        if beta.ndim == 0:
            beta = float(beta)
        else:
            shapes.append(("beta", beta.shape))
            beta = beta[..., None, None]

    log_w = None
    if weights is not None:
        w = xp.asarray(weights, dtype=dtype)
        if w.ndim != 1 or w.shape[0] != m:
            raise ValueError(f"weights must have shape ({m},) (one per key token), got {tuple(w.shape)}")
        if not bool(xp.all(w > 0)) or not bool(xp.all(xp.isfinite(w))):
            raise ValueError("weights must be positive and finite")
        log_w = xp.log(w)

    if diagonal not in ("full", "half"):
        raise ValueError(f"diagonal must be 'full' or 'half', got {diagonal!r}")
    keep = None
    diag_shift = None
    if mask is None:
        if diagonal == "half":
            raise ValueError("diagonal='half' only applies with mask='causal'")
    elif isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or a boolean array, got {mask!r}")
        if n != m:
            raise ValueError(f"mask='causal' needs as many queries as keys, got {n} and {m}")
        if diagonal == "half":
            diag_shift = math.log(0.5)
    else:
        keep = xp.asarray(mask)
        if keep.dtype != xp.bool:
            raise TypeError(f"mask array must be boolean (True = keep), got dtype {keep.dtype}")
        if keep.ndim < 2 or keep.shape[-1] != m or keep.shape[-2] not in (1, n):
            raise ValueError(
                f"mask array must have shape (..., {n}, {m}) or (..., 1, {m}), got {tuple(keep.shape)}"
            )
        if not bool(xp.all(xp.any(keep, axis=-1))):
            raise ValueError("mask removes every key for some query; each row needs one kept entry")
        if diagonal == "half":
            raise ValueError("diagonal='half' only applies with mask='causal'")
        shapes.append(("mask", keep.shape[:-2]))
    try:
        lead = tuple(np.broadcast_shapes(*(tuple(s) for _, s in shapes)))
    except ValueError:
        listed = ", ".join(f"{name} {tuple(s)}" for name, s in shapes)
        raise ValueError(f"leading (batch, head) axes do not broadcast: {listed}") from None
    return q, k, v, beta, log_w, keep, diag_shift, lead

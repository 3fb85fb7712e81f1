r"""Feature-map products with the matrix packed once: oneDNN's inner product (float32).

A feature map multiplies the rows of every token by one matrix, :math:`v \mapsto v W^T + b`.
A BLAS product (OpenBLAS, MKL) copies ("packs") :math:`W` into cache-sized panels on every
call; with few rows (a 16-token forward) that copy costs about as much as the arithmetic.
oneDNN, which torch's CPU wheels carry, reorders a weight once into its own blocked layout
and then reads it as it is. On an AMD EPYC (family 26, model 2; two threads) the 24 products
of a 16-token MiniLM forward in float32 took 1.6 ms this way, against 3.0 ms with OpenBLAS
and 4.4 ms with MKL; at 1024 rows 47 against 54 ms.

A product is packed where all of these hold:

* float32 (oneDNN has no float64 inner product) C-contiguous NumPy rows, and a host matrix
  (the packed copy is made once per discretized operator, like its other converted constants);
* ``CTFORMER_GEMM`` is ``auto`` and this machine's measurement (:func:`measure`, stored with
  the products' choice by :func:`ctformer._numerics.gemm.prepared_products`) chose it: one-thread
  time at a feature map's shapes below ``0.92`` of the product the rows get otherwise
  (:func:`ctformer._numerics.gemm.rows_peer`), and one, two and three threads
  giving the same bits at the corners of the shapes used;
* at least ``_MIN_ROWS`` rows, a width of at least ``_MIN_WIDTH`` and an inner dimension of at
  most ``_MAX_INNER``. oneDNN splits the inner dimension between threads, and so rounds by
  the thread count, only for outputs that are small against it: one row of width 128 at inner
  dimension 4096, or 32 rows of width 32 at 65536 (measured); within these bounds 45 shapes of
  2 to 16 rows gave the same bits on 1, 2, 6, 16, 32 and 64 threads. One row stays with BLAS
  (a matrix-vector product, which packs nothing: as fast as oneDNN's).

The product runs on :func:`~ctformer._numerics.threads.num_threads` of torch's threads (one
inside a worker task), with the bias added by oneDNN in the same pass.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from .threads import _INSIDE, num_threads, single_thread_blas
from .torch_threads import _tensor, _torch, _torch_threads

__all__ = ["PackedMatrix", "measure", "pack"]

_MIN_ROWS = 2
_MIN_WIDTH = 128
_MAX_INNER = 16384
# (rows, inner, width): thread-count invariance is checked at the corners of the bounds above
# and at a network's shapes; the time at the shapes of a 16-row forward and of a row block
_INVARIANCE_SHAPES = ((_MIN_ROWS, _MAX_INNER, _MIN_WIDTH), (_MIN_ROWS, 384, 1152), (5, 4096, 384),
                      (16, 1536, 384), (1000, 384, 1536), (1024, _MAX_INNER, _MIN_WIDTH))
_TIMED_SHAPES = ((16, 384, 1152), (16, 1536, 384), (256, 384, 1536))
# what a stored verdict checked, and against what: a verdict stored otherwise is measured again
_MARGIN = 0.92
# Rounds over the timed shapes, each side's best time kept. Timed once, shape after shape, the
# first shape met torch's OpenMP threads still spinning from the invariance check (two and
# three threads on two cores): 1.43 of NumPy's time stored at 16 x 384 x 1152, where a process
# of its own measured 0.99 (AMD EPYC, family 25 model 1).
_ROUNDS = 3
CHECKED = f"{_INVARIANCE_SHAPES!r} against the rows' own product, best of {_ROUNDS} rounds"


def _ops(torch):
    """oneDNN's weight reorder and inner product through torch, or None."""
    mkldnn = getattr(getattr(torch, "ops", None), "mkldnn", None)
    try:
        if mkldnn is None or not torch.backends.mkldnn.is_available():
            return None
        return mkldnn._reorder_linear_weight, mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):  # an op missing from this build
        return None


class PackedMatrix:
    """:math:`v \\mapsto v M + b` for a float32 host matrix ``M`` (inner x width), packed once."""

    __slots__ = ("weight", "bias", "inner", "width", "_product")
    dtype = np.dtype(np.float32)

    def __init__(self, matrix_t, bias, torch):
        reorder, self._product = _ops(torch)
        self.inner, self.width = matrix_t.shape
        weight = _tensor(torch, np.ascontiguousarray(matrix_t.T, dtype=np.float32))  # read-only too: reordered
        self.weight = reorder(weight, batch_size=None)
        self.bias = None if bias is None else torch.from_numpy(
            np.array(np.broadcast_to(bias, (self.width,)), dtype=np.float32))

    def applies(self, rows: int) -> bool:
        """Whether ``rows`` rows are multiplied here (the bounds of the module docstring)."""
        return rows >= _MIN_ROWS and self.width >= _MIN_WIDTH and self.inner <= _MAX_INNER

    def __call__(self, a):
        """``a @ M + b`` for C-contiguous float32 rows ``a`` (..., inner): a new NumPy array."""
        torch = _torch()
        rows = a.reshape(-1, self.inner)
        threads = 1 if getattr(_INSIDE, "worker", False) else num_threads()
        with _torch_threads(torch, threads):
            out = self._product(_tensor(torch, rows), self.weight, self.bias, "none", [], "")
        return out.numpy().reshape(*a.shape[:-1], self.width)


def pack(matrix_t, bias):
    """The :class:`PackedMatrix` of a host matrix (inner x width) and bias (None: none), or
    None for anything but a 2-d float array."""
    if getattr(matrix_t, "ndim", 0) != 2 or matrix_t.dtype.kind != "f":
        return None
    return PackedMatrix(matrix_t, bias, _torch())


def measure(dtype, best, peer=None) -> dict:
    """The stored verdict: ``"torch"`` where oneDNN is there, gives the same bits on one, two
    and three threads at ``_INVARIANCE_SHAPES`` and takes less than ``_MARGIN`` of the time
    of ``peer(a, b, out)`` (the product the rows get otherwise, on one thread; default NumPy's)
    at ``_TIMED_SHAPES`` (the geometric mean of the shapes' ratios, one thread each,
    ``best(call)`` its best time, the least of ``_ROUNDS`` rounds over the shapes); else
    ``"numpy"`` with the reason."""
    peer = peer or (lambda a, b, out: np.matmul(a, b, out=out))
    torch = _torch()
    if _ops(torch) is None:
        return {"provider": "numpy", "reason": "torch has no oneDNN inner product"}
    rng = np.random.default_rng(2)
    for m, k, n in _INVARIANCE_SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        packed = PackedMatrix(rng.standard_normal((k, n)).astype(np.float32), rng.standard_normal(n), torch)
        outs = []
        for count in (1, 2, 3):
            with _torch_threads(torch, count):
                outs.append(packed._product(torch.from_numpy(a), packed.weight, packed.bias, "none", [], ""))
        if not all(torch.equal(outs[0], other) for other in outs[1:]):
            return {"provider": "numpy", "reason": f"thread counts round differently at {(m, k, n)}"}
    operands = []
    for m, k, n in _TIMED_SHAPES:
        a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
        operands.append((a, b, PackedMatrix(b, None, torch), np.empty((m, n), np.float32)))
    times = np.full((2, len(operands)), np.inf)  # (packed, peer) x shape
    limiter = single_thread_blas()
    with limiter if limiter is not None else nullcontext(), _torch_threads(torch, 1):
        for _ in range(_ROUNDS):
            for i, (a, b, packed, out) in enumerate(operands):
                ta = torch.from_numpy(a)
                times[0, i] = min(times[0, i], best(lambda: packed._product(ta, packed.weight, None, "none", [], "")))
                times[1, i] = min(times[1, i], best(lambda: peer(a, b, out)))
    ratios = (times[0] / times[1]).tolist()
    ratio = float(np.exp(np.mean(np.log(ratios))))  # each shape counts alike, few rows or many
    provider = "torch" if ratio < _MARGIN else "numpy"
    return {"provider": provider, "ratio": ratio, "ratios": ratios}

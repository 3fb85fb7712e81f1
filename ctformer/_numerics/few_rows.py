r"""Feature-map products of few rows in float64, by a compiled kernel that reads the matrix as it is.

A feature map multiplies the rows of every token by one matrix, :math:`v \mapsto v W^T + b`.
With 2-16 rows (a 16-token forward) a BLAS product spends much of its time copying ("packing")
:math:`W` into panels, and float64 has no packed-once product to turn to (oneDNN's, which
:mod:`ctformer._numerics.packed` uses for float32, is float32 only). The kernel of
:mod:`ctformer._numerics.few_rows_loops` reads the rows of :math:`W` where they lie (a
converted model's weight, no copy), four columns by four rows at a time, each sum in SIMD
lanes, and splits the columns between Numba's OpenMP threads
(:func:`ctformer._numerics.openmp.openmp_threads`), which start at once where the library's
own pool threads wake from sleep. On an AMD EPYC (family 26, model 2; two threads) the four
products of a 16-token MiniLM layer took 0.6-0.85 of OpenBLAS's time, and whole 16-token
float64 forwards 0.78-0.82 (MiniLM, GPT-2, Llama).

A product runs here where all of these hold:

* float64 C-contiguous NumPy rows, a host matrix and Numba (the compiled loops);
* ``CTFORMER_GEMM`` is ``auto`` and this machine's measurement (:func:`measure`, stored with
  the products' choice) chose it: its time on the library's threads at a 16-row layer's
  shapes below ``0.92`` of the product the rows get otherwise, on as many threads
  (:func:`ctformer._numerics.gemm.rows_peer`), and the same bits from one thread and from the
  threads' column blocks;
* ``_MIN_ROWS`` to ``_MAX_ROWS`` rows and at least ``_MIN_PRODUCT`` multiply-adds (below,
  launching threads costs more than it saves; above 16 rows the rows no longer stay in the
  first-level cache while the columns pass, and BLAS caught up: 0.8-1.7x at 32 rows).

The kernel reads the rows of :math:`W` (the output columns' weights), which is how converted
weights, the attention projections and the matrices built for refined grids are laid out: they
are read where they lie. A matrix stored the other way (GPT-2's ``Conv1D`` weights, stored
``(in, out)``) is copied once, transposed, at its first product of few rows: one more float64
copy of it, as float32 holds one packed copy. The reason not to leave such a matrix to BLAS
instead: OpenMP's threads spin for a while after a product, and a BLAS product on its own
threads right after one waited for the core they held; a 16-token GPT-2 forward with some
products compiled and the others on OpenBLAS took 48 ms instead of 7. So every product of a
few-row forward runs here.

Results never depend on the thread count: the columns are split in blocks of four, and every
entry is computed by the same code whichever thread runs it. Where the OpenMP threads cannot
run (module :mod:`ctformer._numerics.openmp`) and more than one thread is asked for, the
product is NumPy's, on BLAS's threads.
"""
from __future__ import annotations

from contextlib import nullcontext
from functools import lru_cache

import numpy as np

from . import compiled as _compiled
from .openmp import openmp_threads
from .threads import _INSIDE, num_threads, single_thread_blas

__all__ = ["FewRowsMatrix", "measure", "padded", "prepare"]

_MIN_ROWS = 2
_MAX_ROWS = 16
_MIN_PRODUCT = 1 << 16
# (rows, inner, width): the bits of one thread against the threads' column blocks (a width
# with columns left over, and rows left over); the time at a 16-row layer's shapes
_INVARIANCE_SHAPES = ((16, 384, 1152), (13, 96, 262), (7, 70, 1027), (_MIN_ROWS, 70, 1027))
_TIMED_SHAPES = ((16, 384, 1152), (16, 1536, 384), (16, 384, 384))
# what a stored verdict checked, and against what: a verdict stored otherwise is measured again
CHECKED = f"{_INVARIANCE_SHAPES!r} against the rows' own product, on the library's threads"
_MARGIN = 0.92


@lru_cache(maxsize=1)
def _kernels():
    if _compiled.loop_engine() != "numba":
        return None
    from . import few_rows_loops as _loops

    return {name: _compiled._compiling_uninterrupted(getattr(_loops, name)) for name in ("columns", "columns_parallel")}


class FewRowsMatrix:
    """:math:`v \\mapsto v M + b` for a float64 host matrix ``M`` (inner x width), by the
    compiled kernel (module docstring)."""

    __slots__ = ("matrix_t", "bias", "inner", "width", "_weight", "_bias")
    dtype = np.dtype(np.float64)

    def __init__(self, matrix_t, bias):
        self.matrix_t, self.bias = matrix_t, bias
        self.inner, self.width = matrix_t.shape
        # the rows of W; a matrix stored the other way is copied, once, at its first use
        self._weight = matrix_t.T if matrix_t.T.flags.c_contiguous else None
        self._bias = np.zeros(self.width) if bias is None else np.ascontiguousarray(
            np.broadcast_to(bias, (self.width,)), dtype=np.float64)

    def applies(self, rows: int) -> bool:
        """Whether ``rows`` rows are multiplied here (the bounds of the module docstring)."""
        return _MIN_ROWS <= rows <= _MAX_ROWS and rows * self.inner * self.width >= _MIN_PRODUCT

    def __call__(self, a):
        """``a @ M + b`` for C-contiguous float64 rows ``a`` (..., inner): a new NumPy array."""
        rows = a.reshape(-1, self.inner)
        tiles = padded(rows)
        out = np.empty((tiles.shape[0], self.width))
        threads = 1 if getattr(_INSIDE, "worker", False) else num_threads()
        if self._multiply(tiles, out, threads):
            out = out[:rows.shape[0]]
        else:  # no OpenMP threads here: BLAS's threads
            out = rows @ self.matrix_t
            if self.bias is not None:
                out += self.bias
        return out.reshape(*a.shape[:-1], self.width)

    def _multiply(self, rows, out, threads) -> bool:
        kernels = _kernels()
        if self._weight is None:
            self._weight = np.ascontiguousarray(self.matrix_t.T)
        if threads <= 1:
            kernels["columns"](rows, self._weight, self._bias, out, 0, self.width)
            return True
        block = _column_block(self.width, threads)
        return openmp_threads(lambda: kernels["columns_parallel"](rows, self._weight, self._bias, out, block), threads)


def padded(rows):
    """``rows`` (m x k) as a C-contiguous array of a multiple of four rows, the added ones
    zero: the kernel's one tile (four rows) then computes every row, leftovers included (the
    zero rows cost arithmetic only: a product of 2 or 3 rows reads the matrix, once, either
    way). No copy when ``rows`` is already such an array."""
    m = rows.shape[0]
    if m % 4 == 0:
        return np.ascontiguousarray(rows)
    out = np.zeros((m + 4 - m % 4, rows.shape[1]), dtype=rows.dtype)
    out[:m] = rows
    return out


def prepare(matrix_t, bias):
    """The :class:`FewRowsMatrix` of a float64 host matrix (inner x width) and bias (None:
    none), or None for anything but a 2-d float64 NumPy array, or where the compiled loops are
    off."""
    if (type(matrix_t) is not np.ndarray or matrix_t.ndim != 2 or matrix_t.dtype != np.float64
            or _kernels() is None):
        return None
    return FewRowsMatrix(matrix_t, bias)


def measure(dtype, best, peer=None, threads: int = 1) -> dict:
    """The stored verdict: ``"compiled"`` where the compiled loops are on, the threads' column
    blocks give the bits of one thread at ``_INVARIANCE_SHAPES``, and the kernel on ``threads``
    threads (its column blocks on OpenMP's threads, as :class:`FewRowsMatrix` runs them) takes
    less than ``_MARGIN`` of the time of ``peer(a, b, out)`` (the product the rows get
    otherwise, on as many threads; default NumPy's) at ``_TIMED_SHAPES`` (the geometric mean of
    the shapes' ratios, ``best(call)`` a call's best time); else ``"numpy"`` with the reason.

    Timed on the threads the products run on, not on one: at 16 rows OpenBLAS's second thread
    gained 1.08x and the kernel's 1.6-1.9x (AMD EPYC, family 23 model 49), so one thread each
    (0.97 there) had kept the kernel from the forwards it made 0.57-0.90 of OpenBLAS's time."""
    peer = peer or (lambda a, b, out: np.matmul(a, b, out=out))
    kernels = _kernels()
    if kernels is None:
        return {"provider": "numpy", "reason": "the compiled loops are off (CTFORMER_LOOP_ENGINE or no Numba)"}
    rng = np.random.default_rng(3)
    for m, k, n in _INVARIANCE_SHAPES:
        a, w, b = padded(rng.standard_normal((m, k))), rng.standard_normal((n, k)), rng.standard_normal(n)
        one, blocks = np.empty((a.shape[0], n)), np.empty((a.shape[0], n))
        kernels["columns"](a, w, b, one, 0, n)
        for block in (4, 8, 4 * (n // 12) + 4):
            blocks.fill(np.nan)
            ran = openmp_threads(lambda: kernels["columns_parallel"](a, w, b, blocks, block), 3)
            if ran and not np.array_equal(one, blocks):
                return {"provider": "numpy", "reason": f"column blocks round differently at {(m, k, n)}"}
    ratios = []
    limiter = single_thread_blas() if threads <= 1 else None
    with limiter if limiter is not None else nullcontext():
        for m, k, n in _TIMED_SHAPES:
            a, w = rng.standard_normal((m, k)), rng.standard_normal((n, k))
            out, zero, w_t = np.empty((m, n)), np.zeros(n), w.T
            ours = _timed_product(kernels, a, w, zero, out, threads)
            if ours is None:
                return {"provider": "numpy", "reason": f"no OpenMP threads here for {threads} threads"}
            ratios.append(best(ours) / best(lambda: peer(a, w_t, out)))
    ratio = float(np.exp(np.mean(np.log(ratios))))  # each shape counts alike
    return {"provider": "compiled" if ratio < _MARGIN else "numpy", "ratio": ratio, "ratios": ratios,
            "threads": threads}


def _timed_product(kernels, a, w, bias, out, threads):
    """The kernel's product as :meth:`FewRowsMatrix._multiply` runs it on ``threads`` threads,
    as a call to time; None where OpenMP's threads cannot run here."""
    n = out.shape[1]
    if threads <= 1:
        return lambda: kernels["columns"](a, w, bias, out, 0, n)
    block = _column_block(n, threads)
    call = lambda: openmp_threads(lambda: kernels["columns_parallel"](a, w, bias, out, block), threads)  # noqa: E731
    return call if call() else None


def _column_block(width: int, threads: int) -> int:
    """Columns per block of the threads' split: a multiple of four, one block per thread."""
    return -(-width // (4 * threads)) * 4

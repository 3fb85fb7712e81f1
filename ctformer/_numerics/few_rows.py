r"""Feature-map products of few rows (float64, float32) by a compiled kernel that reads the matrix as it is.

A feature map multiplies the rows of every token by one matrix, :math:`v \mapsto v W^T + b`.
With 2-16 rows (a 16-token forward) a BLAS product spends much of its time copying ("packing")
:math:`W` into panels, and float64 has no packed-once product to turn to (oneDNN's, which
:mod:`ctformer._numerics.packed` uses for float32 where this machine chose it, is float32
only). The kernel of :mod:`ctformer._numerics.few_rows_loops` reads the rows of :math:`W`
where they lie (a converted model's weight, no copy), four rows by four (or three) columns at
a time, each sum in SIMD lanes, and splits the columns between Numba's OpenMP threads
(:func:`ctformer._numerics.openmp.openmp_threads`), which start at once where the library's
own pool threads wake from sleep. On an AMD EPYC (family 26, model 2; two threads) the four
products of a 16-token MiniLM layer took 0.6-0.85 of OpenBLAS's time, and whole 16-token
float64 forwards 0.78-0.82 (MiniLM, GPT-2, Llama).

The tile of the kernel (four rows by four or by three columns) is measured too: sixteen sums
fit AVX-512's 32 vector registers, but spill from AVX2's 16, where tiles of twelve took
0.60-0.67 of the time (module :mod:`ctformer._numerics.few_rows_loops`). With tiles of twelve
the float32 kernel (sums in float32, as BLAS's) took 0.58-0.75 of OpenBLAS's time on two
threads at a 16-row layer's shapes (AMD EPYC, family 23 model 49), where tiles of sixteen had
taken 0.93-1.00; so float32 products of few rows run here too, where this machine did not
choose oneDNN's packed product (:func:`ctformer._numerics.gemm.prepared_products`).

A product runs here where all of these hold:

* float64 or float32 C-contiguous NumPy rows, a host matrix of their dtype and Numba (the
  compiled loops);
* ``CTFORMER_GEMM`` is ``auto`` and this machine's measurement for the dtype (:func:`measure`,
  stored with the products' choice) chose it: its time on the library's threads at a 16-row layer's
  shapes below ``0.92`` of the product the rows get otherwise, on as many threads
  (:func:`ctformer._numerics.gemm.rows_peer`), and the same bits from one thread and from the
  threads' column blocks;
* ``_MIN_ROWS`` to ``_MAX_ROWS`` rows and at least ``_MIN_PRODUCT`` multiply-adds (below,
  launching threads costs more than it saves; above 16 rows the rows no longer stay in the
  first-level cache while the columns pass, and BLAS caught up: 0.8-1.7x at 32 rows).

The kernel reads the rows of :math:`W` (the output columns' weights), which is how converted
weights, the attention projections and the matrices built for refined grids are laid out: they
are read where they lie. A matrix stored the other way (GPT-2's ``Conv1D`` weights, stored
``(in, out)``) is copied once, transposed, at its first product of few rows: one more copy of
it, as oneDNN's packed product holds one packed copy. The reason not to leave such a matrix to BLAS
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
# the tiles' widths (four rows by this many columns) and their kernels: one thread, column blocks
_TILES = {4: "columns", 3: "columns3"}
CHECKED = (f"{_INVARIANCE_SHAPES!r} against the rows' own product, on the library's threads; "
           f"tiles of 4 rows by {tuple(_TILES)} columns, timed before the product")
_MARGIN = 0.92


@lru_cache(maxsize=1)
def _kernels():
    if _compiled.loop_engine() != "numba":
        return None
    from . import few_rows_loops as _loops

    return {name: _compiled._compiling_uninterrupted(getattr(_loops, name))
            for name in (*_TILES.values(), "columns_parallel")}


class FewRowsMatrix:
    """:math:`v \\mapsto v M + b` for a float64 or float32 host matrix ``M`` (inner x width), by
    the compiled kernel (module docstring) in tiles of four rows by ``columns`` columns (4 or 3),
    for rows of the matrix's dtype."""

    __slots__ = ("matrix_t", "bias", "dtype", "inner", "width", "columns", "_weight", "_bias", "_loops")

    def __init__(self, matrix_t, bias, columns=4):
        if columns not in _TILES:
            raise ValueError(f"columns: the width of the kernel's tiles, one of {tuple(_TILES)}, got {columns!r}")
        self.matrix_t, self.bias, self.columns, self.dtype = matrix_t, bias, columns, matrix_t.dtype
        # the kernels it was prepared with: a product kept in a cache keeps working after the
        # process's choices are forgotten under CTFORMER_LOOP_ENGINE=numpy
        self._loops = _kernels()
        self.inner, self.width = matrix_t.shape
        # the rows of W; a matrix stored the other way is copied, once, at its first use
        self._weight = matrix_t.T if matrix_t.T.flags.c_contiguous else None
        self._bias = np.zeros(self.width, self.dtype) if bias is None else np.ascontiguousarray(
            np.broadcast_to(bias, (self.width,)), dtype=self.dtype)

    def applies(self, rows: int) -> bool:
        """Whether ``rows`` rows are multiplied here (the bounds of the module docstring)."""
        return _MIN_ROWS <= rows <= _MAX_ROWS and rows * self.inner * self.width >= _MIN_PRODUCT

    def __call__(self, a, activation: int = -1):
        r"""``a @ M + b`` for C-contiguous rows ``a`` (..., inner) of the matrix's dtype: a new
        NumPy array. ``activation``: -1, or the kind of an activation loop
        (:func:`ctformer._numerics.loops.activation_over`) to apply to the product, each
        thread to its own columns: :math:`\phi(a M + b)` with the bits of the product followed
        by that loop."""
        rows = a.reshape(-1, self.inner)
        tiles = padded(rows)
        out = np.empty((tiles.shape[0], self.width), self.dtype)
        threads = 1 if getattr(_INSIDE, "worker", False) else num_threads()
        if self._multiply(tiles, out, threads, activation):
            out = out[:rows.shape[0]]
        else:  # no OpenMP threads here: BLAS's threads
            out = rows @ self.matrix_t
            if self.bias is not None:
                out += self.bias
            if activation >= 0:
                _compiled._build().activation_over(activation, out.reshape(-1))
        return out.reshape(*a.shape[:-1], self.width)

    def then(self, activation: int):
        """The callable ``a -> phi(a M + b)`` of activation loop ``activation`` (see
        :meth:`__call__`)."""
        return lambda a: self(a, activation)

    def _multiply(self, rows, out, threads, activation=-1) -> bool:
        if self._weight is None:
            self._weight = np.ascontiguousarray(self.matrix_t.T)
        return _product(self._loops or _kernels(), self.columns, rows, self._weight, self._bias, out, threads,
                        activation) is not None


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


def prepare(matrix_t, bias, columns=4):
    """The :class:`FewRowsMatrix` of a float64 or float32 host matrix (inner x width) and bias
    (None: none), in tiles of four rows by ``columns`` columns (this machine's: the stored
    verdict's ``"columns"``), or None for anything but a 2-d NumPy array of those dtypes, or
    where the compiled loops are off."""
    if (type(matrix_t) is not np.ndarray or matrix_t.ndim != 2 or matrix_t.dtype not in (np.float64, np.float32)
            or _kernels() is None):
        return None
    return FewRowsMatrix(matrix_t, bias, columns)


def measure(dtype, best, peer=None, threads: int = 1) -> dict:
    """The stored verdict: ``"compiled"`` where the compiled loops are on, the threads' column
    blocks give the bits of one thread at ``_INVARIANCE_SHAPES`` (every tile), and the kernel
    with its faster tile (``"columns"``), on ``threads`` threads (its column blocks on OpenMP's
    threads, as :class:`FewRowsMatrix` runs them), takes less than ``_MARGIN`` of the time of
    ``peer(a, b, out)`` (the product the rows get otherwise, on as many threads; default
    NumPy's) at ``_TIMED_SHAPES``; else ``"numpy"`` with the reason. Times are compared by the
    geometric mean of the shapes' ratios, ``best(call)`` a call's best time; the tiles are timed
    at every shape (in the order of ``_TILES``) before the peer at any. The tile of four
    columns, the first, is kept unless the other takes less than ``_MARGIN`` of its time.

    Timed on the threads the products run on, not on one: at 16 rows OpenBLAS's second thread
    gained 1.08x and the kernel's 1.6-1.9x (AMD EPYC, family 23 model 49), so one thread each
    (0.97 there) had kept the kernel from the forwards it made 0.57-0.90 of OpenBLAS's time."""
    peer = peer or (lambda a, b, out: np.matmul(a, b, out=out))
    kernels = _kernels()
    if kernels is None:
        return {"provider": "numpy", "reason": "the compiled loops are off (CTFORMER_LOOP_ENGINE or no Numba)"}
    rng = np.random.default_rng(3)
    dtype = np.dtype(dtype)
    for m, k, n in _INVARIANCE_SHAPES:
        a, w, b = (rng.standard_normal(shape).astype(dtype) for shape in ((m, k), (n, k), (n,)))
        a = padded(a)
        for tile, one_thread in _TILES.items():
            one, blocks = np.empty((a.shape[0], n), dtype), np.empty((a.shape[0], n), dtype)
            kernels[one_thread](a, w, b, one, 0, n)
            for block in (tile, 2 * tile, tile * (n // (3 * tile)) + tile):
                blocks.fill(np.nan)
                ran = openmp_threads(lambda: kernels["columns_parallel"](a, w, b, blocks, block, tile, -1), 3)
                if ran and not np.array_equal(one, blocks):
                    return {"provider": "numpy", "reason": f"column blocks round differently at {(m, k, n)}"}
    times = {tile: [] for tile in _TILES}
    operands = [(rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((n, k)).astype(dtype),
                 np.empty((m, n), dtype), np.zeros(n, dtype)) for m, k, n in _TIMED_SHAPES]
    limiter = single_thread_blas() if threads <= 1 else None
    with limiter if limiter is not None else nullcontext():
        # every shape's tiles first, the peers after them: OpenBLAS's threads spin for up to
        # about 0.1 s after a threaded product, and the kernel's OpenMP threads timed right
        # after one waited for the core they held (a tile timed at 11.8x its time once stored
        # "numpy" where the kernel takes 0.70 of its time; AMD EPYC, family 25 model 1)
        for a, w, out, zero in operands:
            for tile in _TILES:
                if _product(kernels, tile, a, w, zero, out, threads) is None:
                    return {"provider": "numpy", "reason": f"no OpenMP threads here for {threads} threads"}
                times[tile].append(best(lambda tile=tile: _product(kernels, tile, a, w, zero, out, threads)))
        peer_times = [best(lambda: peer(a, w.T, out)) for a, w, out, _ in operands]
    tiles = {tile: _geometric_mean(np.divide(t, peer_times)) for tile, t in times.items()}
    columns = min(tiles, key=tiles.get)
    if tiles[columns] >= _MARGIN * tiles[4]:
        columns = 4
    ratio = tiles[columns]
    return {"provider": "compiled" if ratio < _MARGIN else "numpy", "columns": columns, "ratio": ratio,
            "ratios": np.divide(times[columns], peer_times).tolist(), "tiles": {str(t): r for t, r in tiles.items()},
            "threads": threads}


def _geometric_mean(ratios) -> float:
    return float(np.exp(np.mean(np.log(ratios))))  # each shape counts alike


def _product(kernels, columns, rows, weight, bias, out, threads, activation=-1):
    """``out = rows @ weight.T + bias`` by the kernel of tiles ``columns`` wide on ``threads``
    threads (its column blocks on OpenMP's threads), as :meth:`FewRowsMatrix._multiply` runs
    it, then activation loop ``activation`` over it (-1: none); returns ``out``, or None
    (nothing done) where OpenMP's threads cannot run here."""
    n = out.shape[1]
    # the activation by the compiled loops, as the product: kernels() is None once
    # CTFORMER_LOOP_ENGINE=numpy is set, and a product prepared before must keep its bits
    if threads <= 1:
        kernels[_TILES[columns]](rows, weight, bias, out, 0, n)
        if activation >= 0:
            _compiled._build().activation_over(activation, out.reshape(-1))
        return out
    block = -(-n // (columns * threads)) * columns  # one block per thread, a whole number of tiles
    run = kernels["columns_parallel"]
    return out if openmp_threads(lambda: run(rows, weight, bias, out, block, columns, activation),
                                 threads) else None

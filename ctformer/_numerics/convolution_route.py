r"""Up to which grid size a periodic convolution on NumPy arrays multiplies by its dense
matrix rather than by two FFTs, measured once per machine.

A translation-invariant kernel on a uniform periodic grid of :math:`M` points is a circulant
matrix :math:`A`. On :math:`R` rows, :math:`u A^T` costs :math:`R M^2` multiply-adds in one
BLAS call; the FFT route, :math:`\mathcal{F}^{-1}(\hat a \cdot \mathcal{F} u)`, two real
transforms of :math:`O(R M \log M)` and a pass over the spectrum. The product wins on small
grids (one call against three, and the BLAS's register-blocked kernels), the FFT on large
ones, and where they cross depends on the CPU, the BLAS kernel, the dtype and the thread
count. On an AMD EPYC (family 26, model 2), 64 rows, two threads: float32 products of
:math:`M = 256` took 0.56 of the FFT route's time with OpenBLAS's SkylakeX kernel and 0.94
with its Haswell kernel; float64 ones 1.2 and 2.1.

So with ``CTFORMER_GEMM=auto`` (the default) the crossover is measured once per machine and
float dtype and kept with the other measured choices (:mod:`ctformer._numerics.store`, as
``convolution dense``): :data:`ROWS` rows at each grid size of :data:`SIZES`, the product
(NumPy's ``@`` with the BLAS threads as configured, as
:meth:`ctformer.kernels.Kernel.apply` multiplies) against the FFT route (the NumPy backend's
planned transforms, as :meth:`ctformer.kernels.Convolution.apply` runs them), in
:data:`ROUNDS` alternating rounds after a warm-up. The dense product is kept up to the
largest size at which it, and every smaller one, wins (:func:`dense_wins`: up to
:data:`DEFAULT` unless the FFT route is clearly faster, above only where the product is
clearly faster); about 0.1 s in all. A pinned ``CTFORMER_GEMM`` (``numpy``, ``torch``)
and other dtypes keep :data:`DEFAULT`. Stored once, the choice gives a machine the same bits
run after run and at every thread count.
"""
from __future__ import annotations

import os
import time
from functools import lru_cache

import numpy as np

from . import gemm as _gemm
from . import store as _store
from ..environment import _ENCODED
from .blocks import MARGIN, ROUNDS, WINS, ratios

__all__ = ["CHECKED", "DEFAULT", "ROUNDS", "ROWS", "SIZES", "dense_below", "dense_wins", "route_setting"]

#: Grid sizes timed (powers of two: the grids FFT convolutions are usually run on).
SIZES = (16, 32, 64, 128, 256, 512, 1024)
#: Rows of the problem timed at each size, and alternating rounds (the attention blocks').
ROWS, ROUNDS = 64, ROUNDS
#: The crossover where nothing is measured (the AMD EPYC's float64 crossover, SkylakeX kernel).
DEFAULT = 128
CHECKED = f"dense against FFT at M = {SIZES}, {ROWS} rows, {ROUNDS} rounds, default {DEFAULT}, margin {MARGIN}"
_ROUND_SECONDS = 4e-4  # each side of a round repeats its call for about this long


def dense_below(dtype) -> int:
    """The largest grid size at which convolutions of ``dtype`` NumPy rows multiply by the
    dense matrix on this machine (0: never): measured and stored on first use for float32
    and float64 with ``CTFORMER_GEMM=auto`` (:func:`ctformer._numerics.gemm.measured_name`,
    which raises for a bad setting), else :data:`DEFAULT`."""
    name = _gemm.measured_name(dtype)
    return DEFAULT if name is None else _measured(name)


def route_setting():
    """What :func:`dense_below` reads besides the dtype: ``CTFORMER_GEMM``'s raw value (the
    measured crossover under ``auto``, :data:`DEFAULT` when pinned), cheap enough for every
    call (one dictionary lookup). A route cached under one value is not the other's: after
    ``CTFORMER_GEMM=numpy`` a grid of 100 points kept the ``auto`` crossover's FFT route
    (measured 64), not the dense product of a fresh process (last bits apart)."""
    return os.environ.get("CTFORMER_GEMM") if _ENCODED is None else _ENCODED.get(b"CTFORMER_GEMM")


@lru_cache(maxsize=None)
def _measured(name: str) -> int:
    stored = _store.read(_store.cache_file()).get(f"convolution dense {name}")
    if stored is None or stored.get("checked") != CHECKED or not _valid(stored):
        _fft_route(np.dtype(name))  # the transforms' engines are stored choices too: stored first
    return int(_store.entry("convolution dense", name, _measure, CHECKED, _valid, needs_torch=False)["dense_below"])


def _valid(entry) -> bool:
    return entry.get("dense_below") in (0, *SIZES)


def _fft_route(dtype):
    """Run the FFT route once at every size (its plans, and the engine of each transform)."""
    from ..backend import get_backend

    fft = get_backend("numpy").fft
    for m in SIZES:
        fft.irfft(fft.rfft(np.zeros((ROWS, m), dtype), axis=-1), n=m, axis=-1)


def _measure(dtype) -> dict:
    """``{"dense_below": size, "ratios": {size: median ratio of dense to FFT}}``."""
    times = {m: _times(dtype, m) for m in SIZES}
    chosen = 0
    for m in SIZES:
        if not dense_wins(m, *times[m]):
            break
        chosen = m
    return {"provider": "numpy", "dense_below": chosen,
            "ratios": {str(m): round(ratios(*times[m])[0], 3) for m in SIZES}}


def dense_wins(m: int, dense: list, fft: list) -> bool:
    """Whether grids of ``m`` points multiply by the dense matrix, from per-round times: up
    to :data:`DEFAULT` unless the FFT route is clearly faster, above it only where the
    product is, "clearly" as for the attention blocks (:func:`ctformer._numerics.blocks.verdict`:
    a median ratio at most ``MARGIN``, faster in ``WINS`` of the rounds), so that a noisy
    machine keeps the default."""
    if m <= DEFAULT:
        ratio, wins = ratios(fft, dense)
        return not (ratio <= MARGIN and wins >= WINS)
    ratio, wins = ratios(dense, fft)
    return ratio <= MARGIN and wins >= WINS


def _times(dtype, m: int) -> tuple:
    """Per-round seconds ``(dense, fft)`` of one call each on ``ROWS`` rows of ``m`` points."""
    from ..backend import get_backend

    fft = get_backend("numpy").fft
    rng = np.random.default_rng(m)
    u = rng.standard_normal((ROWS, m)).astype(dtype)
    matrix_t = rng.standard_normal((m, m)).astype(dtype)
    symbol = np.fft.rfft(rng.standard_normal(m)).astype(np.result_type(dtype, np.complex64))

    def dense():
        return u @ matrix_t

    def by_fft():
        spectrum = fft.rfft(u, axis=-1)
        spectrum *= symbol
        return fft.irfft(spectrum, n=m, axis=-1)

    calls = (dense, by_fft)
    for call in calls:  # plans, page faults, BLAS threads waking
        call()
    start = time.perf_counter()
    by_fft()
    repeats = max(1, int(_ROUND_SECONDS / max(time.perf_counter() - start, 1e-7)))
    seconds = ([], [])
    for i in range(ROUNDS):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            start = time.perf_counter()
            for _ in range(repeats):
                calls[side]()
            seconds[side].append((time.perf_counter() - start) / repeats)
    return seconds

r"""The fused velocity of many small particle systems and the row retraction, on NumPy arrays.

:func:`fused_velocity` gives, where it applies, the self-attention velocity
(:mod:`ctformer.particles.dynamics`, :math:`Q = K = V = I`, one head, no mask) of a batch of
small systems, ``(B, n, d)`` with :math:`n \le 64` and :math:`d \le 16`, as one compiled
pass per system (:func:`ctformer._numerics.particle_loops.sa_velocity`): for so few tokens
the batched BLAS path spends its time in per-matrix calls and in passes over ``(B, n, n)`` score
arrays that this pass never builds. The systems are split into blocks that depend on the shape
only, so results do not depend on the thread count. The blocks run on Numba's OpenMP threads
(:func:`ctformer._numerics.openmp.openmp_threads`) where that threading layer is available: a
solve hands them a few milliseconds of work per step, and the library's own pool threads, woken
from sleep at every step, gave 1.2x one thread where OpenMP's spinning threads gave 1.7x.
Elsewhere (no OpenMP layer, a forked child of a process that used it, inside a worker) the
library's pool runs them.
:func:`unit_rows` is the scale-safe retraction :math:`x / \|x\|` in one pass, for the same
kind of states. Both need the compiled loops (Numba); without them they return None and the
callers use their NumPy formulas.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import compiled as _compiled
from . import threads as _threads
from .openmp import openmp_threads

__all__ = ["fused_velocity", "unit_rows"]

# Where the fused velocity wins over batched BLAS (Intel Xeon, two threads, against the BLAS
# path: n = 32, d = 2: 0.40x in float64 and 0.45x in float32; d = 16: 0.52x / 0.77x; n = 64,
# d = 4: 0.39x / 0.56x; n = 128, d = 8: 0.86x / 1.34x and n = 512: 1.1x, so those stay on
# BLAS). The retraction's pass wins for every short row (2-10x at d <= 32).
_MAX_TOKENS = 64
_MAX_DIM = 16
_MAX_ROW = 32
_BLOCK_SYSTEMS = 64      # systems per worker task
_PARALLEL_MIN = 1 << 16  # score entries in all below which one thread does everything


@lru_cache(maxsize=1)
def _kernels():
    if _compiled.loop_engine() != "numba":
        return None
    from . import particle_loops as _loops

    return {name: _compiled._compiling_uninterrupted(getattr(_loops, name))
            for name in ("sa_velocity", "sa_velocity_blocks", "unit_rows")}


def _numpy_float(x) -> bool:
    return type(x) is np.ndarray and x.dtype in (np.float32, np.float64) and x.ndim >= 1 and x.size > 0


def fused_velocity(like, beta: float, log_w, normalized: bool):
    """``x -> velocity`` for states like ``like`` (fused), or None where it does not apply.

    ``log_w``: a float (uniform weights) or host log weights of shape (n,).
    """
    kernels = _kernels()
    if (kernels is None or not _numpy_float(like) or like.ndim not in (2, 3)
            or like.shape[-2] > _MAX_TOKENS or like.shape[-1] > _MAX_DIM):
        return None
    dtype, n = like.dtype, like.shape[-2]
    logs = np.ascontiguousarray(np.broadcast_to(np.asarray(log_w, dtype=dtype), (n,)))
    beta_ = dtype.type(beta)
    kernel, blocks_kernel = kernels["sa_velocity"], kernels["sa_velocity_blocks"]

    def velocity(x):
        x3 = np.ascontiguousarray(x).reshape(-1, *x.shape[-2:])
        out = np.empty_like(x3)
        threads = _threads.num_threads() if x3.size * n >= _PARALLEL_MIN else 1
        if threads > 1 and openmp_threads(lambda: blocks_kernel(x3, beta_, logs, normalized, out,
                                                                 _BLOCK_SYSTEMS), threads):
            return out.reshape(x.shape)
        _by_blocks(lambda block: kernel(x3[block], beta_, logs, normalized, out[block]),
                   x3.shape[0], x3[0].size * n)
        return out.reshape(x.shape)

    return velocity


def unit_rows(x):
    """x / |x| row-wise in one pass (a NumPy float array with short rows), or None."""
    kernels = _kernels()
    if kernels is None or not _numpy_float(x) or x.shape[-1] > _MAX_ROW:
        return None
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    kernels["unit_rows"](rows, out)
    return out.reshape(x.shape)


def _by_blocks(call, systems: int, entries_per_system: int) -> None:
    """``call(block)`` over blocks of ``_BLOCK_SYSTEMS`` systems on the worker threads."""
    blocks = [slice(a, min(systems, a + _BLOCK_SYSTEMS)) for a in range(0, systems, _BLOCK_SYSTEMS)]
    threads = _threads.num_threads() if systems * entries_per_system >= _PARALLEL_MIN else 1

    def worker(next_task):
        while (block := next_task()) is not None:
            call(block)

    _threads.run_workers(worker, blocks, threads)

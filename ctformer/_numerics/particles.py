r"""The fused velocity of many small particle systems and the row passes of particle solves, on NumPy arrays.

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
:func:`unit_rows` is the scale-safe retraction :math:`x / \|x\|` and :func:`tangent_rows` the
tangent projection :math:`v - \langle x, v\rangle x`, each in one pass, for NumPy states of any
size. Both need the compiled loops (Numba); without them they return None and the
callers use their NumPy formulas.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from . import compiled as _compiled
from . import threads as _threads
from .openmp import openmp_threads

__all__ = ["fused_velocity", "tangent_rows", "unit_rows"]

# Where the fused velocity wins over batched BLAS (Intel Xeon, two threads, against the BLAS
# path: n = 32, d = 2: 0.40x in float64 and 0.45x in float32; d = 16: 0.52x / 0.77x; n = 64,
# d = 4: 0.39x / 0.56x; n = 128, d = 8: 0.86x / 1.34x and n = 512: 1.1x, so those stay on
# BLAS).
_MAX_TOKENS = 64
_MAX_DIM = 16
_BLOCK_SYSTEMS = 64      # systems per worker task
_PARALLEL_MIN = 1 << 16  # score entries in all below which one thread does everything


@lru_cache(maxsize=1)
def _kernels():
    if _compiled.loop_engine() != "numba":
        return None
    from . import particle_loops as _loops

    return {name: _compiled._compiling_uninterrupted(getattr(_loops, name))
            for name in ("sa_velocity", "sa_velocity_blocks", "unit_rows", "tangent_rows")}


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
    """x / |x| row-wise in one pass (a NumPy float array), or None.

    The NumPy formula (divide by each row's largest entry, square, sum, divide by the root)
    makes five passes and four temporaries: 1000 x 64 took 138 us in float32 against 27 for
    the pass, 64000 x 2 3.6 ms against 0.35 ms, 200 x 512 111 against 41 us (AMD EPYC,
    family 25 model 17)."""
    kernels = _kernels()
    if kernels is None or not _numpy_float(x):
        return None
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    kernels["unit_rows"](rows, out)
    return out.reshape(x.shape)


def tangent_rows(x, v):
    r""":math:`v - \langle x, v\rangle x` row-wise in one pass (NumPy float arrays of one shape
    and dtype), or None. The NumPy formula's four passes took 66 us on 1000 x 64 float32
    states against 21 for the pass, 1.14 ms against 0.19 on 64000 x 2 (AMD EPYC, family 25
    model 17): a particle solve projects each velocity, four times a step with RK4."""
    kernels = _kernels()
    if (kernels is None or not _numpy_float(x) or type(v) is not np.ndarray or v.shape != x.shape
            or v.dtype != x.dtype):
        return None
    rows = np.ascontiguousarray(x).reshape(-1, x.shape[-1])
    out = np.empty_like(rows)
    kernels["tangent_rows"](rows, np.ascontiguousarray(v).reshape(rows.shape), out)
    return out.reshape(x.shape)


def _by_blocks(call, systems: int, entries_per_system: int) -> None:
    """``call(block)`` over blocks of ``_BLOCK_SYSTEMS`` systems on the worker threads."""
    blocks = [slice(a, min(systems, a + _BLOCK_SYSTEMS)) for a in range(0, systems, _BLOCK_SYSTEMS)]
    threads = _threads.num_threads() if systems * entries_per_system >= _PARALLEL_MIN else 1

    def worker(next_task):
        while (block := next_task()) is not None:
            call(block)

    _threads.run_workers(worker, blocks, threads)

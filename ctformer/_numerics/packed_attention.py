r"""Streamed attention's products on key and value blocks packed once per call (oneDNN, float32).

Without a mask, streamed attention (:mod:`ctformer._numerics.streamed`) meets the keys a block
at a time: for each chunk of queries, the scores :math:`s = q_c K_b^\top` of a key block
:math:`b` and the weighted values :math:`p\, V_b`. Every chunk meets every block, so a BLAS
product packs the same :math:`K_b` and :math:`V_b` into its panels once per chunk. oneDNN,
which torch's CPU wheels carry, packs a matrix once into its own layout
(:mod:`ctformer._numerics.packed`): here each block of ``K`` and of ``V^T`` is packed once per
call, shared by the workers (key/value heads shared by groups of query heads are packed
once), and every chunk's two products read the packed copies. Each product runs on one
thread, inside a worker task, so the bits never depend on the thread count.

Whether this is faster depends on the BLAS it replaces: on an AMD EPYC (family 26, model 2)
a chunk's two products took 0.83-1.09 of OpenBLAS's time with its own SkylakeX kernel, 0.50-0.54
with the Haswell kernel that ``OPENBLAS_CORETYPE`` forces, and 0.45-0.56 of MKL's. So with
``CTFORMER_GEMM=auto`` it is measured once per machine (:func:`_measure`, stored as
``packed attention float32``): one causal-free problem of 2048 queries and keys on one thread,
packing included, against the same problem with the products of the worker tasks, in
alternating rounds; kept only when clearly faster (:func:`ctformer._numerics.blocks.verdict`).
float64 keeps the BLAS (oneDNN has no float64 inner product). The packed copies of ``K`` and
``V`` live for the call, so a call whose key and value matrices exceed ``MAX_BYTES`` keeps the
BLAS products too (:func:`fits`): the extra memory of streamed attention stays a few MiB per
thread plus at most that.
"""
from __future__ import annotations

import threading
import time

import numpy as np

from . import gemm as _gemm
from . import streamed as _streamed
from .blocks import DEFAULT, ROUNDS, ratios, verdict
from .packed import PackedMatrix, _ops
from .threads import run_blas_tasks
from .torch_threads import _torch

__all__ = ["CHECKED", "MAX_BYTES", "chosen", "fits", "packed_blocks"]

# The most bytes of packed key and value copies one call may hold (a 12-head layer of 16384
# keys of 64 features in float32 packs 96 MiB; a single head of 131072 keys, 64 MiB).
MAX_BYTES = 64 << 20

_SIZE, _FEATURES = 2048, 64
CHECKED = f"{_SIZE} queries and keys of {_FEATURES} features, key blocks of {DEFAULT.key_block}, {ROUNDS} rounds"


def fits(k, v) -> bool:
    """Whether the packed copies of the key and value matrices ``k``, ``v`` (one per
    key/value head; the arrays as given, before any broadcast to the query heads) stay within
    ``MAX_BYTES``: packing a call's blocks ahead of its tasks holds a second copy of ``K`` and
    ``V`` for the length of the call, where the streamed path otherwise needs a few MiB per
    thread."""
    return (k.size + v.size) * 4 <= MAX_BYTES


def chosen(dtype) -> bool:
    """Whether streamed attention on ``dtype`` arrays multiplies by packed key and value
    blocks on this machine: float32, ``CTFORMER_GEMM=auto``, key blocks in use (the compiled
    kernels and their row kernel), oneDNN in torch, and this machine's measurement.

    Raises
    ------
    ValueError
        If ``CTFORMER_GEMM`` is not one of auto, numpy, torch.
    """
    if np.dtype(dtype) != np.float32 or _gemm._choice() != "auto":
        return False
    if not _streamed.key_blocked(2 * DEFAULT.key_block, None, np.dtype(np.float32), False, DEFAULT.key_block):
        return False
    # the choices the measurement runs on are stored first: it runs under the store's lock
    _gemm.gemm_provider(np.float32)
    return _gemm._measured("packed attention", "float32", _measure, CHECKED) == "torch"


class packed_blocks:
    """``(K_b, V_b)`` packed once per key/value matrix and key block, on first request, for
    the workers of one call: ``self(k_rows, v_rows, col0)`` with the problem's key and value
    matrices (2-d float32 views) and the block's first key."""

    __slots__ = ("key_block", "_packs", "_lock", "_torch")

    def __init__(self, key_block: int):
        self.key_block = key_block
        self._packs: dict = {}
        self._lock = threading.Lock()
        self._torch = _torch()

    def prepare(self, k, v, lead) -> None:
        """Pack every block of the key and value matrices ``k[idx]``, ``v[idx]`` over the
        leading axes ``lead`` ahead of the tasks, spread over the worker threads (each pack
        on one thread), so that no worker waits while another packs a block it needs."""
        tasks = {}
        for idx in np.ndindex(*lead):
            keys, values = k[idx], v[idx]
            for col0 in range(0, len(keys), self.key_block):
                tasks.setdefault(self._tag(keys, values, col0), (keys, values, col0))

        def worker(next_task):
            while (task := next_task()) is not None:
                self(*task)

        run_blas_tasks(worker, list(tasks.values()), len(tasks) > 1)

    @staticmethod
    def _tag(keys, values, col0):
        # grouped query heads share one key/value head: the same memory, packed once
        return keys.__array_interface__["data"][0], values.__array_interface__["data"][0], col0

    def __call__(self, keys, values, col0: int):
        tag = self._tag(keys, values, col0)
        found = self._packs.get(tag)
        if found is None:
            col1 = min(len(keys), col0 + self.key_block)
            found = (PackedMatrix(keys[col0:col1].T, None, self._torch),
                     PackedMatrix(values[col0:col1], None, self._torch))
            with self._lock:
                found = self._packs.setdefault(tag, found)
        return found


def _measure(dtype) -> dict:
    """One plain problem of ``_SIZE`` queries and keys, streamed on one thread with packed
    blocks and with the worker tasks' products, in alternating rounds: ``"torch"`` (packed)
    when :func:`verdict` keeps it."""
    if _ops(_torch()) is None:
        return {"provider": "numpy", "reason": "torch has no oneDNN inner product"}
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((_SIZE, _FEATURES)).astype(np.float32) for _ in range(3))
    times = {False: [], True: []}

    def call(packed):
        packs = packed_blocks(DEFAULT.key_block) if packed else None
        _streamed.stream(q, 0.125, k, v, None, None, False, None, (), None, DEFAULT, packs)

    def timed(next_task):  # one worker: the products on one thread, as in a task
        next_task()
        for packed in (False, True):
            call(packed)
        for i in range(ROUNDS):
            for packed in ((False, True) if i % 2 == 0 else (True, False)):
                start = time.perf_counter()
                call(packed)
                times[packed].append(time.perf_counter() - start)

    run_blas_tasks(timed, [None], True)
    kept = verdict(times, False)
    return {"provider": "torch" if kept else "numpy", "ratio": ratios(times[True], times[False])[0]}

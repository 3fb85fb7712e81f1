r"""The block geometry of streamed attention on this machine
(:class:`ctformer._numerics.blocks.Geometry`), measured once.

With ``CTFORMER_GEMM=auto`` (the default) the candidates of :mod:`ctformer._numerics.blocks`
are timed once per machine and float dtype and stored with the product choices
(:mod:`ctformer._numerics.store`): one task of each candidate against ``_KEYS`` keys of
``_FEATURES`` features, per query row, on one thread with a one-thread BLAS (a task's own
conditions), in ``ROUNDS`` alternating rounds after a warm-up: about 0.3 s in float32 and
0.6 s in float64, at the first large attention problem. The default is replaced only by a
clear winner (:func:`ctformer._numerics.blocks.verdict`), so that a noisy machine keeps it.
A pinned ``CTFORMER_GEMM`` (``numpy``, ``torch``) and other dtypes use the default.
"""
from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from . import gemm as _gemm
from . import store as _store
from . import streamed as _streamed
from .blocks import CHUNK_BYTES, DEFAULT, KEY_BLOCKS, ROUNDS, ROWS, Geometry, ratios, verdict
from .threads import run_blas_tasks

__all__ = ["CHECKED", "geometry"]

_KEYS, _FEATURES = 4096, 64
CHECKED = (f"key blocks {KEY_BLOCKS} x rows {ROWS}, chunks {CHUNK_BYTES} bytes; "
           f"{_KEYS} keys of {_FEATURES} features, {ROUNDS} rounds")
_UNBLOCKED = Geometry(_KEYS, DEFAULT.rows, DEFAULT.chunk_bytes)  # one key block of all keys


def geometry(dtype) -> Geometry:
    """The block geometry of streamed attention on ``dtype`` arrays on this machine: measured
    and stored on first use for float32 and float64 with ``CTFORMER_GEMM=auto``; else
    :data:`ctformer._numerics.blocks.DEFAULT`.

    Raises
    ------
    ValueError
        If ``CTFORMER_GEMM`` is not one of auto, numpy, torch.
    """
    if _gemm._choice() != "auto":
        return DEFAULT
    dtype = np.dtype(dtype)
    return _measured(dtype.name) if dtype in (np.float32, np.float64) else DEFAULT


@lru_cache(maxsize=None)
def _measured(name: str) -> Geometry:
    # the choices the measurement runs on are stored first: it runs under the store's lock
    _gemm.softmax_provider(name)
    _gemm.gemm_provider(name)
    entry = _store.entry("attention blocks", name, _measure, CHECKED, _valid, needs_torch=False)
    return Geometry(entry["key_block"], entry["rows"], entry["chunk_bytes"])


def _valid(entry) -> bool:
    return (entry.get("key_block") in KEY_BLOCKS and entry.get("rows") in ROWS
            and entry.get("chunk_bytes") in CHUNK_BYTES)


def _candidates(dtype, blocked: bool) -> dict:
    """``{geometry: query rows of its task}``: the key-blocked geometries where streamed
    attention would block the keys, and the chunk sizes (unblocked: one block of all keys)."""
    found = {}
    if blocked:
        for key_block in KEY_BLOCKS:
            for rows in ROWS:
                found[Geometry(key_block, rows, DEFAULT.chunk_bytes)] = rows
    for size in CHUNK_BYTES:
        found[Geometry(_KEYS, DEFAULT.rows, size)] = max(64, size // (_KEYS * dtype.itemsize))
    return found


def _measure(dtype) -> dict:
    """Times per query row of every candidate's task (:func:`_candidates`), ``ROUNDS``
    rounds in alternating order after a warm-up, and the geometry kept (:func:`verdict`)."""
    tasks = _candidates(dtype, _streamed.key_blocked(_KEYS, None, dtype, False, DEFAULT.key_block))
    rng = np.random.default_rng(0)
    q = rng.standard_normal((max(tasks.values()), _FEATURES)).astype(dtype)
    k, v = (rng.standard_normal((_KEYS, _FEATURES)).astype(dtype) for _ in range(2))
    order = list(tasks.items())
    times = {shape: [] for shape in tasks}

    def call(shape, rows):
        _streamed.stream(q[:rows], 0.125, k, v, None, None, False, None, (), rows, shape)

    def timed(next_task):  # one worker, as a task of streamed attention runs: BLAS on one thread
        next_task()
        for shape, rows in order:
            call(shape, rows)
        for i in range(ROUNDS):
            for shape, rows in (order if i % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                call(shape, rows)
                times[shape].append((time.perf_counter() - start) / rows)

    run_blas_tasks(timed, [None], True)
    chunks = [s for s in tasks if s.key_block == _KEYS]
    blocked = [s for s in tasks if s.key_block != _KEYS]
    chunk = verdict({s: times[s] for s in chunks}, _UNBLOCKED)
    block = verdict({s: times[s] for s in blocked}, DEFAULT) if blocked else DEFAULT
    shown = {**{f"{s.chunk_bytes >> 20} MiB": ratios(times[s], times[_UNBLOCKED])[0] for s in chunks},
             **{f"{s.key_block}x{s.rows}": ratios(times[s], times[DEFAULT])[0] for s in blocked}}
    return {"provider": "numpy", "key_block": block.key_block, "rows": block.rows,
            "chunk_bytes": chunk.chunk_bytes, "ratios": shown}

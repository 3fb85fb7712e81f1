r"""The block geometry of streamed attention on this machine
(:class:`ctformer._numerics.blocks.Geometry`), measured once.

With ``CTFORMER_GEMM=auto`` (the default) the candidates of :mod:`ctformer._numerics.blocks`
are timed once per machine and float dtype and stored with the product choices
(:mod:`ctformer._numerics.store`): one task of each candidate against ``_KEYS`` keys of
``_FEATURES`` features, per query row, on one thread with a one-thread BLAS (a task's own
conditions), in ``ROUNDS`` alternating rounds after a warm-up. Two measurements, stored
apart: the chunk sizes (``attention chunks``, about 0.1 s), and the key blocks (``attention
key blocks``, about 0.2 s in float32 and 0.5 s in float64), only where streamed attention
can block its keys (the compiled kernels, and their row kernel rather than torch's softmax),
so that a stored key geometry was always timed under the conditions that use it. The default
is replaced only by a clear winner (:func:`ctformer._numerics.blocks.verdict`), so that a
noisy machine keeps it. A pinned ``CTFORMER_GEMM`` (``numpy``, ``torch``) and other dtypes use
the default.
"""
from __future__ import annotations

import time
from functools import lru_cache

import numpy as np

from . import gemm as _gemm
from . import store as _store
from . import streamed as _streamed
from .blocks import CHUNK_BYTES, DEFAULT, KEY_BLOCK_MARGIN, KEY_BLOCKS, ROUNDS, ROWS, Geometry, ratios, verdict
from .threads import run_blas_tasks

__all__ = ["CHUNKS_CHECKED", "KEY_BLOCKS_CHECKED", "geometry"]

_KEYS, _FEATURES = 4096, 64
_PROBLEM = f"{_KEYS} keys of {_FEATURES} features, {ROUNDS} rounds"
CHUNKS_CHECKED = f"chunks {CHUNK_BYTES} bytes; {_PROBLEM}"
KEY_BLOCKS_CHECKED = f"key blocks {KEY_BLOCKS} x rows {ROWS}; {_PROBLEM}; margin {KEY_BLOCK_MARGIN}"
# a key block longer than the keys: the chunks meet all keys at once, as masked and causal
# problems do (from one block's worth of keys, streamed attention would take key blocks)
_UNBLOCKED = Geometry(2 * _KEYS, DEFAULT.rows, DEFAULT.chunk_bytes)


def geometry(dtype) -> Geometry:
    """The block geometry of streamed attention on ``dtype`` arrays on this machine: measured
    and stored on first use for float32 and float64 with ``CTFORMER_GEMM=auto``; else
    :data:`ctformer._numerics.blocks.DEFAULT`. Where streamed attention cannot block its
    keys, the key block and rows are the default's (unused there).

    Raises
    ------
    ValueError
        If ``CTFORMER_GEMM`` is not one of auto, numpy, torch.
    """
    name = _gemm.measured_name(dtype)
    if name is None:
        return DEFAULT
    return _measured(name, _streamed.key_blocked(_KEYS, None, np.dtype(name), False, DEFAULT.key_block))


@lru_cache(maxsize=None)
def _measured(name: str, blocked: bool) -> Geometry:
    # the choices the measurements run on are stored first: they run under the store's lock
    _gemm.softmax_provider(name)
    _gemm.gemm_provider(name)
    chunks = _store.entry("attention chunks", name, _measure_chunks, CHUNKS_CHECKED,
                          lambda e: e.get("chunk_bytes") in CHUNK_BYTES, needs_torch=False)
    if not blocked:
        return Geometry(DEFAULT.key_block, DEFAULT.rows, chunks["chunk_bytes"])
    blocks = _store.entry("attention key blocks", name, _measure_key_blocks, KEY_BLOCKS_CHECKED,
                          lambda e: e.get("key_block") in KEY_BLOCKS and e.get("rows") in ROWS, needs_torch=False)
    return Geometry(blocks["key_block"], blocks["rows"], chunks["chunk_bytes"])


def _measure_chunks(dtype) -> dict:
    """The chunk size kept (:func:`verdict`) from the per-row times of a chunk of each size
    meeting all ``_KEYS`` keys at once, with the ratios to the default."""
    tasks = {Geometry(_UNBLOCKED.key_block, DEFAULT.rows, size): max(64, size // (_KEYS * dtype.itemsize))
             for size in CHUNK_BYTES}
    times = _times(dtype, tasks)
    chosen = verdict(times, _UNBLOCKED)
    return {"provider": "numpy", "chunk_bytes": chosen.chunk_bytes,
            "ratios": {f"{s.chunk_bytes >> 20} MiB": ratios(times[s], times[_UNBLOCKED])[0] for s in tasks}}


def _measure_key_blocks(dtype) -> dict:
    """The key block and rows kept (:func:`verdict`) from the per-row times of each candidate
    block meeting ``_KEYS`` keys, with the ratios to the default."""
    tasks = {Geometry(key_block, rows, DEFAULT.chunk_bytes): rows for key_block in KEY_BLOCKS for rows in ROWS}
    times = _times(dtype, tasks)
    chosen = verdict(times, DEFAULT, KEY_BLOCK_MARGIN)
    return {"provider": "numpy", "key_block": chosen.key_block, "rows": chosen.rows,
            "ratios": {f"{s.key_block}x{s.rows}": ratios(times[s], times[DEFAULT])[0] for s in tasks}}


def _times(dtype, tasks: dict) -> dict:
    """``{geometry: [seconds per query row, one per round]}`` of one streamed task of
    ``tasks[geometry]`` query rows each, ``ROUNDS`` rounds in alternating order after a
    warm-up, on one worker with a one-thread BLAS (as a task of streamed attention runs)."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((max(tasks.values()), _FEATURES)).astype(dtype)
    k, v = (rng.standard_normal((_KEYS, _FEATURES)).astype(dtype) for _ in range(2))
    order = list(tasks.items())
    times = {shape: [] for shape in tasks}

    def call(shape, rows):
        _streamed.stream(q[:rows], 0.125, k, v, None, None, False, None, (), rows, shape)

    def timed(next_task):
        next_task()
        for shape, rows in order:
            call(shape, rows)
        for i in range(ROUNDS):
            for shape, rows in (order if i % 2 == 0 else order[::-1]):
                start = time.perf_counter()
                call(shape, rows)
                times[shape].append((time.perf_counter() - start) / rows)

    run_blas_tasks(timed, [None], True)
    return times

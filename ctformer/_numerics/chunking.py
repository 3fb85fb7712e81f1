r"""How streamed attention splits its work (:mod:`ctformer._numerics.streamed`): whether a
problem meets its keys in blocks of the machine's geometry
(:mod:`ctformer._numerics.blocks`) or all at once, and how many query rows make a task.

For :math:`n` queries against :math:`m` keys of ``itemsize`` bytes, a task is a chunk of query
rows of one (batch, head) problem: the geometry's ``rows`` where the keys come in blocks (or
whole rows of the same height), else about ``chunk_bytes`` of scores; at least a few chunks
in all (balance over the threads), an even number where they are few, and short causal
chunks. The tasks depend on the shapes and dtype only, never on the number of threads, so
results are bit-identical for any thread count.
"""
from __future__ import annotations

import numpy as np

from . import blocks as _blocks
from . import compiled as _compiled
from . import gemm as _gemm

__all__ = ["key_blocked", "stream_chunk", "whole_rows"]

# The fewest query rows a chunk keeps (BLAS efficiency).
_MIN_CHUNK_ROWS = 64
# A streamed call is split into at least this many query chunks (a constant, not the thread
# count: the tasks, hence the rounding, never depend on the threads): balanced over 2 or 4
# threads. Eight chunks had left a single head of 512-1500 queries in chunks of
# 64-188 rows, too short for the products; four took 0.81-0.95 of the time in float32 and
# 0.90-0.99 in float64 (n = 512, 1000, 1500, head dimension 64, two threads; AMD EPYC,
# family 26 model 2, AVX-512 and AVX2 kernels alike); from 2048 queries the chunk size
# decides the chunks, unchanged.
_MIN_CHUNKS = 4
# Below this many chunks in all, their number is rounded up to an even one, a whole number of
# rounds over two threads (a constant again, not the thread count): nine chunks of 256 queries
# (one head of 2300) kept one of two threads busy with a fifth chunk alone; ten of 230 took
# 0.93 of the time with AVX2 kernels, 0.94 with AVX-512 (float32; AMD EPYC, family 26 model 2).
_BALANCED_TASKS = 32
# Causal problems of at least twice this many queries are streamed in chunks of at most this
# many: a chunk meets only the keys up to its last query, so c chunks compute (c + 1) / 2c of
# the scores. Many heads of 512-2048 tokens had taken one or two chunks per head (the chunk
# bytes allow 1024 rows of 2048 keys): 12 heads of 2048 tokens, float32, took 25 ms in
# chunks of 192 against 33 ms; 4 x 12 heads of 512 (head dimension 32) 0.78 of the time in
# float32 and float64, on AVX-512 as with AVX2 kernels; 64 rows were slower again (AMD EPYC,
# family 26 model 2).
_CAUSAL_CHUNK_ROWS = 192
# ... and where a chunk of that many queries cannot hold the scores of all the keys in the
# chunk budget (8 MiB: from 10923 keys in float32, 5462 in float64), causal chunks meet the
# keys in blocks rather than shrink: at 32768 tokens the budget left chunks of 64 queries,
# and key blocks took 0.81-0.84 of their time (float32 and float64; 16384 tokens float32
# 0.87; two threads, one head of 64 features; AMD EPYC, family 25 model 17), with less
# memory (a block of 192 x 2048 float32 scores is 1.5 MiB).


def key_blocked(m, keep=None, dtype=None, causal=False, key_block=None, chunk_bytes=None) -> bool:
    """Whether streamed attention over ``m`` keys meets them in key blocks (online softmax), or
    all at once in chunks of the geometry's query rows (:func:`whole_rows`): at least one block
    of ``key_block`` keys (None: the default, :data:`ctformer._numerics.blocks.DEFAULT`), the
    compiled kernels, no mask array, and the compiled row kernel (not torch's softmax)
    normalizing the scores of ``dtype`` (None: not asked). Otherwise a chunk meets all keys in
    about ``chunk_bytes`` of scores.

    From one block, not two: between one and two blocks' worth of keys the chunks had grown to
    the whole budget (8 MiB: 1024 rows of 2048 float32 keys), and the geometry's rows (whole
    rows, or a full block and a short one) took 0.76-0.93 of their time with 2-12 heads
    (12 x 2048 float32 0.79-0.91, 12 x 2500 0.81, 4 x 3000 0.76; 12 x 1024 float64 0.86-0.87,
    4 x 1500 0.89), 0.90-1.06 with one head (two threads, 9 alternating rounds; AMD EPYC,
    family 25 model 17). Where all keys fit one block the result has the same bits either way.

    A ``causal`` problem takes key blocks only from two blocks, and only where its chunks of
    ``_CAUSAL_CHUNK_ROWS`` queries would not hold all ``m`` keys' scores in ``chunk_bytes``
    (given, with ``dtype``): a causal chunk already skips the keys after it, and was 1.08-1.3x
    slower in key blocks in float32 (AMD EPYC, family 26 model 2), but where the budget cuts
    its rows, key blocks keep them (see ``_CAUSAL_CHUNK_ROWS``)."""
    key_block = _blocks.DEFAULT.key_block if key_block is None else key_block
    if causal and (chunk_bytes is None or dtype is None
                   or _CAUSAL_CHUNK_ROWS * m * np.dtype(dtype).itemsize <= chunk_bytes):
        return False
    return (m >= (2 if causal else 1) * key_block and keep is None and _compiled.kernels() is not None
            and (dtype is None or _gemm.softmax_provider(dtype) == "numpy"))


def whole_rows(m, itemsize, geometry) -> bool:
    """Whether streamed attention that could meet ``m`` keys in blocks (:func:`key_blocked`)
    meets them all at once instead: where a chunk of ``geometry.rows`` queries holds the
    scores of all ``m`` keys in half of ``geometry.chunk_bytes`` (two threads' chunks in
    flight within one chunk budget). The chunks keep the blocks' rows. A single head of 2048
    tokens took 0.90 of SDPA's time this way against 0.93 in blocks of 512 keys, one of 1536
    0.94 against 0.98, 2-12 heads of 1024-2048 0.90-0.94 against 0.91-0.95 (float32, two
    threads); in float64, whose measured blocks hold 1024 keys, one head of 2048 0.86 against
    0.88 and 2-4 heads 0.89-0.90 against 0.88 (AMD EPYC, family 23 model 49). Blocks keep
    longer rows: at 4096 keys they were as fast in float32 and faster in float64 (0.85
    against 0.86)."""
    return 2 * geometry.rows * m * itemsize <= geometry.chunk_bytes


def stream_chunk(n, m, itemsize, problems, blocked=None, geometry=None, causal=False):
    """Query rows per task: ``geometry.chunk_bytes`` of scores, or ``geometry.rows`` where the
    keys may come in blocks (``blocked``; None: :func:`key_blocked` of ``m``; so do the whole
    rows that replace them, :func:`whole_rows`); at least
    ``_MIN_CHUNKS`` chunks in all, an even number of them where they are few
    (:func:`_whole_rounds`); for ``causal`` problems of at least ``2 * _CAUSAL_CHUNK_ROWS`` queries
    at most ``_CAUSAL_CHUNK_ROWS`` (see there); thread-independent. ``geometry`` None: the
    defaults (:data:`ctformer._numerics.blocks.DEFAULT`)."""
    geometry = _blocks.DEFAULT if geometry is None else geometry
    blocked = key_blocked(m, key_block=geometry.key_block) if blocked is None else blocked
    chunk = geometry.rows if blocked else max(_MIN_CHUNK_ROWS, geometry.chunk_bytes // (m * itemsize))
    if causal and n >= 2 * _CAUSAL_CHUNK_ROWS:
        chunk = min(chunk, _CAUSAL_CHUNK_ROWS)
    per_problem = -(-_MIN_CHUNKS // max(1, problems))
    chunk = max(1, min(n, chunk, max(_MIN_CHUNK_ROWS, -(-n // per_problem))))
    return chunk if causal else _whole_rounds(n, chunk, max(1, problems))


def _whole_rounds(n, chunk, problems):
    """``chunk``, or the largest smaller one that makes the number of chunks in all even,
    where that number is under ``_BALANCED_TASKS`` (below it a last odd chunk leaves a thread
    idle for a noticeable share of the call) and a chunk keeps at least ``_MIN_CHUNK_ROWS``
    rows. Causal chunks are not equal, and go largest first instead."""
    count = -(-n // chunk)
    if problems * count >= _BALANCED_TASKS or problems * count % 2 == 0:
        return chunk
    smaller = -(-n // (count + 1))
    return smaller if smaller >= _MIN_CHUNK_ROWS and -(-n // smaller) == count + 1 else chunk

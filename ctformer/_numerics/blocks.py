r"""The block geometry of streamed attention: how many queries and keys make a block of
scores.

Streamed attention (:mod:`ctformer._numerics.streamed`) never forms the :math:`N \times M`
scores :math:`s = \beta q k^\top`. Each task takes a chunk of query rows, and

* without a mask (with the compiled kernels), ``rows`` queries meet the keys ``key_block`` at
  a time, the softmax carried from block to block (online softmax): a ``(rows, key_block)``
  block of scores; so do long causal problems, whose causal chunks ``chunk_bytes`` would cut
  short;
* with a mask array, without the compiled kernels, or with the causal mask otherwise, a chunk
  meets all its keys at once, about ``chunk_bytes`` of scores.

Which sizes are fastest depends on the core's caches and the BLAS kernel: this module holds
the default and the candidates, and the rule that keeps a candidate only when it wins
clearly (:func:`verdict`); :mod:`ctformer._numerics.measured_blocks` times them once per
machine. The geometry changes the order of the sums, hence the last bits of a result (as the
BLAS kernel does); it never depends on the number of threads.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["CHUNK_BYTES", "DEFAULT", "Geometry", "KEY_BLOCKS", "KEY_BLOCK_MARGIN", "ROWS", "verdict"]


@dataclass(frozen=True)
class Geometry:
    """Block sizes of streamed attention: ``key_block`` keys and ``rows`` queries per block
    without a mask; about ``chunk_bytes`` of scores per chunk otherwise."""
    key_block: int
    rows: int
    chunk_bytes: int


# The defaults: 1-2 MiB of key-blocked scores stay in a core's L2 cache (0.80-0.92 of the time
# of unblocked chunks at M = 8192 on an AMD EPYC); ~8 MiB chunks keep BLAS efficient (>= 128
# rows at M = 8192 in float64) while the extra memory stays far below N x M.
DEFAULT = Geometry(key_block=1024, rows=256, chunk_bytes=8 << 20)
KEY_BLOCKS = (512, 1024, 2048)
ROWS = (128, 256, 512)
CHUNK_BYTES = (2 << 20, 4 << 20, 8 << 20, 16 << 20)
# A candidate is kept when the median of its per-round ratios to the default is at most
# MARGIN and it was faster in at least WINS of ROUNDS rounds.
ROUNDS, WINS, MARGIN = 7, 6, 0.92
# The key blocks' margin. 512 x 512 blocks measured 0.90-0.94 of the default's time per row in
# four runs of the measurement (float32; AMD EPYC, family 23 model 49), and 0.954-0.958 of the
# time of whole calls of 8192 and 32768 tokens on two threads: at 0.92 the choice flipped
# from run to run (kept in 2 of 3), which a stored choice should not. The wins still have to
# be WINS of ROUNDS rounds.
KEY_BLOCK_MARGIN = 0.95


def ratios(seconds, default_seconds) -> tuple:
    """``(median ratio, wins)`` of per-round times against the default's."""
    per_round = [t / d for t, d in zip(seconds, default_seconds)]
    return float(np.median(per_round)), sum(r < 1.0 for r in per_round)


def verdict(times: dict, default, margin: float = MARGIN):
    """The candidate kept from per-round times ``{candidate: [seconds, ...]}`` (one list per
    candidate, rounds aligned, ``default`` among them): the one of smallest median per-round
    ratio to ``default`` among those with a median ratio at most ``margin`` that were faster
    than ``default`` in at least ``WINS`` rounds; ``default`` when none is."""
    best, best_ratio = default, margin
    for candidate, seconds in times.items():
        ratio, wins = ratios(seconds, times[default])
        if candidate != default and wins >= WINS and ratio <= best_ratio:
            best, best_ratio = candidate, ratio
    return best

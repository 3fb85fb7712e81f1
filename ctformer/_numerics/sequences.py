r"""Tasks of whole sequences: a token-mixing map evaluated on blocks of a batch's sequences.

Attention couples the tokens of one sequence and no others: on a batch of :math:`B`
sequences of :math:`N` tokens, :math:`u \in \mathbb{R}^{B \times N \times d}`,

.. math:: A(u)_b = P_O\, \mathrm{attn}\big(P_{QKV}\, u_b\big), \qquad b = 1, \dots, B,

so its projections and its heads can run sequence by sequence, each block of sequences one
task on a worker thread: the projected queries, keys and values and the heads' outputs are
used while they are in that core's caches, and the three passes over the threads (the two
projections by row blocks, the heads by blocks of heads) become one.

The blocks depend on the shape only (never on the thread count): a result has the same bits
for every number of threads. They differ from the bits of the three-pass evaluation, whose
row blocks are other products (OpenBLAS's float32 product of a row depends on how many rows
it is multiplied with).
"""
from __future__ import annotations

import math

__all__ = ["sequence_blocks"]

# A task holds whole sequences, at least this many rows (tokens) in all: a product of fewer
# rows packs its matrix for little work (16-token sequences go eight to a task).
_TASK_ROWS = 128
# At least this many tasks: balanced on two and four threads; fewer sequences keep the
# three-pass evaluation, whose row blocks and blocks of heads use more threads.
_MIN_TASKS = 4
# At most this many tokens a sequence: a longer one's heads are worth spreading over all the
# threads (the streamed engine's query chunks), which a task of whole sequences cannot do.
_MAX_TOKENS = 512


def sequence_blocks(shape) -> list | None:
    """Blocks of the sequences of a state of ``shape`` ``(..., N, d)`` (the leading axes
    flattened: slices of ``range(prod(shape[:-2]))``), each at least ``_TASK_ROWS`` tokens or
    the rest; None where tasks of whole sequences do not apply: fewer than ``_MIN_TASKS``
    blocks, or sequences of more than ``_MAX_TOKENS`` tokens (or none).

    Measured against the three passes (AMD EPYC, family 23 model 49, two threads, GPT-2 of
    384 features and 12 heads, float32): 64 x 16 tokens 0.92 of the time, 16 x 64 0.96,
    4 x 128 0.97, 8 x 128 0.97, 4 x 512 0.94."""
    if len(shape) < 3:
        return None
    n, count = shape[-2], math.prod(shape[:-2])
    if not 0 < n <= _MAX_TOKENS:
        return None
    step = -(-_TASK_ROWS // n)
    if -(-count // step) < _MIN_TASKS:
        return None
    return [slice(start, min(count, start + step)) for start in range(0, count, step)]

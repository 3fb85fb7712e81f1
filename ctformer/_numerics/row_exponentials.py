r"""The numerators of one chunk of attention scores, in place: exponentials and row sums.

For a chunk of query rows :math:`i` (starting at query ``start``) against keys :math:`j`,

.. math::

    s_{ij} \leftarrow \exp\bigl(s_{ij} + \log w_j - \max_l (s_{il} + \log w_l)\bigr),
    \qquad \mathrm{sums}_i = \sum_j s_{ij},

with the causal order applied (keys after the query are 0) and, on the half-weight diagonal
rule, :math:`\log \tfrac12` added to the diagonal entry. Three ways to do it, each an
``exp_rows(s, start, sums)`` for the streamed engine (:mod:`ctformer._numerics.streamed`): the
compiled row kernel (one pass per row, :mod:`ctformer._numerics.compiled`), torch's softmax
(rows normalized, sums 1), or NumPy passes over row blocks that stay in cache.
"""
from __future__ import annotations

import numpy as np

from . import compiled as _compiled
from . import gemm as _gemm

__all__ = ["exp_rows_kernel", "fused_exp_rows", "log_weights", "numpy_exp_rows", "torch_softmax_rows"]

# NumPy loops: rows of a score chunk are exponentiated in blocks of this size (L2 cache).
_ELEMENTWISE_BLOCK_BYTES = 1 << 20


def exp_rows_kernel():
    """The compiled row kernel, or None (NumPy loops)."""
    made = _compiled.kernels()
    return None if made is None else made.exp_rows


def log_weights(log_w, dtype):
    """The log-weights as the kernels take them: contiguous in ``dtype``, empty for uniform weights."""
    return np.empty(0, dtype) if log_w is None else np.ascontiguousarray(log_w, dtype=dtype)


def fused_exp_rows(kernel, log_w, causal, diag_shift, dtype):
    """``exp_rows(s, start, sums)`` by the compiled kernel: one pass per row."""
    log_w = log_weights(log_w, dtype)
    shift = dtype.type(diag_shift or 0)
    big = np.iinfo(np.int64).max

    def exp_rows(s, start, sums):
        kernel(s, log_w, start if causal else -1, big, shift, sums)
    return exp_rows


def torch_softmax_rows(log_w, causal, diag_shift, chunk):
    """``exp_rows(s, start, sums)`` by torch's softmax (rows normalized in place, sums 1)."""
    upper = np.triu(np.ones((chunk, chunk), dtype=bool), 1) if causal else None

    def exp_rows(s, start, sums):
        r, cols = s.shape
        if log_w is not None:
            np.add(s, log_w[:cols], out=s)
        if causal:  # only the diagonal block has keys after the query
            diag = s[:, start:]
            np.copyto(diag, -np.inf, where=upper[:r, :r])
            if diag_shift is not None:
                i = np.arange(r)
                diag[i, i] += diag_shift
        _gemm.softmax_rows(s)
        sums[:] = 1
    return exp_rows


def numpy_exp_rows(log_w, causal, diag_shift, chunk):
    """``exp_rows(s, start, sums)`` by NumPy passes over row blocks that stay in cache."""
    upper = np.triu(np.ones((chunk, chunk), dtype=bool), 1) if causal else None

    def exp_rows(s, start, sums):
        r, cols = s.shape
        block_rows = max(1, _ELEMENTWISE_BLOCK_BYTES // (cols * s.dtype.itemsize))
        for a in range(0, r, block_rows):
            b = min(r, a + block_rows)
            sa = s[a:b]
            if log_w is not None:
                np.add(sa, log_w[:cols], out=sa)
            if causal:  # only the diagonal block has keys after the query
                diag = sa[:, start:]
                np.copyto(diag, -np.inf, where=upper[a:b, :r])
                if diag_shift is not None:
                    i = np.arange(a, b)
                    diag[i - a, i] += diag_shift
            np.subtract(sa, np.max(sa, axis=1, keepdims=True), out=sa)
            np.exp(sa, out=sa)
            np.sum(sa, axis=1, out=sums[a:b])
    return exp_rows

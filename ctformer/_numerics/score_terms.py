r"""Score terms: what the scores of attention get besides the log-weights and the masks.

.. math::

    s_{ij} = \phi(\beta\, q_i \cdot k_j) + b_{ij}, \qquad \phi(s) = c \tanh(s / c),

the soft cap :math:`\phi` (Gemma 2's ``attn_logit_softcapping``; the identity without one) and
an additive term :math:`b` (ALiBi's :math:`-m_h |p_i - p_j|`), before the log-weights, the
masks and the exponential. Every path of the dense engine applies them to each block of scores
right after its product (:mod:`ctformer._numerics.dense`, :mod:`ctformer._numerics.streamed`).
"""
from __future__ import annotations

import numpy as np

__all__ = ["ScoreTerms", "score_terms"]


class ScoreTerms:
    r"""What the scores :math:`s = \beta q \cdot k` get before the log-weights, the masks and
    the exponential: a soft cap :math:`c \tanh(s / c)` (Gemma 2), then an additive term
    :math:`b` (ALiBi's :math:`-m_h |p_i - p_j|`), either None. ``bias`` broadcasts against
    the scores of all problems, ``(*lead, n, m)``."""

    __slots__ = ("cap", "bias")

    def __init__(self, cap=None, bias=None):
        self.cap, self.bias = cap, bias

    def spread(self, lead, n, m):
        """``(cap, bias)`` with ``bias`` as a ``(*lead, n, m)`` view (or None), for slicing by task."""
        bias = None if self.bias is None else np.broadcast_to(self.bias, (*lead, n, m))
        return self.cap, bias


def score_terms(s, cap, bias) -> None:
    """In place, ``s <- cap * tanh(s / cap) + bias`` (a None term is left out)."""
    if cap is not None:
        np.divide(s, cap, out=s)
        np.tanh(s, out=s)
        np.multiply(s, cap, out=s)
    if bias is not None:
        np.add(s, bias, out=s)

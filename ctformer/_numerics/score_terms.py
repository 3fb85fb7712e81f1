r"""Score terms: what the scores of attention get besides the log-weights and the masks.

.. math::

    s_{ij} = \phi(\beta\, q_i \cdot k_j) + b_{ij}, \qquad \phi(s) = c \tanh(s / c),

the soft cap :math:`\phi` (Gemma 2's ``attn_logit_softcapping``; the identity without one) and
an additive term :math:`b` (ALiBi's :math:`-m_h |p_i - p'_j|`), before the log-weights, the
masks and the exponential. Every path of the dense engine applies them to each block of scores
right after its product (:mod:`ctformer._numerics.dense`, :mod:`ctformer._numerics.streamed`).

The additive term is an array of all the scores' terms, or, for ALiBi, a
:class:`DistanceTerm` that evaluates :math:`-m_h |p_i - p'_j|` for each block of scores when
the block is computed: no array of :math:`N \times M` terms per head is ever formed.
"""
from __future__ import annotations

import array_api_compat
import numpy as np

from . import compiled as _compiled

__all__ = ["DistanceTerm", "ScoreTerms", "score_terms"]

_ALL = slice(None)


class DistanceTerm:
    r"""The additive score term :math:`b_{ij} = -m\, |p_i - p'_j|` (ALiBi), evaluated by blocks.

    Parameters
    ----------
    slopes : ndarray of float64
        :math:`m \ge 0`, broadcasting against the leading axes of the scores as ``(..., 1, 1)``
        (one slope per head: ``(heads, 1, 1)``).
    p, pk : ndarray (n,), (m,) of float64
        The positions of the queries and of the keys.

    The distance is rounded to the scores' dtype before it is scaled, as the banded engine's
    term (:func:`ctformer._numerics.banded.slopes_bias`).
    """

    __slots__ = ("slopes", "p", "pk", "_converted")

    def __init__(self, slopes, p, pk):
        self.slopes, self.p, self.pk = slopes, p, pk
        self._converted = {}   # (namespace, dtype, device) -> (slopes, p, pk) there

    def __getitem__(self, idx) -> "DistanceTerm":
        """The term of the problems ``idx`` (an index into the leading axes)."""
        return DistanceTerm(self.slopes[idx], self.p, self.pk)

    def spread(self, lead) -> "DistanceTerm":
        """The term with its slopes as a ``(*lead, 1, 1)`` view, for indexing by problem."""
        return DistanceTerm(np.broadcast_to(self.slopes, (*lead, 1, 1)), self.p, self.pk)

    def add_to(self, s, rows=_ALL, cols=_ALL) -> None:
        """In place on NumPy scores ``s`` (..., r, c) of the queries ``rows`` and keys ``cols``:
        ``s -= m |p_i - p'_j|``, in one compiled pass where there is one slope and one block."""
        p, pk = self.p[rows], self.pk[cols]
        made = _compiled.kernels() if s.ndim == 2 and self.slopes.size == 1 else None
        if made is not None and s.flags.c_contiguous:
            made.add_distance(s, p, pk, s.dtype.type(self.slopes.reshape(())))
            return
        distance = np.abs(np.asarray(p[:, None] - pk[None, :], dtype=s.dtype))
        s -= np.asarray(self.slopes, dtype=s.dtype) * distance

    def array(self, like, rows=_ALL, cols=_ALL):
        """The terms ``-m |p_i - p'_j|`` of the queries ``rows`` and keys ``cols``, in the
        namespace, dtype and device of ``like`` (broadcasting against its scores)."""
        xp = array_api_compat.array_namespace(like)
        device = array_api_compat.device(like)
        key = (xp.__name__, str(like.dtype), str(device))
        found = self._converted.get(key)
        if found is None:
            found = self._converted[key] = (xp.asarray(self.slopes, dtype=like.dtype, device=device),
                                            xp.asarray(self.p, device=device), xp.asarray(self.pk, device=device))
        slopes, p, pk = found
        distance = xp.abs(xp.astype(p[rows][:, None] - pk[cols][None, :], like.dtype))
        return -(slopes * distance)


class ScoreTerms:
    r"""What the scores :math:`s = \beta q \cdot k` get before the log-weights, the masks and
    the exponential: a soft cap :math:`c \tanh(s / c)` (Gemma 2), then an additive term
    :math:`b` (ALiBi's :math:`-m_h |p_i - p'_j|`), either None. ``bias`` is an array
    broadcasting against the scores of all problems, ``(*lead, n, m)``, or a
    :class:`DistanceTerm`."""

    __slots__ = ("cap", "bias")

    def __init__(self, cap=None, bias=None):
        self.cap, self.bias = cap, bias

    def spread(self, lead, n, m) -> "ScoreTerms":
        """The terms with ``bias`` laid out over ``(*lead, n, m)`` (views), for :meth:`apply`
        by problem."""
        bias = self.bias
        if isinstance(bias, DistanceTerm):
            bias = bias.spread(lead)
        elif bias is not None:
            bias = np.broadcast_to(bias, (*lead, n, m))
        return ScoreTerms(self.cap, bias)

    def at(self, idx) -> "ScoreTerms":
        """The terms of the problems ``idx`` of spread terms (:meth:`spread`)."""
        return ScoreTerms(self.cap, None if self.bias is None else self.bias[idx])

    def apply(self, s, idx=(), rows=_ALL, cols=_ALL) -> None:
        """In place on NumPy scores ``s``: the terms of the problems ``idx`` (of spread terms;
        ``()``: the scores of every problem), queries ``rows`` and keys ``cols``."""
        score_terms(s, self.cap, None)
        bias = self.bias
        if isinstance(bias, DistanceTerm):
            bias[idx].add_to(s, rows, cols)
        elif bias is not None:
            np.add(s, bias[idx][..., rows, cols], out=s)

    def applied(self, s, rows=_ALL, cols=_ALL):
        """``s`` with the terms, in the namespace of ``s`` (not in place): the array-API chunks."""
        if self.cap is not None:
            s = self.cap * array_api_compat.array_namespace(s).tanh(s / self.cap)
        bias = self.bias
        if isinstance(bias, DistanceTerm):
            return s + bias.array(s, rows, cols)
        return s if bias is None else s + bias[..., rows, cols]


def score_terms(s, cap, bias) -> None:
    """In place, ``s <- cap * tanh(s / cap) + bias`` (a None term is left out; ``bias`` an array)."""
    if cap is not None:
        np.divide(s, cap, out=s)
        np.tanh(s, out=s)
        np.multiply(s, cap, out=s)
    if bias is not None:
        np.add(s, bias, out=s)

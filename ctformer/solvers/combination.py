r"""The stage combination of the explicit Runge-Kutta methods: :math:`u + h \sum_i w_i k_i`.

:func:`_combine` forms the sum in the order of the stages, skipping the zero weights; a term
whose factor is :math:`h w_i = 1` is added as it is. Inside a :class:`summing` block a
thread's large unit-weight sums :math:`u + k` are formed by the block's adder, a faster engine
that must return the bits of NumPy's :math:`u + k`.
"""
from __future__ import annotations

import threading
from typing import Callable

import numpy as np

__all__ = ["summing"]


_IN_PLACE_MIN = 1 << 16  # entries from which a stage term is summed into itself (no second array)
_SUMMING = threading.local()  # .add: the adder of large unit-weight terms inside a summing block


class summing:
    """A block in which this thread's steps form their large unit-weight sums :math:`u + k`
    (a residual block in the discrete limit, NumPy arrays of at least ``_IN_PLACE_MIN``
    entries) by ``add(u, k)``, which must return a new array with the bits of ``u + k`` (a
    faster engine for the same sum: the model's solves pass
    :func:`ctformer._numerics.elementwise.add`). Nested blocks keep the outer adder; other
    threads are not affected."""

    __slots__ = ("add", "entered")

    def __init__(self, add: Callable):
        self.add = add

    def __enter__(self):
        self.entered = getattr(_SUMMING, "add", None) is None
        if self.entered:
            _SUMMING.add = self.add
        return self

    def __exit__(self, *exc):
        if self.entered:
            _SUMMING.add = None


def _combine(u, h: float, weights, ks):
    r""":math:`u + h \sum_i w_i k_i`, skipping the zero weights; a factor :math:`h w_i = 1`
    (a residual block in the discrete limit) adds :math:`k_i` as it is (by the adder of a
    :class:`summing` block for large NumPy arrays), and a large NumPy term is scaled and
    summed in one new array (the same bits: IEEE products by 1 and sums commute)."""
    out = u
    for w_i, k in zip(weights, ks):
        if w_i:
            c = h * w_i
            if c == 1:
                add = getattr(_SUMMING, "add", None) if type(out) is np.ndarray and out.size >= _IN_PLACE_MIN else None
                out = out + k if add is None else add(out, k)
            elif (type(k) is np.ndarray and k.size >= _IN_PLACE_MIN and type(out) is np.ndarray
                  and k.shape == out.shape and k.dtype == out.dtype):  # small arrays: the plain sum is cheaper
                term = c * k
                term += out
                out = term
            else:
                out = out + c * k
    return out

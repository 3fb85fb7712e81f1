r"""Plans for small NumPy states: a token-wise map evaluated in a few direct calls.

A solve of a small state (tens of tokens and features) evaluates each operator thousands of
times, and for such a state the general path's dispatch (which product, which loop, row
blocks, threads, each asked again per call) costs more than its arithmetic. The feed-forward
operator

.. math::  F(u) = W_2\,\phi(W_1 u + b_1) + b_2

on 16 tokens x 16 features took 28 us an evaluation through the general path, of which the
two products, the biases and the activation were 11 (AMD EPYC, family 23 model 49).

:class:`SmallPlans` decides once, per shape, dtype and engine settings (``CTFORMER_GEMM``,
``CTFORMER_LOOP_ENGINE``, read at every call), what the general path does for a C-contiguous
NumPy state of fewer than 256 rows, and then does only that: the same operations in the same
order, so the same bits. Everything else (tensors, larger states, states inside a worker
thread, products that the general path sends to torch) goes to the general path.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..environment import setting
from .._numerics.threads import _INSIDE, _PACKED_MIN_ROWS

__all__ = ["SmallPlans"]

# plans kept per map: a solve uses one shape, a study a few; more are made again
_SHAPES = 8
_SETTINGS = ("CTFORMER_GEMM", "CTFORMER_LOOP_ENGINE")


class SmallPlans:
    """The map ``general`` with its small NumPy states evaluated by plans.

    Parameters
    ----------
    general : callable
        The map on any state.
    make : callable
        ``make(u)``: the plan for states of ``u``'s shape and dtype, a callable ``u -> map(u)``
        with the bits of ``general(u)``, or None where the general path is to be taken.
        Called with C-contiguous float32 or float64 NumPy states of fewer than 256 rows; it
        reads the settings through their checks (a bad value raises there, every call).
    """

    __slots__ = ("general", "make", "_plans")

    def __init__(self, general: Callable, make: Callable):
        self.general, self.make = general, make
        self._plans = {}  # (shape, dtype, settings) -> plan or None

    def __call__(self, u):
        if type(u) is np.ndarray and u.flags.c_contiguous and not getattr(_INSIDE, "worker", False):
            key = (u.shape, u.dtype, setting(_SETTINGS[0]), setting(_SETTINGS[1]))
            plan = self._plans.get(key, self)
            if plan is self:
                plan = self._plan(u, key)
            if plan is not None:
                return plan(u)
        return self.general(u)

    def _plan(self, u, key):
        if len(self._plans) >= _SHAPES:
            self._plans.clear()
        small = u.dtype in (np.float32, np.float64) and u.ndim >= 2 and u.size > 0 \
            and u.size // u.shape[-1] < _PACKED_MIN_ROWS
        plan = self.make(u) if small else None
        self._plans[key] = plan  # not reached when make raises (a bad setting): raised again next call
        return plan

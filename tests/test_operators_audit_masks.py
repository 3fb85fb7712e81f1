"""Keep-masks at every entry point, and the equality of mask objects (audit of the operators).

One rule: a padding (key) mask is boolean, or integers that are all 0 or 1 (HuggingFace's
``attention_mask`` is int64); other integers are refused by value. The reference is a
written-out NumPy causal softmax over the kept keys, and ``Model.run``, which read 0/1
integers before the operator did.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import ContinuousTransformer as Model
from ctformer.discretizations import Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.model import Block
from ctformer.operators import Attention, Grids
from ctformer.operators.local_attention import local_attention
from ctformer.operators.masks import Causal, Intersection, Mask, SlidingWindow
from tests.conftest import require

HEADS, D, D_H, N = 2, 8, 4, 6


def _attention(seed=0):
    rng = np.random.default_rng(seed)

    def kernels(rows, cols):
        return [PiecewiseConstant(rng.standard_normal((rows, cols)) / 3) for _ in range(HEADS)]

    weights = kernels(D_H, D), kernels(D_H, D), kernels(D_H, D), kernels(D, D_H)
    return Attention(*weights, mask="causal", beta=float(np.sqrt(D_H))), weights


def _reference(u, weights, keep):
    """Causal softmax attention over the kept keys, head by head, with ``sqrt(d_h) / d_h``
    the score scale of midpoint head features; a query without keys gives zero."""
    out = 0.0
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    allowed = (j <= i) & keep[..., None, :]
    for h in range(HEADS):
        q, k, v = (u @ w[h].matrix(Midpoint(D_H), Midpoint(D)).T for w in weights[:3])
        s = np.where(allowed, q @ k.swapaxes(-1, -2) / np.sqrt(D_H), -np.inf)
        top = np.max(s, axis=-1, keepdims=True)
        p = np.where(allowed, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
        total = p.sum(-1, keepdims=True)
        o = np.divide(p, total, out=np.zeros_like(p), where=total > 0) @ v
        out = out + o @ weights[3][h].matrix(Midpoint(D), Midpoint(D_H)).T
    return out


def _mask():
    keep = np.ones((2, N), dtype=np.int64)
    keep[0, :2] = 0    # left padding: queries 0 and 1 of sequence 0 see no key
    keep[1, -1] = 0    # right padding
    return keep


def test_operator_reads_integer_masks_as_the_boolean_mask():
    """Attention(...)(u, grids, padding_mask=int64) raised TypeError ('must be a boolean
    array') where run and solve accepted the same mask; now it is the boolean computation."""
    att, weights = _attention()
    grids = Grids(Midpoint(N), Midpoint(D), Midpoint(D_H), context_length=N)
    u = np.random.default_rng(1).standard_normal((2, N, D))
    keep = _mask()
    expected = _reference(u, weights, keep.astype(bool))
    for given in (keep, keep.astype(np.int32), keep.astype(np.uint8), keep.astype(bool)):
        got = att(u, grids, padding_mask=given)
        assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-12
    # the discretized operator of a solve takes the same mask
    flow = att.discretize(grids, padding_mask=keep)
    assert np.max(np.abs(flow(u) - expected)) / np.max(np.abs(expected)) < 1e-12


def test_operator_and_run_agree_on_integer_masks_and_refuse_the_same_values():
    """One rule at both entry points: run(x, int mask) is x + Attn(x) with the operator's
    answer for that mask, and a value 2 is refused by both, by name."""
    att, weights = _attention(2)
    model = Model([Block(attention=att, placement="none")])
    grids = Grids(Midpoint(N), Midpoint(D), Midpoint(D_H), context_length=N)
    x = np.random.default_rng(3).standard_normal((2, N, D))
    keep = _mask()
    by_run = model.run(x, padding_mask=keep)
    by_operator = x + att(x, grids, padding_mask=keep)
    assert np.max(np.abs(by_run - by_operator)) / np.max(np.abs(by_run)) < 1e-12
    assert np.max(np.abs(by_run - (x + _reference(x, weights, keep.astype(bool))))) < 1e-12
    bad = keep.copy()
    bad[1, 0] = 2
    with pytest.raises(ValueError, match=r"padding_mask must .*0 and 1"):
        model.run(x, padding_mask=bad)
    with pytest.raises(ValueError, match=r"padding_mask must hold only 0 and 1 \(1 = keep, 0 = padding\), "
                                         r"got the value 2; pass a boolean mask"):
        att(x, grids, padding_mask=bad)
    with pytest.raises(ValueError, match=r"padding_mask must hold only 0 and 1 .*got the value 2"):
        att.discretize(grids, padding_mask=bad)


def test_torch_integer_mask_on_the_operator():
    torch = require("torch")
    att, weights = _attention(4)
    grids = Grids(Midpoint(N), Midpoint(D), Midpoint(D_H), context_length=N)
    u = np.random.default_rng(5).standard_normal((2, N, D))
    keep = _mask()
    got = att(torch.tensor(u), grids, padding_mask=torch.tensor(keep))
    expected = _reference(u, weights, keep.astype(bool))
    assert np.max(np.abs(got.numpy() - expected)) / np.max(np.abs(expected)) < 1e-12
    with pytest.raises(ValueError, match=r"got the value 3"):
        att(torch.tensor(u), grids, padding_mask=torch.tensor(3 * keep))


def test_local_attention_reads_integer_key_masks():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, N, 4)) for _ in range(3))
    keep = _mask()
    by_int = local_attention(q, k, v, beta=1.0, causal=True, key_mask=keep)
    by_bool = local_attention(q, k, v, beta=1.0, causal=True, key_mask=keep.astype(bool))
    np.testing.assert_array_equal(by_int, by_bool)
    # written out: softmax of q.k over the kept causal keys
    s = np.where(np.tril(np.ones((N, N), dtype=bool)) & keep.astype(bool)[:, None, :],
                 q @ k.swapaxes(-1, -2), -np.inf)
    real = np.isfinite(s).any(-1)
    p = np.exp(s - np.max(np.where(np.isfinite(s), s, -1e300), -1, keepdims=True))
    expected = np.where(real[..., None], p / np.where(real, p.sum(-1), 1.0)[..., None] @ v, 0.0)
    assert np.max(np.abs(by_int - expected)) < 1e-12


class _Table(Mask):
    """A mask holding an array (a subclass as a user writes one)."""

    def __init__(self, table):
        object.__setattr__(self, "table", table)

    def keep(self, p, p_key):
        return np.ones(np.broadcast_shapes(np.shape(p), np.shape(p_key)), dtype=bool)


def test_masks_are_equal_in_any_order_and_different_masks_never_equal():
    """Causal() & SlidingWindow(3) != SlidingWindow(3) & Causal() (the same mask); and a
    subclass holding array([1.]) compared equal to one holding array([[1.]]), array([5]) to 5."""
    a, b = Causal() & SlidingWindow(3), SlidingWindow(3) & Causal()
    assert a == b and hash(a) == hash(b)
    assert a != Causal() & SlidingWindow(4)
    assert a != Causal() and Causal() != a
    assert Intersection(Causal(), SlidingWindow(3), SlidingWindow(5)) != \
        Intersection(Causal(), SlidingWindow(5), SlidingWindow(5))
    assert _Table(np.array([1.0])) != _Table(np.array([[1.0]]))
    assert _Table(np.array([5])) != _Table(5)
    assert _Table(np.array([1, 2])) != _Table(np.array([1.0, 2.0]))
    assert _Table([np.array([1.0, 2.0])]) == _Table([np.array([1.0, 2.0])])
    assert _Table(np.array([1.0, 2.0])) == _Table(np.array([1.0, 2.0]))
    assert _Table(np.array([])) == _Table(np.array([]))
    assert _Table(np.array([1.0, 2.0])) != _Table(np.array([1.0, 3.0]))

"""Attention on tasks of whole sequences: a batch of sequences is shared among the worker
threads sequence by sequence (projections and heads in one task). The blocks follow the
shape only; the values are those of the operator's formula (longdouble) and of the
three-pass evaluation, for every mask, position encoding and head layout the path takes;
padding keys (which differ between sequences) keep the three passes."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import Midpoint
from ctformer.model import ContinuousTransformer
from ctformer.operators import attention_flow
from ctformer._numerics import sequences
from tests.test_small_attention_path import _formula


@pytest.mark.parametrize("shape, expected", [
    ((8, 128, 384), [slice(i, i + 1) for i in range(8)]),
    ((64, 16, 384), [slice(i, i + 8) for i in range(0, 64, 8)]),
    ((9, 64, 32), [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8), slice(8, 9)]),
    ((2, 2, 128, 32), [slice(i, i + 1) for i in range(4)]),   # leading axes flattened
    ((4, 512, 32), [slice(i, i + 1) for i in range(4)]),
    ((3, 128, 32), None),      # three tasks: fewer than four
    ((2, 512, 32), None),
    ((4, 513, 32), None),      # sequences too long to keep on one thread
    ((128, 32), None),         # one sequence
    ((0, 128, 32), None),
    ((8, 0, 32), None),
])
def test_blocks_follow_the_shape(shape, expected):
    assert sequences.sequence_blocks(shape) == expected


CASES = {  # name: random_smooth options, (causal, half diagonal) for the formula or None (RoPE)
    "plain": (dict(), (False, False)),
    "causal, half diagonal": (dict(mask="causal", diagonal="half"), (True, True)),
    "grouped query, causal": (dict(heads=4, kv_heads=2, mask="causal"), (True, False)),
    "RoPE, grouped query": (dict(heads=4, kv_heads=2, positions="rope", context_length=40.0), None),
    "sliding window (banded), ALiBi": (dict(mask="causal", window=10.0, context_length=40.0,
                                             positions="alibi"), None),
}


def _flow(case, n, d=16):
    options = {"heads": 2, **CASES[case][0]}
    model = ContinuousTransformer.random_smooth(seed=3, layers=1, **options)
    grids = model.grids(Midpoint(n), Midpoint(d))
    op = model.blocks[0].attention
    return op, grids, op.discretize(grids)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_tasks_of_sequences_give_the_three_passes_values(monkeypatch, case, dtype):
    op, grids, flow = _flow(case, 40)
    u = np.random.default_rng(7).standard_normal((18, 40, 16)).astype(dtype)  # 5 tasks of 4 sequences, the last of 2
    assert sequences.sequence_blocks(u.shape) is not None
    calls = []
    original = attention_flow.DiscretizedAttention._attend_by_sequences
    monkeypatch.setattr(attention_flow.DiscretizedAttention, "_attend_by_sequences",
                        lambda *a: calls.append(1) or original(*a))
    got = flow(u)
    assert calls and got.dtype == dtype and got.shape == u.shape
    monkeypatch.setattr(attention_flow, "sequence_blocks", lambda shape: None)
    three = op.discretize(grids)(u)
    scale = np.max(np.abs(three))
    assert np.max(np.abs(got.astype(np.float64) - three)) <= (1e-13 if dtype == np.float64 else 2e-6) * scale
    structure = CASES[case][1]
    if structure is not None and dtype == np.float64:
        ref = _formula(op, grids, u, *structure).astype(np.float64)
        assert np.max(np.abs(got - ref)) <= 1e-13 * np.max(np.abs(ref))


def test_padding_keys_keep_the_three_passes():
    op, grids, flow = _flow("causal, half diagonal", 40)
    rng = np.random.default_rng(8)
    real = np.ones((8, 40), dtype=bool)
    real[::2, 30:] = False
    padded = flow.with_padding(real)
    assert flow.engine.per_sequence and not padded.engine.per_sequence
    u = rng.standard_normal((8, 40, 16))
    out = padded(u)
    # each sequence alone, its own padding: the same values
    for b in range(8):
        alone = flow.with_padding(real[b:b + 1])(u[b:b + 1])
        np.testing.assert_allclose(out[b:b + 1], alone, rtol=0, atol=1e-13 * np.max(np.abs(out)))


def test_leading_axes_are_sequences_too():
    """A state (2, 9, N, d): the 18 sequences in 5 blocks, the result laid out as the state's
    leading axes, each sequence's values those of the flattened batch and of the three passes."""
    op, grids, flow = _flow("grouped query, causal", 40)
    u = np.random.default_rng(9).standard_normal((2, 9, 40, 16))
    got = flow(u)
    assert got.shape == u.shape
    np.testing.assert_array_equal(got.reshape(18, 40, 16), flow(u.reshape(18, 40, 16)))
    ref = _formula(op, grids, u, True, False).astype(np.float64)
    assert np.max(np.abs(got - ref)) <= 1e-13 * np.max(np.abs(ref))

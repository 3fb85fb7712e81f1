"""The batched pass of small attention problems when the values carry more leading axes than
the queries and keys: every output row is divided by its own row sum of exponentials."""
import numpy as np
import pytest

from ctformer.operators import quadrature_attention


def _softmax_attention(q, k, v, beta, causal):
    """Float64 softmax attention written out: scores, row maximum, exponentials, row sums."""
    s = beta * (q @ np.swapaxes(k, -1, -2))
    if causal:
        n = s.shape[-1]
        s = np.where(np.tril(np.ones((n, n), dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p @ v) / p.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("q_lead, k_lead, v_lead", [((), (), (3,)), ((), (), (1,)), ((3,), (1,), (2, 1)),
                                                    ((1,), (3,), (2, 1)), ((3,), (3,), (2, 1))])
@pytest.mark.parametrize("mask", [None, "causal"])
@pytest.mark.parametrize("check", [True, False])
def test_values_with_more_leading_axes_than_the_scores(q_lead, k_lead, v_lead, mask, check):
    """q (5, 4) and k (5, 4) against v (3, 5, 2) had raised "axes don't match array" in the
    division by the row sums (the sums had the scores' two axes, the output three); the
    output is now the float64 reference, (3, 5, 2), to 1e-13."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((*q_lead, 5, 4))
    k = rng.standard_normal((*k_lead, 5, 4))
    v = rng.standard_normal((*v_lead, 5, 2))
    out = quadrature_attention(q, k, v, beta=0.5, mask=mask, check=check)
    expected = _softmax_attention(q, k, v, 0.5, mask == "causal")
    assert out.shape == expected.shape == np.broadcast_shapes(q_lead, k_lead, v_lead) + (5, 2)
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-13 * np.abs(expected).max())


def test_broadcast_values_give_each_problem_its_own_attention_in_float32():
    """The same in float32 (one batched pass, a key mask): each of the three value sets
    attended alone gives the matching slice of the broadcast call, to 1e-6 of the float64
    reference."""
    rng = np.random.default_rng(1)
    q, k = (rng.standard_normal((7, 3)).astype(np.float32) for _ in range(2))
    v = rng.standard_normal((3, 7, 5)).astype(np.float32)
    keep = rng.random((1, 7)) < 0.6
    keep[0, 0] = True
    out = quadrature_attention(q, k, v, beta=0.8, mask=keep)
    s = np.float64(np.float32(0.8)) * (q.astype(np.float64) @ k.T.astype(np.float64))
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    expected = (p @ v.astype(np.float64)) / p.sum(axis=-1)[:, None]
    assert out.shape == (3, 7, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    for b in range(3):
        np.testing.assert_allclose(out[b], quadrature_attention(q, k, v[b], beta=0.8, mask=keep),
                                   rtol=1e-6, atol=1e-7)

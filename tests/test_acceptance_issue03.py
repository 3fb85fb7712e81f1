"""Acceptance of issue 3 (operators and the discrete limit): the public names it gives, called
as it writes them, against explicit float64 formulas, closed forms and torch."""
from __future__ import annotations

import inspect

import numpy as np
import pytest

from ctformer import ContinuousTransformer
from ctformer.discretizations import Chebyshev, Fourier, GaussLegendre, Midpoint
from ctformer.kernels import Convolution, PiecewiseConstant, Smooth, SmoothRandom
from ctformer.operators import attention_flow, quadrature_attention

from .conftest import require


def _formula(q, k, v, beta, weights, keep):
    """out_i = sum_j w_j m_ij exp(beta q_i.k_j) v_j / sum_j w_j m_ij exp(beta q_i.k_j), term by
    term in float64 (m_ij a weight: 0, 1/2 on a half diagonal, 1)."""
    out = np.zeros((*q.shape[:-1], v.shape[-1]))
    for lead in np.ndindex(q.shape[:-2]):
        for i in range(q.shape[-2]):
            terms = np.array([weights[j] * keep[i, j] * np.exp(beta * q[lead][i] @ k[lead][j])
                              for j in range(k.shape[-2])])
            out[lead][i] = terms @ v[lead] / terms.sum()
    return out


@pytest.mark.parametrize("mask, diagonal", [(None, "full"), ("causal", "full"), ("causal", "half"), ("array", "full")])
def test_quadrature_attention_is_the_issues_formula(mask, diagonal):
    """Issue 3: 'out_i = sum_j w_j m_ij exp(beta q_i.k_j) v_j / sum_j w_j m_ij exp(beta q_i.k_j),
    for arrays shaped (..., N, d) with any leading batch/head axes ... mask="causal" keeps
    x_j <= x_i and diagonal="half" gives the diagonal cell half weight'; Gauss-Legendre
    weights, two leading axes."""
    rng = np.random.default_rng(11)
    n = 7
    q, k = rng.standard_normal((2, 3, n, 4)), rng.standard_normal((2, 3, n, 4))
    v = rng.standard_normal((2, 3, n, 5))
    weights = GaussLegendre(n).weights
    keep = np.ones((n, n))
    given = None if mask is None else mask
    if mask == "causal":
        keep = np.tril(keep)
        if diagonal == "half":
            np.fill_diagonal(keep, 0.5)
    elif mask == "array":
        given = rng.random((n, n)) < 0.6
        given[:, 0] = True  # every query keeps a key
        keep = given.astype(float)
    got = quadrature_attention(q, k, v, beta=0.7, weights=weights, mask=given, diagonal=diagonal, chunk=None)
    ref = _formula(q, k, v, 0.7, weights, keep)
    assert got.shape == (2, 3, n, 5)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-14 * np.abs(ref).max())
    chunked = quadrature_attention(q, k, v, beta=0.7, weights=weights, mask=given, diagonal=diagonal, chunk=2)
    np.testing.assert_allclose(chunked, ref, rtol=0, atol=1e-14 * np.abs(ref).max())


@pytest.mark.parametrize("change, match", [
    (dict(k=(2, 4, 3)), "k and v must have the same number of tokens, got 4 and 5"),
    (dict(v=(2, 4, 3)), "k and v must have the same number of tokens, got 5 and 4"),
    (dict(k=(2, 5, 2)), "q and k must share the feature size, got 3 and 2"),
    (dict(weights=np.ones(4)), r"weights must have shape \(5,\) \(one per key token\), got \(4,\)"),
    (dict(beta=np.nan), "beta must be finite, got nan"),
    (dict(beta=np.inf), "beta must be finite, got inf"),
    (dict(mask=np.ones((5, 4), bool)),
     r"mask array must have shape \(\.\.\., 5, 5\) or \(\.\.\., 1, 5\), got \(5, 4\)"),
])
def test_quadrature_attention_refuses_bad_input_naming_it(change, match):
    """Issue 3: 'A clear exception for: mismatched shapes between q, k, v or weights; beta not
    finite; a mask of the wrong shape'."""
    rng = np.random.default_rng(0)
    args = {name: rng.standard_normal((2, 5, 3)) for name in "qkv"}
    args.update(beta=1.0)
    for name, value in change.items():
        args[name] = rng.standard_normal(value) if name in "qkv" else value
    with pytest.raises(ValueError, match=match):
        quadrature_attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_from_torch_names_the_module_it_does_not_support():
    """Issue 3: 'a torch module the bridge does not support (say which)'."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    with pytest.raises(TypeError, match="supports torch.nn.TransformerEncoderLayer and torch.nn.TransformerEncoder; "
                                        "got torch.nn.TransformerDecoderLayer"):
        from_torch(torch.nn.TransformerDecoderLayer(8, 2))


def test_kernels_discretize_as_the_issue_states():
    """Issue 3: 'PiecewiseConstant(matrix) (the embedding of a discrete weight A: value
    d_in * A[i, j] on cell (i, j))', kernel matrices are 'kernel values at nodes times
    quadrature weights', Convolution is periodic and applied by FFT: equal to the dense
    circulant product."""
    a = np.arange(1.0, 13.0).reshape(3, 4)
    centres_out, centres_in = Midpoint(3).nodes, Midpoint(4).nodes
    np.testing.assert_array_equal(PiecewiseConstant(a).evaluate(centres_out[:, None], centres_in[None, :]), 4 * a)
    np.testing.assert_array_equal(PiecewiseConstant(a).matrix(Midpoint(3), Midpoint(4)), a)

    def w(y, eta):
        return np.exp(-(y - eta) ** 2) * (1 + y)

    out, inp = GaussLegendre(5), Chebyshev(6)
    np.testing.assert_allclose(Smooth(w).matrix(out, inp), w(out.nodes[:, None], inp.nodes[None, :]) * inp.weights,
                               rtol=1e-15, atol=0)
    random = SmoothRandom(seed=3, modes=4, decay=2.0)
    np.testing.assert_array_equal(random.matrix(out, inp), SmoothRandom(seed=3, modes=4, decay=2.0).matrix(out, inp))
    grid = Fourier(64)
    u = np.random.default_rng(1).standard_normal((3, 64))
    circulant = np.exp(np.cos(2 * np.pi * (grid.nodes[:, None] - grid.nodes[None, :]))) * grid.weights
    got = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z))).apply(u, grid, grid)
    np.testing.assert_allclose(got, u @ circulant.T, rtol=0, atol=1e-14 * np.abs(got).max())


def test_random_smooth_and_solve_keep_the_issues_defaults():
    """Issue 3: 'solve(u0, *, tokens, features, scheme="lie", steps_per_layer=1)' and
    'random_smooth(seed=0, layers=2, heads=2, ..., activation="gelu", mask=None,
    diagonal="full", beta=4.0)'; the renamed norm= is refused naming placement=."""
    params = inspect.signature(ContinuousTransformer.random_smooth).parameters
    expected = dict(seed=0, layers=2, heads=2, activation="gelu", mask=None, diagonal="full", beta=4.0)
    assert {name: params[name].default for name in expected} == expected
    solve = inspect.signature(ContinuousTransformer.solve).parameters
    assert solve["scheme"].default == "lie" and solve["steps_per_layer"].default == 1
    assert all(solve[name].kind is inspect.Parameter.KEYWORD_ONLY for name in ("tokens", "features"))
    with pytest.raises(TypeError, match="placement= says where the norms sit"):
        ContinuousTransformer.random_smooth(seed=0, layers=2, heads=2, norm="pre")


def test_solve_reads_the_grid_on_the_last_two_axes_of_a_batch():
    """Issue 3: 'u0 holds values on the tokens x features grid (axes -2, -1)': a batch equals
    each state solved alone, for lie and euler."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=2, heads=2)
    tokens, features = Midpoint(6), GaussLegendre(5)
    x, y = tokens.nodes[:, None], features.nodes[None, :]
    batch = np.stack([np.cos(4 * y + 1.5 * np.sin(np.pi * x + s)) + 0.3 * np.sin(np.pi * x * y) for s in (0.5, 1.0)])
    for scheme in ("lie", "euler"):
        together = model.solve(batch, tokens=tokens, features=features, scheme=scheme, steps_per_layer=2)
        alone = [model.solve(u, tokens=tokens, features=features, scheme=scheme, steps_per_layer=2) for u in batch]
        np.testing.assert_allclose(together, np.stack(alone), rtol=0, atol=1e-14)


def _small_attention_flow():
    """A discretized attention on 8 tokens x 64 features: products of 8 rows, few enough for
    the small path and many enough for a prepared product where the machine chose one."""
    model = ContinuousTransformer.random_smooth(seed=3, layers=1, heads=2)
    op = model.blocks[0].attention
    return op, model.grids(Midpoint(8), Midpoint(64))


def test_small_attention_plans_follow_the_product_setting(monkeypatch):
    """A small-state plan holds the products that CTFORMER_GEMM chose when it was made: a
    plan made under auto (where this machine prepares float64 products of few rows) was
    kept after CTFORMER_GEMM=numpy, 4.2e-17 off NumPy's bits, and a bad value set after the
    first call was not refused. Now the plans follow the setting: the general path's bits
    under each value, and a bad value refused at every call."""
    monkeypatch.delenv("CTFORMER_GEMM", raising=False)
    op, grids = _small_attention_flow()
    u = np.random.default_rng(5).standard_normal((8, 64))
    flow = op.discretize(grids)
    flow._small.clear()
    results = {}
    for value in ("auto", "numpy", "auto"):
        monkeypatch.setenv("CTFORMER_GEMM", value)
        results.setdefault(value, []).append(flow(u))
        assert flow._small[(u.shape, u.dtype)] is not None  # the small path was taken
    monkeypatch.setenv("CTFORMER_GEMM", "fastest")
    for _ in range(2):
        with pytest.raises(ValueError, match="CTFORMER_GEMM must be one of auto, numpy, torch"):
            flow(u)
    monkeypatch.setattr(attention_flow._SmallPlan, "of", classmethod(lambda cls, attention, u: None))
    for value, got in results.items():
        monkeypatch.setenv("CTFORMER_GEMM", value)
        flow._small.clear()
        general = flow(u)
        for each in got:
            np.testing.assert_array_equal(each, general)
    # and the formula, from the operator's own matrices (float64 through longdouble)
    wide = np.longdouble
    qkv = u.astype(wide) @ flow.constants.host["QKV_t"].astype(wide) + flow.constants.host["b_QKV"]
    heads = qkv.reshape(8, 6, 64).swapaxes(0, 1)
    q, k, v = heads[:2], heads[2:4], heads[4:]
    scores = flow.constants.host["beta"].astype(wide)[:, None, None] * (q @ k.swapaxes(-1, -2))
    p = np.exp(scores - scores.max(-1, keepdims=True))
    attended = (p / p.sum(-1, keepdims=True)) @ v
    host = flow.constants.host
    ref = (attended.swapaxes(0, 1).reshape(8, 128) @ host["O"].astype(wide) + host["b_O"]).astype(np.float64)
    np.testing.assert_allclose(results["numpy"][0], ref, rtol=0, atol=1e-14 * np.abs(ref).max())

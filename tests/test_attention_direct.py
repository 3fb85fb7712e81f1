"""``Attention`` called directly (issue 19, items 2 and 6): the public call validates its input
once and is scale-safe (``1e300 * u``, ``beta=1e308``: the finite hard-max limit, never NaN),
and a query without keys gets attention output zero. Every number is checked against an
independent float64 NumPy forward of the discrete multi-head attention."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctformer.discretizations import Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.operators import Attention, Grids
from ctformer.operators.positions import ALiBi
from tests.conftest import require

# Derandomized: every run tries the same examples (a red run is reproducible).
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

KINDS = ["plain", "causal", "window", "alibi"]


def _attention(rng, kind, *, d=8, heads=2, kv_heads=None, d_h=4, bias=True, beta=None):
    """A random discrete multi-head attention as an ``Attention`` and its matrices.

    On ``Midpoint`` grids a ``PiecewiseConstant`` kernel is its matrix, the head-feature
    weights are 1/d_h, and positions are the integers 0..N-1 (context length N)."""
    kv = kv_heads or heads
    mats = {"Q": rng.standard_normal((heads, d_h, d)) / math.sqrt(d),
            "K": rng.standard_normal((kv, d_h, d)) / math.sqrt(d),
            "V": rng.standard_normal((kv, d_h, d)) / math.sqrt(d),
            "O": rng.standard_normal((heads, d, d_h)) / math.sqrt(d_h * heads)}
    biases = {n: (0.1 * rng.standard_normal(mats[n].shape[:2]) if bias else None) for n in "QKV"}
    biases["O"] = 0.1 * rng.standard_normal(d) if bias else None
    beta = np.sqrt(d_h) * (1.0 + 0.2 * np.arange(heads)) if beta is None else np.full(heads, float(beta))
    options = dict(mask="causal" if kind != "plain" else None,
                   window=3.0 if kind == "window" else None,
                   positions=ALiBi() if kind == "alibi" else None)
    kernels = [[PiecewiseConstant(m) for m in mats[n]] for n in "QKVO"]
    bias_lists = {f"b_{n}": None if biases[n] is None else list(biases[n]) for n in "QKV"}
    att = Attention(*kernels, b_O=biases["O"], beta=beta, kv_heads=kv_heads, **bias_lists, **options)
    slopes = ALiBi().slopes_for(heads) if kind == "alibi" else np.zeros(heads)
    return att, dict(mats=mats, biases=biases, beta=beta, kind=kind, slopes=slopes, heads=heads, kv=kv)


def _grids(n, d, d_h):
    return Grids(Midpoint(n), Midpoint(d), Midpoint(d_h), context_length=n)


def _allowed(kind, n, padding):
    """The (…, N, N) boolean matrix of admissible keys: structure and padding."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = np.ones((n, n), bool)
    if kind != "plain":
        keep &= j <= i
    if kind == "window":
        keep &= i - j < 3
    if padding is not None:
        keep = keep & padding[..., None, :]
    return keep


def _reference(u, ref, padding=None, hard=False):
    """Plain float64 NumPy multi-head attention; ``hard``: the limit beta -> inf (arg max).

    A query with no admissible key gets attention output zero."""
    n = u.shape[-2]
    mats, biases = ref["mats"], ref["biases"]
    d_h = mats["Q"].shape[1]
    keep = _allowed(ref["kind"], n, padding)
    dist = np.abs(np.arange(n)[:, None] - np.arange(n)[None, :])
    out = 0.0 if biases["O"] is None else biases["O"]
    groups = ref["heads"] // ref["kv"]
    for h in range(ref["heads"]):
        g = h // groups
        q, k, v = (u @ mats[n_].__getitem__(i).T + (0 if biases[n_] is None else biases[n_][i])
                   for n_, i in (("Q", h), ("K", g), ("V", g)))
        s = q @ np.swapaxes(k, -1, -2)
        if not hard:  # the hard limit (beta > 0): only the order of q . k counts
            s = ref["beta"][h] / d_h * s - ref["slopes"][h] * dist
        s = np.where(keep, s, -np.inf)
        top = s.max(-1, keepdims=True)
        if hard:
            p = (s == top).astype(float)
        else:
            with np.errstate(invalid="ignore", over="ignore"):
                p = np.exp(s - top)
        p = np.where(keep, p, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            a = np.where(keep.any(-1)[..., None], (p @ v) / p.sum(-1, keepdims=True), 0.0)
        out = out + a @ mats["O"][h].T
    return out


def _rel(got, ref):
    return float(np.abs(got - ref).max() / np.abs(ref).max())


# -- the user's reproducers -------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_huge_input_gives_the_hard_max_limit_not_nan(kind):
    """Attention(1e300 u): the scores overflow, the exact answer is the hard-max limit
    (without biases attention is homogeneous: out(c u) = c out_hard(u))."""
    rng = np.random.default_rng(1)
    att, ref = _attention(rng, kind, bias=False)
    u = rng.standard_normal((2, 7, 8))
    got = att(1e300 * u, _grids(7, 8, 4))
    assert np.all(np.isfinite(got))
    assert _rel(got / 1e300, _reference(u, ref, hard=True)) < 1e-13
    # ordinary inputs are unchanged by the scale-safe path: the plain float64 forward
    assert _rel(att(u, _grids(7, 8, 4)), _reference(u, ref)) < 1e-13
    # the discretized callable (a solve's validated state) is the same at ordinary sizes
    assert _rel(att.discretize(_grids(7, 8, 4))(u), _reference(u, ref)) < 1e-13


@pytest.mark.parametrize("kind", KINDS)
def test_beta_1e308_gives_the_hard_max_limit(kind):
    rng = np.random.default_rng(2)
    att, ref = _attention(rng, kind, beta=1e308)
    u = rng.standard_normal((7, 8))
    got = att(u, _grids(7, 8, 4))
    assert np.all(np.isfinite(got))
    assert _rel(got, _reference(u, ref, hard=True)) < 1e-13


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("kv_heads", [None, 1])
def test_query_without_keys_gets_zero_attention(kind, kv_heads):
    """A padding mask that leaves queries without keys (left padding with the causal mask; for
    the non-causal kinds a fully padded sequence): attention output 0, output row = b_O."""
    rng = np.random.default_rng(3)
    att, ref = _attention(rng, kind, kv_heads=kv_heads)
    u = rng.standard_normal((3, 6, 8))
    padding = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]], bool)
    if kind == "plain":
        padding[2] = False   # no key at all for every query of sequence 2
    grids = _grids(6, 8, 4)
    expected = _reference(u, ref, padding)
    empty = ~_allowed(kind, 6, padding).any(-1)
    assert empty.sum() >= 2
    for got in (att(u, grids, padding_mask=padding), att.discretize(grids, padding_mask=padding)(u)):
        assert np.all(np.isfinite(got))
        assert _rel(got, expected) < 1e-13
        assert np.abs(got[empty] - ref["biases"]["O"]).max() < 1e-15


def test_not_representable_output_raises_a_floating_point_error():
    rng = np.random.default_rng(4)
    att, _ = _attention(rng, "plain", bias=False)
    u = 1e308 * np.sign(rng.standard_normal((5, 8)))   # |q| ~ 1e308 sqrt(8) > finfo.max
    with pytest.raises(FloatingPointError, match="projection of u overflow float64.*scale u down"):
        att(u, _grids(5, 8, 4))
    with pytest.raises(ValueError, match="NaN or inf"):
        att(np.full((5, 8), np.nan), _grids(5, 8, 4))


@pytest.mark.parametrize("kind", KINDS[1:])
def test_torch_namespace_huge_input_and_empty_rows(kind):
    torch = require("torch")
    rng = np.random.default_rng(5)
    att, ref = _attention(rng, kind, bias=False)
    u = rng.standard_normal((2, 6, 8))
    padding = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]], bool)
    got = att(torch.from_numpy(1e300 * u), _grids(6, 8, 4), padding_mask=torch.from_numpy(padding))
    assert isinstance(got, torch.Tensor) and bool(torch.isfinite(got).all())
    assert _rel(got.numpy() / 1e300, _reference(u, ref, padding, hard=True)) < 1e-13


# -- properties -------------------------------------------------------------------------------
@st.composite
def cases(draw):
    kind = draw(st.sampled_from(KINDS))
    n = draw(st.integers(1, 9))
    batch = draw(st.integers(1, 3))
    kv_heads = draw(st.sampled_from([None, 1]))
    dtype = draw(st.sampled_from(["float64", "float32"]))
    top = 300 if dtype == "float64" else 35
    exponent = draw(st.integers(-top, top))
    bits = draw(st.lists(st.booleans(), min_size=batch * n, max_size=batch * n))
    seed = draw(st.integers(0, 2**16))
    return kind, n, batch, kv_heads, dtype, exponent, np.array(bits).reshape(batch, n), seed


@SETTINGS
@given(cases())
def test_direct_call_is_finite_and_matches_numpy_softmax(case):
    """Any finite scale and any padding (rows without keys included): a finite answer, equal
    to the plain float64 softmax reference wherever that reference is finite."""
    kind, n, batch, kv_heads, dtype, exponent, padding, seed = case
    rng = np.random.default_rng(seed)
    att, ref = _attention(rng, kind, kv_heads=kv_heads, bias=False)
    u = rng.standard_normal((batch, n, 8)) * 10.0**exponent
    u = u.astype(dtype)
    got = att(u, _grids(n, 8, 4), padding_mask=padding)
    assert got.dtype == np.dtype(dtype) and np.all(np.isfinite(got))
    with np.errstate(over="ignore", invalid="ignore"):
        expected = _reference(u.astype(np.float64), ref, padding)
    scale = float(np.abs(u).max()) or 1.0
    if np.all(np.isfinite(expected)) and scale < 1e3:  # well-conditioned softmax
        tol = 1e-12 if dtype == "float64" else 1e-4
        assert np.abs(got - expected).max() <= tol * max(np.abs(expected).max(), 1e-300)
    else:  # large scores: the limit is the hard maximum, out(c u) = c out_hard(u)
        limit = _reference(u.astype(np.float64) / scale, ref, padding, hard=True) * scale
        hard_ok = _hard_limit_applies(u.astype(np.float64) / scale, ref, padding, scale, dtype)
        if hard_ok:
            tol = 1e-12 if dtype == "float64" else 1e-5
            assert np.abs(got - limit).max() <= tol * max(np.abs(limit).max(), 1e-300)


def _hard_limit_applies(u, ref, padding, scale, dtype):
    """True when every head's top two kept scores of ``scale * u`` differ by more than 50 (the
    softmax is then its hard maximum to e^-50) and by far more than their rounding."""
    n = u.shape[-2]
    keep = _allowed(ref["kind"], n, padding)
    d_h = ref["mats"]["Q"].shape[1]
    eps = np.finfo(dtype).eps
    groups = ref["heads"] // ref["kv"]
    for h in range(ref["heads"]):
        q = u @ ref["mats"]["Q"][h].T
        k = u @ ref["mats"]["K"][h // groups].T
        s = ref["beta"][h] / d_h * q @ np.swapaxes(k, -1, -2)
        s = np.where(keep, s, -np.inf)
        rows = np.broadcast_to(keep.sum(-1) >= 2, s.shape[:-1])
        if not rows.any():
            continue
        srt = np.sort(s[rows], axis=-1)   # rows with two kept keys: the top two are finite
        gap = srt[:, -1] - srt[:, -2]
        if np.min(gap) < 50 / scale / scale or np.min(gap) < 1e3 * eps * np.abs(srt[:, -1]).max():
            return False
    return True

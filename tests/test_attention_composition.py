"""Attention composed of position and mask objects (issue 20, item 2).

Every composition is checked against two independent things: the flag constructor that built
the same model before (``mask="causal"``, ``diagonal=``, ``window=``, ``positions=``), and a
float64 torch ``scaled_dot_product_attention`` per head with the mask and the score terms built
by hand as one additive matrix (``-inf`` where a key is dropped, :math:`\\log \\tfrac12` on a
half-weight diagonal, :math:`-m_h |i - j|` for ALiBi), and queries rotated by hand for RoPE.
A position encoding and a mask written here (one class each) plug in without library edits.
"""
from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from ctformer.discretizations import Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.operators import (ALiBi, Attention, AxialRoPE, Causal, Grids, Mask, NoPositions, Padding,
                                PositionEncoding, RoPE, SlidingWindow, mask_pattern, window_pattern)
from ctformer.operators.local_attention import BandedAttention
from tests.conftest import require

N, D, D_H, HEADS = 9, 8, 4, 2
TOL = 1e-13


def _weights(rng, heads=HEADS, kv=HEADS):
    mats = {"Q": rng.standard_normal((heads, D_H, D)) / math.sqrt(D),
            "K": rng.standard_normal((kv, D_H, D)) / math.sqrt(D),
            "V": rng.standard_normal((kv, D_H, D)) / math.sqrt(D),
            "O": rng.standard_normal((heads, D, D_H)) / math.sqrt(D_H * heads)}
    biases = {n: 0.1 * rng.standard_normal(mats[n].shape[:2]) for n in "QKV"}
    biases["O"] = 0.1 * rng.standard_normal(D)
    beta = math.sqrt(D_H) * (1.0 + 0.3 * np.arange(heads))
    return mats, biases, beta


def _attention(weights, kv_heads=None, **options):
    mats, biases, beta = weights
    kernels = [[PiecewiseConstant(m) for m in mats[n]] for n in "QKVO"]
    return Attention(*kernels, b_Q=list(biases["Q"]), b_K=list(biases["K"]), b_V=list(biases["V"]),
                     b_O=biases["O"], beta=beta, kv_heads=kv_heads, **options)


def _grids():
    return Grids(Midpoint(N), Midpoint(D), Midpoint(D_H), context_length=N)


def _rope_tables(theta=10000.0):
    """HuggingFace rotary tables on positions 0..N-1: frequency theta^(-tau) at the pair
    coordinates tau = 2 sigma of the Midpoint(D_H) nodes sigma < 1/2."""
    tau = (2 * np.arange(D_H // 2) + 1) / D_H
    angles = np.arange(N)[:, None] * theta ** -tau[None, :]
    return np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))


def _sdpa_reference(u, weights, keep, score=None, rope=False, kv=HEADS):
    """Multi-head attention by torch SDPA in float64 with an explicit additive mask.

    ``keep``: boolean (..., N, N); ``score``: extra score terms (HEADS, N, N) or None. A query
    without keys gets attention output zero (the integral over an empty set)."""
    torch = require("torch")
    functional = torch.nn.functional
    mats, biases, beta = weights
    x = torch.from_numpy(u)
    keep = np.broadcast_to(keep, (*u.shape[:-2], N, N))
    out = torch.from_numpy(biases["O"]).expand(*u.shape[:-1], D).clone()
    for h in range(HEADS):
        g = h * kv // HEADS

        def project(name, i):
            return x @ torch.from_numpy(mats[name][i]).T + torch.from_numpy(biases[name][i])
        q, k, v = project("Q", h), project("K", g), project("V", g)
        if rope:
            cos, sin = (torch.from_numpy(t) for t in _rope_tables())

            def rotate(a):
                return a * cos + torch.cat([-a[..., D_H // 2:], a[..., :D_H // 2]], -1) * sin
            q, k = rotate(q), rotate(k)
        additive = np.where(keep, 0.0, -np.inf) + (0.0 if score is None else score[h])
        empty = ~keep.any(-1)
        safe = np.where(empty[..., None], 0.0, additive)   # SDPA gives NaN on rows without keys
        attended = functional.scaled_dot_product_attention(
            q * (beta[h] / D_H), k, v, attn_mask=torch.from_numpy(safe), scale=1.0)
        attended = attended.masked_fill(torch.from_numpy(empty)[..., None], 0.0)
        out = out + attended @ torch.from_numpy(mats["O"][h]).T
    return out.numpy()


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


I, J = np.arange(N)[:, None], np.arange(N)[None, :]
CAUSAL = J <= I
HALF = np.where(I == J, math.log(0.5), 0.0)[None].repeat(HEADS, 0)
ALIBI = -ALiBi().slopes_for(HEADS)[:, None, None] * np.abs(I - J)[None]
PADDING = np.array([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 0, 0]], bool)

# (objects, the flag keywords that built the same model before, kept pairs, score terms)
CASES = {
    "causal-full": (dict(mask=Causal()), dict(mask="causal"), CAUSAL, None),
    "causal-half": (dict(mask=Causal(diagonal="half")), dict(mask="causal", diagonal="half"),
                    CAUSAL, HALF),
    "sliding-window": (dict(mask=Causal() & SlidingWindow(3)), dict(mask="causal", window=3),
                       CAUSAL & (I - J < 3), None),
    "alibi": (dict(positions=ALiBi()), dict(positions=ALiBi()), np.ones((N, N), bool), ALIBI),
    "alibi-causal-half": (dict(mask=Causal("half"), positions=ALiBi()),
                          dict(mask="causal", diagonal="half", positions=ALiBi()), CAUSAL, HALF + ALIBI),
    "alibi-window": (dict(mask=SlidingWindow(4) & Causal(), positions=ALiBi()),
                     dict(mask="causal", window=4, positions=ALiBi()), CAUSAL & (I - J < 4), ALIBI),
    "rope-causal": (dict(mask=Causal(), positions=RoPE()), dict(mask="causal", positions=RoPE()),
                    CAUSAL, None),
    "rope-window": (dict(mask=Causal() & SlidingWindow(2.5), positions=RoPE()),
                    dict(mask="causal", window=2.5, positions=RoPE()), CAUSAL & (I - J < 2.5), None),
}


# the half-weight diagonal combines with no padding (refused, tested below)
@pytest.mark.parametrize("name, padded", [(name, padded) for name in CASES for padded in (False, True)
                                          if not (padded and name.endswith("half"))])
def test_composed_objects_equal_flags_and_sdpa(name, padded):
    """Objects, flags and a hand-built SDPA mask agree, with and without a padding mask."""
    objects, flags, keep, score = CASES[name]
    weights = _weights(np.random.default_rng(7))
    u = np.random.default_rng(8).standard_normal((2, N, D))
    padding = PADDING if padded else None
    composed, flagged = _attention(weights, **objects), _attention(weights, **flags)
    got = composed(u, _grids(), padding_mask=padding)
    expected = _sdpa_reference(u, weights, keep if padding is None else keep & padding[:, None, :],
                               score, rope="rope" in name)
    assert _rel(got, expected) < TOL
    np.testing.assert_array_equal(flagged(u, _grids(), padding_mask=padding), got)
    solved = composed.discretize(_grids(), padding_mask=padding)(u)
    assert _rel(solved, expected) < TOL


def test_bidirectional_window_and_padding_in_the_constructor():
    """SlidingWindow alone keeps |i - j| < W (no flag built it); a Padding object in the mask
    equals the same padding handed to the call."""
    weights = _weights(np.random.default_rng(1))
    u = np.random.default_rng(2).standard_normal((2, N, D))
    expected = _sdpa_reference(u, weights, (np.abs(I - J) < 3) & PADDING[:, None, :])
    window = _attention(weights, mask=SlidingWindow(3))
    assert _rel(window(u, _grids(), padding_mask=PADDING), expected) < TOL
    inside = _attention(weights, mask=SlidingWindow(3) & Padding(PADDING))
    assert _rel(inside(u, _grids()), expected) < TOL


def test_grouped_query_heads_with_window_rope_and_padding():
    weights = _weights(np.random.default_rng(3), kv=1)
    u = np.random.default_rng(4).standard_normal((2, N, D))
    att = _attention(weights, kv_heads=1, mask=Causal() & SlidingWindow(3), positions=RoPE())
    expected = _sdpa_reference(u, weights, CAUSAL & (I - J < 3) & PADDING[:, None, :], rope=True, kv=1)
    assert _rel(att(u, _grids(), padding_mask=PADDING), expected) < TOL


def test_grouped_query_heads_with_alibi_and_padding():
    # ALiBi's slopes laid out as (kv_heads, groups) on the dense engine, head h = g * groups + r
    weights = _weights(np.random.default_rng(11), kv=1)
    u = np.random.default_rng(12).standard_normal((2, N, D))
    att = _attention(weights, kv_heads=1, mask=Causal(), positions=ALiBi())
    for padding, keep in ((None, CAUSAL), (PADDING, CAUSAL & PADDING[:, None, :])):
        expected = _sdpa_reference(u, weights, keep, ALIBI, kv=1)
        assert _rel(att(u, _grids(), padding_mask=padding), expected) < TOL


def test_engine_follows_the_pattern():
    """A finite band, or a score term other than ALiBi's, takes the banded engine; no band the
    dense one, ALiBi's term included (evaluated there block by block)."""
    weights = _weights(np.random.default_rng(0))
    banded = [dict(mask=SlidingWindow(3)), dict(mask=Causal() & SlidingWindow(3), positions=ALiBi()),
              dict(mask=Causal(), positions=_Gaussian([0.1, 0.2]))]
    dense = [dict(), dict(mask=Causal()), dict(mask=Causal(), positions=RoPE()), dict(mask=_EvenDistance()),
             dict(positions=ALiBi()), dict(mask=Causal(), positions=ALiBi()),
             dict(mask=_EvenDistance() & Causal(), positions=ALiBi())]
    for options, expected in [(o, True) for o in banded] + [(o, False) for o in dense]:
        engine = _attention(weights, **options).discretize(_grids()).engine
        assert isinstance(getattr(engine, "engine", None), BandedAttention) is expected, options


def test_a_window_no_shorter_than_the_grid_is_left_out():
    """On N = 9 tokens at positions 0..8, SlidingWindow(W) keeps every pair iff N - 1 < W: from
    W = 9 the causal window is the causal mask, on the dense engine with its bits; at W = 8 it
    is banded and drops the key 8 positions back."""
    p = np.arange(N, dtype=np.float64)
    assert [SlidingWindow(w).keeps_all(p, p) for w in (8, 8.5, 9, 100)] == [False, True, True, True]
    assert not Causal().keeps_all(p, p)
    weights = _weights(np.random.default_rng(4))
    u = np.random.default_rng(5).standard_normal((2, N, D))
    causal = _attention(weights, mask=Causal()).discretize(_grids())
    for width in (9, 100):
        wide = _attention(weights, mask=Causal() & SlidingWindow(width)).discretize(_grids())
        assert getattr(wide.engine, "engine", None) is None
        assert np.array_equal(wide(u), causal(u))
    narrow = _attention(weights, mask=Causal() & SlidingWindow(8)).discretize(_grids())
    assert isinstance(narrow.engine.engine, BandedAttention)
    keep = np.tril(np.ones((N, N), dtype=bool)) & ~np.tril(np.ones((N, N), dtype=bool), -8)
    assert np.abs(narrow(u) - _sdpa_reference(u, weights, keep)).max() < TOL
    assert np.abs(narrow(u) - causal(u)).max() > 1e-6


@pytest.mark.parametrize("n, tokens", [(9, 9), (9, 27), (16, 40)])
def test_composed_window_pattern_equals_window_pattern(n, tokens):
    """Causal() & SlidingWindow(W) keeps exactly window_pattern's entries, on refined grids too."""
    p = Grids(Midpoint(tokens), Midpoint(2), context_length=n).positions()
    for width in (1, 2.5, 3, n):
        got = mask_pattern(Causal() & SlidingWindow(width), p).todense()
        np.testing.assert_array_equal(got, window_pattern(p, width).todense())


# -- what a user writes: one class each ----------------------------------------------------------
class _EvenDistance(Mask):
    """Keys at an even distance p(x) - p(x') (a dilated pattern, no band)."""

    def keep(self, p, p_key):
        return np.round(np.asarray(p) - np.asarray(p_key)) % 2 == 0


class _Gaussian(PositionEncoding):
    """The score term -c_h (p(x) - p(x'))^2, one width c_h per head."""

    def __init__(self, widths):
        self.widths = np.asarray(widths, dtype=np.float64)

    def score_bias(self, heads):
        widths = self.widths

        def bias(difference):
            return -(widths[:, None, None] * difference ** 2)
        return bias


def test_user_mask_plugs_in():
    weights = _weights(np.random.default_rng(5))
    u = np.random.default_rng(6).standard_normal((2, N, D))
    even = (I - J) % 2 == 0
    for mask, keep in ((_EvenDistance(), even), (_EvenDistance() & Causal(), even & CAUSAL)):
        att = _attention(weights, mask=mask)
        expected = _sdpa_reference(u, weights, keep & PADDING[:, None, :])
        assert _rel(att(u, _grids(), padding_mask=PADDING), expected) < TOL
    alibi = _attention(weights, mask=_EvenDistance() & Causal(), positions=ALiBi())   # a pattern and a term
    assert _rel(alibi(u, _grids()), _sdpa_reference(u, weights, even & CAUSAL, ALIBI)) < TOL


def test_user_position_encoding_plugs_in():
    weights = _weights(np.random.default_rng(9))
    u = np.random.default_rng(10).standard_normal((2, N, D))
    widths = [0.05, 0.4]
    gauss = -np.asarray(widths)[:, None, None] * ((I - J) ** 2)[None]
    att = _attention(weights, mask=Causal(), positions=_Gaussian(widths))
    expected = _sdpa_reference(u, weights, CAUSAL & PADDING[:, None, :], gauss)
    assert _rel(att(u, _grids(), padding_mask=PADDING), expected) < TOL
    assert _rel(att(u, _grids()), _sdpa_reference(u, weights, CAUSAL, gauss)) < TOL
    grouped = _weights(np.random.default_rng(11), kv=1)    # one key/value head for both
    att = _attention(grouped, kv_heads=1, positions=_Gaussian(widths))
    assert _rel(att(u, _grids()), _sdpa_reference(u, grouped, np.ones((N, N), bool), gauss, kv=1)) < TOL


# -- the objects' own contract -------------------------------------------------------------------
def test_mask_objects_are_values_and_refuse_bad_combinations():
    assert Causal() == Causal("full") != Causal("half")
    assert SlidingWindow(3) == SlidingWindow(3.0) != SlidingWindow(4)
    assert (Causal() & SlidingWindow(3)).parts() == (Causal(), SlidingWindow(3))
    assert pickle.loads(pickle.dumps(Causal() & SlidingWindow(3))) == Causal() & SlidingWindow(3)
    with pytest.raises(AttributeError, match="immutable"):
        Causal().diagonal = "half"
    with pytest.raises(ValueError, match=r"Causal\(diagonal='half'\) combines with no other mask"):
        Causal("half") & SlidingWindow(3)
    with pytest.raises(ValueError, match="diagonal must be one of 'full', 'half'"):
        Causal("third")
    with pytest.raises(ValueError, match=r"width \(of the sliding window\) must be a finite positive"):
        SlidingWindow(0)
    weights = _weights(np.random.default_rng(0))
    with pytest.raises(ValueError, match="write them into it"):
        _attention(weights, mask=Causal(), window=3)
    att = _attention(weights, mask=Causal("half"))
    with pytest.raises(ValueError, match="combines with no other mask"):
        att.discretize(_grids(), padding_mask=PADDING)


def test_attention_reads_its_objects():
    weights = _weights(np.random.default_rng(0))
    flagged = _attention(weights, mask="causal", window=3, positions=ALiBi())
    assert flagged.mask == Causal() & SlidingWindow(3) and flagged.window == 3.0
    assert flagged.diagonal == "full" and isinstance(flagged.positions, ALiBi)
    plain = _attention(weights)
    assert plain.mask is None and plain.window is None and plain.positions == NoPositions()
    assert repr(flagged).endswith("mask=Causal() & SlidingWindow(3.0), positions=ALiBi(slopes=default))")
    with pytest.raises(ValueError, match="ALiBi has 3 slopes; the attention has 2 heads"):
        _attention(weights, positions=ALiBi([1.0, 0.5, 0.25]))
    with pytest.raises(ValueError, match="AxialRoPE rotates with the two positions"):
        _attention(weights, positions=AxialRoPE())(np.zeros((N, D)), _grids())


def test_positions_page_blocks_run():
    """The Python blocks of docs/positions.rst run in order and their asserts hold (a mask and
    an encoding written there checked against the formulas)."""
    from tests.test_docs_pages import python_blocks

    namespace = {}
    blocks = python_blocks("positions.rst")
    assert len(blocks) == 2
    for block in blocks:
        exec(compile(block, "docs/positions.rst", "exec"), namespace)


class _FirstAxisOnly:
    """omega(tau) = 100^(-2 tau) on the x1 pairs (tau < 1/2), 0 on the x2 pairs."""

    def __call__(self, tau):
        tau = np.asarray(tau, dtype=np.float64)
        return np.where(tau < 0.5, 100.0 ** (-2.0 * tau), 0.0)


def test_axial_rope_on_patches_with_one_column_is_rope_on_the_first_axis():
    """On n x 1 patches every token has the same x2 position, so the x2 rotations cancel in the
    scores: AxialRoPE equals one-dimensional RoPE whose x2 pairs do not turn."""
    from ctformer.discretizations import Product

    weights = _weights(np.random.default_rng(12))
    u = np.random.default_rng(13).standard_normal((2, 6, D))
    axial = _attention(weights, positions=AxialRoPE(theta=100.0))(
        u, Grids(Product(Midpoint(6), Midpoint(1)), Midpoint(D), Midpoint(D_H), context_length=(6, 3)))
    line = _attention(weights, positions=RoPE(frequencies=_FirstAxisOnly()))(
        u, Grids(Midpoint(6), Midpoint(D), Midpoint(D_H), context_length=6))
    assert _rel(axial, line) < 1e-13
    plain = _attention(weights)(u, Grids(Midpoint(6), Midpoint(D), Midpoint(D_H)))
    assert _rel(axial, plain) > 1e-3    # the rotation does something


def test_incomplete_mask_and_length_frequencies_are_refused_when_made():
    """The contracts are abstract: a Mask without keep, or LengthFrequencies without at, cannot
    be instantiated (instead of failing at the first solve)."""
    from ctformer.operators import LengthFrequencies

    class _NoKeep(Mask):
        pass

    class _NoTable(LengthFrequencies):
        pass

    for incomplete, method in ((_NoKeep, "keep"), (_NoTable, "at")):
        with pytest.raises(TypeError, match=f"abstract method '?{method}'?"):
            incomplete()

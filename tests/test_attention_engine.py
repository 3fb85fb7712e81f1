"""Which engine takes softmax attention that torch's fused kernel could take:
``CTFORMER_ATTENTION_ENGINE`` pins it (``fused`` / ``streamed``), and with ``auto`` long plain
and causal problems run on the engine measured faster on this machine, kept only when it wins clearly
(ctformer._numerics.fused.fused_chosen, engine_verdict). Either engine gives softmax attention
to rounding against a float64 evaluation of the formula."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import fused, gemm
from ctformer.operators.quadrature_attention import quadrature_attention

from .conftest import fused_path_on, require

torch = require("torch")

BIG = fused._CALIBRATED_MIN_SCORES


def test_verdict_keeps_the_kernel_unless_the_streamed_engine_wins_clearly():
    kernel = [1.0] * 9
    clear = fused.engine_verdict(kernel, [0.8] * 9)
    assert clear["provider"] == "numpy" and clear["wins"] == 9 and clear["ratio"] == pytest.approx(0.8)
    # a median below the margin from a few large wins, most pairs lost: the kernel stays
    mixed = fused.engine_verdict(kernel, [0.5] * 5 + [1.05] * 4)
    assert mixed["ratio"] == pytest.approx(0.5) and mixed["wins"] == 5 and mixed["provider"] == "torch"
    # every pair won, but by less than the margin: the kernel stays
    close = fused.engine_verdict(kernel, [0.95] * 9)
    assert close["wins"] == 9 and close["provider"] == "torch"
    assert fused.engine_verdict([2.0] * 9, [1.0] * 9)["torch_s"] == 2.0


@pytest.mark.parametrize("engine, causal, scores, expected", [
    ("fused", True, BIG, True), ("fused", False, 10, True),
    ("streamed", True, BIG, False), ("streamed", False, BIG, False),
])
def test_the_setting_pins_the_engine(monkeypatch, engine, causal, scores, expected):
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", engine)
    monkeypatch.setattr(gemm, "_measured", lambda *a: pytest.fail("a pinned engine measures nothing"))
    assert fused.fused_chosen(np.float64, causal, scores) is expected


@pytest.mark.parametrize("stored", ["numpy", "torch"])
def test_auto_asks_the_measurement_for_long_problems_only(monkeypatch, stored):
    """Short problems go to the kernel unasked; long ones to the engine measured on this
    machine, plain and causal apart (the plain one after the packed blocks' choice, which its
    streamed side uses)."""
    monkeypatch.delenv("CTFORMER_ATTENTION_ENGINE", raising=False)
    asked = []
    monkeypatch.setattr(gemm, "_measured", lambda kind, dtype, *a: asked.append((kind, dtype)) or stored)
    assert fused.fused_chosen(np.float64, True, BIG - 1) is True  # short causal: the kernel
    assert fused.fused_chosen(np.float64, False, BIG - 1) is True  # short plain: the kernel
    assert not asked
    assert fused.fused_chosen(np.float32, True, BIG) is (stored == "torch")
    assert ("causal attention", "float32") in asked and ("plain attention", "float32") not in asked
    assert fused.fused_chosen(np.float64, False, 4 * BIG) is (stored == "torch")
    assert ("plain attention", "float64") in asked


def test_a_bad_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", "flash")
    with pytest.raises(ValueError, match="CTFORMER_ATTENTION_ENGINE"):
        fused.fused_chosen(np.float64, True, BIG)


@pytest.mark.parametrize("where", ["small path", "general path", "quadrature_attention", "torch"])
def test_a_bad_setting_is_refused_at_every_size(monkeypatch, where):
    """Every attention evaluation reads the setting, also those it decides nothing for (a
    16-token problem): a typo is refused at once, not at the first long problem. For torch
    tensors it chooses between torch's fused kernel and the library's query chunks."""
    from ctformer.discretizations import Midpoint
    from ctformer.model import ContinuousTransformer
    from ctformer.operators import attention_flow

    rng = np.random.default_rng(5)
    model = ContinuousTransformer.random_smooth(seed=3, layers=1, heads=2, mask="causal")
    flow = model.blocks[0].attention.discretize(model.grids(Midpoint(12), Midpoint(16)))
    u = rng.standard_normal((2, 12, 16))
    q, k, v = (rng.standard_normal((2, 8, 4)) for _ in range(3))
    calls = {"small path": lambda: flow(u),
             "general path": lambda: flow(u),
             "quadrature_attention": lambda: quadrature_attention(q, k, v, beta=0.5),
             "torch": lambda: quadrature_attention(*(torch.from_numpy(a) for a in (q, k, v)), beta=0.5)}
    expected = calls[where]()  # the default setting (auto)
    if where == "general path":
        monkeypatch.setattr(attention_flow._SmallPlan, "of", classmethod(lambda cls, attention, u: None))
        flow._small.clear()
    for value in ("flash", "Fused!"):
        monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", value)
        with pytest.raises(ValueError, match=r"CTFORMER_ATTENTION_ENGINE must be one of auto, fused, streamed"):
            calls[where]()
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", " Streamed ")  # case and blanks do not matter
    if where == "torch":  # torch tensors: the fused kernel (auto) against the library's chunks
        np.testing.assert_allclose(np.asarray(calls[where]()), np.asarray(expected), rtol=1e-13, atol=1e-14)
    else:
        np.testing.assert_array_equal(np.asarray(calls[where]()), np.asarray(expected))
    if where == "small path":
        assert flow._small[(u.shape, u.dtype)] is not None  # the small path was the one taken
    # and against the formula: softmax(beta q k^T) v with uniform weights, float64
    if where == "quadrature_attention":
        s = 0.5 * q @ np.swapaxes(k, -1, -2)
        p = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(expected, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("engine", ["fused", "streamed"])
def test_either_engine_gives_causal_attention(monkeypatch, engine):
    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", engine)
    fused_path_on(monkeypatch)
    calls = []
    real = fused.fused_attention
    monkeypatch.setattr(fused, "fused_attention", lambda *a: calls.append(a[4]) or real(*a))
    n = 1024  # 2^20 scores: a problem the measurement decides under auto
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((n, 16)) for _ in range(3))
    out = quadrature_attention(q, k, v, beta=0.3, mask="causal")
    assert calls == ([True] if engine == "fused" else [])
    s = 0.3 * (q @ k.T)
    s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    assert np.max(np.abs(out - ref)) <= 1e-13 * np.max(np.abs(ref))


@pytest.mark.parametrize("measure, dtype", [("_measure_causal", np.float64), ("_measure_plain", np.float32)])
def test_the_measurement_returns_a_stored_choice_by_its_rule(measure, dtype):
    gemm.softmax_provider(np.dtype(dtype).name)
    result = getattr(fused, measure)(np.dtype(dtype))
    assert result["numpy_s"] > 0 and result["torch_s"] > 0 and 0 <= result["wins"] <= fused._PAIRS
    clear = result["ratio"] <= fused._MARGIN and result["wins"] >= fused._WINS
    assert result["provider"] == ("numpy" if clear else "torch")

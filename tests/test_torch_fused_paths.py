"""torch states on torch's fused functions: activations (``torch.nn.functional``), softmax
attention, normalizations (``layer_norm``, ``rms_norm``) and biased products (``addmm``),
against SciPy / NumPy float64 references, with autograd, and with the scale-safe general path
kept where the fused one would overflow."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.special import ndtr

from ctformer import Grids
from ctformer._numerics import gemm
from ctformer.discretizations import Midpoint, Trapezoid
from ctformer.operators import LayerNormProjection, RMSNorm, activations, quadrature_attention
from ctformer.operators import normalization as norm_module

from .conftest import require

torch = require("torch")


def _gelu(z):
    return z * ndtr(z)


@pytest.mark.parametrize("name, reference", [
    ("gelu", _gelu),
    ("gelu_tanh", lambda z: z / (1 + np.exp(-2 * np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))),
    ("silu", lambda z: z / (1 + np.exp(-z))),
    ("relu", lambda z: np.maximum(z, 0.0))])
def test_activations_of_tensors_are_the_formulas(name, reference):
    z = np.concatenate([np.linspace(-30, 30, 2001), [0.0, -1e-300, 1e-300]])
    got = activations.get_activation(name)(torch.from_numpy(z)).numpy()
    with np.errstate(over="ignore"):  # exp(-z) -> inf: the limit 0 is right
        exact = reference(z)
    # a few ulps of the value, or of |z| where torch's GELUs cancel (1 + erf, 1 + tanh in the
    # negative tail, as HuggingFace computes them: absolute, not relative, accuracy there)
    cancels = name.startswith("gelu")
    assert np.all(np.abs(got - exact) <= 4e-16 * np.abs(exact) + 2.3e-16 * np.abs(z) * cancels + 1e-300)
    assert torch.isnan(activations.get_activation(name)(torch.tensor([np.nan]))).all()  # NaN stays NaN


@pytest.mark.parametrize("name", ["gelu", "gelu_tanh", "silu"])
def test_tensor_activations_differentiate(name):
    z = torch.linspace(-4, 4, 17, dtype=torch.float64, requires_grad=True)
    f = activations.get_activation(name)
    assert torch.autograd.gradcheck(f, (z,)) and torch.autograd.gradgradcheck(f, (z,))


def test_bfloat16_gelu_is_rounded_once():
    z = torch.linspace(-3, 6, 401, dtype=torch.bfloat16)  # below -3 the 1 + erf form cancels
    exact = _gelu(z.to(torch.float64).numpy())
    got = activations.gelu(z).to(torch.float64).numpy()
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(exact), 1e-30))) - 7)  # bfloat16: 8 bits
    assert np.all(np.abs(got - exact) <= 0.51 * ulp + 1e-30)


@pytest.mark.parametrize("causal", [False, True])
def test_tensor_attention_by_softmax_equals_numpy(rng, causal):
    q, k, v = (rng.standard_normal((2, 3, 40, 8)) for _ in range(3))
    w = rng.uniform(0.5, 1.5, 40)
    w /= w.sum()
    mask = "causal" if causal else None
    ref = quadrature_attention(q, k, v, beta=0.7, weights=w, mask=mask)
    got = quadrature_attention(*(torch.from_numpy(a) for a in (q, k, v)), beta=0.7,
                               weights=torch.from_numpy(w), mask=mask)
    assert np.abs(got.numpy() - ref).max() <= 1e-14 * np.abs(ref).max()


def _state_and_grids(rng, features, scale=1.0):
    grids = Grids(tokens=Midpoint(5), features=features)
    u = scale * (rng.standard_normal((2, 5, features.n)) + 0.5)
    return u, grids


@pytest.mark.parametrize("operator", [LayerNormProjection(gain=np.linspace(0.5, 2, 12), shift=0.25, eps=1e-5),
                                      RMSNorm(gain=np.linspace(0.5, 2, 12), eps=1e-6)])
def test_tensor_normalizations_fused_and_general_agree_with_numpy(rng, monkeypatch, operator):
    calls = []
    fused = norm_module._torch_fused
    monkeypatch.setattr(norm_module, "_torch_fused", lambda *a, **k: calls.append(r := fused(*a, **k)) or r)
    for features, expect_fused in ((Midpoint(12), True), (Trapezoid(12), False)):
        u, grids = _state_and_grids(rng, features)
        ref = operator.discretize(grids)(u)
        calls.clear()
        got = operator.discretize(grids)(torch.from_numpy(u)).numpy()
        assert np.abs(got - ref).max() <= 1e-14 * np.abs(ref).max()
        assert (calls[-1] is not None) == expect_fused  # uniform weights only
    u, grids = _state_and_grids(rng, Midpoint(12), scale=2.0 ** 450)  # squares would overflow
    calls.clear()
    got = operator.discretize(grids)(torch.from_numpy(u)).numpy()
    assert calls[-1] is None and np.isfinite(got).all()
    ref = operator.discretize(grids)(u)
    assert np.abs(got - ref).max() <= 1e-14 * np.abs(ref).max()


def test_fused_normalization_keeps_the_general_path_for_eps_zero(rng):
    u, grids = _state_and_grids(rng, Midpoint(12))
    u[0, 2] = 3.0  # a feature-constant token: eps = 0 must name it, not divide by zero
    with pytest.raises(ValueError, match=r"token at index \(0, 2\)"):
        LayerNormProjection().discretize(grids)(torch.from_numpy(u))


def test_fused_normalization_differentiates(rng):
    u, grids = _state_and_grids(rng, Midpoint(6))
    layer = LayerNormProjection(gain=np.linspace(0.5, 2, 6), shift=0.1, eps=1e-3).discretize(grids)
    x = torch.from_numpy(u[0, :2]).requires_grad_(True)
    assert torch.autograd.gradcheck(layer, (x,))


def test_biased_tensor_products_are_addmm(rng, monkeypatch):
    a, m, b = rng.standard_normal((3, 7, 16)), rng.standard_normal((16, 9)), rng.standard_normal(9)
    called = []
    addmm = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *args, **kw: called.append(1) or addmm(*args, **kw))
    got = gemm.rows_product(*(torch.from_numpy(x) for x in (a, m, b)))
    assert called and got.shape == (3, 7, 9)
    exact = a @ m + b
    assert np.abs(got.numpy() - exact).max() <= 1e-14 * np.abs(exact).max()
    # a bias of another dtype: the product and a separate sum, as before
    mixed = gemm.rows_product(torch.from_numpy(a), torch.from_numpy(m), torch.from_numpy(b).float())
    assert len(called) == 1 and np.abs(mixed.numpy() - exact).max() <= 1e-6 * np.abs(exact).max()


@pytest.mark.parametrize("mask", [None, "causal"])
def test_tensor_attention_with_uniform_weights_is_torchs_kernel(rng, monkeypatch, mask):
    q, k, v = (rng.standard_normal((2, 3, 24, 8)) for _ in range(3))
    ref = quadrature_attention(q, k, v, beta=0.7, mask=mask)
    calls = []
    kernel = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **kw: calls.append(kw) or kernel(*a, **kw))
    tq, tk, tv = (torch.from_numpy(a).requires_grad_(True) for a in (q, k, v))
    got = quadrature_attention(tq, tk, tv, beta=0.7, mask=mask)
    assert calls and calls[0]["is_causal"] == (mask == "causal")
    assert np.abs(got.detach().numpy() - ref).max() <= 1e-14 * np.abs(ref).max()
    # its backward: first derivatives against finite differences
    small = [torch.from_numpy(a[:1, :1, :6, :3]).requires_grad_(True) for a in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *t: quadrature_attention(*t, beta=0.7, mask=mask), small)
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", "streamed")  # the library's chunks instead
    calls.clear()
    chunks = quadrature_attention(tq, tk, tv, beta=0.7, mask=mask)
    assert not calls and np.abs(chunks.detach().numpy() - ref).max() <= 1e-14 * np.abs(ref).max()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16])
def test_all_finite_by_one_sum_decides_as_the_entrywise_test(dtype):
    from ctformer.backend import all_finite

    big = float(torch.finfo(dtype).max) / 2
    cases = {"finite": [1.0, -2.0, 3.0], "finite, sum overflows": [big, big, big],
             "nan": [1.0, float("nan")], "inf": [float("inf"), 1.0], "inf - inf": [float("inf"), -float("inf")]}
    for name, values in cases.items():
        u = torch.tensor(values, dtype=dtype).requires_grad_(dtype != torch.float16)
        assert all_finite(u) == bool(torch.isfinite(u).all()), name
        assert all_finite(u.detach().numpy()) == all_finite(u), name  # NumPy: the entry-wise test

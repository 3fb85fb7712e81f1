"""Plans for small NumPy states (ctformer.operators.small_plans): a feed-forward map or a
normalization of fewer than 256 rows is evaluated by a plan made once per shape, dtype and
engine settings. It must give the general path's bits for every activation, dtype and batch
shape, agree with the formula (the discrete limit: ``nn.Linear`` layers, LayerNorm, RMSNorm),
follow a change of the settings, refuse a bad one at every call, and leave degenerate tokens,
strided states and large states to the general path with its messages."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import expit, ndtr

from ctformer.discretizations import Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.operators import (FeedForward, GatedFeedForward, Grids, LayerNormProjection, RMSNorm,
                                SphereProjection)
from ctformer.operators.small_plans import SmallPlans

D, HIDDEN = 6, 10
FORMULAS = {  # activation: its formula in float64
    "gelu": lambda z: z * ndtr(z),
    "gelu_tanh": lambda z: 0.5 * z * (1 + np.tanh(math.sqrt(2 / math.pi) * (z + 0.044715 * z ** 3))),
    "silu": lambda z: z * expit(z),
    "relu": lambda z: np.maximum(z, 0.0),
}


def _weights(seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(shape) / math.sqrt(shape[-1]) for name, shape in
            (("w1", (HIDDEN, D)), ("wu", (HIDDEN, D)), ("w2", (D, HIDDEN)), ("b1", (HIDDEN,)),
             ("bu", (HIDDEN,)), ("b2", (D,)))}


def _grids(n):
    return Grids(Midpoint(n), Midpoint(D), hidden=Midpoint(HIDDEN))


def _feedforward(activation, w):
    return FeedForward(PiecewiseConstant(w["w1"]), PiecewiseConstant(w["w2"]), b_1=w["b1"], b_2=w["b2"],
                       activation=activation)


def _gated(activation, w):
    return GatedFeedForward(PiecewiseConstant(w["w1"]), PiecewiseConstant(w["wu"]), PiecewiseConstant(w["w2"]),
                            b_gate=w["b1"], b_up=w["bu"], b_2=w["b2"], activation=activation)


def _planned(op, grids, u):
    """The discretized ``op`` on ``grids``, evaluated on ``u`` by its plan; the general path's
    value of the same ``u``."""
    flow = op.discretize(grids)
    assert isinstance(flow, SmallPlans)
    got = flow(u)
    assert any(plan is not None for plan in flow._plans.values()), "no plan was made"
    return got, flow.general(u)


def _state(lead, n, dtype, seed=1):
    return np.random.default_rng(seed).standard_normal((*lead, n, D)).astype(dtype)


@pytest.mark.parametrize("activation", list(FORMULAS))
@pytest.mark.parametrize("lead, dtype", [((), np.float64), ((3,), np.float64), ((2, 2), np.float32)])
def test_feedforward_plans_give_the_general_bits_and_the_formula(activation, lead, dtype):
    w = _weights()
    u = _state(lead, 7, dtype)
    got, general = _planned(_feedforward(activation, w), _grids(7), u)
    assert got.dtype == general.dtype == dtype and got.shape == general.shape == u.shape
    np.testing.assert_array_equal(got, general)
    x = u.astype(np.float64)
    ref = FORMULAS[activation](x @ w["w1"].T + w["b1"]) @ w["w2"].T + w["b2"]
    tol = 1e-14 if dtype == np.float64 else 3e-6
    assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref))


@pytest.mark.parametrize("activation", ["silu", "gelu", "relu"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gated_feedforward_plans_give_the_general_bits_and_the_formula(activation, dtype):
    w = _weights(2)
    u = _state((2,), 5, dtype, seed=3)
    got, general = _planned(_gated(activation, w), _grids(5), u)
    np.testing.assert_array_equal(got, general)
    x = u.astype(np.float64)
    ref = (FORMULAS[activation](x @ w["w1"].T + w["b1"]) * (x @ w["wu"].T + w["bu"])) @ w["w2"].T + w["b2"]
    tol = 1e-14 if dtype == np.float64 else 3e-6
    assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref))


def test_a_custom_activation_is_called_by_the_plan_and_still_checked():
    """A custom activation runs as it is inside the plan: a pointwise one gives the formula,
    one that changes the shape is refused by name, as on the general path."""
    w = _weights(4)
    u = _state((), 6, np.float64)
    got, general = _planned(_feedforward(np.sin, w), _grids(6), u)
    np.testing.assert_array_equal(got, general)
    ref = np.sin(u @ w["w1"].T + w["b1"]) @ w["w2"].T + w["b2"]
    assert np.max(np.abs(got - ref)) <= 1e-14 * np.max(np.abs(ref))
    flow = _feedforward(lambda z: z[..., :3], w).discretize(_grids(6))
    with pytest.raises(ValueError, match="must act pointwise"):
        flow(u)


NORMALIZATIONS = {  # name: (operator, formula in float64)
    "layer norm": (lambda g: LayerNormProjection(gain=g, shift=0.25, eps=1e-5),
                   lambda u, g: g * (u - u.mean(-1, keepdims=True))
                   / np.sqrt(u.var(-1, keepdims=True) + 1e-5) + 0.25),
    "layer norm, eps 0": (lambda g: LayerNormProjection(),
                          lambda u, g: (u - u.mean(-1, keepdims=True)) / u.std(-1, keepdims=True)),
    "rms norm": (lambda g: RMSNorm(gain=g, eps=1e-6),
                 lambda u, g: g * u / np.sqrt((u * u).mean(-1, keepdims=True) + 1e-6)),
    "sphere": (lambda g: SphereProjection(), lambda u, g: u / np.sqrt((u * u).mean(-1, keepdims=True))),
}


@pytest.mark.parametrize("name", list(NORMALIZATIONS))
@pytest.mark.parametrize("lead, dtype", [((), np.float64), ((2, 3), np.float64), ((4,), np.float32)])
def test_normalization_plans_give_the_general_bits_and_the_formula(name, lead, dtype):
    make, formula = NORMALIZATIONS[name]
    g = np.linspace(0.5, 1.5, D)
    u = 3.0 * _state(lead, 9, dtype, seed=5) + 1.0
    got, general = _planned(make(g), Grids(Midpoint(9), Midpoint(D)), u)
    np.testing.assert_array_equal(got, general)
    ref = formula(u.astype(np.float64), g)
    tol = 1e-14 if dtype == np.float64 else 1e-6
    assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref))


def test_a_token_the_compiled_pass_declines_gets_the_general_message():
    """A token without variance (LayerNorm, eps = 0) and a zero token (sphere) are left by the
    plan to the scale-safe formulas, which name the token; a huge token is normalized there."""
    grids = Grids(Midpoint(4), Midpoint(D))
    u = _state((), 4, np.float64)
    flat = u.copy()
    flat[2] = 7.0
    layer_norm = LayerNormProjection().discretize(grids)
    layer_norm(u)  # the plan is made on a good state
    with pytest.raises(ValueError, match=r"token at index \(2,\) .* zero feature variance"):
        layer_norm(flat)
    zero = u.copy()
    zero[1] = 0.0
    with pytest.raises(ValueError, match=r"token at index \(1,\) .* is zero"):
        SphereProjection().discretize(grids)(zero)
    huge = u.copy()
    huge[3] *= 1e300
    out = layer_norm(huge)
    ref = (u[3] - u[3].mean()) / u[3].std()
    assert np.max(np.abs(out[3] - ref)) <= 1e-14 * np.max(np.abs(ref))


def test_plans_follow_the_settings_and_refuse_a_bad_one_every_time(monkeypatch):
    """A change of CTFORMER_LOOP_ENGINE makes a new plan (NumPy's passes, the general path's
    bits under that setting); a bad CTFORMER_GEMM is refused at every call, naming it."""
    w = _weights(6)
    u = _state((), 8, np.float64)
    flow = _feedforward("gelu", w).discretize(_grids(8))
    compiled = flow(u)
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    numpy_passes = flow(u)
    assert len(flow._plans) == 2
    np.testing.assert_array_equal(numpy_passes, flow.general(u))
    ref = FORMULAS["gelu"](u @ w["w1"].T + w["b1"]) @ w["w2"].T + w["b2"]
    for got in (compiled, numpy_passes):
        assert np.max(np.abs(got - ref)) <= 1e-14 * np.max(np.abs(ref))
    monkeypatch.setenv("CTFORMER_GEMM", "fastest")
    for _ in range(2):
        with pytest.raises(ValueError, match="CTFORMER_GEMM must be one of"):
            flow(u)


def test_strided_and_large_states_take_the_general_path():
    """A strided view and a state of 256 rows make no plan; both give the formula."""
    w = _weights(7)
    flow = _feedforward("silu", w).discretize(_grids(256))
    large = _state((), 256, np.float64)
    strided = _state((), 512, np.float64)[::2]
    for u in (large, strided):
        got = flow(u)
        ref = FORMULAS["silu"](u @ w["w1"].T + w["b1"]) @ w["w2"].T + w["b2"]
        assert np.max(np.abs(got - ref)) <= 1e-14 * np.max(np.abs(ref))
    assert list(flow._plans.values()) == [None]  # the large state's entry; the view made none


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_large_states_take_the_activation_over_the_first_product(monkeypatch, gated, dtype):
    """Past the plans (600 tokens, row blocks on two threads) the activation overwrites the
    first product's new output (``activations.overwrite``): the bits of the evaluation with a
    new array for it, the state itself untouched, and the formula to rounding."""
    from ctformer.operators import feature

    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    w = _weights(4)
    activation = "silu" if gated else "gelu"
    op = _gated(activation, w) if gated else _feedforward(activation, w)
    u = _state((2,), 600, dtype, seed=5)
    before = u.copy()
    calls = []
    real = feature.overwrite
    monkeypatch.setattr(feature, "overwrite", lambda phi, z: calls.append(z.shape) or real(phi, z))
    got = op.discretize(_grids(600))(u)
    assert calls and all(shape[-1] == HIDDEN for shape in calls)
    monkeypatch.setattr(feature, "overwrite", lambda phi, z: None)
    np.testing.assert_array_equal(got, op.discretize(_grids(600))(u))
    np.testing.assert_array_equal(u, before)
    x = u.astype(np.float64)
    hidden = FORMULAS[activation](x @ w["w1"].T + w["b1"])
    if gated:
        hidden = hidden * (x @ w["wu"].T + w["bu"])
    ref = hidden @ w["w2"].T + w["b2"]
    tol = 1e-14 if dtype == np.float64 else 3e-6
    assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref))

"""Every HuggingFace RoPE scaling converts: float64 frequencies and attention temperature.

References: an element-by-element closed-form re-derivation of each rope_type in Python floats
(to 2 ulp), HuggingFace's own float32 ROPE_INIT_FUNCTIONS (to the float32 rounding), and the
HuggingFace float64 module (SDPA, float64 angles as ``float64_reference`` makes them) to 1e-12,
with GQA and right padding; the stock HuggingFace module (float32 frequencies) to 1e-5.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _padding, _randomize, _run_hf

pytestmark = pytest.mark.transformers

HEAD_DIM, L0, MAX = 16, 16, 64  # head_dim, original max positions, max_position_embeddings
SCALINGS = {
    "default": {},
    "linear": {"factor": 2.5},
    "dynamic": {"factor": 3.0},
    "yarn": {"factor": 4.0, "original_max_position_embeddings": L0, "beta_fast": 8, "beta_slow": 1},
    "yarn_mscale": {"factor": 4.0, "original_max_position_embeddings": L0, "mscale": 1.0,
                    "mscale_all_dim": 0.5, "truncate": False},
    "yarn_attention": {"factor": 2.0, "original_max_position_embeddings": L0, "attention_factor": 1.3},
    "llama3": {"factor": 8.0, "low_freq_factor": 0.5, "high_freq_factor": 2.0,  # all three bands
               "original_max_position_embeddings": L0},
    "longrope": {"short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
                 "long_factor": [1.0 + 0.7 * i for i in range(HEAD_DIM // 2)],
                 "original_max_position_embeddings": L0},
}


def _params(name, theta=10000.0):
    return {"rope_type": name.split("_")[0], "rope_theta": theta, **copy.deepcopy(SCALINGS[name])}


def _config(t, name, cls="Llama", d=32, heads=2, kv_heads=1, layers=2, theta=10000.0):
    return getattr(t, f"{cls}Config")(
        vocab_size=32, hidden_size=d, intermediate_size=24, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=HEAD_DIM, max_position_embeddings=MAX, rms_norm_eps=1e-6,
        rope_parameters=_params(name, theta), bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _closed_form(name, length, theta=10000.0):
    """Each rope_type re-derived element by element in Python floats: (omega list, a)."""
    p, dim = SCALINGS[name], HEAD_DIM
    base = [theta ** (-(2 * i) / dim) for i in range(dim // 2)]
    kind = name.split("_")[0]
    if kind == "default":
        return base, 1.0
    if kind == "linear":
        return [w / p["factor"] for w in base], 1.0
    if kind == "dynamic":
        s, n = p["factor"], max(length, MAX)
        b = theta * (s * n / MAX - (s - 1)) ** (dim / (dim - 2))
        return [b ** (-(2 * i) / dim) for i in range(dim // 2)], 1.0
    if kind == "yarn":
        s = p["factor"]
        corr = [dim * math.log(L0 / (r * 2 * math.pi)) / (2 * math.log(theta)) for r in (p["beta_fast"] if
                "beta_fast" in p else 32, p.get("beta_slow", 1))]
        lo, hi = (corr if p.get("truncate", True) is False else (math.floor(corr[0]), math.ceil(corr[1])))
        lo, hi = max(lo, 0), min(hi, dim - 1)
        out = []
        for i, w in enumerate(base):
            r = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: keep w (fast), 1: interpolate w / s
            out.append(w * (1 - r) + (w / s) * r)
        if "attention_factor" in p:
            a = p["attention_factor"]
        elif "mscale" in p:
            a = (0.1 * p["mscale"] * math.log(s) + 1) / (0.1 * p["mscale_all_dim"] * math.log(s) + 1)
        else:
            a = 0.1 * math.log(s) + 1
        return out, a
    if kind == "llama3":
        out = []
        for w in base:
            wavelength = 2 * math.pi / w
            if wavelength < L0 / p["high_freq_factor"]:
                out.append(w)
            elif wavelength > L0 / p["low_freq_factor"]:
                out.append(w / p["factor"])
            else:
                g = (L0 / wavelength - p["low_freq_factor"]) / (p["high_freq_factor"] - p["low_freq_factor"])
                out.append((1 - g) * w / p["factor"] + g * w)
        return out, 1.0
    factors = p["long_factor"] if length > L0 else p["short_factor"]
    return [w / f for w, f in zip(base, factors)], math.sqrt(1 + math.log(MAX / L0) / math.log(L0))


@pytest.mark.parametrize("length", [8, L0, 40, 100])
@pytest.mark.parametrize("name", list(SCALINGS))
def test_frequencies_are_the_closed_form_and_hf_float32(name, length):
    torch = require("torch")
    t = require("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ctformer.bridges.rope_scaling import scaled_frequencies

    cfg = _config(t, name)
    omega, a = scaled_frequencies(cfg, length)
    exact, a_exact = _closed_form(name, length)
    exact = np.array(exact)
    assert omega.dtype == np.float64 and omega.shape == (HEAD_DIM // 2,)
    assert np.all(np.abs(omega - exact) <= 4 * np.spacing(exact)), np.abs(omega - exact) / np.spacing(exact)
    assert abs(a - a_exact) <= 2 * np.spacing(a_exact)
    kind = name.split("_")[0]
    if kind == "default":
        return
    hf, hf_a = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu", seq_len=length if kind in ("dynamic", "longrope") else None)
    hf = hf.double().numpy()
    np.testing.assert_allclose(hf, omega, rtol=2e-6, atol=0)  # float32 (HF) vs float64 (ours)
    assert abs(hf_a - a) <= 1e-15 * a


def _pair(t, torch, name, cls="Llama", seed=0, **kw):
    """A random float64 model with the scaling, and its float64 reference (a deep copy)."""
    from ctformer.bridges import float64_reference

    model = _randomize(torch, getattr(t, f"{cls}Model")(_config(t, name, cls, **kw)).double().eval(), seed)
    return model, float64_reference(copy.deepcopy(model))


END_TO_END = [(n, "Llama", 9) for n in SCALINGS] + [("dynamic", "Llama", 90), ("longrope", "Llama", 40),
                                                     ("yarn", "Qwen2", 12), ("llama3", "Mistral", 12),
                                                     ("longrope", "Qwen2", 30), ("dynamic", "Mistral", 80)]


@pytest.mark.parametrize("name, cls, tokens", END_TO_END)
def test_run_equals_the_float64_hf_module(name, cls, tokens):
    torch = require("torch")
    t = require("transformers", f"{cls}Model")
    from ctformer.bridges import from_hf

    model, reference = _pair(t, torch, name, cls, seed=tokens)
    x = np.random.default_rng(tokens).standard_normal((3, tokens, 32))
    mask = _padding(3, tokens, 0)
    ref, _ = _run_hf(torch, reference, x, mask)
    ct = from_hf(model)
    err = rel_err(ct.run(x, padding_mask=mask), ref, mask)
    assert err <= 1e-12, err
    # the stock HuggingFace module (float32 frequencies and its own dynamic/longrope update) agrees
    stock, _ = _run_hf(torch, model, x, mask)
    assert rel_err(stock, ref, mask) < 1e-5
    # the reference is not the unscaled network: the scaling moves the output (not for short dynamic)
    if name != "default" and not (name == "dynamic" and tokens <= MAX) and not (name == "longrope" and tokens <= L0):
        plain, _ = _run_hf(torch, _pair(t, torch, "default", cls, seed=tokens)[1], x, mask)
        assert rel_err(plain, ref, mask) > 1e-4


def test_temperature_is_attention_scaling_squared():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model, _ = _pair(t, torch, "yarn_attention")
    beta = from_hf(model).blocks[0].attention.beta
    np.testing.assert_allclose(beta, 1.3 ** 2 * math.sqrt(HEAD_DIM), rtol=1e-15)
    plain, _ = _pair(t, torch, "default")
    assert np.all(from_hf(plain).blocks[0].attention.beta == math.sqrt(HEAD_DIM))


def test_dynamic_uses_the_context_length_and_is_default_up_to_max_positions():
    torch = require("torch")
    t = require("transformers")
    from ctformer.discretizations import Midpoint
    from ctformer.bridges import from_hf

    model, _ = _pair(t, torch, "dynamic")
    plain, _ = _pair(t, torch, "default")
    ct, ct_plain = from_hf(model), from_hf(plain)
    x = np.random.default_rng(1).standard_normal((1, 20, 32))
    assert np.array_equal(ct.run(x), ct_plain.run(x))  # N = 20 <= 64: the default frequencies
    rope = ct.blocks[0].attention.positions
    tau = (np.arange(HEAD_DIM // 2) + 0.5) / (HEAD_DIM // 2)
    for length in (20, 64, 100):
        assert np.all(np.abs(rope.omega(tau, length) - np.array(_closed_form("dynamic", length)[0]))
                      <= 4 * np.spacing(rope.omega(tau, length)))
    with pytest.raises(ValueError, match="depends on the context length"):
        rope.omega(tau)
    # the length is the context length, not the number of nodes: 40 tokens at L = 20 are unscaled
    y = np.random.default_rng(2).standard_normal((1, 40, 32))
    grid = dict(tokens=Midpoint(40), features=Midpoint(32), context_length=20)
    assert np.array_equal(ct.solve(y, **grid), ct_plain.solve(y, **grid))


def test_linear_scaling_is_token_refinement_at_fixed_context_length():
    torch = require("torch")
    t = require("transformers")
    from ctformer.discretizations import Midpoint
    from ctformer.bridges import from_hf

    model, _ = _pair(t, torch, "linear")
    plain, _ = _pair(t, torch, "default")
    n, factor = 10, SCALINGS["linear"]["factor"]
    x = np.random.default_rng(3).standard_normal((2, n, 32))
    scaled = from_hf(model).run(x)
    # p = (L/N)(n + 1/2) - 1/2 with L = N / s: p = n/s + const, and RoPE sees only differences
    stretched = from_hf(plain).solve(x, tokens=Midpoint(n), features=Midpoint(32), context_length=n / factor)
    assert rel_err(stretched, scaled) < 1e-13


def test_longrope_switches_tables_at_the_original_length():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model, _ = _pair(t, torch, "longrope")
    rope = from_hf(model).blocks[0].attention.positions
    short, long = (np.array(_closed_form("longrope", n)[0]) for n in (L0, L0 + 1))
    assert np.all(np.abs(rope.frequencies.at(L0) - short) <= 4 * np.spacing(short))
    assert np.all(np.abs(rope.frequencies.at(L0 + 1) - long) <= 4 * np.spacing(long))


def test_unknown_rope_type_and_partial_rotary_are_refused_by_name():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf
    from ctformer.bridges.rope_scaling import SUPPORTED_ROPE_TYPES, scaled_frequencies

    assert SUPPORTED_ROPE_TYPES == ("default", "linear", "dynamic", "yarn", "llama3", "longrope")
    model, _ = _pair(t, torch, "default")
    model.config.rope_parameters = {"rope_type": "ntk-by-parts", "rope_theta": 1e4}
    with pytest.raises(ValueError, match=r"rope_type='ntk-by-parts' is not modelled; supported rope types: "
                                         r"\['default', 'linear', 'dynamic', 'yarn', 'llama3', 'longrope'\]"):
        from_hf(model)
    # partial rotary: frequencies of the first rho * d_h features (HF's float32 function agrees) ...
    cfg = _config(t, "default")
    cfg.rope_parameters = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "partial_rotary_factor": 0.5}
    omega, _ = scaled_frequencies(cfg)
    exact = np.array([1e4 ** (-(2 * i) / 8) / 2.0 for i in range(4)])
    assert np.all(np.abs(omega - exact) <= 2 * np.spacing(exact))
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    np.testing.assert_allclose(ROPE_INIT_FUNCTIONS["linear"](cfg, "cpu")[0].double().numpy(), omega, rtol=2e-7)
    # ... but HuggingFace's Llama rotates every head feature, so the Llama bridge refuses it
    model.config.rope_parameters = cfg.rope_parameters
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5 is not modelled for the Llama family"):
        from_hf(model)


def test_edited_attention_scaling_is_refused():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model, _ = _pair(t, torch, "yarn")
    model.rotary_emb.attention_scaling = 1.0
    with pytest.raises(ValueError, match=r"rotary_emb.attention_scaling=1.0 differs from the configuration's "
                                         r"1.1386"):
        from_hf(model)

"""RoPE frequencies of converted Llama-family models come from the configuration in float64.

HuggingFace computes ``rotary_emb.inv_freq`` in float32 (0.0099999998 for 0.01), even in a
float64 model; angles at position 511 then carry float32 rounding. The bridge computes
theta^(-2i/d_h) in float64 from ``rope_theta`` and ``head_dim`` instead.
"""
from __future__ import annotations

import copy
import math
import types

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _numpy_llama, _randomize

pytestmark = pytest.mark.transformers


def _stock(t, torch, cls, *, theta=10000.0, d=16, heads=2, kv_heads=1, head_dim=None, seed=0, **extra):
    """A stock float64 HuggingFace model (its inv_freq computed in float32, then cast)."""
    config = getattr(t, f"{cls}Config")(
        vocab_size=32, hidden_size=d, intermediate_size=24, num_hidden_layers=2,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim or d // heads,
        max_position_embeddings=1024, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=0, eos_token_id=0, pad_token_id=0, **extra)
    return _randomize(torch, getattr(t, f"{cls}Model")(config).double().eval(), seed)


@pytest.mark.parametrize("cls", ["Llama", "Mistral", "Qwen2"])
def test_float64_conversion_at_512_tokens_is_the_exact_float64_network(cls):
    torch = require("torch")
    t = require("transformers", f"{cls}Model")
    from ctformer.bridges import float64_reference, from_hf

    # the user's reproducer: from_hf(m).run(x) of a stock float64 model, N = 512
    model = _stock(t, torch, cls)
    n = 512
    x = np.random.default_rng(0).standard_normal((1, n, 16))
    mask = np.ones((1, n), dtype=bool)
    got = from_hf(model).run(x)
    exact = _numpy_llama(model, x, mask)  # an independent float64 forward (NumPy)
    assert rel_err(got, exact) < 1e-13  # was 6.7e-8 .. 1e-7 with the float32 inv_freq
    reference = float64_reference(copy.deepcopy(model))
    with torch.no_grad():
        ref = reference(inputs_embeds=torch.from_numpy(x)).last_hidden_state.numpy()
    assert rel_err(ref, exact) < 1e-13
    # the test sees the float32 frequencies: the same float64 network with HF's buffer is 1e-8 off
    rounded = float64_reference(copy.deepcopy(model))
    rounded.rotary_emb.inv_freq = model.rotary_emb.inv_freq.clone()
    with torch.no_grad():
        off = rounded(inputs_embeds=torch.from_numpy(x)).last_hidden_state.numpy()
    assert rel_err(off, exact) > 1e-8


ROPE_CASES = [(10000.0, 8, 16, 2), (500.0, 16, 16, 1), (1e6, 64, 128, 2), (123456.0, 6, 12, 2), (50.0, 4, 24, 6)]


@pytest.mark.parametrize("theta, head_dim, d, heads", ROPE_CASES)
def test_converted_frequencies_are_theta_powers_to_one_ulp_and_the_buffer_is_not(theta, head_dim, d, heads):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf
    from ctformer.bridges.llama import rope_frequencies

    model = _stock(t, torch, "Llama", theta=theta, d=d, heads=heads, kv_heads=heads, head_dim=head_dim)
    exact = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ulp = np.spacing(exact)
    ours = from_hf(model).blocks[0].attention.positions.frequencies
    assert ours.dtype == np.float64 and ours.shape == (head_dim // 2,)
    assert np.all(np.abs(ours - exact) <= ulp)
    assert np.array_equal(rope_frequencies(model.config), ours)
    buffer = model.rotary_emb.inv_freq.numpy()
    assert buffer.dtype == np.float64  # cast to float64 with the model, computed in float32
    assert np.max(np.abs(buffer - exact) / ulp) > 1e3
    # the same formula as HuggingFace's (head_dim from the config, not hidden_size / heads)
    np.testing.assert_allclose(buffer, ours, rtol=(4 + math.log(theta)) * 2.0 ** -23, atol=0)


def test_transformers_4_config_rope_theta_attribute():
    require("transformers")
    from ctformer.bridges.llama import rope_frequencies

    cfg = types.SimpleNamespace(rope_theta=500.0, rope_scaling=None, hidden_size=24, num_attention_heads=4)
    exact = 500.0 ** (-np.arange(0, 6, 2) / 6.0)
    assert np.all(np.abs(rope_frequencies(cfg) - exact) <= np.spacing(exact))
    # transformers 4 spelled the kind "type"; linear scaling divides the frequencies by the factor
    scaled = types.SimpleNamespace(rope_theta=500.0, rope_scaling={"type": "linear", "factor": 2.0},
                                   hidden_size=24, num_attention_heads=4)
    assert np.all(np.abs(rope_frequencies(scaled) - exact / 2.0) <= np.spacing(exact / 2.0))
    unknown = types.SimpleNamespace(rope_theta=500.0, rope_scaling={"rope_type": "su", "factor": 2.0},
                                    hidden_size=24, num_attention_heads=4)
    with pytest.raises(ValueError, match=r"rope_type='su' is not modelled; supported rope types: \['default', "
                                         r"'linear', 'dynamic', 'yarn', 'llama3', 'longrope'\]"):
        rope_frequencies(unknown)


def test_buffers_rounded_by_a_cast_are_accepted_and_edited_buffers_refused():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import float64_reference, from_hf

    for dtype, theta in ((torch.bfloat16, 10000.0), (torch.float16, 1e8)):  # float16 flushes 1e8^(-62/64)
        model = _stock(t, torch, "Llama", theta=theta, d=128, heads=1, kv_heads=1).to(dtype)
        assert model.rotary_emb.inv_freq.dtype == dtype
        exact = theta ** (-np.arange(0, 128, 2) / 128.0)
        buffer = model.rotary_emb.inv_freq.double().numpy()
        assert np.max(np.abs(buffer - exact) / exact) > 1e-4  # rounded to half precision
        for cast in (model, copy.deepcopy(model).double()):  # also half, then float64
            frequencies = from_hf(cast).blocks[0].attention.positions.frequencies
            assert np.all(np.abs(frequencies - exact) <= np.spacing(exact))
    edited = _stock(t, torch, "Llama")
    with torch.no_grad():
        edited.rotary_emb.inv_freq /= 4.0  # a hand-made position interpolation
    for convert in (from_hf, float64_reference):
        with pytest.raises(ValueError, match=r"rotary_emb.inv_freq differs from the configuration's "
                                             r"frequencies .* by up to 7.50e-01 relative"):
            convert(edited)


def test_unmodelled_rope_options_are_still_refused_by_name():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model = _stock(t, torch, "Llama")
    model.config.rope_parameters = {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type='proportional' is not modelled; supported rope types"):
        from_hf(model)
    model.config.rope_parameters = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0, "beta_fast": 3}
    with pytest.raises(ValueError, match=r"keys \['beta_fast'\] are not modelled for rope_type='linear'"):
        from_hf(model)
    model.config.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    with pytest.raises(ValueError, match="partial_rotary_factor=0.5 is not modelled"):
        from_hf(model)
    model.config.rope_parameters = {"rope_type": "default"}
    with pytest.raises(ValueError, match="no 'rope_theta'"):
        from_hf(model)

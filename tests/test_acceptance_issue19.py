"""Acceptance of issue 19 ("Nothing silently wrong, again"): RoPE frequencies from the
configuration through the public name, and left padding that never reaches a real token.

Items already asserted elsewhere (not repeated here): 1 at N = 512 against an independent
float64 forward in ``test_rope_config.py``; 2 against HuggingFace and torch in
``test_padding_queries.py`` and ``test_attention_direct.py``; 3 and 13 in
``test_identity_objects.py``; 4 in ``test_parameters_readonly.py``; 5 in
``test_thread_independence.py`` and ``test_attention_threads.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _llama, _randomize, _run_hf


@pytest.mark.transformers
@pytest.mark.parametrize("cls, theta, d, heads, head_dim", [
    ("Llama", 10000.0, 16, 2, 8), ("Mistral", 1e6, 24, 3, 16), ("Qwen2", 500000.0, 32, 4, 8)])
def test_item1_public_rope_frequencies_are_theta_powers_in_float64(cls, theta, d, heads, head_dim):
    """Issue 19, item 1: "Compute the frequencies from the config (rope_theta, head
    dimension, scaling) in the computation dtype; never read HuggingFace's float32 buffer".
    ``ctformer.bridges.rope_frequencies(config)`` (the name the closing note gives) is
    theta^(-2i/d_h) to 1 ulp for each family, from the config alone."""
    t = require("transformers", f"{cls}Config")
    from ctformer.bridges import rope_frequencies

    config = getattr(t, f"{cls}Config")(
        hidden_size=d, num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta})
    exact = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    got = rope_frequencies(config)
    assert got.dtype == np.float64 and got.shape == (head_dim // 2,)
    assert np.all(np.abs(got - exact) <= np.spacing(exact))
    # the float32 value HuggingFace's buffer holds is well over an ulp away (0.0099999998)
    assert np.max(np.abs(exact.astype(np.float32).astype(np.float64) - exact) / np.spacing(exact)) > 1


def _padded_inputs(x, mask, seed):
    """x with other, large values at the padding positions (mask False)."""
    changed = x.copy()
    noise = 1e3 * np.random.default_rng(seed).standard_normal(x.shape)
    changed[~mask] = noise[~mask]
    return changed


@pytest.mark.transformers
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_item2_left_padding_never_reaches_a_real_token(family):
    """Issue 19, item 2: "A padded query that sees no key must give a defined, finite output
    that never reaches real tokens ... and the real tokens must equal HuggingFace's to 1e-12".
    The user's mask [[0, 0, 1, 1, 1]]: real tokens equal the float64 HuggingFace model, and
    stay bit for bit the same when the padding positions hold other (large) values."""
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    if family == "gpt2":
        config = t.GPT2Config(vocab_size=32, n_positions=32, n_embd=8, n_layer=2, n_head=2,
                              n_inner=12, bos_token_id=0, eos_token_id=0)
        model = _randomize(torch, t.GPT2Model(config).double().eval(), 1, conv1d=True)
    else:
        model = _llama(t, torch, layers=2, heads=4, kv_heads=2, d=16, theta=1000.0)
    d = model.config.hidden_size
    mask = np.array([[0, 0, 1, 1, 1]], dtype=bool)
    x = np.random.default_rng(0).standard_normal((1, 5, d))
    last, hidden = _run_hf(torch, model, x, mask)
    converted = from_hf(model)
    got = converted.run(hidden[0], padding_mask=mask)
    assert np.all(np.isfinite(got))
    assert rel_err(got, last, mask) < 1e-12
    other = converted.run(_padded_inputs(hidden[0], mask, 1), padding_mask=mask)
    assert np.all(np.isfinite(other))
    np.testing.assert_array_equal(other[mask], got[mask])


@pytest.mark.torch
def test_item2_torch_causal_encoder_padding_never_reaches_a_real_token():
    """Issue 19, item 2 for ``from_torch(causal=True)``: with the mask [[0, 0, 1, 1, 1]] the
    real tokens equal torch's causal encoder on the three real tokens alone (the encoder has
    no positions), and do not change, bit for bit, with the values at the padding positions."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=12, nhead=3, dim_feedforward=20, dropout=0.0,
                                             batch_first=True, norm_first=True)
    net = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).double().eval()
    mask = np.array([[0, 0, 1, 1, 1]], dtype=bool)
    x = np.random.default_rng(3).standard_normal((1, 5, 12))
    converted = from_torch(net, causal=True)
    got = converted.run(x, padding_mask=mask)
    real = torch.from_numpy(x[:, 2:])
    square = torch.nn.Transformer.generate_square_subsequent_mask(3, dtype=torch.float64)
    with torch.no_grad():
        expected = net(real, mask=square, is_causal=True).numpy()
    assert rel_err(got[:, 2:], expected) < 1e-12
    other = converted.run(_padded_inputs(x, mask, 2), padding_mask=mask)
    assert np.all(np.isfinite(other))
    np.testing.assert_array_equal(other[mask], got[mask])

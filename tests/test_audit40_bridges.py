"""Audit 40 of the HuggingFace and torch bridges: edge cases probed against the float64 modules
(no defect found; these pin the agreement). Sliding windows of 1 token, of N - 1 and N tokens
(the window left out) with left and middle padding, a soft-capped window on the first layer
only (``layer_types``), and torch encoder layers whose LayerNorms have no affine part or no
shift."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import rel_err, require

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from .test_model_audit_inputs import _randomize as _randomize_weights  # noqa: E402

TOL = 1e-12
N = 9


def _randomize(torch, model, seed=0):
    """O(1) weights, as the model-input audit draws them."""
    return _randomize_weights(torch, model, seed)


def _decoder(name, **options):
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import float64_reference

    config = getattr(t, f"{name}Config")(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         vocab_size=100, bos_token_id=0, eos_token_id=0, pad_token_id=0, **options)
    return torch, float64_reference(_randomize(torch, getattr(t, f"{name}Model")(config).double().eval()))


def _against_hf(torch, model, mask):
    from ctformer.bridges import from_hf

    x = np.random.default_rng(1).standard_normal((*mask.shape, model.config.hidden_size))
    with torch.no_grad():
        ref = model(inputs_embeds=torch.from_numpy(x),
                    attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state.numpy()
    return rel_err(from_hf(model).run(x, padding_mask=mask), ref, mask)


def _mask(kind):
    mask = np.ones((2, N), dtype=bool)
    if kind == "left":
        mask[1, :4] = False
    else:
        mask[1, 3:5] = False
    return mask


@pytest.mark.parametrize("window", [1, N - 1, N])
def test_mistral_windows_of_one_and_of_the_sequence_with_left_padding(window):
    torch, model = _decoder("Mistral", sliding_window=window)
    assert _against_hf(torch, model, _mask("left")) < TOL


@pytest.mark.parametrize("window", [1, 2, N])
def test_gemma2_capped_window_on_the_first_layer_with_middle_padding(window):
    torch, model = _decoder("Gemma2", head_dim=8, query_pre_attn_scalar=5, sliding_window=window,
                            attn_logit_softcapping=1.0, layer_types=["sliding_attention", "full_attention"])
    assert _against_hf(torch, model, _mask("middle")) < TOL


@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_layer_norms_without_affine_part_or_shift(norm_first):
    torch = require("torch")
    from ctformer.bridges import from_torch

    layer = torch.nn.TransformerEncoderLayer(32, 4, 48, dropout=0.0, batch_first=True, norm_first=norm_first)
    layer.norm1 = torch.nn.LayerNorm(32, elementwise_affine=False, eps=0.3)
    layer.norm2 = torch.nn.LayerNorm(32, bias=False, eps=0.2)
    encoder = torch.nn.TransformerEncoder(layer, 2, norm=torch.nn.LayerNorm(32, elementwise_affine=False),
                                          enable_nested_tensor=False).double().eval()
    _randomize(torch, encoder, seed=3)
    x = np.random.default_rng(2).standard_normal((2, N, 32))
    mask = _mask("left")
    with torch.enable_grad():  # the module's own forward, not the fast path
        ref = encoder(torch.from_numpy(x), src_key_padding_mask=torch.from_numpy(~mask)).detach().numpy()
    assert rel_err(from_torch(encoder).run(x, padding_mask=mask), ref, mask) < TOL

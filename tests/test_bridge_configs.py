"""Unusual but legal HuggingFace configurations against the float64 HuggingFace forward.

Partial rotary with a RoPE attention scaling (HuggingFace scales only the rotated features),
``sliding_window`` / ``layer_types`` that a class does not read, and left padding through
Gemma 2's soft-capped float64 reference. Random weights from the configuration classes; the
reference is the HuggingFace module in float64 (``float64_reference``: its own masks and
layers, float64 RoPE angles), and the stock module (float32 RoPE angles) where the
frequencies themselves are checked.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _padding, _randomize, _run_hf

pytestmark = pytest.mark.transformers

TOL = 1e-12
#: The stock module forms its RoPE angles in float32: about 1e-7 relative.
STOCK_TOL = 1e-5
COMMON = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
SMALL = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)


def _model(t, torch, cls, reference=True, **config):
    from ctformer.bridges import float64_reference

    model = _randomize(torch, getattr(t, f"{cls}Model")(getattr(t, f"{cls}Config")(**COMMON, **config))
                       .double().eval(), 0)
    if reference:
        return float64_reference(model)
    model.set_attn_implementation("sdpa")
    return model


def _errors(torch, model, tokens=9, batch=3, mask=None):
    """Max relative error of ``from_hf(model).run`` against the module over the real tokens."""
    from ctformer.bridges import from_hf

    x = np.random.default_rng(1).standard_normal((batch, tokens, model.config.hidden_size))
    mask = _padding(batch, tokens, 0) if mask is None else mask
    last, hidden = _run_hf(torch, model, x, mask)
    assert np.all(np.isfinite(last[mask])), "the reference is not finite on the real tokens"
    return rel_err(from_hf(model).run(hidden[0], padding_mask=mask), last, mask)


def _longrope(partial, head_dim=16, **extra):
    n = int(head_dim * partial) // 2
    short = [1.0 + 0.3 * i for i in range(n)]
    return {"rope_type": "longrope", "rope_theta": 500.0, "partial_rotary_factor": partial,
            "short_factor": short, "long_factor": [2.0 * s for s in short], **extra}


PHI3 = dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            max_position_embeddings=16, original_max_position_embeddings=8, rms_norm_eps=1e-6)


# before the fix: 9e-2 to 6e-1 (a^2 on the whole score instead of a on the rotated features)
@pytest.mark.parametrize("partial", [0.5, 0.75])
@pytest.mark.parametrize("extra", [{}, {"factor": 3.0}, {"attention_factor": 1.7}], ids=["ratio", "factor", "af"])
@pytest.mark.parametrize("tokens", [6, 12])  # short and long tables (original length 8)
def test_phi3_partial_rotary_with_attention_scaling(partial, extra, tokens):
    torch, t = require("torch"), require("transformers")
    config = dict(PHI3, rope_parameters=_longrope(partial, **extra))
    model = _model(t, torch, "Phi3", **config)
    assert abs(model.rotary_emb.attention_scaling - 1.0) > 0.05  # the case that was wrong
    assert _errors(torch, model, tokens) < TOL
    assert _errors(torch, _model(t, torch, "Phi3", reference=False, **config), tokens) < STOCK_TOL


@pytest.mark.parametrize("parallel", [True, False])
def test_gpt_neox_partial_rotary_with_yarn(parallel):
    torch, t = require("torch"), require("transformers")
    config = dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                  max_position_embeddings=16, rotary_pct=0.25, rotary_emb_base=500.0, use_parallel_residual=parallel,
                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})
    model = _model(t, torch, "GPTNeoX", **config)
    assert model.rotary_emb.attention_scaling > 1.1
    assert _errors(torch, model, tokens=20) < TOL  # before the fix: 1.7e-1 (parallel), 2.5e-1
    assert _errors(torch, _model(t, torch, "GPTNeoX", reference=False, **config), tokens=20) < STOCK_TOL


@pytest.mark.parametrize("cls, extra", [
    ("Llama", dict(sliding_window=3)),  # LlamaModel ignores a sliding_window (before: 4.9e-1)
    ("Mistral", dict(sliding_window=3, layer_types=["full_attention", "sliding_attention"])),  # before: 3.9e-1
    ("Phi3", dict(sliding_window=3, layer_types=["full_attention", "sliding_attention"])),  # before: 5.1e-1
], ids=["llama", "mistral", "phi3"])
def test_window_options_a_class_does_not_read_are_ignored_as_huggingface_does(cls, extra):
    torch, t = require("torch"), require("transformers")
    model = _model(t, torch, cls, **SMALL, **extra)
    assert _errors(torch, model, tokens=9) < TOL


def test_qwen2_layer_types_still_choose_the_sliding_layers():
    torch, t = require("torch"), require("transformers")
    model = _model(t, torch, "Qwen2", **SMALL, use_sliding_window=True, sliding_window=3,
                   layer_types=["sliding_attention", "full_attention"])
    assert _errors(torch, model, tokens=9) < TOL


@pytest.mark.parametrize("cap", [2.0, None])
def test_gemma2_left_padding_reference_is_finite_and_matches(cap):
    torch, t = require("torch"), require("transformers")
    model = _model(t, torch, "Gemma2", **SMALL, head_dim=8, sliding_window=3, attn_logit_softcapping=cap)
    mask = np.ones((3, 9), dtype=bool)
    mask[1, :2] = mask[2, :4] = False  # left padding: the first queries have no keys
    assert _errors(torch, model, mask=mask) < TOL  # before the fix the capped reference was NaN


def test_a_spec_with_an_unknown_windows_value_is_refused():
    from dataclasses import replace

    from ctformer.bridges.llama import LLAMA

    with pytest.raises(ValueError, match="windows must be False, True or 'uniform'"):
        replace(LLAMA, windows="all")

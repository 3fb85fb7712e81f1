"""Padding on either side for the bridges whose tests use right padding only: Gemma, Gemma 2
(sliding window 3 below the sequence, with and without soft-capping), Phi-3 and GPT-NeoX (partial
rotary), BERT and ALBERT. References: the float64 HuggingFace modules (``float64_reference`` for
the RoPE networks, SDPA in float64 for the encoders), random weights, relative error <= 1e-12
on the real tokens; a batch of one-token sequences as well."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _randomize, _run_hf

pytestmark = pytest.mark.transformers

TOL = 1e-12
COMMON = dict(vocab_size=32, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
BASE = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
PARTIAL = {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
DECODERS = {
    "gemma": ("Gemma", dict(BASE, head_dim=6)),
    "gemma2-window": ("Gemma2", dict(BASE, head_dim=4, sliding_window=3, query_pre_attn_scalar=4,
                                     attn_logit_softcapping=None)),
    "gemma2-capped": ("Gemma2", dict(BASE, head_dim=4, sliding_window=3, query_pre_attn_scalar=4,
                                     attn_logit_softcapping=0.7)),
    "phi3-partial": ("Phi3", dict(BASE, rope_parameters=PARTIAL)),
    "gpt-neox-partial": ("GPTNeoX", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                         num_attention_heads=2, hidden_act="gelu", rope_parameters=PARTIAL)),
}


def _masks(tokens=7):
    """Left padding (2 and 6 of 7 tokens), padding at both ends, a full sequence."""
    left = np.ones((3, tokens), dtype=bool)
    left[1, :2] = left[2, :-1] = False
    both = np.ones((3, tokens), dtype=bool)
    both[1, 0] = both[1, -1] = False
    both[2, :3] = both[2, -2:] = False
    return {"left": left, "both": both}


def _decoder(t, torch, name):
    from ctformer.bridges import float64_reference

    cls, config = DECODERS[name]
    model = getattr(t, f"{cls}Model")(getattr(t, f"{cls}Config")(**COMMON, **config))
    return float64_reference(_randomize(torch, model.double().eval(), 0))


@pytest.mark.parametrize("name", list(DECODERS))
def test_decoders_with_left_and_two_sided_padding_and_single_tokens(name):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model = _decoder(t, torch, name)
    ct = from_hf(model)
    d = model.config.hidden_size
    for side, mask in _masks().items():
        x = np.random.default_rng(len(side)).standard_normal((3, 7, d))
        last, hidden = _run_hf(torch, model, x, mask)
        got = ct.run(hidden[0], padding_mask=mask)
        assert np.all(np.isfinite(got)), side
        assert rel_err(got, last, mask) < TOL, side
    one = np.ones((2, 1), dtype=bool)
    x = np.random.default_rng(1).standard_normal((2, 1, d))
    last, hidden = _run_hf(torch, model, x, one)
    assert rel_err(ct.run(hidden[0], padding_mask=one), last, one) < TOL


def _encoder(t, torch, name):
    if name == "bert":
        config = t.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                              intermediate_size=24, max_position_embeddings=32)
        return _randomize(torch, t.BertModel(config, add_pooling_layer=False).double().eval(), 0)
    config = t.AlbertConfig(vocab_size=32, embedding_size=8, hidden_size=16, num_hidden_layers=3,
                            num_attention_heads=4, intermediate_size=24, max_position_embeddings=32)
    return _randomize(torch, t.AlbertModel(config, add_pooling_layer=False).double().eval(), 0)


@pytest.mark.parametrize("name", ["bert", "albert"])
def test_encoders_with_left_and_two_sided_padding(name):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model = _encoder(t, torch, name)
    ct = from_hf(model)
    width = model.config.embedding_size if name == "albert" else model.config.hidden_size
    for side, mask in _masks().items():
        x = np.random.default_rng(len(side)).standard_normal((3, 7, width))
        last, hidden = _run_hf(torch, model, x, mask)
        got = ct.run(hidden[0], padding_mask=mask)
        assert rel_err(got, last, mask) < TOL, side

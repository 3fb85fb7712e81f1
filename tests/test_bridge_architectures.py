"""Phi-3, GPT-NeoX, Gemma, Gemma 2 and DeiT as exact discrete limits: ``from_hf(m).run`` against
the float64 HuggingFace module (random weights from the configuration class; RoPE angles,
RMSNorm and softmax in float64 as ``float64_reference`` makes them) with right padding, several
layers and grouped-query attention, relative error <= 1e-12; and the refusals."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _padding, _randomize, _run_hf

pytestmark = pytest.mark.transformers

TOL = 1e-12
COMMON = dict(vocab_size=32, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _reference(t, torch, cls, seed=0, **config):
    from ctformer.bridges import float64_reference

    model = getattr(t, f"{cls}Model")(getattr(t, f"{cls}Config")(**COMMON, **config))
    return float64_reference(_randomize(torch, model.double().eval(), seed))


def _check(torch, model, batch=2, tokens=9, seed=0):
    """Max relative error of run against HuggingFace over the real tokens of a padded batch."""
    from ctformer.bridges import from_hf

    d = model.config.hidden_size
    x = np.random.default_rng(seed).standard_normal((batch, tokens, d))
    mask = _padding(batch, tokens, 0)
    last, _ = _run_hf(torch, model, x, mask)
    ct = from_hf(model)
    return ct, rel_err(ct.run(x, padding_mask=mask), last, mask), (x, mask, last)


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_phi3_fused_qkv_and_gate_up(partial):
    torch = require("torch")
    t = require("transformers")
    model = _reference(t, torch, "Phi3", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                       rope_parameters={"rope_type": "default", "rope_theta": 500.0,
                                        "partial_rotary_factor": partial})
    ct, error, _ = _check(torch, model)
    assert ct.blocks[0].attention.kv_heads == 2 and ct.hidden.n == 24
    assert error < TOL


@pytest.mark.parametrize("parallel, partial", [(True, 0.25), (False, 0.5), (True, 1.0)])
def test_gpt_neox_parallel_residual_and_partial_rotary(parallel, partial):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges.composite import EulerNetwork
    from ctformer.discretizations import Midpoint

    model = _reference(t, torch, "GPTNeoX", hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                       num_attention_heads=2, use_parallel_residual=parallel, hidden_act="gelu",
                       rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                        "partial_rotary_factor": partial})
    ct, error, (x, mask, last) = _check(torch, model)
    assert isinstance(ct, EulerNetwork) == parallel
    assert error < TOL
    if parallel:  # the same equation: its Lie splitting is the sequential network, not this one
        grids = dict(tokens=Midpoint(9), features=Midpoint(32), context_length=9)
        lie = ct.solve(x, scheme="lie", padding_mask=mask, **grids)
        assert rel_err(lie, last, mask) > 1e-3


def test_gemma_offset_rms_norm_and_tanh_geglu():
    torch = require("torch")
    t = require("transformers")
    model = _reference(t, torch, "Gemma", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=6, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    ct, error, _ = _check(torch, model)
    assert ct.head_features.n == 6
    assert error < TOL


def test_gemma2_sandwich_norms_scalar_and_sliding_layers_longer_than_the_window():
    torch = require("torch")
    t = require("transformers")
    model = _reference(t, torch, "Gemma2", hidden_size=16, intermediate_size=24, num_hidden_layers=4,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-6,
                       query_pre_attn_scalar=7, sliding_window=3, attn_logit_softcapping=None,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    assert list(model.config.layer_types)[:2] == ["sliding_attention", "full_attention"]
    ct, error, _ = _check(torch, model, tokens=10)
    attentions = [b.attention.operator for b in ct.blocks]
    assert [a.window for a in attentions] == [3.0, None, 3.0, None]
    assert np.allclose(attentions[0].beta, 4 / 7 ** 0.5, rtol=1e-15, atol=0)
    assert error < TOL


def _capped_gemma2(t, torch, cap):
    """A float64 Gemma 2 reference with attention soft-capping ``cap``, window 3, GQA 4/2."""
    return _reference(t, torch, "Gemma2", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-6,
                      query_pre_attn_scalar=4, sliding_window=3, attn_logit_softcapping=cap,
                      rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


@pytest.mark.parametrize("cap", [50.0, 0.7])
def test_gemma2_attention_soft_capping(cap):
    # the default cap (50) and one that bends most scores (0.7): HuggingFace's eager formula,
    # softmax in float64, against the operator's kernel exp(c tanh(s / c))
    torch = require("torch")
    t = require("transformers")
    model = _capped_gemma2(t, torch, cap)
    ct, error, _ = _check(torch, model, tokens=10)
    assert [b.attention.operator.softcap for b in ct.blocks] == [cap, cap]
    assert error < TOL
    if cap < 1:  # the cap matters: without it the same weights give another network
        from ctformer.bridges import from_hf

        model.config.attn_logit_softcapping = None
        x = np.random.default_rng(0).standard_normal((1, 10, 16))
        assert rel_err(from_hf(model).run(x), ct.run(x)) > 1e-3


@pytest.mark.parametrize("cap", [50.0, 0.7])
def test_gemma2_soft_capped_reference_without_padding_stays_causal(cap):
    # Without padding HuggingFace's SDPA mask function hands attention no mask (SDPA applies
    # causality itself); the soft-capped float64 reference computes its scores by hand and once
    # attended to every key. Checked against HuggingFace's own eager module with the same
    # weights (softmax in float32: agreement to ~1e-7), and by causality itself.
    import copy

    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model = _capped_gemma2(t, torch, cap)
    config = copy.deepcopy(model.config)
    config._attn_implementation = "eager"
    eager = t.Gemma2Model(config).double().eval()
    eager.load_state_dict(model.state_dict())
    x = np.random.default_rng(3).standard_normal((1, 12, 16))
    later = x.copy()
    later[0, -1] += 1.0

    def last(module, inputs):
        with torch.no_grad():
            return module(inputs_embeds=torch.from_numpy(inputs)).last_hidden_state.numpy()

    reference = last(model, x)
    assert rel_err(reference, last(eager, x)) < 1e-6
    assert rel_err(last(model, later)[0, :-1], reference[0, :-1]) < 1e-15
    assert rel_err(from_hf(model).run(x), reference) < TOL


def test_deit_class_and_distillation_tokens_are_two_atoms():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf
    from ctformer.discretizations import Midpoint, Product, WithAtoms

    config = t.DeiTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
                          image_size=16, patch_size=4, layer_norm_eps=1e-6)
    model = _randomize(torch, t.DeiTModel(config, add_pooling_layer=False).double().eval(), 5)
    pixels = torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out = model(pixel_values=pixels, output_hidden_states=True)
    x, reference = out.hidden_states[0].numpy(), out.last_hidden_state.numpy()
    assert x.shape[1] == 4 * 4 + 2
    ct = from_hf(model)
    assert rel_err(ct.run(x), reference) < TOL
    atoms = ct.solve(x, tokens=WithAtoms(Product(Midpoint(4), Midpoint(4)), count=2), features=Midpoint(16))
    assert rel_err(atoms, reference) < TOL


# -- refusals ------------------------------------------------------------------------------------
def test_unsupported_configurations_are_refused_by_name_with_the_supported_list():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf, supported

    names = ("BertModel", "GPT2Model", "LlamaModel", "Phi3Model", "GPTNeoXModel", "GemmaModel", "Gemma2Model",
             "DeiTModel")
    assert set(names) <= set(supported())
    both = t.GemmaModel(t.GemmaConfig(**COMMON, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                                      use_bidirectional_attention=True))
    with pytest.raises(ValueError, match=r"GemmaModel: use_bidirectional_attention=True is not modelled"):
        from_hf(both)
    moe = t.MixtralModel(t.MixtralConfig(**COMMON, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, num_local_experts=2))
    with pytest.raises(TypeError, match=re.escape(", ".join(supported()))):
        from_hf(moe)  # mixture-of-experts layers: not a registered class
    neox = t.GPTNeoXModel(t.GPTNeoXConfig(**COMMON, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                          num_attention_heads=2))
    neox.config.rope_parameters = {"rope_type": "proportional", "rope_theta": 1e4}
    with pytest.raises(ValueError, match=r"rope_type='proportional' is not modelled; supported rope types"):
        from_hf(neox)


def test_phi3_longrope_beyond_the_original_length_and_the_gemma_offset_matters():
    torch = require("torch")
    t = require("transformers")
    from dataclasses import replace

    from ctformer.bridges.convert import convert
    from ctformer.bridges.gemma import GEMMA

    factors = {"short_factor": [1 + 0.1 * i for i in range(8)], "long_factor": [1 + 0.7 * i for i in range(8)]}
    for tokens in (12, 20):  # short table at N <= L0 = 16, long table and attention factor above
        model = _reference(t, torch, "Phi3", hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, original_max_position_embeddings=16,
                           rope_parameters={"rope_type": "longrope", "rope_theta": 1e4,
                                            "original_max_position_embeddings": 16, **factors})
        assert _check(torch, model, tokens=tokens)[1] < TOL
    gemma = _reference(t, torch, "Gemma", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=1, head_dim=6,
                       rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    _, error, (x, mask, last) = _check(torch, gemma)
    plain = convert(replace(GEMMA, norm_kind="rms"), gemma)  # gain w instead of 1 + w: another network
    assert error < TOL < 1e-3 < rel_err(plain.run(x, padding_mask=mask), last, mask)


def test_a_network_in_train_mode_with_dropout_converts_with_a_warning():
    import warnings

    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf
    from ctformer.bridges.convert import TrainModeWarning

    model = _reference(t, torch, "GPTNeoX", hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                       num_attention_heads=2, attention_dropout=0.25, hidden_dropout=0.5, hidden_act="gelu")
    x = np.random.default_rng(1).standard_normal((1, 6, 16))
    mask = np.ones((1, 6), dtype=bool)
    evaluated, _ = _run_hf(torch, model, x, mask)
    model.train()
    with pytest.warns(TrainModeWarning, match=r"GPTNeoXModel is in train\(\) mode with dropout \(.*hidden_dropout"
                                              r"=0.5.*the continuous model is the eval-mode network"):
        ct = from_hf(model)
    torch.manual_seed(0)
    trained, _ = _run_hf(torch, model, x, mask)
    assert rel_err(trained, evaluated) > 1e-2          # dropout is active in the HF module ...
    assert rel_err(ct.run(x), evaluated) < TOL         # ... the converted model is the eval network
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainModeWarning)
        from_hf(model)
    bert = t.BertModel(t.BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                    intermediate_size=12), add_pooling_layer=False)
    with pytest.warns(TrainModeWarning, match="BertModel is in train"):
        from_hf(bert)


def test_limit_report_of_the_parallel_residual_network_uses_its_euler_step():
    require("torch")
    require("transformers")
    from ctformer.bridges import limit_report

    text = limit_report("gpt_neox", seed=2)
    errors = [float(e) for e in re.findall(r"layer \d+: max relative error ([0-9.e+-]+)", text)]
    assert "explicit Euler" in text and len(errors) == 3 and max(errors) < TOL


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_half_precision_states_compute_in_their_dtype(half):
    """A half-precision model converts to the network of its half-precision weights: float64
    states give that network in float64 (1e-12), half-precision states compute in their dtype,
    as accurately as HuggingFace's own half-precision forward (measured 0.7x its error)."""
    import copy

    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf
    from tests.test_modern_bridges import _llama

    dtype = getattr(torch, half)
    model = copy.deepcopy(_llama(t, torch, layers=2, d=32, heads=4, kv_heads=2)).to(dtype)
    exact = _llama(t, torch, layers=2, d=32, heads=4, kv_heads=2)
    exact.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    x = np.random.default_rng(0).standard_normal((2, 9, 32))
    mask = _padding(2, 9, 0)
    reference, _ = _run_hf(torch, exact, x, mask)
    with torch.no_grad():
        theirs = model(inputs_embeds=torch.from_numpy(x).to(dtype),
                       attention_mask=torch.from_numpy(mask.astype(np.int64))).last_hidden_state.double().numpy()
    ct = from_hf(model)
    ours = ct.run(torch.from_numpy(x).to(dtype), padding_mask=mask)
    assert ours.dtype == dtype
    error, hf_error = rel_err(ours.double().numpy(), reference, mask), rel_err(theirs, reference, mask)
    assert 2.0 ** -14 < error < 2.0 * hf_error
    assert rel_err(ct.run(x, padding_mask=mask), reference, mask) < TOL

"""Acceptance of issue 22 (the models people run now: bridges as data, every RoPE scaling,
Gemma, Gemma 2, Phi-3, GPT-NeoX, DeiT), items the other bridge tests do not already assert.

References: the float64 HuggingFace modules built from their configuration classes with random
weights (``float64_reference``: float64 RoPE angles and RMSNorm), run from token ids so that
``hidden_states[0]`` is HuggingFace's own embedding output; the closed form
:math:`\\sqrt{d}\\, E[\\text{ids}]` of Gemma's scaled embedding.
"""
from __future__ import annotations

import dataclasses
import math
import re

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_acceptance_issue12 import _from_ids
from tests.test_modern_bridges import _randomize

pytestmark = pytest.mark.transformers

TOL = 1e-12
COMMON = dict(vocab_size=32, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)
SMALL = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=4, rms_norm_eps=1e-6)


def _gemma(t, torch, cls, rope, **extra):
    from ctformer.bridges import float64_reference

    config = getattr(t, f"{cls}Config")(**COMMON, **SMALL, rope_parameters=rope, **extra)
    return float64_reference(_randomize(torch, getattr(t, f"{cls}Model")(config).double().eval(), 21))


YARN = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 16}


@pytest.mark.parametrize("cls, rope, extra", [
    ("Gemma", {"rope_type": "default", "rope_theta": 1e4}, {}),
    ("Gemma", YARN, {}),
    ("Gemma2", {"rope_type": "default", "rope_theta": 1e4},
     dict(sliding_window=3, attn_logit_softcapping=None, final_logit_softcapping=30.0)),
], ids=["gemma", "gemma-yarn", "gemma2"])
def test_gemma_embedding_scale_is_part_of_hidden_states0(cls, rope, extra):
    """Issue 22: "GemmaModel (RMSNorm with 1 + w, GeGLU with tanh GELU, the sqrt(d) embedding
    scale applied by the bridge or documented)": from token ids, ``hidden_states[0]`` is
    sqrt(d) E[ids] (closed form, measured 0) and ``run`` of it is ``last_hidden_state`` (measured
    1.2e-15 to 3.2e-15; Gemma 2 with 10 tokens past a window of 3, and a YaRN-scaled Gemma); the
    unscaled rows are another input (0.79 to 1.08 away)."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    model = _gemma(t, torch, cls, rope, **extra)
    x, mask, last = _from_ids(torch, model, tokens=10)
    ids = torch.randint(1, 32, (2, 10), generator=torch.Generator().manual_seed(0)).numpy()
    rows = model.embed_tokens.weight.detach().numpy()[ids]
    assert rel_err(x, math.sqrt(16) * rows) < 1e-15
    ct = from_hf(model)
    assert rel_err(ct.run(x, padding_mask=mask), last, mask) < TOL
    assert rel_err(ct.run(rows, padding_mask=mask), last, mask) > 1e-3


def test_configurations_are_refused_naming_the_option_and_what_is_supported():
    """Issue 22: "Unsupported configurations (cross-attention, an unknown rope_type,
    mixture-of-experts layers) are refused by name with the list of what is supported".
    Before: "GPT2Model: add_cross_attention=True is not modelled (cross-attention layers)" and
    "LlamaModel: num_local_experts=4 is not modelled (mixture-of-experts layers)", with nothing on
    what is supported; now each message ends with it."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf, supported

    cross = t.GPT2Model(t.GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                     add_cross_attention=True, bos_token_id=0, eos_token_id=0))
    with pytest.raises(ValueError, match=r"^GPT2Model: add_cross_attention=True is not modelled \(cross-attention "
                                         r"layers\); supported: self-attention blocks only, "
                                         r"add_cross_attention=False$"):
        from_hf(cross)
    decoder = t.BertModel(t.BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=12, is_decoder=True), add_pooling_layer=False)
    with pytest.raises(ValueError, match=r"BertModel: is_decoder=True is not modelled .*; supported: the "
                                         r"bidirectional encoder, is_decoder=False"):
        from_hf(decoder)
    for cls in ("Llama", "Mistral", "Qwen2"):
        model = getattr(t, f"{cls}Model")(getattr(t, f"{cls}Config")(**COMMON, hidden_size=8, intermediate_size=12,
                                                                     num_hidden_layers=1, num_attention_heads=2,
                                                                     num_key_value_heads=1))
        model.config.num_local_experts = 4
        with pytest.raises(ValueError, match=rf"^{cls}Model: num_local_experts=4 is not modelled \(mixture-of-experts "
                                             r"layers\); supported: one dense gated feed-forward per layer"):
            from_hf(model)
    moe = t.Qwen2MoeModel(t.Qwen2MoeConfig(**COMMON, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, num_experts=2,
                                           moe_intermediate_size=4, shared_expert_intermediate_size=4))
    with pytest.raises(TypeError, match=re.escape("supported HuggingFace classes: " + ", ".join(supported()))):
        from_hf(moe)  # a mixture-of-experts class: not registered


def test_bridges_are_frozen_data_in_one_registry():
    """Issue 22: "One spec per architecture (a frozen dataclass ...), registered by the HuggingFace
    class it converts ... from_hf, the list of supported classes (ctformer.bridges.supported()),
    the error that lists them, and the CLI's --model choices all come from the registry"."""
    require("torch")
    require("transformers")
    from ctformer.bridges import ArchitectureSpec, register, supported
    from ctformer.bridges.hf import small_models
    from ctformer.bridges.spec import ARCHITECTURES

    assert supported() == ("BertModel", "BertEncoder", "GPT2Model", "LlamaModel", "MistralModel", "Qwen2Model",
                           "AlbertModel", "ViTModel", "Phi3Model", "GPTNeoXModel", "GemmaModel", "Gemma2Model",
                           "DeiTModel")
    assert all(isinstance(ARCHITECTURES[name], ArchitectureSpec) for name in supported())
    with pytest.raises(dataclasses.FrozenInstanceError):
        ARCHITECTURES["Phi3Model"].causal = False
    with pytest.raises(TypeError, match="register takes an ArchitectureSpec, got dict"):
        register({"hf_class": "T5Model"})
    assert set(small_models()) == {spec.family for spec in ARCHITECTURES.values() if spec.small is not None}


def test_gpt_neox_parallel_residual_is_euler_and_the_sequential_network_is_lie():
    """Issue 22: "GPTNeoXModel (partial rotary, and its parallel residual: in the continuum that
    is the euler scheme, in which attention and feed-forward read the same state; the sequential
    variant is lie)". References: the HuggingFace parallel network (``run``, one Euler step per
    layer) and the HuggingFace sequential network with the same weights (one Lie step per
    layer of the same converted model); refined, both schemes converge to one continuous model
    at first order (measured 1.06 and 1.03 against strang with 256 steps per layer; run is
    5.5e-16 from the parallel network, lie 6.7e-16 from the sequential one; they are 0.93 apart)."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf, float64_reference
    from ctformer.bridges.composite import EulerNetwork
    from ctformer.discretizations import Midpoint
    from tests.conftest import fitted_order

    def neox(parallel):
        config = t.GPTNeoXConfig(**COMMON, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                                 num_attention_heads=2, hidden_act="gelu", use_parallel_residual=parallel,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                                  "partial_rotary_factor": 0.5})
        return float64_reference(_randomize(torch, t.GPTNeoXModel(config).double().eval(), 5))

    parallel, sequential = neox(True), neox(False)
    sequential.load_state_dict(parallel.state_dict())
    x, mask, last = _from_ids(torch, parallel)
    _, _, last_sequential = _from_ids(torch, sequential)
    ct = from_hf(parallel)
    assert isinstance(ct, EulerNetwork) and not ct.warns_inconsistent_depth
    grids = dict(tokens=Midpoint(7), features=Midpoint(16), context_length=7)
    assert rel_err(ct.run(x, padding_mask=mask), last, mask) < TOL
    assert rel_err(ct.solve(x, scheme="lie", padding_mask=mask, **grids), last_sequential, mask) < TOL
    assert rel_err(last_sequential, last, mask) > 1e-3
    u = x[0]
    reference = ct.solve(u, scheme="strang", steps_per_layer=256, **grids)
    steps = (4, 8, 16, 32)
    for scheme in ("euler", "lie"):
        errors = [rel_err(ct.solve(u, scheme=scheme, steps_per_layer=k, **grids), reference) for k in steps]
        assert abs(fitted_order([1.0 / k for k in steps], errors) - 1.0) < 0.1, (scheme, errors)

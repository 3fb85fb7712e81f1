"""RoPE configurations as checkpoints carry them, and the DeiT token measure, against HuggingFace.

* A configuration saved with the old ``rope_scaling={"type": ...}`` (Phi-3's longrope, many
  linear- and dynamic-scaled Llama checkpoints): transformers 5 keeps ``"type"`` beside
  ``"rope_type"`` in ``rope_parameters``. The converted model is compared with the stock float64
  HuggingFace module (its own float32 RoPE angles: about 1e-7) and with the float64 reference
  (1e-12), below and above the original length.
* A transformers 4 Phi-3 configuration (``rope_scaling`` without the original length, which sits
  on the configuration): the frequencies and the attention factor against transformers'
  own ``longrope`` function on the same configuration and the closed form
  :math:`a = \\sqrt{1 + \\ln s / \\ln L_0}`.
* The token discretization the DeiT bridge names, solved, against ``last_hidden_state``.
"""
from __future__ import annotations

import math
import re
import types

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_bridge_configs import _model
from tests.test_modern_bridges import _randomize, _run_hf

pytestmark = pytest.mark.transformers

COMMON = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
SMALL = dict(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=12, rms_norm_eps=1e-6)
PHI3 = dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=32, original_max_position_embeddings=8, rms_norm_eps=1e-6, rope_theta=500.0)
SHORT, LONG = [1.0, 1.5, 1.2, 1.1], [2.0, 3.0, 2.5, 4.0]

LEGACY = {
    "phi3-longrope": ("Phi3", dict(PHI3, rope_scaling={"type": "longrope", "short_factor": SHORT,
                                                      "long_factor": LONG})),
    "llama-linear": ("Llama", dict(SMALL, rope_theta=300.0, rope_scaling={"type": "linear", "factor": 2.0})),
    "llama-dynamic": ("Llama", dict(SMALL, rope_theta=300.0, rope_scaling={"type": "dynamic", "factor": 2.0})),
    "qwen2-yarn": ("Qwen2", dict(SMALL, rope_theta=300.0, rope_scaling={
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8})),
    "neox-linear": ("GPTNeoX", dict(hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                                    max_position_embeddings=12, rotary_pct=0.5,
                                    rope_scaling={"type": "linear", "factor": 2.0})),
}


def _module(t, torch, cls, config, reference):
    return _model(t, torch, cls, reference, **config)


def _padded(tokens):
    """Right padding in the second sequence, left padding in the third."""
    mask = np.ones((3, tokens), dtype=bool)
    mask[1, tokens - 3:] = False
    mask[2, :3] = False
    return mask


@pytest.mark.parametrize("case", list(LEGACY))
def test_a_configuration_with_the_old_type_key_converts_to_the_huggingface_network(case):
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    cls, config = LEGACY[case]
    stock = _module(t, torch, cls, config, reference=False)
    assert stock.config.rope_parameters.get("type") is not None  # the configuration this is about
    reference = _module(t, torch, cls, config, reference=True)
    for tokens in (6, 20):  # below and above the original length (8, or max_position_embeddings 12)
        x = np.random.default_rng(tokens).standard_normal((3, tokens, stock.config.hidden_size))
        mask = _padded(tokens)
        for model, tol in ((reference, 1e-12), (stock, 1e-5)):
            last, hidden = _run_hf(torch, model, x, mask)
            # before the fix: ValueError "rope_parameters keys ['type'] are not modelled"
            assert rel_err(from_hf(model).run(hidden[0], padding_mask=mask), last, mask) < tol


def test_transformers4_phi3_longrope_takes_the_original_length_from_the_configuration():
    torch, t = require("torch"), require("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ctformer.bridges import scaled_frequencies

    # what transformers 4 held for a Phi-3 128k checkpoint: L0 on the configuration, no factor
    old = types.SimpleNamespace(hidden_size=32, num_attention_heads=4, max_position_embeddings=32,
                                original_max_position_embeddings=8, rope_theta=500.0,
                                rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG})
    new = t.Phi3Config(**COMMON, **PHI3, rope_scaling=dict(old.rope_scaling))
    closed_form = math.sqrt(1.0 + math.log(32 / 8) / math.log(8))  # s = 32 / 8, L0 = 8: 1.2910
    for length in (6, 8, 9, 20):
        omega, a = scaled_frequencies(old, length)
        hf_omega, hf_a = ROPE_INIT_FUNCTIONS["longrope"](new, seq_len=length)
        # before the fix: a = 1.0 (L0 read as max_position_embeddings = 32, s = 1), and the short
        # table at 9 and 20 tokens (omega 2 to 3.6 times too large there)
        assert abs(a - closed_form) < 1e-12 and abs(hf_a - closed_form) < 1e-6
        np.testing.assert_allclose(omega, hf_omega.double().numpy(), rtol=1e-6)


@pytest.mark.parametrize("cls, atoms", [("DeiT", 2), ("ViT", 1)])
def test_the_token_discretization_the_vision_bridges_name_is_the_network(cls, atoms):
    torch, t = require("torch"), require("transformers")
    import ctformer.bridges.deit as deit_module
    import ctformer.bridges.vit as vit_module
    from ctformer.bridges import from_hf
    from ctformer.discretizations import Midpoint, Product, WithAtoms

    docstring = (deit_module if cls == "DeiT" else vit_module).__doc__
    expression = re.search(r"``(WithAtoms\(Product\(Midpoint\(g\), Midpoint\(g\)\)[^`]*\))``", docstring).group(1)
    g = 4
    # before the fix the DeiT docstring named WithAtoms(..., atoms=2): TypeError
    names = {"__builtins__": {}, "WithAtoms": WithAtoms, "Product": Product, "Midpoint": Midpoint, "g": g}
    tokens = eval(expression, names)
    assert len(tokens.quadrature_weights) == g * g + atoms
    config = getattr(t, f"{cls}Config")(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=24, image_size=2 * g, patch_size=2, num_channels=3)
    model = _randomize(torch, getattr(t, f"{cls}Model")(config, add_pooling_layer=False).double().eval(), 0)
    pixels = torch.from_numpy(np.random.default_rng(2).standard_normal((2, 3, 2 * g, 2 * g)))
    with torch.no_grad():
        out = model(pixel_values=pixels, output_hidden_states=True)
    solved = from_hf(model).solve(out.hidden_states[0].numpy(), scheme="lie", steps_per_layer=1, tokens=tokens,
                                  features=Midpoint(16))
    assert rel_err(solved, out.last_hidden_state.numpy()) < 1e-12

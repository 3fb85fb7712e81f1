"""Vision transformers: a HuggingFace ViTModel is patches on [0, 1]^2 plus a class-token atom."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import Midpoint, Product, WithAtoms

from .conftest import require

pytestmark = pytest.mark.transformers


def _vit(patch, seed=0, layers=2):
    torch = require("torch")
    transformers = require("transformers")
    torch.manual_seed(seed)
    config = transformers.ViTConfig(image_size=32, patch_size=patch, num_channels=3, hidden_size=16,
                                    num_hidden_layers=layers, num_attention_heads=2,
                                    intermediate_size=24, hidden_act="gelu", qkv_bias=True,
                                    attn_implementation="sdpa")
    model = transformers.ViTModel(config, add_pooling_layer=False).double().eval()
    with torch.no_grad():   # random LayerNorm parameters, so that nothing is trivially 1 or 0
        for name, p in model.named_parameters():
            if "layernorm" in name:
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("weight") else 0.0))
    return torch, model


@pytest.mark.parametrize("patch", [8, 4])
def test_vit_discrete_limit_is_exact(patch):
    from ctformer.bridges.vit import from_hf_vit

    torch, model = _vit(patch)
    pixels = torch.randn(2, 3, 32, 32, dtype=torch.float64)
    with torch.no_grad():
        out = model(pixel_values=pixels, output_hidden_states=True)
    x = out.hidden_states[0].numpy()
    reference = out.last_hidden_state.numpy()
    from ctformer.bridges import from_hf

    ours = from_hf(model).run(x)
    assert np.abs(ours - reference).max() / np.abs(reference).max() < 1e-12
    # the same numbers as tokens on the square with the class token as an atom of weight 1/(P+1)
    g = 32 // patch
    continuous = from_hf_vit(model).solve(x, tokens=WithAtoms(Product(Midpoint(g), Midpoint(g))),
                                          features=Midpoint(16))
    assert np.abs(continuous - reference).max() / np.abs(reference).max() < 1e-12


def test_position_table_interpolation_is_huggingface_bicubic():
    from ctformer.bridges.vit import patch_position_table

    torch, model = _vit(8, seed=3, layers=1)
    embeddings = model.embeddings
    with torch.no_grad():
        table = embeddings.position_embeddings[0, 1:].numpy()          # 4 x 4 patches
        for size in (8, 6, 3):
            hf = embeddings.interpolate_pos_encoding(
                torch.zeros(1, size * size + 1, 16, dtype=torch.float64), 8 * size, 8 * size)
            ours = patch_position_table(table, (size, size))
            np.testing.assert_allclose(ours, hf[0, 1:].numpy(), rtol=1e-12, atol=1e-13)
    # Keys' kernel with a = -3/4 (torch's bicubic) is first-order accurate on smooth tables
    errors = []
    for g in (8, 16, 32, 64):
        c = (np.arange(g) + 0.5) / g
        fine = (np.arange(2 * g) + 0.5) / (2 * g)
        table = np.sin(3 * c)[:, None, None] * np.cos(2 * c)[None, :, None]
        got = patch_position_table(table, (2 * g, 2 * g)).reshape(2 * g, 2 * g)
        exact = np.sin(3 * fine)[:, None] * np.cos(2 * fine)[None, :]
        errors.append(np.abs(got - exact)[g // 2: -g // 2, g // 2: -g // 2].max())
    slope = np.polyfit(np.log([8, 16, 32, 64]), np.log(errors), 1)[0]
    assert abs(slope + 1.0) < 0.1


def test_vit_bridge_refuses_other_models():
    from ctformer.bridges.vit import from_hf_vit

    with pytest.raises(TypeError, match="ViTModel"):
        from_hf_vit(object())

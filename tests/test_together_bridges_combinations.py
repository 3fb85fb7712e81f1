"""Bridged features used together: padding with windows, GQA, soft-capping and RoPE scalings,
ViT position interpolation on other image shapes, shared ALBERT weights under a gradient,
and the banded engine with ALiBi, windows, padding and weights at once.

References, all independent of ctformer's own RoPE tables: the stock HuggingFace modules in
float64 (their ``inv_freq`` is float32, so RoPE networks agree to about 1e-7 and are held to
1e-6; Gemma 2's eager softmax is float32 too, 1e-5), each sequence
run alone through HuggingFace, HuggingFace's autograd, and attention written out in NumPy.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _randomize

pytestmark = pytest.mark.transformers

COMMON = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0, max_position_embeddings=32,
              hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4)
YARN = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 8}
N = 12


def _mask():
    """Three sequences of 12, 8 and 5 real tokens, padded on the left."""
    mask = np.ones((3, N), dtype=bool)
    mask[1, :4] = mask[2, :7] = False
    return mask


def _hf(torch, model, x, mask):
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(x), attention_mask=torch.from_numpy(mask.astype(np.int64)))
    return out.last_hidden_state.numpy()


def _stock(t, torch, cls, attention, **config):
    config = getattr(t, f"{cls}Config")(**{**COMMON, **config})
    config._attn_implementation = attention
    return _randomize(torch, getattr(t, f"{cls}Model")(config).double().eval(), 0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_mistral_window_gqa_and_yarn_attention_factor_on_a_padded_batch(side):
    """Window 3 < real lengths 5, 8, 12 < N; one key/value head for four queries; YaRN with
    attention factor 0.1 ln 4 + 1 = 1.139 and N = 12 beyond L0 = 8: the stock float64
    module (SDPA) agrees to 1.4e-7 on either side of the padding; the same weights with
    attention factor 1 are another network (more than 1e-3 away)."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    model = _stock(t, torch, "Mistral", "sdpa", num_key_value_heads=1, sliding_window=3, rope_parameters=dict(YARN))
    assert abs(model.rotary_emb.attention_scaling - (0.1 * np.log(4.0) + 1.0)) < 1e-12
    mask = _mask() if side == "left" else _mask()[:, ::-1].copy()
    x = np.random.default_rng(3).standard_normal((3, N, 16))
    got = from_hf(model).run(x, padding_mask=mask)
    assert np.all(np.isfinite(got))
    assert rel_err(got, _hf(torch, model, x, mask), mask) < 1e-6
    unscaled = _stock(t, torch, "Mistral", "sdpa", num_key_value_heads=1, sliding_window=3,
                      rope_parameters=dict(YARN, attention_factor=1.0))
    assert rel_err(got, _hf(torch, unscaled, x, mask), mask) > 1e-3


def test_gemma2_softcap_alternating_windows_and_yarn_padded_equal_each_sequence_alone():
    """Gemma 2 with soft-capping 2.0 (the factor a^2 of YaRN inside the cap), alternating
    sliding (window 3) and global layers, one key/value head, query_pre_attn_scalar 7: the
    padded batch equals each sequence run alone through the stock eager module (whose own
    padded batch holds NaN in float64; its softmax is float32), 1.8e-6 measured."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    model = _stock(t, torch, "Gemma2", "eager", num_key_value_heads=1, head_dim=4, sliding_window=3,
                   query_pre_attn_scalar=7, attn_logit_softcapping=2.0, rope_parameters=dict(YARN))
    mask = _mask()
    x = np.random.default_rng(3).standard_normal((3, N, 16))
    got = from_hf(model).run(x, padding_mask=mask)
    for b in range(3):
        alone = _hf(torch, model, x[b:b + 1, mask[b]], np.ones((1, mask[b].sum()), dtype=bool))[0]
        assert rel_err(got[b][mask[b]], alone) < 1e-5, b


def test_a_partial_rotary_factor_is_refused_for_gemma_by_its_family_whatever_the_width():
    """A Gemma configuration with partial_rotary_factor=0.5 and head_dim 6 (3 rotated
    features) was refused for an odd rotated width, naming a cause that making it even does
    not remove; the refusal names the family, as for head_dim 4."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    for head_dim in (6, 4):
        model = _stock(t, torch, "Gemma", "sdpa", num_key_value_heads=2, head_dim=head_dim,
                       rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.5})
        with pytest.raises(ValueError, match=r"partial_rotary_factor=0.5 is not modelled for the Gemma family"):
            from_hf(model)


@pytest.mark.parametrize("name, atoms", [("ViT", 1), ("DeiT", 2)])
def test_vision_position_interpolation_on_other_image_shapes(name, atoms):
    """A 4 x 4 patch network run at 6 x 4, 2 x 3 and 5 x 3 patches with
    ``interpolate_pos_encoding=True``: patch_position_table is HuggingFace's bicubic table
    (1.7e-15) and ``run`` on the embedding output its network (9e-16)."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf, patch_position_table

    config = getattr(t, f"{name}Config")(image_size=16, patch_size=4, hidden_size=16, num_hidden_layers=2,
                                         num_attention_heads=4, intermediate_size=24)
    model = _randomize(torch, getattr(t, f"{name}Model")(config, add_pooling_layer=False).double().eval(), 0)
    ct = from_hf(model)
    table = model.embeddings.position_embeddings[0, atoms:].detach().numpy()
    for shape in ((24, 16), (8, 12), (20, 12)):
        pixels = torch.randn(2, 3, *shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        with torch.no_grad():
            out = model(pixel_values=pixels, interpolate_pos_encoding=True, output_hidden_states=True)
            patches = model.embeddings.patch_embeddings(pixels)[0].numpy()
        embedded = out.hidden_states[0].numpy()
        positions = patch_position_table(table, (shape[0] // 4, shape[1] // 4))
        assert rel_err(positions, embedded[0, atoms:] - patches) < 1e-12, shape
        assert rel_err(ct.run(embedded), out.last_hidden_state.numpy()) < 1e-12, shape


def test_albert_shared_weights_padding_and_the_gradient():
    """Three layers sharing one block, a right-padded batch: the gradient of a loss on the real
    tokens with respect to the state and to the shared query weight is HuggingFace's autograd
    gradient (5e-16); the shared weight's gradient (the sum over the three layers) reaches the
    tensor the model keeps, the one given under the last layer's name."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    config = t.AlbertConfig(vocab_size=32, embedding_size=8, hidden_size=16, num_hidden_layers=3,
                            num_attention_heads=4, intermediate_size=24, max_position_embeddings=32)
    model = _randomize(torch, t.AlbertModel(config, add_pooling_layer=False).double().eval(), 0)
    ct = from_hf(model)
    mask = np.ones((2, 6), dtype=bool)
    mask[1, -2:] = False
    rng = np.random.default_rng(0)
    u0 = torch.from_numpy(rng.standard_normal((2, 6, 16)))
    weight = torch.from_numpy(rng.standard_normal((2, 6, 16)) * mask[..., None])
    leaf = u0.clone().requires_grad_(True)   # HuggingFace's hidden_states[0], as the layers' input
    hook = model.encoder.embedding_hidden_mapping_in.register_forward_hook(lambda module, args, out: leaf)
    out = model(inputs_embeds=torch.zeros(2, 6, 8, dtype=torch.float64),
                attention_mask=torch.from_numpy(mask.astype(np.int64)))
    hook.remove()
    (out.last_hidden_state * weight).sum().backward()
    params = {k: torch.tensor(v, requires_grad=True) for k, v in ct.parameters().items()}
    u = u0.clone().requires_grad_(True)
    got = ct.with_parameters(params).run(u, padding_mask=torch.from_numpy(mask))
    assert rel_err(got.detach().numpy(), out.last_hidden_state.detach().numpy(), mask) < 1e-12
    (got * weight).sum().backward()
    assert rel_err(u.grad.numpy(), leaf.grad.numpy()) < 1e-12
    query = model.encoder.albert_layer_groups[0].albert_layers[0].attention.query.weight.grad.numpy()
    kept = torch.cat([params[f"blocks.2.attention.W_Q.{h}.weight"].grad for h in range(4)]).numpy()
    assert rel_err(kept, query) < 1e-12


def _attention(q, k, v, beta, keep, bias, log_weights):
    """Softmax attention over the kept keys, written out (empty rows give zero)."""
    s = np.where(keep, beta * np.einsum("bhnd,bhmd->bhnm", q, k) + bias + log_weights, -np.inf)
    top = s.max(-1, keepdims=True)
    e = np.exp(s - np.where(np.isfinite(top), top, 0.0))
    total = e.sum(-1, keepdims=True)
    return np.einsum("bhnm,bhme->bhne", e, v) / np.where(total > 0, total, 1.0)


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-13), (np.float32, 2e-6)])
def test_banded_engine_with_alibi_window_padding_and_weights_together(dtype, tol):
    """ALiBi slopes per head, a window of 3, padding that differs per sequence, positive key
    weights and blocks of 2 rows, on NumPy and torch: the written-out float64 softmax, 3e-16
    (float32 2.8e-7)."""
    torch = require("torch")
    from ctformer.operators import local_attention, window_pattern

    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 3, 2, 13, 4))
    v = rng.standard_normal((3, 2, 13, 5))
    positions = np.arange(13.0)
    keys = np.ones((3, 13), dtype=bool)
    keys[1, :4] = keys[2, 9:] = False
    slopes, weights = np.array([0.3, 0.7]), rng.uniform(0.5, 1.5, 13)
    diff = positions[:, None] - positions[None, :]
    keep = ((diff >= 0) & (diff < 3))[None, None] & keys[:, None, None, :]
    want = _attention(q, k, v, 0.8, keep, -slopes[None, :, None, None] * np.abs(diff), np.log(weights))
    options = dict(beta=0.8, pattern=window_pattern(positions, 3), weights=weights, slopes=slopes,
                   positions=positions, block=2)
    got = local_attention(*(a.astype(dtype) for a in (q, k, v)), key_mask=keys[:, None, :], **options)
    assert got.dtype == dtype and rel_err(np.asarray(got, dtype=np.float64), want) < tol
    tensors = [torch.from_numpy(a.astype(dtype)) for a in (q, k, v)]
    got = local_attention(*tensors, key_mask=torch.from_numpy(keys[:, None, :]), **options)
    assert rel_err(got.double().numpy(), want) < tol

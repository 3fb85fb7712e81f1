"""Head sizes of the classes whose attention does not read ``head_dim`` or ``num_key_value_heads``.

BERT and ALBERT size their heads ``hidden_size // num_attention_heads`` and GPT-2
``n_embd // n_head``, whatever ``config.head_dim`` says, and none of them, nor ViT, has
key/value heads of its own. A configuration carrying such a key (any configuration class takes
extra keys) runs in HuggingFace as without it; the converted model now does too (1e-12 against
the float64 module), where it was refused with a message about the weights' shapes. ViT and
DeiT do read ``head_dim`` (``ViTAttention``): that is still honoured.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _padding, _randomize, _run_hf

pytestmark = pytest.mark.transformers

TOL = 1e-12
COMMON = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
BERT = dict(COMMON, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
            max_position_embeddings=32)
ALBERT = dict(COMMON, embedding_size=8, hidden_size=16, num_hidden_layers=3, num_attention_heads=4,
              intermediate_size=24, max_position_embeddings=32)
GPT2 = dict(vocab_size=32, n_positions=32, n_embd=12, n_layer=2, n_head=3, n_inner=20, bos_token_id=0, eos_token_id=0)


def _hf(cls, **config):
    torch, t = require("torch"), require("transformers")
    model = getattr(t, f"{cls}Model")(getattr(t, f"{cls}Config")(**config)).double().eval()
    return _randomize(torch, model, 0, conv1d=cls == "GPT2")


def _error(model, width, tokens=7):
    torch = require("torch")
    from ctformer.bridges import from_hf

    x = np.random.default_rng(1).standard_normal((3, tokens, width))
    mask = _padding(3, tokens, 0)
    last, hidden = _run_hf(torch, model, x, mask)
    return rel_err(from_hf(model).run(hidden[0], padding_mask=mask), last, mask)


CASES = {
    "bert-head_dim": ("Bert", dict(BERT, head_dim=8), 16),
    "bert-kv_heads": ("Bert", dict(BERT, num_key_value_heads=2), 16),
    "albert-head_dim": ("Albert", dict(ALBERT, head_dim=8), 8),
    "gpt2-head_dim": ("GPT2", dict(GPT2, head_dim=8), 12),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_head_key_the_class_does_not_read_is_ignored_as_huggingface_ignores_it(case):
    cls, config, width = CASES[case]
    model = _hf(cls, **config)
    # the module really ignores it: heads of d / H features
    first = model.encoder.albert_layer_groups[0].albert_layers[0] if cls == "Albert" else None
    assert first is None or first.attention.attention_head_size == 4
    # before: ValueError "the q projection has shape (16, 16), expected 32 rows" (BERT, ALBERT),
    # "c_attn.weight has 36 rows ... set config.head_dim to 4 or None" (GPT-2); now 3e-16 to 7e-16
    assert _error(model, width) < TOL


def _vit(**extra):
    torch, t = require("torch"), require("transformers")
    config = t.ViTConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
                         image_size=8, patch_size=4, **extra)
    return _randomize(torch, t.ViTModel(config, add_pooling_layer=False).double().eval(), 0)


@pytest.mark.parametrize("extra", [dict(num_key_value_heads=2), dict(head_dim=8)], ids=["kv_heads", "head_dim"])
def test_vit_ignores_key_value_heads_and_reads_head_dim_as_huggingface_does(extra):
    torch = require("torch")
    from ctformer.bridges import from_hf

    model = _vit(**extra)
    assert model.layers[0].attention.q_proj.weight.shape[0] == 4 * extra.get("head_dim", 4)
    pixels = torch.from_numpy(np.random.default_rng(2).standard_normal((2, 3, 8, 8)))
    with torch.no_grad():
        out = model(pixel_values=pixels, output_hidden_states=True)
    # before (kv_heads): ValueError "the k projection has shape (16, 16), expected 8 rows"
    assert rel_err(from_hf(model).run(out.hidden_states[0].numpy()), out.last_hidden_state.numpy()) < TOL


def test_gpt2_weights_of_another_width_are_refused_naming_the_mismatch():
    """d_h = n_embd / n_head: a mismatch is the weights', not a head_dim to set."""
    from ctformer.bridges.convert import build
    from ctformer.bridges.gpt2 import GPT2 as SPEC

    model = _hf("GPT2", **GPT2)
    config = dict(model.config.to_dict(), n_embd=16, n_head=4)
    # before: "... set config.head_dim to 3 or None" (GPT-2 has no head_dim)
    with pytest.raises(ValueError, match=r"GPT2Model: h\.0\.attn\.c_attn\.weight has 36 rows, but n_embd / n_head "
                                         r"= 4 with 4 heads gives 48: the weights do not belong to this "
                                         r"configuration; load them with the configuration they were saved with"):
        build(SPEC, model.state_dict(), config)

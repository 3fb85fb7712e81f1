"""A converted model whose module changed in place after the conversion refuses to be pickled or
copied, as it refuses to solve: its copy would pair the module's new values with arrays derived
from the old ones and compute neither network (0.185 from the old network and 0.648 from the
new one, for a Llama whose ``q_proj`` and ``input_layernorm`` weights were scaled)."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from ctformer.bridges import StaleConversionError
from tests.conftest import rel_err, require
from tests.test_modern_bridges import _llama, _run_hf


@pytest.fixture
def llama():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    module = _llama(t, torch, layers=2, heads=4, kv_heads=2, d=16, theta=1000.0)
    x = np.random.default_rng(0).standard_normal((2, 6, 16))
    last, hidden = _run_hf(torch, module, x, np.ones((2, 6), dtype=bool))
    return torch, module, from_hf(module), hidden[0], last


def test_a_fresh_conversion_pickles_and_its_copy_is_the_network(llama):
    """The unchanged conversion still pickles; the copy equals the float64 HF module (1e-12)."""
    _, _, model, u0, last = llama
    model.run(u0)  # after a solve too
    for copied in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert rel_err(copied.run(u0), last) < 1e-12


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "copy"])
def test_a_stale_conversion_refuses_to_be_copied(llama, how):
    """Before, ``pickle.loads(pickle.dumps(model))`` of the stale model (which itself raises
    StaleConversionError in ``run``) solved on without a word: 0.185 from the old network's
    output and 0.648 from the new one's. Now pickling and copying raise, naming the weights and
    the remedy."""
    torch, module, model, u0, _ = llama
    model.run(u0)
    weights = dict(module.named_parameters())
    with torch.no_grad():
        weights["layers.0.self_attn.q_proj.weight"].mul_(1.5)
        weights["layers.0.input_layernorm.weight"].mul_(1.5)
    copier = {"pickle": lambda m: pickle.loads(pickle.dumps(m)), "deepcopy": copy.deepcopy, "copy": copy.copy}[how]
    with pytest.raises(StaleConversionError, match=r"cannot pickle or copy .*q_proj.*input_layernorm.*"
                                                   r"Convert the module again"):
        copier(model)
    with pytest.raises(StaleConversionError, match="q_proj"):
        model.run(u0)

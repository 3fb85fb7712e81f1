"""Gemma's activation follows the installed ``GemmaMLP``, as transformers has changed which key it reads.

Before transformers 4.48 ``GemmaMLP`` applied ``config.hidden_activation`` (``None`` meaning
``gelu_pytorch_tanh``) and never read ``hidden_act``, which the official Gemma configurations
set to ``"gelu"`` (the erf GELU); later versions read ``hidden_act``. The bridge read
``hidden_act`` whatever was installed: under an older transformers a Gemma configuration
converted to the erf GELU where the module applies the tanh one. The older code is simulated:
:func:`~ctformer.bridges.gemma.mlp_reads_hidden_activation` answers for it, and the module's
activations are the ones that code builds.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _padding, _randomize, _run_hf

pytestmark = pytest.mark.transformers

GEMMA = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0, hidden_size=16, intermediate_size=24,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
             max_position_embeddings=64)

OLD_MLP = '''
class GemmaMLP:
    def __init__(self, config):
        if config.hidden_activation is None:
            config.hidden_activation = "gelu_pytorch_tanh"
        self.act_fn = config.hidden_activation
'''


def test_the_installed_code_decides_which_key_is_read():
    from ctformer.bridges.gemma import mlp_reads_hidden_activation

    old = types.ModuleType("audit_old_modeling_gemma")
    exec(OLD_MLP, old.__dict__)  # the shape of transformers 4.40's GemmaMLP.__init__
    sys.modules[old.__name__] = old
    try:
        assert mlp_reads_hidden_activation(old.__name__)
    finally:
        del sys.modules[old.__name__]
    require("transformers")
    assert not mlp_reads_hidden_activation()  # transformers 5 reads hidden_act
    assert not mlp_reads_hidden_activation("audit_no_such_module")


@pytest.mark.parametrize("hidden_activation", [None, "silu"])
def test_gemma_under_a_transformers_that_reads_hidden_activation(hidden_activation, monkeypatch):
    torch, t = require("torch"), require("transformers")
    from transformers.activations import ACT2FN

    import ctformer.bridges.gemma as gemma
    from ctformer.bridges import float64_reference, from_hf

    model = _randomize(torch, t.GemmaModel(t.GemmaConfig(**GEMMA)).double().eval(), 0)
    # the configuration of the official checkpoints, as the older code saw it
    model.config.hidden_act = "gelu"
    model.config.hidden_activation = hidden_activation
    for layer in model.layers:  # what that code built: the activation of hidden_activation
        layer.mlp.act_fn = ACT2FN[hidden_activation or "gelu_pytorch_tanh"]
    model = float64_reference(model)
    monkeypatch.setattr(gemma, "mlp_reads_hidden_activation", lambda: True)
    x = np.random.default_rng(1).standard_normal((3, 7, 16))
    mask = _padding(3, 7, 0)
    last, hidden = _run_hf(torch, model, x, mask)
    # before: hidden_act='gelu' read, the erf GELU: 3.2e-4 from the module (None), 0.21 (silu);
    # now 1.7e-15 and 4.0e-15
    assert rel_err(from_hf(model).run(hidden[0], padding_mask=mask), last, mask) < 1e-12

"""Explicit ``position_ids`` against ``run``, which numbers the tokens 0, ..., N - 1.

References: the float64 HuggingFace modules (``float64_reference``) given ``position_ids``.
An offset is the same network for a RoPE that does not depend on the length (only position
differences enter the scores); it moves the length of ``dynamic``; gaps are another numbering
that ``run`` does not take. The numbers are those of ``docs/bridges.rst`` (Padded batches).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _randomize

pytestmark = pytest.mark.transformers

BASE = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0, hidden_size=16, intermediate_size=24,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8)
DEFAULT = {"rope_type": "default", "rope_theta": 100.0}
DYNAMIC = {"rope_type": "dynamic", "rope_theta": 100.0, "factor": 2.0}


def _error(cls, rope, positions, **extra):
    """Relative error of ``run`` against HuggingFace's forward given ``position_ids``."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import float64_reference, from_hf

    config = getattr(t, f"{cls}Config")(**BASE, rope_parameters=dict(rope), **extra)
    model = float64_reference(_randomize(torch, getattr(t, f"{cls}Model")(config).double().eval(), 0))
    x = np.random.default_rng(1).standard_normal((2, len(positions), 16))
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(x), position_ids=torch.tensor(np.tile(positions, (2, 1))))
    return rel_err(from_hf(model).run(x), out.last_hidden_state.numpy())


@pytest.mark.parametrize("cls, extra", [("Llama", {}), ("Mistral", {"sliding_window": 3})])
def test_an_offset_is_the_same_network_for_a_rope_without_length(cls, extra):
    assert _error(cls, DEFAULT, np.arange(6) + 5, **extra) < 1e-12
    assert _error(cls, DEFAULT, np.arange(6), **extra) < 1e-12


def test_an_offset_moves_the_length_of_dynamic_rope_and_gaps_are_another_numbering():
    assert 0.02 < _error("Llama", DYNAMIC, np.arange(6) + 5) < 0.05   # L = 11 > L0 = 8, run takes L = 6
    assert _error("Llama", DYNAMIC, np.arange(6)) < 1e-12
    for cls, extra in (("Llama", {}), ("Mistral", {"sliding_window": 3})):
        assert _error(cls, DEFAULT, 2 * np.arange(6), **extra) > 0.3


def test_absolute_positions_take_any_position_ids_through_the_embedding():
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf

    config = t.GPT2Config(vocab_size=32, n_positions=32, n_embd=12, n_layer=2, n_head=3, n_inner=20)
    model = _randomize(torch, t.GPT2Model(config).double().eval(), 0, conv1d=True)
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0))
    for positions in (np.arange(6) + 5, 2 * np.arange(6), np.array([0, 1, 2, 0, 1, 2])):
        with torch.no_grad():
            out = model(input_ids=ids, position_ids=torch.tensor(np.tile(positions, (2, 1))), output_hidden_states=True)
        assert rel_err(from_hf(model).run(out.hidden_states[0].numpy()), out.last_hidden_state.numpy()) < 1e-12

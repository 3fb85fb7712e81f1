"""One copy of the weights in a converted network, measured as resident bytes.

The resident bytes of a converted model are the bytes of the distinct buffers under the arrays
of its ``parameters()`` (each view followed to the array that owns its memory, each buffer
counted once); "owned" ones are those outside the memory of the module's tensors. The
references: the module's own tensors (their address ranges), its parameter count, and the
float64 HuggingFace forward (relative error 1e-12).
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _padding, _randomize, _run_hf

pytestmark = pytest.mark.transformers

COMMON = dict(vocab_size=32, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, pad_token_id=0)


def _buffers(net) -> dict:
    """address -> bytes of the distinct buffers under the model's matrices."""
    found = {}
    for value in net.parameters().values():
        if getattr(value, "ndim", 0) != 2:
            continue  # biases and gains: O(d), not weight matrices
        root = value
        while isinstance(root.base, np.ndarray):
            root = root.base
        found[root.__array_interface__["data"][0]] = root.nbytes
    return found


def _owned_bytes(net, module) -> int:
    """Bytes of the model's matrix buffers that lie outside every tensor of ``module``."""
    ranges = [(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in module.state_dict().values()]
    return sum(size for start, size in _buffers(net).items() if not any(lo <= start < hi for lo, hi in ranges))


def _neox(t, torch, partial):
    from ctformer.bridges import float64_reference

    config = t.GPTNeoXConfig(**COMMON, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=4, rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                                     "partial_rotary_factor": partial})
    return float64_reference(_randomize(torch, t.GPTNeoXModel(config).double().eval(), 3))


@pytest.mark.parametrize("partial", [1.0, 0.5])
def test_gpt_neox_per_head_qkv_is_shared_not_copied(partial):
    # query_key_value holds rows (head, [q, k, v], head_dim): each head's block is a contiguous
    # view. The queries and keys of partial rotary are reordered (one copy of them, stated);
    # the values never are, and nothing is copied with full rotary.
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model = _neox(t, torch, partial)
    net = from_hf(model)
    qkv_bytes = 2 * 3 * 32 * 32 * 8  # two layers of the fused (3d, d) weight
    expected = 0 if partial == 1.0 else 2 * qkv_bytes // 3  # partial: the reordered q and k rows
    assert _owned_bytes(net, model) == expected
    fused = model.layers[0].attention.query_key_value.weight.detach().numpy()
    for h, kernel in enumerate(net.blocks[0].attention.W_V):
        assert np.shares_memory(kernel.weight, fused)
        np.testing.assert_array_equal(kernel.weight, fused[(3 * h + 2) * 8:(3 * h + 3) * 8])
    x = np.random.default_rng(0).standard_normal((2, 9, 32))
    mask = _padding(2, 9, 0)
    last, _ = _run_hf(torch, model, x, mask)
    assert rel_err(net.run(x, padding_mask=mask), last, mask) < 1e-12


def test_tied_parameters_of_a_float32_module_convert_once_and_stay_tied():
    # Two layers holding the same nn.Linear modules (a tie): the float32 weights are converted
    # to float64 once, and both blocks read that one array, as a float64 module's blocks share
    # its one tensor.
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    config = t.LlamaConfig(**COMMON, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2)
    model = _randomize(torch, t.LlamaModel(config).eval(), 1)
    model.layers[1].mlp = model.layers[0].mlp
    model.layers[1].self_attn.q_proj = model.layers[0].self_attn.q_proj
    distinct = {p.data_ptr(): p.numel() for n, p in model.named_parameters() if p.ndim == 2 and "embed" not in n}
    net = from_hf(model)
    ff0, ff1 = net.blocks[0].feedforward, net.blocks[1].feedforward
    assert ff0.W_up.weight is ff1.W_up.weight or np.shares_memory(ff0.W_up.weight, ff1.W_up.weight)
    assert np.shares_memory(net.blocks[0].attention.W_Q[0].weight, net.blocks[1].attention.W_Q[0].weight)
    assert sum(_buffers(net).values()) == 8 * sum(distinct.values())  # one float64 copy of each
    # the network of the float32 weights, computed in float64: HuggingFace on the widened module
    reference = _randomize(torch, t.LlamaModel(config).eval(), 1)
    reference.load_state_dict(model.state_dict())
    from ctformer.bridges import float64_reference

    reference = float64_reference(reference.double())
    x = np.random.default_rng(1).standard_normal((2, 7, 32))
    mask = np.ones((2, 7), dtype=bool)
    last, _ = _run_hf(torch, reference, x, mask)
    assert rel_err(net.run(x), last) < 1e-12


def test_gpt_neox_head_dim_that_is_not_the_attention_head_size_is_refused_by_name():
    # HuggingFace's GPT-NeoX sizes its heads as hidden_size / num_attention_heads (8 here) and
    # reads head_dim for the rotary features only; the split of query_key_value by head_dim=4
    # once failed inside NumPy ("cannot reshape array of size 48"): now the option is named
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    config = t.GPTNeoXConfig(**COMMON, hidden_size=16, intermediate_size=24, num_hidden_layers=1,
                             num_attention_heads=2, head_dim=4,
                             rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 1.0})
    model = t.GPTNeoXModel(config).double().eval()
    assert model.layers[0].attention.head_size == 8
    with pytest.raises(ValueError, match=r"GPTNeoXModel: layers\.0\.attention\.query_key_value\.weight has 48 rows, "
                                         r"but head_dim=4 .* set config\.head_dim to 8 or None"):
        from_hf(model)

"""One copy of each weight in a converted HuggingFace network (shared with the module in float64).

References: the module's own tensors (``np.shares_memory`` with their NumPy views), the
module's parameter count (bytes held, measured by :mod:`tracemalloc` in NumPy's domain) and
the result of the same network converted from float32 weights, whose one float64 conversion
has the layout every product had before the weights were shared.
"""
import gc
import tracemalloc

import numpy as np
import pytest

from .conftest import require

torch = require("torch")
transformers = require("transformers")

from ctformer.bridges import from_hf  # noqa: E402
from ctformer.discretizations import Midpoint  # noqa: E402

D, FF, HEADS, KV, HEAD_DIM, LAYERS = 64, 160, 4, 2, 16, 2


def _mistral(dtype):
    torch.manual_seed(0)
    cfg = transformers.MistralConfig(hidden_size=D, intermediate_size=FF, num_attention_heads=HEADS,
                                     num_key_value_heads=KV, head_dim=HEAD_DIM, num_hidden_layers=LAYERS,
                                     vocab_size=8, sliding_window=None, bos_token_id=0, eos_token_id=1)
    return transformers.MistralModel(cfg).to(dtype).eval()


def _tensor(module, name):
    return module.get_parameter(name).detach().numpy()


def test_operators_and_parameters_share_the_float64_module_weights():
    module = _mistral(torch.float64)
    net = from_hf(module)
    params = net.parameters()
    for i, block in enumerate(net.blocks):
        layer = f"layers.{i}."
        pairs = [(block.feedforward.W_gate, "mlp.gate_proj"), (block.feedforward.W_up, "mlp.up_proj"),
                 (block.feedforward.W_2, "mlp.down_proj")]
        pairs += [(k, "self_attn.q_proj") for k in block.attention.W_Q]
        pairs += [(k, "self_attn.k_proj") for k in block.attention.W_K]
        pairs += [(k, "self_attn.o_proj") for k in block.attention.W_O]
        for kernel, name in pairs:
            assert np.shares_memory(kernel.weight, _tensor(module, layer + name + ".weight"))
        head = block.attention.W_O[1].weight  # columns 16..31 of o_proj, a view
        np.testing.assert_array_equal(head, _tensor(module, layer + "self_attn.o_proj.weight")[:, 16:32])
        assert np.shares_memory(params[f"blocks.{i}.feedforward.W_up.weight"], block.feedforward.W_up.weight)
        assert np.shares_memory(params[f"blocks.{i}.attention.W_V.1.weight"],
                                _tensor(module, layer + "self_attn.v_proj.weight"))
    for name, value in params.items():
        assert not value.flags.writeable, name
    with pytest.raises(ValueError, match="read-only"):
        params["blocks.0.feedforward.W_2.weight"][0, 0] = 1.0
    # the products of a run read the weights themselves (transposed views), not copies
    net.run(np.ones((2, 5, D)))
    ff = net.blocks[0].feedforward
    assert np.shares_memory(ff.W_2.transposed_matrix(Midpoint(D), Midpoint(FF)),
                            _tensor(module, "layers.0.mlp.down_proj.weight"))


def _held_numpy_bytes(action):
    """NumPy array bytes still allocated after ``action()`` (its result kept alive)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = _numpy_bytes()
        kept = action()
        gc.collect()
        return _numpy_bytes() - before, kept
    finally:
        tracemalloc.stop()


def _numpy_bytes():
    only = [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]
    return sum(s.size for s in tracemalloc.take_snapshot().filter_traces(only).statistics("filename"))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_converted_model_holds_one_copy(dtype):
    module = _mistral(getattr(torch, dtype))
    x = np.random.default_rng(0).standard_normal((2, 8, D))
    from_hf(_mistral(torch.float64)).run(x)  # warm-up: imports, compiled loops
    converted = 8 * sum(p.numel() for n, p in module.named_parameters() if not n.startswith("embed"))
    packed = 8 * LAYERS * (HEADS + 2 * KV) * HEAD_DIM * D  # the packed q/k/v product matrix

    def convert_and_run():
        net = from_hf(module)
        first = net.run(x)
        return net, first

    held, (net, first) = _held_numpy_bytes(convert_and_run)
    owned = 0 if dtype == "float64" else converted  # float32: one float64 conversion
    assert owned + packed <= held <= owned + packed + 0.08 * converted, (held, owned, packed, converted)
    again, _ = _held_numpy_bytes(lambda: net.run(x))  # a second run builds nothing that stays
    assert again <= x.nbytes + 0.005 * converted  # its result only
    assert sum(v.size for v in net.parameters().values()) * 8 == converted


def test_run_is_unchanged_bit_for_bit():
    # float32 weights converted once to float64 (in the module's layout) against the same values
    # shared from a float64 module: the same matrices in the same layout, so the same bits
    module = _mistral(torch.float32)
    shared = module.to(torch.float64)
    x = np.random.default_rng(1).standard_normal((3, 9, D))
    owned_net = from_hf(_mistral(torch.float32))
    shared_net = from_hf(shared)
    np.testing.assert_array_equal(owned_net.run(x), shared_net.run(x))
    solved = [net.solve(np.random.default_rng(2).standard_normal((2, 16, 2 * D)), tokens="midpoint",
                        features="midpoint", context_length=16) for net in (owned_net, shared_net)]
    np.testing.assert_array_equal(*solved)  # refined grids: built matrices, the same either way
    one = np.random.default_rng(3).standard_normal((1, 1, D))  # one row: BLAS's vector product
    np.testing.assert_array_equal(owned_net.run(one), shared_net.run(one))  # the same layout

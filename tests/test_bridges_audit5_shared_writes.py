"""Writes through ``tensor.data`` into the weights a converted float64 model shares.

``p.data`` is a new tensor over ``p``'s memory with a version counter of its own, so a write
through it (``p.data.add_``, a LoRA merge ``weight.data += B @ A``, hand-written updates)
changes the memory a converted model shares without counting a version of ``p``. Before the
fix such a model ran on: its shared views followed the module, the packed attention
projections kept the old values, and the result was neither network (0.20 away from the old
one, 0.16 from the new one, for 10% noise on every matrix of a 2-layer Llama). References:
the float64 HuggingFace module before and after the write.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _randomize, _run_hf

pytestmark = pytest.mark.transformers

LLAMA = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0, hidden_size=16, intermediate_size=24,
             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _llama():
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import float64_reference

    model = _randomize(torch, t.LlamaModel(t.LlamaConfig(**LLAMA)).double().eval(), 0)
    return torch, float64_reference(model)


def _inputs():
    return np.random.default_rng(1).standard_normal((2, 7, 16)), np.ones((2, 7), dtype=bool)


def test_a_write_through_data_does_not_count_a_version():
    """Why the version counters alone miss it: torch's own behaviour, the premise of the fix."""
    torch, model = _llama()
    weight = model.layers[0].self_attn.q_proj.weight
    before = weight._version
    with torch.no_grad():
        weight.data.mul_(2.0)
    assert weight._version == before


def test_a_data_write_after_the_conversion_stops_the_solve():
    from ctformer.bridges import StaleConversionError, from_hf

    torch, model = _llama()
    x, mask = _inputs()
    old, _ = _run_hf(torch, model, x, mask)
    converted = from_hf(model)
    assert rel_err(converted.run(x, padding_mask=mask), old) < 1e-12  # packs its projections
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.data.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype) / p.shape[1] ** 0.5)
    new, _ = _run_hf(torch, model, x, mask)
    assert rel_err(new, old) > 0.1  # the write changed the network
    # before: ran on, 0.20 from the old network and 0.16 from the new one
    with pytest.raises(StaleConversionError, match=r"LlamaModel weights layers\.0\.self_attn\.q_proj\.weight.*"
                                                   r"changed in place.*from_hf\(module\)"):
        converted.run(x, padding_mask=mask)
    assert rel_err(from_hf(model).run(x, padding_mask=mask), new) < 1e-12  # the remedy


def test_a_lora_merge_through_data_is_caught():
    """A rank-1 update of one projection (PEFT merges ``weight.data += B @ A``)."""
    from ctformer.bridges import StaleConversionError, from_hf

    torch, model = _llama()
    x, mask = _inputs()
    converted = from_hf(model)
    converted.run(x, padding_mask=mask)
    v_proj = model.layers[1].self_attn.v_proj.weight
    g = torch.Generator().manual_seed(5)
    delta = torch.randn(v_proj.shape[0], 1, generator=g, dtype=torch.float64) @ \
        torch.randn(1, v_proj.shape[1], generator=g, dtype=torch.float64)
    with torch.no_grad():
        v_proj.data += 0.05 * delta
    with pytest.raises(StaleConversionError, match=r"weight layers\.1\.self_attn\.v_proj\.weight changed in place"):
        converted.run(x, padding_mask=mask)


def test_an_unchanged_module_keeps_running_and_float32_conversions_own_their_arrays():
    from ctformer.bridges import from_hf

    torch, model = _llama()
    x, mask = _inputs()
    reference, _ = _run_hf(torch, model, x, mask)
    converted = from_hf(model)
    for _ in range(2):  # no false alarm: the sampled values are read, not changed
        assert rel_err(converted.run(x, padding_mask=mask), reference) < 1e-12
    single = model.float()  # new float32 tensors: the float64 memory stays with the model
    assert rel_err(converted.run(x, padding_mask=mask), reference) < 1e-12  # replaced, not changed
    owned = from_hf(single)
    first = owned.run(x.astype(np.float32), padding_mask=mask)
    with torch.no_grad():
        for p in single.parameters():
            p.data.mul_(1.5)
    np.testing.assert_array_equal(owned.run(x.astype(np.float32), padding_mask=mask), first)


def test_training_one_module_leaves_the_conversions_of_its_untouched_copy_alone():
    """Kernels are compared by value and equal kernels share cached matrices. Before the fix,
    after one module was trained in place, the conversion of an untouched copy (converted before
    or after) found the trained model's kernels equal (keys of the old values) and computed with
    the trained weights: 0.025 and 0.041 away from its own network, without an error."""
    import copy

    from ctformer.bridges import StaleConversionError, from_hf

    torch, trained = _llama()
    _, pristine = _llama()
    x, mask = _inputs()
    reference, _ = _run_hf(torch, pristine, x, mask)
    first, before = from_hf(trained), from_hf(pristine)
    for converted in (first, before):
        converted.run(x, padding_mask=mask)
    loss = trained(inputs_embeds=torch.from_numpy(x)).last_hidden_state.square().mean()
    loss.backward()
    torch.optim.SGD(trained.parameters(), lr=0.1).step()
    with pytest.raises(StaleConversionError, match="changed in place"):
        first.run(x, padding_mask=mask)
    assert rel_err(before.run(x, padding_mask=mask), reference) < 1e-12
    after = from_hf(copy.deepcopy(pristine))
    assert rel_err(after.run(x, padding_mask=mask), reference) < 1e-12


def test_kernels_over_module_memory_are_equal_only_to_themselves():
    """A float64 module's weights are viewed (identity-compared kernels); a float32 module's
    are converted into arrays of the model's own (value-compared: equal conversions share)."""
    from ctformer.bridges import from_hf
    from ctformer.bridges.common import ModuleWeight

    _, model = _llama()
    one, two = (from_hf(model).blocks[0].attention.W_V[0] for _ in range(2))
    assert isinstance(one, ModuleWeight) and one == one and one != two
    np.testing.assert_array_equal(one.weight, two.weight)
    single = model.float()
    three, four = (from_hf(single).blocks[0].attention.W_V[0] for _ in range(2))
    assert not isinstance(three, ModuleWeight) and three == four

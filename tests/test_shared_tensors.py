"""A converted float64 module shares its tensors with the model; a tensor changed in place after
the conversion (an optimizer step, ``mul_``, ``load_state_dict``) would leave the model mixing
new values (the shared views) with arrays derived from the old ones (the packed attention
projections, float32 copies). Such a model is refused by name; a new conversion computes the
changed network (reference: the HuggingFace module itself, float64); copies of a converted
model and conversions of other dtypes hold their own arrays and keep computing the old one."""
from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from ctformer.shared_tensors import StaleConversionError

from .conftest import require

torch = require("torch")
require("transformers")

pytestmark = pytest.mark.transformers


def _network(kind="gpt2"):
    from ctformer.bridges.hf import small_model

    return small_model(kind, seed=1)


def _hf(module, x):
    with torch.no_grad():
        return module(inputs_embeds=torch.from_numpy(x)).last_hidden_state.numpy()


def _embedded(module, tokens=7):
    rng = np.random.default_rng(3)
    return rng.standard_normal((2, tokens, module.config.hidden_size))


def _relative(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _gpt2_input(module, x):
    """GPT-2 adds its position table to inputs_embeds; the model takes the sum."""
    return x + module.wpe.weight.detach().numpy()[: x.shape[1]]


@pytest.mark.parametrize("change", ["mul_", "optimizer step", "load_state_dict"])
def test_a_model_whose_module_changed_in_place_is_refused(change):
    from ctformer.bridges import from_hf

    module = _network("llama")
    model = from_hf(module)
    x = _embedded(module)
    assert _relative(model.run(x), _hf(module, x)) < 1e-12
    model.run(x.astype(np.float32))  # a float32 copy of the weights is made and kept
    weight = module.layers[0].self_attn.q_proj.weight
    if change == "mul_":
        with torch.no_grad():
            weight.mul_(1.5)
    elif change == "optimizer step":
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        module(inputs_embeds=torch.from_numpy(x)).last_hidden_state.square().sum().backward()
        optimizer.step()
    else:
        module.load_state_dict({k: 2 * v for k, v in module.state_dict().items()})
    for dtype in (np.float64, np.float32):
        with pytest.raises(StaleConversionError, match=r"layers\.0\.self_attn\.q_proj\.weight.*changed in "
                                                       r"place after the conversion.*from_hf\(module\)"):
            model.run(x.astype(dtype))
    # the remedy: a new conversion computes the changed network
    assert _relative(from_hf(module).run(x), _hf(module, x)) < 1e-12


def test_the_message_names_the_first_weights_and_counts_the_others():
    from ctformer.bridges import from_hf

    module = _network("gpt2")
    model = from_hf(module)
    with torch.no_grad():
        for p in module.h.parameters():
            p.mul_(1.01)
    with pytest.raises(StaleConversionError) as raised:
        model.run(_embedded(module))
    message = str(raised.value)
    changed = len(list(module.h.parameters()))
    assert message.startswith("the GPT2Model weights h.0.") and f"and {changed - 3} more changed" in message


def test_copies_and_other_dtypes_keep_the_network_of_the_conversion():
    from ctformer.bridges import from_hf

    module = _network("gpt2")
    x = _embedded(module)
    xg = _gpt2_input(module, x)
    before = _hf(module, x)
    model = from_hf(module)
    ours = model.run(xg)
    assert _relative(ours, before) < 1e-12
    copies = [copy.deepcopy(model), pickle.loads(pickle.dumps(model)),
              model.with_parameters(model.parameters())]
    single = copy.deepcopy(module).float()
    converted = from_hf(single)  # float32 weights: converted to float64 arrays, nothing shared
    with torch.no_grad():
        for m in (module, single):
            m.h[1].mlp.c_fc.weight.mul_(-1.0)
    assert _relative(_hf(module, x), before) > 1e-2  # the module did change
    for other in copies:  # their own arrays: the network of the conversion, bit for bit
        np.testing.assert_array_equal(other.run(xg), ours)
    # the float32 module's weights are exact in float64: the old network to float32 rounding
    assert _relative(converted.run(xg), before) < 1e-5
    with pytest.raises(StaleConversionError):
        model.run(xg)

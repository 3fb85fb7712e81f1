"""``with_parameters`` on a model whose layers share one weight (ALBERT), and on a converted
model whose module changed in place. References: the float64 HuggingFace module itself."""
import numpy as np
import pytest

from tests.conftest import require

pytestmark = pytest.mark.transformers


def _albert():
    require("torch")
    require("transformers")
    import torch
    import transformers as t

    torch.manual_seed(0)
    config = t.AlbertConfig(embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                            intermediate_size=64, num_hidden_groups=1, inner_group_num=1)
    return t.AlbertModel(config).double().eval()


def test_names_of_one_shared_weight_given_two_values_are_refused():
    from ctformer.bridges import from_hf

    ct = from_hf(_albert())
    params = {k: np.array(v) for k, v in ct.parameters().items()}
    name = "blocks.0.attention.W_Q.0.weight"
    params[name] = 2.0 * params[name]  # before: kept silently or dropped, as blocks.1 and 2 came later
    with pytest.raises(ValueError, match=r"params\['blocks.0.attention.W_Q.0.weight'\] and "
                                         r"params\['blocks.1.attention.W_Q.0.weight'\] set one weight"):
        ct.with_parameters(params)


def test_every_name_of_a_shared_weight_set_alike_is_the_module_with_that_weight():
    import torch

    from ctformer.bridges import from_hf

    module = _albert()
    ct = from_hf(module)
    params = {k: np.array(v) for k, v in ct.parameters().items()}
    for layer in range(3):
        params[f"blocks.{layer}.feedforward.W_1.weight"] = 2.0 * params[f"blocks.{layer}.feedforward.W_1.weight"]
    changed = ct.with_parameters(params)
    embedded = torch.randn(1, 7, module.config.embedding_size, dtype=torch.float64,
                           generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # the reference: the module with its one shared ffn weight doubled
        module.encoder.albert_layer_groups[0].albert_layers[0].ffn.weight.mul_(2.0)
        reference = module.encoder(embedded).last_hidden_state.numpy()
        x = module.encoder.embedding_hidden_mapping_in(embedded).numpy()
    ours = changed.run(x)
    assert np.max(np.abs(ours - reference)) < 1e-12 * np.max(np.abs(reference))


def test_with_parameters_of_a_stale_conversion_is_refused():
    require("torch")
    require("transformers")
    import torch
    import transformers as t

    from ctformer.bridges import from_hf
    from ctformer.shared_tensors import StaleConversionError

    torch.manual_seed(0)
    module = t.GPT2Model(t.GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=32, vocab_size=50,
                                      bos_token_id=0, eos_token_id=0)).double().eval()
    ct = from_hf(module)
    with torch.no_grad():
        module.h[0].ln_1.weight.mul_(1.5)  # before: a copy 0.27 off a fresh conversion, no error
    with pytest.raises(StaleConversionError, match="h.0.ln_1.weight changed in place"):
        ct.with_parameters(ct.parameters())

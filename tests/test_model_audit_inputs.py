"""Audit of what enters a converted or built model: position options that the installed
HuggingFace code ignores, NumPy values beside torch tensors in ``with_parameters``, and the
names in the messages of ``run``. References: the float64 HuggingFace modules themselves."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tests.conftest import rel_err, require

from ctformer.discretizations import Midpoint
from ctformer.model import ContinuousTransformer

TOL = 1e-12
ALBERT_MODULE = "transformers.models.albert.modeling_albert"
BERT_MODULE = "transformers.models.bert.modeling_bert"


def _randomize(torch, model, seed):
    """O(1) weights: matrices ~ N(0, 1/fan_in), other entries 1 + N(0, 0.1^2) or N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if p.ndim == 2:
                p.copy_(noise / math.sqrt(p.shape[1]))
            else:
                p.copy_((1.0 if "norm" in name.lower() and name.endswith("weight") else 0.0) + 0.1 * noise)
    return model


def _albert(t, torch, **options):
    config = t.AlbertConfig(vocab_size=32, embedding_size=6, hidden_size=12, num_hidden_layers=3,
                            num_hidden_groups=1, num_attention_heads=3, intermediate_size=20,
                            max_position_embeddings=32, layer_norm_eps=1e-6, **options)
    config._attn_implementation = "eager"
    return _randomize(torch, t.AlbertModel(config, add_pooling_layer=False).double().eval(), 3)


def _bert(t, torch, **options):
    config = t.BertConfig(vocab_size=32, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                          intermediate_size=20, max_position_embeddings=32, layer_norm_eps=1e-7,
                          **options)
    config._attn_implementation = "eager"
    return _randomize(torch, t.BertModel(config, add_pooling_layer=False).double().eval(), 4)


def _reference(torch, model, ids, mask):
    """``hidden_states[0]`` (the initial state) and ``last_hidden_state`` of the float64 module."""
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    output_hidden_states=True)
    return out.hidden_states[0].numpy(), out.last_hidden_state.numpy()


def spec_relative() -> bool:
    """Whether the installed BERT computes relative position scores (transformers < 5)."""
    from ctformer.bridges import spec

    return spec.hf_relative_positions(BERT_MODULE)


IDS_MASK = (np.array([[3, 5, 7, 9, 2, 4, 8], [1, 8, 2, 6, 0, 0, 0]]),
            np.array([[1] * 7, [1] * 4 + [0] * 3], dtype=bool))


# -- relative position options ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["relative_key", "relative_key_query"])
def test_albert_relative_option_gives_huggingfaces_network(kind, monkeypatch):
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_albert, from_hf
    from ctformer.bridges import spec

    ids, mask = torch.from_numpy(IDS_MASK[0]), IDS_MASK[1]
    model = _albert(t, torch, position_embedding_type=kind)
    if spec.hf_relative_positions(ALBERT_MODULE):  # transformers < 5 computes the scores
        with pytest.raises(ValueError, match=f"position_embedding_type='{kind}' is not modelled"):
            from_albert(model)
        return
    x, last = _reference(torch, model, ids, mask)
    # transformers >= 5 ignores the option: the module is the absolute-position network
    plain = _albert(t, torch)
    np.testing.assert_array_equal(_reference(torch, plain, ids, mask)[1], last)
    assert rel_err(from_albert(model).run(x, padding_mask=mask), last, mask) < TOL
    assert rel_err(from_hf(model).run(x, padding_mask=mask), last, mask) < TOL
    # where the installed code does compute relative scores, the option is refused by name
    monkeypatch.setattr(spec, "hf_relative_positions", lambda module: True)
    with pytest.raises(ValueError, match=f"AlbertModel: position_embedding_type='{kind}' is not "
                                         "modelled .*relative position scores"):
        from_albert(model)


def test_bert_relative_option_gives_huggingfaces_network(monkeypatch):
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import from_hf, from_hf_bert
    from ctformer.bridges import spec

    ids, mask = torch.from_numpy(IDS_MASK[0]), IDS_MASK[1]
    model = _bert(t, torch, position_embedding_type="relative_key")
    if spec.hf_relative_positions(BERT_MODULE):
        with pytest.raises(ValueError, match="position_embedding_type='relative_key' is not modelled"):
            from_hf_bert(model)
        return
    x, last = _reference(torch, model, ids, mask)
    np.testing.assert_array_equal(_reference(torch, _bert(t, torch), ids, mask)[1], last)
    assert rel_err(from_hf_bert(model).run(x, padding_mask=mask), last, mask) < TOL
    assert rel_err(from_hf(model).run(x, padding_mask=mask), last, mask) < TOL
    monkeypatch.setattr(spec, "hf_relative_positions", lambda module: True)
    with pytest.raises(ValueError, match="BertModel: position_embedding_type='relative_key' is not "
                                         "modelled .*relative position scores"):
        from_hf_bert(model)


def test_bert_file_with_relative_position_tables_is_refused(tmp_path):
    torch, t = require("torch"), require("transformers")
    require("safetensors")
    from safetensors.numpy import save_file

    from ctformer.bridges import from_hf_bert

    model = _bert(t, torch, position_embedding_type="relative_key")
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    cfg = {"num_attention_heads": 3, "layer_norm_eps": 1e-7, "hidden_act": "gelu",
           "position_embedding_type": "relative_key"}
    save_file(state, str(tmp_path / "model.safetensors"))
    x, last = _reference(torch, model, torch.from_numpy(IDS_MASK[0]), IDS_MASK[1])
    if not spec_relative():  # the file of a transformers 5 network: the absolute one
        ct = from_hf_bert(tmp_path / "model.safetensors", config=cfg)
        assert rel_err(ct.run(x, padding_mask=IDS_MASK[1]), last, IDS_MASK[1]) < TOL
    # a trained table (transformers < 5 writes one per layer) is another network: refused
    table = np.zeros((63, 4))
    save_file({**state, "encoder.layer.0.attention.self.distance_embedding.weight": table},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"relative position tables of position_embedding_type="
                                         r"'relative_key' \(layer.0.attention.self.distance_embedding"):
        from_hf_bert(tmp_path / "model.safetensors", config=cfg)


# -- NumPy values beside torch tensors in with_parameters ---------------------------------------
MODEL = ContinuousTransformer.random_smooth(seed=2, layers=2)
GRIDS = dict(tokens=Midpoint(5), features=Midpoint(6))


def _start():
    return np.random.default_rng(0).standard_normal((2, 5, 6))


def test_numpy_values_beside_tensors_become_tensors_without_warnings():
    torch = require("torch")
    params = MODEL.parameters()
    names = sorted(params)
    trained = set(names[::3])
    mixed = {k: torch.tensor(np.array(v), requires_grad=True) if k in trained else v
             for k, v in params.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch's "non-writable NumPy array" warning included
        model = MODEL.with_parameters(mixed)
        out = model.solve(torch.tensor(_start()), **GRIDS)
    frozen = model.parameters()[names[1]]
    assert isinstance(frozen, torch.Tensor) and frozen.dtype == torch.float64
    assert not frozen.requires_grad
    np.testing.assert_array_equal(frozen.numpy(), params[names[1]])
    # the same numbers as the NumPy model, and gradients reach the trained tensors only
    np.testing.assert_allclose(out.detach().numpy(), MODEL.solve(_start(), **GRIDS), rtol=0, atol=1e-13)
    (out ** 2).sum().backward()
    assert all(mixed[k].grad is not None and bool(torch.isfinite(mixed[k].grad).all()) for k in trained)


def test_numpy_values_beside_float32_tensors_are_the_float32_network():
    torch = require("torch")
    params = MODEL.parameters()
    first = sorted(params)[0]
    mixed = {k: torch.tensor(v, dtype=torch.float32) if k == first else v for k, v in params.items()}
    every = {k: torch.tensor(v, dtype=torch.float32) for k, v in params.items()}
    u0 = torch.tensor(_start(), dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours = MODEL.with_parameters(mixed).solve(u0, **GRIDS)
    np.testing.assert_array_equal(ours.numpy(), MODEL.with_parameters(every).solve(u0, **GRIDS).numpy())
    huge = dict(mixed, **{sorted(params)[1]: np.full(np.shape(params[sorted(params)[1]]), 1e300)})
    with pytest.raises(ValueError, match=rf"params\['{sorted(params)[1]}'\] overflows torch.float32"):
        MODEL.with_parameters(huge)


# -- run names its argument x -------------------------------------------------------------------
def test_run_names_x_in_its_messages():
    torch = require("torch")
    x = _start()[0]
    bad = x.copy()
    bad[1, 2] = math.nan
    with pytest.raises(ValueError, match=r"^x contains NaN or inf"):
        MODEL.run(bad)
    infinite = torch.tensor(x)
    infinite[0, 0] = math.inf
    with pytest.raises(ValueError, match=r"^x contains NaN or inf"):
        MODEL.run(infinite)
    tensors = MODEL.with_parameters({k: torch.tensor(v, dtype=torch.float32)
                                     for k, v in MODEL.parameters().items()})
    with pytest.raises(TypeError, match=r"^x is a numpy.ndarray on cpu, the parameters are "
                                        r"torch.Tensor on cpu: pass x in"):
        tensors.run(x)
    with pytest.raises(TypeError, match=r"^x has dtype torch.float64, .* pass x as torch.float32"):
        tensors.run(torch.tensor(x))
    # solve and evolve keep the name of their own argument
    with pytest.raises(ValueError, match=r"^u0 contains NaN or inf"):
        MODEL.solve(bad, **GRIDS)
    with pytest.raises(TypeError, match=r"^u0 has dtype torch.float64"):
        tensors.evolve(torch.tensor(x), **GRIDS)


# -- Block: swapped sub-flows ---------------------------------------------------------------------
def test_block_refuses_swapped_sub_flows():
    from ctformer.bridges.composite import OutputNormalized
    from ctformer.model import Block

    block = MODEL.blocks[0]
    attention, feedforward = block.attention, block.feedforward
    # before: Block(feedforward, attention) ran the feed-forward sub-step first, another network
    with pytest.raises(TypeError, match=r"^attention got FeedForward, an operator of the feedforward "
                                        r"sub-flow: pass it as feedforward="):
        Block(feedforward, attention)
    with pytest.raises(TypeError, match=r"^feedforward got Attention, an operator of the attention "
                                        r"sub-flow: pass it as attention="):
        Block(feedforward=attention)
    wrapped = OutputNormalized(feedforward, block.normalization2)
    with pytest.raises(TypeError, match=r"^attention got FeedForward"):
        Block(attention=wrapped)
    kept = Block(attention, feedforward, block.normalization1, block.normalization2,
                 placement=block.placement)
    np.testing.assert_array_equal(ContinuousTransformer([kept]).solve(_start(), **GRIDS),
                                  ContinuousTransformer([block]).solve(_start(), **GRIDS))

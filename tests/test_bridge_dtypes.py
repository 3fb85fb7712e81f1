"""Weight dtypes of the bridges: float16 and bfloat16 networks convert exactly.

Every float16 or bfloat16 number is a float32 (and a float64), so converting a half-precision
network is exact: its parameters are the half-precision weights widened, and a run is the
network of those weights computed in float64. Weights of other dtypes are refused by name.
"""
from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_bridges import random_encoder, tiny_bert
from tests.test_modern_bridges import _randomize
from tests.test_rope_config import _stock
from tests.test_vit import _vit

KINDS = ["torch", "bert", "gpt2", "llama", "qwen2", "albert", "vit"]


def _build(kind, torch, t):
    """A float64 network of ``kind`` with O(1) random weights, and its inputs."""
    g = torch.Generator().manual_seed(7)
    if kind == "torch":
        net = random_encoder(torch, d=12, heads=3, d_ff=20, layers=2, activation="gelu", norm_first=True,
                             final_norm=True, eps=1e-5, seed=3)
        return net, dict(src=torch.randn(2, 7, 12, generator=g, dtype=torch.float64))
    if kind == "bert":
        return tiny_bert(torch, t), dict(input_ids=torch.randint(1, 50, (2, 7), generator=g))
    if kind == "gpt2":
        config = t.GPT2Config(vocab_size=32, n_positions=32, n_embd=12, n_layer=2, n_head=3, n_inner=20,
                              bos_token_id=0, eos_token_id=0)
        net = _randomize(torch, t.GPT2Model(config).double().eval(), 4, conv1d=True)
    elif kind in ("llama", "qwen2"):
        net = _stock(t, torch, {"llama": "Llama", "qwen2": "Qwen2"}[kind], d=16, heads=4, kv_heads=2)
    elif kind == "albert":
        config = t.AlbertConfig(vocab_size=32, embedding_size=8, hidden_size=12, num_hidden_layers=2,
                                num_attention_heads=3, intermediate_size=20, max_position_embeddings=32)
        net = _randomize(torch, t.AlbertModel(config, add_pooling_layer=False).double().eval(), 5)
        return net, dict(input_ids=torch.randint(1, 32, (2, 7), generator=g))
    else:
        return _vit(8)[1], dict(pixel_values=torch.randn(2, 3, 32, 32, generator=g, dtype=torch.float64))
    return net, dict(inputs_embeds=torch.randn(2, 7, net.config.hidden_size, generator=g, dtype=torch.float64))


def _convert(kind, net):
    from ctformer.bridges import from_hf, from_torch

    return from_torch(net) if kind == "torch" else from_hf(net)


def _copy(kind, torch, t, net, dtype):
    """A HuggingFace (or torch) copy of ``net`` in ``dtype`` that computes as the network should.

    A cast Llama keeps its inv_freq rounded to the half precision: the copy is a fresh model
    (inv_freq from the configuration) holding the same weights; in float64 it is made a true
    float64 reference.
    """
    from ctformer.bridges import float64_reference

    if kind not in ("llama", "qwen2"):
        return copy.deepcopy(net).to(dtype).eval()
    fresh = type(net)(net.config).to(dtype).eval()
    fresh.load_state_dict(net.state_dict())
    return float64_reference(fresh) if dtype == torch.float64 else fresh


def _io(kind, torch, net, inputs, dtype):
    """(input state, output) of ``net``: the embedding output and the last hidden state."""
    inputs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        if kind == "torch":
            return inputs["src"].numpy(), net(inputs["src"]).numpy()
        out = net(**inputs, output_hidden_states=True)
    return out.hidden_states[0].numpy(), out.last_hidden_state.numpy()


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
@pytest.mark.parametrize("kind", KINDS)
def test_half_precision_networks_convert_exactly(kind, half):
    torch = require("torch")
    t = require("transformers")
    net64, inputs = _build(kind, torch, t)
    dtype = getattr(torch, half)
    net = copy.deepcopy(net64).to(dtype)  # the user's model: from_hf(bf16 model) was torch's TypeError
    ours = _convert(kind, net)
    # the parameters are the half-precision weights, widened exactly (torch's own cast)
    widened = _convert(kind, copy.deepcopy(net).double()).parameters()
    params = ours.parameters()
    assert params.keys() == widened.keys()
    for name, value in params.items():
        assert value.dtype == np.float64 and np.array_equal(value, widened[name]), name
        assert np.array_equal(value, value.astype(np.float32)), name  # half-precision numbers
    assert any(not np.array_equal(v, v.astype(np.float16).astype(np.float64))
               for v in _convert(kind, net64).parameters().values())  # the cast did round the weights
    # a run is the network of the half-precision weights: HF's float32 copy to float32 rounding,
    # its float64 copy to float64 rounding
    x32, out32 = _io(kind, torch, _copy(kind, torch, t, net, torch.float32), inputs, torch.float32)
    assert rel_err(ours.run(x32.astype(np.float64)), out32) < 2e-6  # measured 8e-8 .. 5e-7
    x64, out64 = _io(kind, torch, _copy(kind, torch, t, net, torch.float64), inputs, torch.float64)
    assert rel_err(ours.run(x64), out64) < 1e-13  # measured 1e-16 .. 1.1e-15


def test_bfloat16_and_float16_safetensors_files(tmp_path):
    torch = require("torch")
    t = require("transformers")
    safetensors_torch = require("safetensors.torch")
    from ctformer.bridges import from_hf_bert

    for dtype in (torch.bfloat16, torch.float16):
        model = tiny_bert(torch, t).to(dtype)
        folder = tmp_path / str(dtype).removeprefix("torch.")
        folder.mkdir()
        safetensors_torch.save_file({f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()},
                                    str(folder / "model.safetensors"))
        (folder / "config.json").write_text(json.dumps(model.config.to_dict()))
        from_file = from_hf_bert(folder).parameters()  # bfloat16 was "not a valid .safetensors file"
        in_memory = from_hf_bert(copy.deepcopy(model).double()).parameters()
        assert from_file.keys() == in_memory.keys()
        for name, value in from_file.items():
            assert np.array_equal(value, in_memory[name]), name


def test_weights_of_other_dtypes_are_refused_by_name(tmp_path):
    torch = require("torch")
    t = require("transformers")
    require("safetensors")
    from safetensors.numpy import save_file

    from ctformer.bridges import from_hf_bert, from_torch

    layer = torch.nn.TransformerEncoderLayer(8, 2, 12, batch_first=True)
    layer.linear1.weight = torch.nn.Parameter(torch.ones(12, 8, dtype=torch.int8), requires_grad=False)
    with pytest.raises(TypeError, match=r"weight layers\[0\]\.linear1\.weight has dtype int8; the bridges "
                                        r"take float16, bfloat16, float32, float64 weights \(dequantize"):
        from_torch(layer)
    model = tiny_bert(torch, t)
    state = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    state["encoder.layer.0.output.dense.weight"] = state["encoder.layer.0.output.dense.weight"].astype(np.int32)
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))
    with pytest.raises(TypeError, match=r"weight layer\.0\.output\.dense\.weight has dtype int32"):
        from_hf_bert(tmp_path)
    if hasattr(torch, "float8_e4m3fn"):  # a valid file NumPy cannot read: named, not "invalid"
        from safetensors.torch import save_file as save_torch

        eight = {k: v.contiguous() for k, v in model.state_dict().items()}
        eight["encoder.layer.1.output.dense.weight"] = eight["encoder.layer.1.output.dense.weight"].to(
            torch.float8_e4m3fn)
        save_torch(eight, str(tmp_path / "model.safetensors"))
        with pytest.raises(TypeError, match=r"tensor encoder\.layer\.1\.output\.dense\.weight has dtype "
                                            r"F8_E4M3, which NumPy cannot hold"):
            from_hf_bert(tmp_path)


def test_float32_network_runs_float64_and_float32_states():
    torch = require("torch")
    from ctformer.bridges import from_torch

    net = random_encoder(torch, d=12, heads=3, d_ff=20, layers=2, activation="relu", norm_first=False,
                         final_norm=False, eps=1e-5, seed=1).float()
    model = from_torch(net)  # float32 torch weights: the model holds float64 host copies
    assert all(type(v) is np.ndarray and v.dtype == np.float64 for v in model.parameters().values())
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    with torch.no_grad():
        exact = net.double()(x).numpy()
        single = net.float()(x.float()).numpy()
    got64 = model.run(x)  # a float64 torch state with weights from float32 tensors: no dtype error
    assert got64.dtype == torch.float64 and rel_err(got64.numpy(), exact) < 1e-12
    got32 = model.run(x.float())
    assert got32.dtype == torch.float32 and rel_err(got32.numpy(), single) < 1e-5
    assert math.isclose(rel_err(got32.numpy(), exact), rel_err(single, exact), rel_tol=2.0, abs_tol=1e-6)

"""The discrete limit (design notes, section 2): converted torch / HuggingFace modules, run in
float64, agree with the modules themselves to 1e-12 relative error."""
import json

import numpy as np
import pytest

from tests.conftest import rel_err, require

from ctformer.discretizations import Midpoint
from ctformer.model import Block, ContinuousTransformer

TOL = 1e-12


def random_encoder(torch, *, d, heads, d_ff, layers, activation, norm_first, final_norm, eps, seed,
                   bias=True):
    """A float64 eval-mode TransformerEncoder with O(1) random weights (and biases)."""
    nn = torch.nn
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, activation=activation,
                                       layer_norm_eps=eps, batch_first=True, norm_first=norm_first,
                                       bias=bias)
    norm = nn.LayerNorm(d, eps=eps) if final_norm else None
    enc = nn.TransformerEncoder(layer, layers, norm=norm, enable_nested_tensor=False).double().eval()
    with torch.no_grad():
        for name, p in enc.named_parameters():
            # weights ~ 1/sqrt(fan_in) keep activations O(1); random LayerNorm affine too
            scale = 1.0 / np.sqrt(p.shape[-1]) if p.ndim == 2 else 0.3
            p.copy_(torch.randn_like(p) * scale + (1.0 if name.endswith("norm1.weight") else 0.0))
    return enc


CONFIGS = [
    # d, heads, d_ff, layers, activation, norm_first, final_norm, causal, batch, tokens, eps
    dict(d=8, heads=2, d_ff=16, layers=1, activation="relu", norm_first=False, final_norm=False,
         causal=False, batch=1, tokens=5, eps=1e-5),
    dict(d=12, heads=3, d_ff=20, layers=3, activation="gelu", norm_first=False, final_norm=False,
         causal=True, batch=2, tokens=7, eps=1e-5),
    dict(d=16, heads=4, d_ff=24, layers=2, activation="gelu", norm_first=True, final_norm=True,
         causal=False, batch=3, tokens=9, eps=1e-6),
    dict(d=10, heads=5, d_ff=8, layers=4, activation="relu", norm_first=True, final_norm=False,
         causal=True, batch=2, tokens=11, eps=1e-5),
    dict(d=6, heads=1, d_ff=30, layers=2, activation="gelu", norm_first=True, final_norm=True,
         causal=True, batch=1, tokens=4, eps=1e-3),
    dict(d=24, heads=6, d_ff=12, layers=2, activation="relu", norm_first=False, final_norm=True,
         causal=False, batch=2, tokens=13, eps=1e-12),
]


@pytest.mark.torch
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "d{d}h{heads}ff{d_ff}L{layers}-{activation}-"
                         "{nf}{fn}{ca}".format(nf="pre" if c["norm_first"] else "post",
                                               fn="-final" if c["final_norm"] else "",
                                               ca="-causal" if c["causal"] else "", **c))
def test_torch_encoder_discrete_limit(cfg):
    torch = require("torch")
    from ctformer.bridges import from_torch

    enc = random_encoder(torch, d=cfg["d"], heads=cfg["heads"], d_ff=cfg["d_ff"], layers=cfg["layers"],
                         activation=cfg["activation"], norm_first=cfg["norm_first"],
                         final_norm=cfg["final_norm"], eps=cfg["eps"], seed=cfg["d"])
    x = torch.randn(cfg["batch"], cfg["tokens"], cfg["d"], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        if cfg["causal"]:
            mask = torch.nn.Transformer.generate_square_subsequent_mask(cfg["tokens"], dtype=torch.float64)
            ref = enc(x, mask=mask, is_causal=True).numpy()
        else:
            ref = enc(x).numpy()
    model = from_torch(enc, causal=cfg["causal"])
    assert model.layers == cfg["layers"]
    assert (model.final_normalization is not None) == cfg["final_norm"]
    assert rel_err(model.run(x.numpy()), ref) < TOL
    # unbatched input (N, d) gives the first batch entry
    assert rel_err(model.run(x[0].numpy()), ref[0]) < TOL


@pytest.mark.torch
@pytest.mark.parametrize("norm_first", [False, True])
def test_torch_layer_with_padding_mask_and_fast_path(norm_first):
    """A single layer, no grad (torch's fused fast path is eligible), a key-padding mask."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    enc = random_encoder(torch, d=8, heads=2, d_ff=12, layers=1, activation="gelu", norm_first=norm_first,
                         final_norm=False, eps=1e-5, seed=3)
    layer = enc.layers[0]
    x = torch.randn(3, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    real = np.array([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4])
    with torch.no_grad():
        ref = layer(x, src_key_padding_mask=torch.from_numpy(real == 0)).numpy()
    out = from_torch(layer).run(x.numpy(), padding_mask=real)
    assert rel_err(out, ref, real == 1) < TOL


@pytest.mark.torch
def test_torch_module_activations_and_no_bias():
    """nn.GELU / F.relu given as callables, and bias=False layers."""
    torch = require("torch")
    import torch.nn.functional as F

    from ctformer.bridges import from_torch

    for activation in (torch.nn.GELU(), F.relu, torch.nn.SiLU(), torch.nn.GELU(approximate="tanh")):
        enc = random_encoder(torch, d=8, heads=2, d_ff=10, layers=2, activation=activation, norm_first=True,
                             final_norm=True, eps=1e-5, seed=5, bias=False)
        x = torch.randn(2, 5, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            ref = enc(x).numpy()
        assert rel_err(from_torch(enc).run(x), ref) < TOL, activation


@pytest.mark.torch
def test_torch_unsupported_modules_raise():
    torch = require("torch")
    nn = torch.nn
    from ctformer.bridges import from_torch

    with pytest.raises(TypeError, match="TransformerDecoderLayer"):
        from_torch(nn.TransformerDecoderLayer(8, 2, 16))
    with pytest.raises(TypeError, match="Linear"):
        from_torch(nn.Linear(3, 3))
    with pytest.raises(ValueError, match="activation"):
        from_torch(nn.TransformerEncoderLayer(8, 2, 16, activation=torch.tanh))
    with pytest.raises(TypeError, match="causal"):
        from_torch(nn.TransformerEncoderLayer(8, 2, 16), causal="yes")


@pytest.mark.torch
def test_run_validates_inputs():
    torch = require("torch")
    from ctformer.bridges import from_torch

    model = from_torch(torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0))
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    with pytest.raises(ValueError, match="features"):
        model.run(x[..., :6])
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., tokens, features\)"):
        model.run(x[0, 0])
    with pytest.raises(ValueError, match="mask must have shape"):
        model.run(x, padding_mask=np.ones((2, 4), dtype=bool))
    with pytest.raises(ValueError, match="0 and 1"):
        model.run(x, padding_mask=np.full((2, 5), 2))
    with pytest.raises(ValueError, match="without any real token"):
        model.run(x, padding_mask=np.array([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]]))
    x[0, 1, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        model.run(x)


def tiny_bert(torch, transformers, **overrides):
    options = dict(vocab_size=50, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                   intermediate_size=20, layer_norm_eps=1e-7, hidden_act="gelu")
    config = transformers.BertConfig(**{**options, **overrides})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.BertModel(config).double().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return model


@pytest.mark.transformers
def test_hf_bert_in_memory_and_safetensors(tmp_path):
    torch = require("torch")
    transformers = require("transformers")
    require("safetensors")
    from safetensors.numpy import save_file

    from ctformer.bridges import from_hf_bert

    model = tiny_bert(torch, transformers)
    ids = torch.tensor([[1, 5, 7, 9, 2, 0], [1, 8, 2, 0, 0, 0]])
    attention_mask = (ids != 0).long()
    with torch.no_grad():
        x = model.embeddings(input_ids=ids).numpy()
        ref = model(input_ids=ids, attention_mask=attention_mask).last_hidden_state.numpy()
    keep = attention_mask.numpy() == 1
    assert rel_err(from_hf_bert(model).run(x, padding_mask=keep), ref, keep) < TOL
    assert rel_err(from_hf_bert(model.encoder).run(x, padding_mask=attention_mask.numpy()), ref, keep) < TOL

    # the same weights from a safetensors file (+ config.json next to it), prefixed "bert."
    state = {f"bert.{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()}
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(model.config.to_dict()))
    assert rel_err(from_hf_bert(tmp_path).run(x, padding_mask=keep), ref, keep) < TOL
    cfg = {"num_attention_heads": 3, "layer_norm_eps": 1e-7, "hidden_act": "gelu"}
    assert rel_err(from_hf_bert(str(tmp_path / "model.safetensors"), config=cfg).run(x, padding_mask=keep),
                   ref, keep) < TOL


@pytest.mark.transformers
def test_hf_bert_unsupported_raise(tmp_path):
    torch = require("torch")
    transformers = require("transformers")
    from ctformer.bridges import from_hf_bert

    with pytest.raises(TypeError, match="BertModel"):
        from_hf_bert(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="hidden_act"):
        from_hf_bert(tiny_bert(torch, transformers, hidden_act="tanh"))
    (tmp_path / "weights.bin").write_bytes(b"not a pickle we would ever open")
    with pytest.raises(ValueError, match="safetensors"):
        from_hf_bert(tmp_path / "weights.bin")


def test_block_and_model_validation():
    with pytest.raises(ValueError, match="placement"):
        Block(attention=object(), placement="sandwich")
    with pytest.raises(ValueError, match="needs an attention or a feedforward"):
        Block()
    with pytest.raises(ValueError, match="takes no normalizations"):
        Block(attention=object(), normalization1=object(), placement="none")
    with pytest.raises(ValueError, match="at least one Block"):
        ContinuousTransformer([])
    with pytest.raises(TypeError, match="blocks\\[0\\]"):
        ContinuousTransformer([object()])
    with pytest.raises(TypeError, match="hidden"):
        ContinuousTransformer([Block(attention=object())], hidden=16)
    assert Midpoint(3).n == 3


@pytest.mark.torch
@pytest.mark.parametrize("norm_first", [False, True])
def test_long_inputs_by_row_blocks_equal_torch_for_any_thread_count(norm_first, monkeypatch):
    """600 rows (2 x 300 tokens): the feed-forward layers and attention's projections run by
    row blocks on the worker threads; still torch's numbers, and bit for bit the same for one
    and for three threads."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    enc = random_encoder(torch, d=16, heads=4, d_ff=32, layers=2, activation="gelu",
                         norm_first=norm_first, final_norm=norm_first, eps=1e-5, seed=3)
    x = torch.randn(2, 300, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = enc(x).numpy()
    model = from_torch(enc)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "1")
    one = model.run(x.numpy())
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    three = model.run(x.numpy())
    np.testing.assert_array_equal(one, three)
    assert rel_err(three, ref) < TOL

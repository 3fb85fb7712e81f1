"""HuggingFace GPT-2, Llama, Mistral, Qwen2 and ALBERT as exact discrete limits (design notes,
section 10): float64 relative error <= 1e-12 against the HuggingFace modules with random
weights, a float64 Llama reference checked against an independent NumPy forward, continuous
depth of the converted pre-norm networks, and the refusals."""
from __future__ import annotations

import copy
import math
import os
import re
import warnings

import numpy as np
import pytest

from tests.conftest import fitted_order, rel_err, require

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TOL = 1e-12


def _randomize(torch, model, seed, conv1d=False):
    """O(1) weights: matrices ~ N(0, 1/fan_in), norm gains 1 + N(0, 0.1^2), other vectors N(0, 0.1^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g, dtype=p.dtype)
            if p.ndim == 2:
                p.copy_(noise / math.sqrt(p.shape[0] if conv1d else p.shape[1]))
            elif name.endswith("weight") and ("norm" in name.lower() or "ln_" in name):
                p.copy_(1.0 + 0.1 * noise)
            else:
                p.copy_(0.1 * noise)
    return model


def _padding(batch, tokens, seed):
    """Right padding: the first sequence is full, the others lose 1, 2, ... tokens."""
    mask = np.ones((batch, tokens), dtype=bool)
    for b in range(1, batch):
        mask[b, tokens - min(b * 2, tokens - 1):] = False
    return mask


def _run_hf(torch, model, x, mask):
    with torch.no_grad():
        out = model(inputs_embeds=torch.from_numpy(x), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                    output_hidden_states=True)
    return out.last_hidden_state.numpy(), [h.numpy() for h in out.hidden_states]


# -- GPT-2 ------------------------------------------------------------------------------------
GPT2_CONFIGS = [
    dict(layers=1, heads=2, d=8, inner=12, act="gelu_new", inverse=False, batch=1, tokens=5),
    dict(layers=2, heads=3, d=12, inner=20, act="gelu_new", inverse=True, batch=3, tokens=7),
    dict(layers=3, heads=4, d=16, inner=24, act="relu", inverse=False, batch=2, tokens=9),
]


@pytest.mark.parametrize("cfg", GPT2_CONFIGS, ids=lambda c: "L{layers}H{heads}d{d}-{act}".format(**c))
def test_gpt2_discrete_limit(cfg):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    config = t.GPT2Config(vocab_size=32, n_positions=32, n_embd=cfg["d"], n_layer=cfg["layers"],
                          n_head=cfg["heads"], n_inner=cfg["inner"], activation_function=cfg["act"],
                          scale_attn_by_inverse_layer_idx=cfg["inverse"], layer_norm_epsilon=1e-5,
                          bos_token_id=0, eos_token_id=0)
    model = _randomize(torch, t.GPT2Model(config).double().eval(), cfg["d"], conv1d=True)
    x = np.random.default_rng(cfg["d"]).standard_normal((cfg["batch"], cfg["tokens"], cfg["d"]))
    mask = _padding(cfg["batch"], cfg["tokens"], 0)
    last, hidden = _run_hf(torch, model, x, mask)
    ct = from_hf(model)
    assert ct.layers == cfg["layers"] and ct.blocks[0].placement == "pre"
    # hidden_states[0] is the embedding output: inputs_embeds plus the position table
    assert rel_err(hidden[0], x + model.wpe.weight.detach().numpy()[: cfg["tokens"]]) < 1e-15
    assert rel_err(ct.run(hidden[0], padding_mask=mask), last, mask) < TOL


# -- Llama family: a float64 reference and an independent NumPy forward ------------------------
def _llama(t, torch, *, layers=2, heads=4, kv_heads=2, d=16, head_dim=None, inner=24, theta=10000.0,
           bias=False, mlp_bias=False, eps=1e-6, seed=0, cls="Llama", **extra):
    from ctformer.bridges import float64_reference

    config = getattr(t, f"{cls}Config")(
        vocab_size=32, hidden_size=d, intermediate_size=inner, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim or d // heads,
        max_position_embeddings=64, rms_norm_eps=eps,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        bos_token_id=0, eos_token_id=0, pad_token_id=0, **extra)
    if cls == "Llama":
        config.attention_bias, config.mlp_bias = bias, mlp_bias
    model = getattr(t, f"{cls}Model")(config)
    return float64_reference(_randomize(torch, model.double().eval(), seed))


def _numpy_llama(model, x, mask):
    """An independent float64 forward of a Llama/Mistral/Qwen2 model from its state dict."""
    cfg = model.config
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d_h = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    theta = cfg.rope_parameters["rope_theta"]
    inv = 1.0 / theta ** (np.arange(0, d_h, 2) / d_h)
    n = x.shape[1]
    ang = np.arange(n)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))
    window = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None) or ["sliding_attention" if window else "full_attention"] * cfg.num_hidden_layers

    def rms(h, w):
        return w * h / np.sqrt((h * h).mean(-1, keepdims=True) + cfg.rms_norm_eps)

    def lin(h, name):
        out = h @ sd[name + ".weight"].T
        return out + sd[name + ".bias"] if name + ".bias" in sd else out

    def rope(q):
        half = d_h // 2
        return q * cos + np.concatenate([-q[..., half:], q[..., :half]], -1) * sin

    silu = lambda z: z / (1 + np.exp(-z))  # noqa: E731
    h = x.copy()
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    for layer in range(cfg.num_hidden_layers):
        p = f"layers.{layer}."
        keep = (j <= i)[None] & mask[:, None, :]
        if types[layer] == "sliding_attention":
            keep = keep & (i - j < window)[None]
        a = rms(h, sd[p + "input_layernorm.weight"])
        q = lin(a, p + "self_attn.q_proj").reshape(*a.shape[:2], heads, d_h).transpose(0, 2, 1, 3)
        k = lin(a, p + "self_attn.k_proj").reshape(*a.shape[:2], kv, d_h).transpose(0, 2, 1, 3)
        v = lin(a, p + "self_attn.v_proj").reshape(*a.shape[:2], kv, d_h).transpose(0, 2, 1, 3)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, heads // kv, axis=1), np.repeat(v, heads // kv, axis=1)
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d_h)
        s = np.where(keep[:, None], s, -np.inf)
        s = np.where(np.isinf(s).all(-1, keepdims=True), 0.0, s)  # rows without keys: not compared
        w = np.exp(s - s.max(-1, keepdims=True))
        o = (w / w.sum(-1, keepdims=True)) @ v
        h = h + lin(o.transpose(0, 2, 1, 3).reshape(*a.shape[:2], heads * d_h), p + "self_attn.o_proj")
        a = rms(h, sd[p + "post_attention_layernorm.weight"])
        gate, up = lin(a, p + "mlp.gate_proj"), lin(a, p + "mlp.up_proj")
        h = h + lin(silu(gate) * up, p + "mlp.down_proj")
    return rms(h, sd["norm.weight"])


LLAMA_CONFIGS = [
    dict(layers=1, heads=2, kv_heads=1, d=8, theta=10000.0, bias=False, eps=1e-6, batch=1, tokens=6),
    dict(layers=2, heads=4, kv_heads=2, d=16, theta=500.0, bias=True, mlp_bias=True, eps=1e-5, batch=2, tokens=9),
    dict(layers=3, heads=4, kv_heads=4, d=12, head_dim=4, theta=123456.0, bias=False, eps=1e-3, batch=3, tokens=7),
    dict(layers=2, heads=6, kv_heads=2, d=12, head_dim=6, theta=50.0, bias=True, eps=1e-6, batch=2, tokens=11),
]


@pytest.mark.parametrize("cfg", LLAMA_CONFIGS, ids=lambda c: "L{layers}H{heads}kv{kv_heads}-theta{theta:g}-b{bias}".format(**c))
def test_llama_discrete_limit_and_float64_reference(cfg):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    batch, tokens = cfg.pop("batch"), cfg.pop("tokens")
    model = _llama(t, torch, seed=tokens, **cfg)
    x = np.random.default_rng(tokens).standard_normal((batch, tokens, model.config.hidden_size))
    mask = _padding(batch, tokens, 0)
    last, _ = _run_hf(torch, model, x, mask)
    # the reference is a float64 computation: an independent NumPy forward agrees to 1e-13
    assert rel_err(_numpy_llama(model, x, mask), last, mask) < 1e-13
    ct = from_hf(model)
    assert ct.blocks[0].attention.kv_heads == cfg["kv_heads"]
    assert rel_err(ct.run(x, padding_mask=mask), last, mask) < TOL


def test_stock_float64_llama_is_not_a_float64_reference_and_theta_matters():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    model = _llama(t, torch, theta=500.0)
    x = np.random.default_rng(1).standard_normal((1, 12, 16))
    mask = np.ones((1, 12), dtype=bool)
    reference = _numpy_llama(model, x, mask)
    stock_model = t.LlamaModel(copy.deepcopy(model.config)).double().eval()  # inv_freq rounded to float32
    stock_model.load_state_dict(model.state_dict())
    stock_model.set_attn_implementation("eager")
    plain, _ = _run_hf(torch, stock_model, x, mask)
    assert 1e-10 < rel_err(plain, reference) < 1e-5  # float32 angles, variance, softmax
    # a different rope_theta (transformers 5: rope_parameters) changes the network and the model
    other = _llama(t, torch, theta=5000.0)  # same seed: the same weights
    changed, _ = _run_hf(torch, other, x, mask)
    assert rel_err(changed, reference) > 1e-3
    assert rel_err(from_hf(other).run(x[0]), changed[0]) < TOL


def test_mistral_sliding_window_shorter_than_the_sequence():
    torch = require("torch")
    t = require("transformers", "MistralModel")
    from ctformer.bridges import from_hf

    model = _llama(t, torch, cls="Mistral", layers=2, heads=4, kv_heads=2, d=16, theta=1000.0, sliding_window=3)
    x = np.random.default_rng(2).standard_normal((2, 10, 16))
    mask = _padding(2, 10, 0)
    last, _ = _run_hf(torch, model, x, mask)
    assert rel_err(_numpy_llama(model, x, mask), last, mask) < 1e-13
    ct = from_hf(model)
    assert ct.blocks[0].attention.window == 3.0
    assert rel_err(ct.run(x, padding_mask=mask), last, mask) < TOL
    # the window matters: the full causal model differs
    full = _llama(t, torch, cls="Mistral", layers=2, heads=4, kv_heads=2, d=16, theta=1000.0, sliding_window=None)
    full.load_state_dict(model.state_dict())
    assert rel_err(_run_hf(torch, full, x, mask)[0], last, mask) > 1e-3


def test_qwen2_with_sliding_layers():
    torch = require("torch")
    t = require("transformers", "Qwen2Model")
    from ctformer.bridges import from_hf

    model = _llama(t, torch, cls="Qwen2", layers=3, heads=4, kv_heads=1, d=16, theta=2000.0,
                   use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert list(model.config.layer_types) == ["full_attention", "sliding_attention", "sliding_attention"]
    x = np.random.default_rng(3).standard_normal((2, 9, 16))
    mask = _padding(2, 9, 0)
    last, _ = _run_hf(torch, model, x, mask)
    assert rel_err(_numpy_llama(model, x, mask), last, mask) < 1e-13
    ct = from_hf(model)
    assert [b.attention.window for b in ct.blocks] == [None, 4.0, 4.0]
    assert ct.blocks[0].attention.b_Q is not None  # Qwen2: q, k, v biases, none on o_proj
    assert rel_err(ct.run(x, padding_mask=mask), last, mask) < TOL


# -- ALBERT -----------------------------------------------------------------------------------
@pytest.mark.parametrize("groups, inner", [(1, 1), (2, 1), (1, 2)])
def test_albert_shared_layers_discrete_limit(groups, inner):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    config = t.AlbertConfig(vocab_size=32, embedding_size=6, hidden_size=12, num_hidden_layers=4,
                            num_hidden_groups=groups, inner_group_num=inner, num_attention_heads=3,
                            intermediate_size=20, max_position_embeddings=32, layer_norm_eps=1e-6)
    model = _randomize(torch, t.AlbertModel(config, add_pooling_layer=False).double().eval(), 7)
    ids = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(0))
    mask = _padding(2, 8, 0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=torch.from_numpy(mask.astype(np.int64)), output_hidden_states=True)
    x = out.hidden_states[0].numpy()
    assert x.shape[-1] == 12  # after embedding_hidden_mapping_in (embedding size 6 != hidden size 12)
    ct = from_hf(model)
    assert ct.layers == 4 * inner
    # one layer group: every block holds the same operators (parameters independent of t)
    assert (ct.blocks[0].attention is ct.blocks[-inner].attention) == (groups == 1)
    assert rel_err(ct.run(x, padding_mask=mask), out.last_hidden_state.numpy(), mask) < TOL
    assert ct.warns_inconsistent_depth
    from ctformer.model import InconsistentDepthLimitWarning

    with pytest.warns(InconsistentDepthLimitWarning):
        ct.solve(x[:1], tokens="midpoint", features="midpoint", steps_per_layer=2)


# -- continuous depth of the converted pre-norm networks --------------------------------------
def _depth_orders(ct, x, steps=(2, 4, 8, 16)):
    from ctformer.discretizations import Midpoint

    grids = dict(tokens=Midpoint(x.shape[0]), features=Midpoint(x.shape[1]), context_length=x.shape[0])
    reference = ct.solve(x, scheme="strang", steps_per_layer=128, **grids)
    orders = {}
    for scheme in ("lie", "strang"):
        errors = [rel_err(ct.solve(x, scheme=scheme, steps_per_layer=k, **grids), reference) for k in steps]
        orders[scheme] = fitted_order([1.0 / k for k in steps], errors)
    return orders


def test_depth_refinement_of_converted_gpt2_and_llama():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    gpt2 = _randomize(torch, t.GPT2Model(t.GPT2Config(vocab_size=32, n_positions=32, n_embd=12, n_layer=2, n_head=3,
                                                      n_inner=16, bos_token_id=0, eos_token_id=0)).double().eval(),
                      5, conv1d=True)
    llama = _llama(t, torch, layers=2, heads=4, kv_heads=2, d=16, inner=16, theta=500.0)
    for model in (gpt2, llama):
        ct = from_hf(model)
        x = np.random.default_rng(4).standard_normal((7, ct.features.n))
        assert not ct.warns_inconsistent_depth
        orders = _depth_orders(ct, x)
        assert abs(orders["lie"] - 1.0) < 0.15, orders
        assert abs(orders["strang"] - 2.0) < 0.15, orders


# -- refusals ------------------------------------------------------------------------------------
def test_unsupported_class_and_unmodelled_options_are_refused_by_name():
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    with pytest.raises(TypeError, match="GPT2Model.*LlamaModel.*AlbertModel"):
        from_hf(torch.nn.Linear(2, 2))
    lm = t.GPT2LMHeadModel(t.GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                        bos_token_id=0, eos_token_id=0))
    with pytest.raises(TypeError, match="supported HuggingFace classes"):
        from_hf(lm)
    scaled = t.LlamaModel(t.LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, bos_token_id=0,
                                        eos_token_id=0, pad_token_id=0,
                                        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0,
                                                         "factor": 2.0}))
    scaled.config.rope_parameters = {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match="rope_type='proportional' is not modelled"):
        from_hf(scaled)
    cross = t.GPT2Model(t.GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=1, n_head=2,
                                     add_cross_attention=True, bos_token_id=0, eos_token_id=0))
    with pytest.raises(ValueError, match="add_cross_attention"):
        from_hf(cross)


def test_limit_report_gpt2_and_albert():
    require("torch")
    require("transformers")
    from ctformer.bridges import limit_report

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        text = limit_report("albert", seed=1)
    errors = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if "layer" in line and "error" in line]
    assert errors and max(errors) < TOL
    assert "no consistent depth limit" in text
    with pytest.raises(ValueError, match="model must be one of"):
        limit_report("t5")
    with pytest.raises(ValueError, match="pretrained=True"):
        limit_report("gpt2", pretrained=True)


# -- the registry --------------------------------------------------------------------------------
def test_a_spec_added_to_the_registry_reaches_from_hf_and_its_refusal(monkeypatch):
    """One registered spec is a new architecture: from_hf converts it, its refusal lists it.

    The new class is GPT-2 with its language-model head: GPT-2's spec with the state-dict prefix
    ``transformer.``; the continuous model's discrete limit is the head model's last hidden state.
    """
    from dataclasses import replace

    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf, hf, spec, supported
    from ctformer.bridges.gpt2 import GPT2

    config = t.GPT2Config(vocab_size=32, n_positions=16, n_embd=8, n_layer=2, n_head=2, n_inner=12,
                          bos_token_id=0, eos_token_id=0)
    lm = _randomize(torch, t.GPT2LMHeadModel(config).double().eval(), 3, conv1d=True)
    old = ("BertModel, BertEncoder, GPT2Model, LlamaModel, MistralModel, Qwen2Model, AlbertModel, "
           "ViTModel")
    with pytest.raises(TypeError, match=re.escape(old)):
        from_hf(lm)
    monkeypatch.setattr(spec, "ARCHITECTURES", dict(spec.ARCHITECTURES))
    spec.register(replace(GPT2, hf_class="GPT2LMHeadModel", prefix="transformer.", small=None))
    assert supported()[-1] == "GPT2LMHeadModel"
    x = np.random.default_rng(3).standard_normal((2, 6, 8))
    mask = _padding(2, 6, 0)
    with torch.no_grad():
        out = lm(inputs_embeds=torch.from_numpy(x), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                 output_hidden_states=True)
    hidden = [h.numpy() for h in out.hidden_states]
    assert rel_err(from_hf(lm).run(hidden[0], padding_mask=mask), hidden[-1], mask) < TOL
    with pytest.raises(TypeError, match=re.escape(old) + ".*GPT2LMHeadModel \\(base models"):
        from_hf(torch.nn.Linear(2, 2))
    assert hf.small_models() == ("bert", "gpt2", "llama", "albert", "phi3", "gpt_neox", "gemma", "gemma2")
    assert hf.BRIDGES["llama"].classes == ("LlamaModel", "MistralModel", "Qwen2Model")

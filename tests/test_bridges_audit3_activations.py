"""Activations the bridges accept, against the float64 HuggingFace and torch modules.

* HuggingFace's ``gelu_python``, ``gelu_python_tanh`` and ``gelu_accurate`` are the erf GELU and
  its tanh form with the same constant :math:`\\sqrt{2/\\pi}` (``transformers.activations``):
  they convert to the module's network (1e-12), where they were refused.
* An activation that is not modelled (``quick_gelu``, ``gelu_fast``: the constant rounded to
  0.7978845608) is refused naming the class, the configuration key and the remedy, and the
  remedy (register the function, map the name) converts the network to 1e-12.
* ``torch.nn.TransformerEncoderLayer`` with ``torch.relu`` or ``functools.partial(F.gelu,
  approximate=...)`` converts to the module's network, where it was refused with a message
  offering relu and gelu; an ``nn.GELU`` subclass that overrides ``forward`` is refused, where
  it was converted silently as the erf GELU (0.46 from the module's forward).
"""
from __future__ import annotations

import functools

import numpy as np
import pytest

from tests.conftest import rel_err, require
from tests.test_modern_bridges import _padding, _randomize, _run_hf

TOL = 1e-12
COMMON = dict(vocab_size=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
BERT = dict(COMMON, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24,
            max_position_embeddings=32)
LLAMA = dict(COMMON, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-6)
GPT2 = dict(vocab_size=32, n_positions=32, n_embd=12, n_layer=2, n_head=3, n_inner=20, bos_token_id=0, eos_token_id=0)
VIT = dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24, image_size=8,
           patch_size=4)
GEMMA2 = dict(COMMON, hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=4, max_position_embeddings=64)


def _hf(cls, **config):
    """A random float64 HuggingFace module of ``cls`` (RoPE networks through float64_reference)."""
    torch, t = require("torch"), require("transformers")
    from ctformer.bridges import float64_reference

    kwargs = {"add_pooling_layer": False} if cls in ("Bert", "ViT") else {}
    model = getattr(t, f"{cls}Model")(getattr(t, f"{cls}Config")(**config), **kwargs).double().eval()
    model = _randomize(torch, model, 0, conv1d=cls == "GPT2")
    return float64_reference(model) if cls in ("Llama", "Gemma2") else model


def _error(model, tokens=7):
    """Max relative error of ``from_hf(model).run`` against the module, real tokens of a padded batch."""
    torch = require("torch")
    from ctformer.bridges import from_hf

    x = np.random.default_rng(1).standard_normal((3, tokens, model.config.hidden_size))
    mask = _padding(3, tokens, 0)
    last, hidden = _run_hf(torch, model, x, mask)
    return rel_err(from_hf(model).run(hidden[0], padding_mask=mask), last, mask)


@pytest.mark.transformers
@pytest.mark.parametrize("act", ["gelu_python", "gelu_python_tanh", "gelu_accurate"])
@pytest.mark.parametrize("cls, config", [("Bert", BERT), ("Llama", LLAMA)], ids=["bert", "llama"])
def test_exact_aliases_of_the_gelu_convert_to_the_huggingface_network(act, cls, config):
    # before: ValueError "hidden_act='gelu_python' is not modelled"; now 5.7e-16 to 9.5e-16
    assert _error(_hf(cls, **dict(config, hidden_act=act))) < TOL


@pytest.mark.transformers
def test_the_tanh_aliases_are_not_the_erf_gelu():
    """The aliases map to their own form: a tanh alias converted as the erf GELU would be 1e-4 off."""
    from ctformer.bridges import HF_ACTIVATIONS

    assert HF_ACTIVATIONS["gelu_python"] == "gelu"
    assert HF_ACTIVATIONS["gelu_python_tanh"] == HF_ACTIVATIONS["gelu_accurate"] == "gelu_tanh"
    erf, tanh = _hf("Bert", **dict(BERT, hidden_act="gelu")), _hf("Bert", **dict(BERT, hidden_act="gelu_accurate"))
    x = np.random.default_rng(2).standard_normal((1, 5, 16))
    from ctformer.bridges import from_hf

    assert rel_err(from_hf(tanh).run(x), from_hf(erf).run(x)) > 1e-5


REFUSED = [
    ("Bert", dict(BERT, hidden_act="quick_gelu"), "BertModel: hidden_act='quick_gelu'"),
    ("Bert", dict(BERT, hidden_act="gelu_fast"), "BertModel: hidden_act='gelu_fast'"),
    ("GPT2", dict(GPT2, activation_function="quick_gelu"), "GPT2Model: activation_function='quick_gelu'"),
    ("Llama", dict(LLAMA, hidden_act="gelu_fast"), "LlamaModel: hidden_act='gelu_fast'"),
    ("Gemma2", dict(GEMMA2, hidden_activation="quick_gelu"), "Gemma2Model: hidden_activation='quick_gelu'"),
    ("ViT", dict(VIT, hidden_act="tanh"), "ViTModel: hidden_act='tanh'"),
]


@pytest.mark.transformers
@pytest.mark.parametrize("cls, config, named", REFUSED, ids=[r[2].split(":")[0] for r in REFUSED])
def test_an_activation_that_is_not_modelled_is_refused_with_the_class_and_the_remedy(cls, config, named):
    from ctformer.bridges import from_hf

    # before: "hidden_act='quick_gelu' is not modelled; supported: [...]", without class or remedy
    with pytest.raises(ValueError, match=named.replace("(", r"\(") + r" is not modelled; supported: \[.*\]\. "
                       r".*register_activation\(name, function\).*HF_ACTIVATIONS\["):
        from_hf(_hf(cls, **config))


@pytest.mark.transformers
@pytest.mark.parametrize("cls, config", [("Bert", BERT), ("Llama", LLAMA)], ids=["bert", "llama"])
def test_the_remedy_of_the_refusal_converts_the_network(cls, config, monkeypatch):
    """quick_gelu, z sigma(1.702 z), registered as the message says: the HuggingFace network to 1e-12."""
    from ctformer.bridges import HF_ACTIVATIONS
    from ctformer.operators.activations import ACTIVATIONS, register_activation

    def quick_gelu(z):
        return z / (1.0 + np.exp(-1.702 * z))

    monkeypatch.setitem(ACTIVATIONS, "audit_quick_gelu", quick_gelu)  # undone after the test
    register_activation("audit_quick_gelu", quick_gelu)
    monkeypatch.setitem(HF_ACTIVATIONS, "quick_gelu", "audit_quick_gelu")
    assert _error(_hf(cls, **dict(config, hidden_act="quick_gelu"))) < TOL


def _torch_error(activation, reference_activation=None):
    """Max relative error of ``from_torch`` of a float64 two-layer encoder with ``activation``,
    against the module with ``reference_activation`` (default: the same). Three heads: torch's
    fast path (even heads), which runs the erf GELU for every ``nn.GELU``, is not taken."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    def encoder(act):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d_model=12, nhead=3, dim_feedforward=20, batch_first=True,
                                                 activation=act, dtype=torch.float64)
        module = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.randn(p.shape, dtype=p.dtype) * (2.0 if p.ndim == 2 else 0.5))
        return module

    x = np.random.default_rng(1).standard_normal((2, 7, 12)) * 3.0
    with torch.no_grad():
        reference = encoder(reference_activation or activation)(torch.from_numpy(x)).numpy()
    return rel_err(from_torch(encoder(activation)).run(x), reference)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["torch.relu", "partial-gelu-tanh", "partial-gelu-none"])
def test_torch_relu_and_a_partial_gelu_convert_to_the_module(name):
    torch = require("torch")
    activation = {"torch.relu": torch.relu,
                  "partial-gelu-tanh": functools.partial(torch.nn.functional.gelu, approximate="tanh"),
                  "partial-gelu-none": functools.partial(torch.nn.functional.gelu, approximate="none")}[name]
    # before: ValueError "unsupported activation <built-in method relu ...>: the continuous model offers relu"
    assert _torch_error(activation) < TOL


@pytest.mark.torch
def test_a_partial_tanh_gelu_is_the_tanh_form_not_the_erf_one():
    torch = require("torch")
    tanh = functools.partial(torch.nn.functional.gelu, approximate="tanh")
    assert _torch_error(tanh, torch.nn.GELU(approximate="tanh")) < TOL
    assert _torch_error(tanh, torch.nn.GELU()) > 1e-5


@pytest.mark.torch
def test_a_gelu_subclass_that_overrides_forward_is_refused():
    torch = require("torch")
    from ctformer.bridges import from_torch

    class Shifted(torch.nn.GELU):
        def forward(self, z):
            return torch.nn.functional.gelu(z) + 1.0

    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=12, batch_first=True,
                                             activation=Shifted(), dtype=torch.float64).eval()
    # before: converted as the erf GELU. The module has two answers: torch's fast path (eval, no grad,
    # even heads) runs the stock GELU (3e-16 from that conversion), its forward the override (0.46 away)
    with pytest.raises(ValueError, match=r"layers\[0\]\.activation=Shifted\(.*\) is not modelled: .*"
                                         r"build the layer with one of these"):
        from_torch(layer)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["tanh-module", "lambda"])
def test_an_unsupported_torch_activation_is_refused_naming_the_layer_and_the_remedy(name):
    torch = require("torch")
    from ctformer.bridges import from_torch

    activation = torch.nn.Tanh() if name == "tanh-module" else (lambda z: torch.nn.functional.gelu(z))
    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=12, batch_first=True,
                                             activation=activation, dtype=torch.float64)
    module = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    module.layers[0].activation = torch.nn.ReLU()  # the first layer is supported, the second not
    # before: "unsupported activation Tanh(): ...", without the layer or the remedy
    with pytest.raises(ValueError, match=r"layers\[1\]\.activation=.* is not modelled: the continuous model "
                                         r"offers relu .*build the layer with one of these"):
        from_torch(module)


@pytest.mark.torch
def test_a_tanh_gelu_layer_converts_to_its_forward_not_to_torchs_fast_path():
    """torch's inference fast path runs the erf GELU for any nn.GELU (from_torch's docstring)."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=12, batch_first=True,
                                             activation=torch.nn.GELU(approximate="tanh"),
                                             dtype=torch.float64).eval()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, dtype=p.dtype) * 2.0)
    x = np.random.default_rng(1).standard_normal((2, 5, 8)) * 3.0
    forward = layer(torch.from_numpy(x)).detach().numpy()  # autograd on: the layer's forward
    with torch.no_grad():
        fast = layer(torch.from_numpy(x)).numpy()
    ours = from_torch(layer).run(x)
    assert rel_err(ours, forward) < TOL
    assert 1e-6 < rel_err(ours, fast) < 1e-4  # 7.7e-6: the fast path's erf GELU

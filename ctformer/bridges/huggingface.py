r"""Convert a HuggingFace BERT encoder to a :class:`ctformer.model.ContinuousTransformer`.

A BERT layer is post-norm (Tai, Liu, Li, Chan 2025):

.. math::

    h = N_1\big(u + \mathrm{Attn}(u)\big), \qquad u \leftarrow N_2\big(h + F(h)\big),

with ``attention.self.{query,key,value}`` and ``attention.output.dense`` in
:math:`\mathrm{Attn}`, ``attention.output.LayerNorm`` as :math:`N_1`, ``intermediate.dense``,
the activation and ``output.dense`` in :math:`F`, and ``output.LayerNorm`` as :math:`N_2`; the
epsilon is ``config.layer_norm_eps``. The embeddings are not part of the evolution: their
output is the initial state :math:`u_0`.

Weights come from a model in memory (``BertModel`` or ``BertEncoder``) or from a
``.safetensors`` file read with :func:`safetensors.numpy.load_file` (never unpickled).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..discretizations import Midpoint
from ..model import Block, ContinuousTransformer
from .common import optional_import, attention_from_weights, feedforward_from_weights, layer_norm_from_weights, to_numpy

__all__ = ["from_hf_bert", "HF_ACTIVATIONS"]

#: ``config.hidden_act`` -> FeedForward activation.
HF_ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}


def from_hf_bert(model, config=None) -> ContinuousTransformer:
    r"""The continuous Transformer whose discrete limit is a BERT encoder.

    Parameters
    ----------
    model : transformers BertModel or BertEncoder, or str or os.PathLike
        A model in memory, or the path of a ``.safetensors`` file (or of a directory holding
        ``model.safetensors``) with BERT parameter names (``encoder.layer.0.attention...``,
        optionally prefixed ``bert.``).
    config : mapping or transformers config, optional
        Needed for a path when no ``config.json`` sits next to the weights: keys
        ``num_attention_heads``, ``layer_norm_eps``, ``hidden_act`` (and optionally
        ``num_hidden_layers``, ``position_embedding_type``). Ignored for a model in memory
        (its own config is used).

        Weights may be float16, bfloat16, float32 or float64 (in memory or in the file): they
        are copied to float64 exactly.

    Returns
    -------
    ContinuousTransformer
        Post-norm blocks; ``features = Midpoint(hidden_size)``,
        ``head_features = Midpoint(hidden_size / heads)``, ``hidden = Midpoint(intermediate_size)``.

    Raises
    ------
    TypeError
        If ``model`` is neither a BERT model/encoder nor a path, or a weight has another dtype
        (integer, quantized, float8; the message names it).
    ValueError
        For unsupported configurations: relative position embeddings, decoder or
        cross-attention layers, an unknown activation, missing weights or config keys; for a
        corrupt ``config.json`` or ``.safetensors`` file (the message names the file and
        what is wrong with it).
    """
    if isinstance(model, (str, os.PathLike)):
        state, cfg = _load_safetensors(Path(model), config)
    else:
        state, cfg = _from_module(model)
    return _build(state, cfg)


def _from_module(model):
    bert = optional_import("transformers.models.bert.modeling_bert", "from_hf_bert")
    BertEncoder, BertModel = bert.BertEncoder, bert.BertModel
    if isinstance(model, BertModel):
        encoder, prefix = model.encoder, "layer."
    elif isinstance(model, BertEncoder):
        encoder, prefix = model, "layer."
    else:
        raise TypeError(
            "from_hf_bert supports transformers BertModel and BertEncoder (or a .safetensors path); "
            f"got {type(model).__module__}.{type(model).__qualname__}"
        )
    cfg = encoder.config.to_dict() if hasattr(encoder, "config") else model.config.to_dict()
    state = {name[len(prefix):]: tensor for name, tensor in encoder.state_dict().items()
             if name.startswith(prefix)}
    return state, cfg


def _load_safetensors(path: Path, config):
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise ValueError(f"no safetensors file at {path}")
    if path.suffix != ".safetensors":
        raise ValueError(f"from_hf_bert reads only .safetensors files (never pickles), got {path.name}")
    if config is None:
        config_file = path.parent / "config.json"
        if not config_file.is_file():
            raise ValueError(f"pass config=...: no config.json next to {path}")
        config = _read_config(config_file)
    elif hasattr(config, "to_dict"):
        config = config.to_dict()
    try:
        tensors = _read_tensors(path)
    except TypeError:  # a valid file with a dtype NumPy cannot hold (named)
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own SafetensorError
        raise ValueError(f"{path}: not a valid .safetensors file ({type(exc).__name__}: {exc}); "
                         "re-download or re-export the weights") from None
    state = {}
    for prefix in ("encoder.layer.", "bert.encoder.layer."):
        found = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if found:
            state = found
            break
    if not state:
        raise ValueError(f"{path.name} holds no BERT encoder weights (encoder.layer.*)")
    return state, dict(config)


#: safetensors dtypes that ``safetensors.numpy`` loads.
_NUMPY_KINDS = ("BOOL", "U8", "I8", "U16", "I16", "F16", "U32", "I32", "F32", "U64", "I64", "F64")


def _read_tensors(path: Path) -> dict:
    r"""``name -> ndarray`` of a ``.safetensors`` file; BF16 tensors widened exactly to float32.

    NumPy has no bfloat16. A bfloat16 number is the upper half of the float32 of the same
    value, so its bits :math:`b` give the float32 with bits :math:`2^{16} b` exactly.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:  # validates the header
        kinds = {name: f.get_slice(name).get_dtype() for name in f.keys()}
        for name, kind in kinds.items():
            if kind not in _NUMPY_KINDS and kind != "BF16":
                raise TypeError(f"{path}: tensor {name} has dtype {kind}, which NumPy cannot hold; the "
                                "bridges take F16, BF16, F32 and F64 weights (dequantize first)")
        tensors = {name: f.get_tensor(name) for name, kind in kinds.items() if kind != "BF16"}
    wide = [name for name, kind in kinds.items() if kind == "BF16"]
    if wide:
        raw = path.read_bytes()
        size = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + size])
        for name in wide:
            start, stop = (8 + size + int(o) for o in header[name]["data_offsets"])
            bits = np.frombuffer(raw[start:stop], dtype="<u2").astype(np.uint32) << 16
            tensors[name] = bits.view(np.float32).reshape(header[name]["shape"])
    return tensors


def _read_config(config_file: Path) -> dict:
    """The settings of ``config.json``; a corrupt file is named with what is wrong with it."""
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{config_file}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                         "expected a JSON object of BERT settings") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_file}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                         f"column {exc.colno}); expected a JSON object of BERT settings") from None
    if not isinstance(config, dict):
        raise ValueError(f"{config_file}: expected a JSON object of BERT settings, got a "
                         f"JSON {type(config).__name__}")
    return config


def _build(state, cfg):
    for key in ("num_attention_heads", "layer_norm_eps", "hidden_act"):
        if key not in cfg:
            raise ValueError(f"the BERT config lacks {key!r}")
    if cfg.get("position_embedding_type", "absolute") not in ("absolute", None):
        raise ValueError(
            f"position_embedding_type={cfg['position_embedding_type']!r} adds position terms to the "
            "scores; only 'absolute' (embeddings outside the encoder) is supported"
        )
    if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
        raise ValueError("decoder / cross-attention BERT layers are not supported")
    act = cfg["hidden_act"]
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {act!r}; supported: {sorted(HF_ACTIVATIONS)}")
    heads, eps = int(cfg["num_attention_heads"]), float(cfg["layer_norm_eps"])

    indices = sorted({int(k.split(".", 1)[0]) for k in state})
    n_layers = int(cfg.get("num_hidden_layers", len(indices)))
    if indices != list(range(n_layers)):
        raise ValueError(f"expected weights of layers 0..{n_layers - 1}, found layers {indices}")

    def weight(i, name, optional=False):
        key = f"{i}.{name}"
        if key not in state:
            if optional:
                return None
            raise ValueError(f"missing BERT weight layer.{key}")
        return to_numpy(state[key], f"layer.{key}")

    blocks = []
    for i in range(n_layers):
        w = {n: weight(i, f"attention.self.{n}.weight") for n in ("query", "key", "value")}
        b = {n: weight(i, f"attention.self.{n}.bias", True) for n in ("query", "key", "value")}
        attention = attention_from_weights(
            w["query"], w["key"], w["value"], weight(i, "attention.output.dense.weight"),
            b["query"], b["key"], b["value"], weight(i, "attention.output.dense.bias", True), heads)
        feedforward = feedforward_from_weights(
            weight(i, "intermediate.dense.weight"), weight(i, "intermediate.dense.bias", True),
            weight(i, "output.dense.weight"), weight(i, "output.dense.bias", True), HF_ACTIVATIONS[act])
        norm1 = layer_norm_from_weights(weight(i, "attention.output.LayerNorm.weight", True),
                                        weight(i, "attention.output.LayerNorm.bias", True), eps)
        norm2 = layer_norm_from_weights(weight(i, "output.LayerNorm.weight", True),
                                        weight(i, "output.LayerNorm.bias", True), eps)
        blocks.append(Block(attention, feedforward, norm1, norm2, placement="post"))
    d_model = w["query"].shape[1]
    d_ff = weight(0, "intermediate.dense.weight").shape[0]
    return ContinuousTransformer(blocks, head_features=Midpoint(d_model // heads), hidden=Midpoint(d_ff),
                                 features=Midpoint(d_model))

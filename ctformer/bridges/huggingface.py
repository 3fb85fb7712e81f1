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
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..model import ContinuousTransformer
from .common import optional_import
from .convert import build, warn_train_mode
from .spec import ENCODER_NAMES, HF_ACTIVATIONS, ArchitectureSpec, Refusal, register, relative_refusal, truthy

__all__ = ["from_hf_bert", "HF_ACTIVATIONS", "BERT", "BERT_ENCODER"]


def _small(t):
    return t.BertModel(t.BertConfig(hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=32, max_position_embeddings=64, vocab_size=64),
                       add_pooling_layer=False)


#: BERT: post-norm; the encoder's layers are ``encoder.layer.{i}``.
BERT = register(ArchitectureSpec(
    hf_class="BertModel", family="bert", prefix="encoder.", layer="layer.{i}.", query="attention.self.query",
    key="attention.self.key", value="attention.self.value", output="attention.output.dense",
    up="intermediate.dense", down="output.dense", norm_kind="layer", norm1="attention.output.LayerNorm",
    norm2="output.LayerNorm", placement="post", names=ENCODER_NAMES,
    refusals=(relative_refusal("transformers.models.bert.modeling_bert"),
              Refusal("is_decoder", truthy, "decoder layers are not supported",
                      "the bidirectional encoder, is_decoder=False"),
              Refusal("add_cross_attention", truthy, "cross-attention layers are not supported",
                      "self-attention blocks only, add_cross_attention=False")),
    small=_small))
#: ``BertEncoder`` alone: the same layers without the ``encoder.`` prefix.
BERT_ENCODER = register(replace(BERT, hf_class="BertEncoder", prefix="", small=None))


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
        are held once in float64, float64 tensors of a model in memory shared (read-only
        views), other dtypes converted exactly.

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
        For unsupported configurations: relative position embeddings where they act
        (``position_embedding_type`` when the installed transformers computes them, before
        version 5, or weights holding their ``distance_embedding`` tables; transformers 5
        ignores the option, and so does the converted model), decoder or cross-attention
        layers, an unknown activation, missing weights or config keys; for a
        corrupt ``config.json`` or ``.safetensors`` file (the message names the file and
        what is wrong with it).
    """
    if isinstance(model, (str, os.PathLike)):
        state, cfg = _load_safetensors(Path(model), config)
    else:
        state, cfg = _from_module(model)
    for key in ("num_attention_heads", "layer_norm_eps", "hidden_act"):
        if key not in cfg:
            raise ValueError(f"the BERT config lacks {key!r}")
    _refuse_distance_tables(state, cfg)
    network = build(BERT, state, cfg)
    if not isinstance(model, (str, os.PathLike)):
        warn_train_mode(model)
    return network


def _refuse_distance_tables(state, cfg) -> None:
    """Weights of relative position scores (``distance_embedding``) mean a network trained with
    them: converting without them would be another network, so they are refused by name."""
    tables = sorted(name for name in state if "distance_embedding" in name)
    if tables:
        kind = cfg.get("position_embedding_type")
        raise ValueError(f"the BERT weights hold the relative position tables of "
                         f"position_embedding_type={kind!r} ({tables[0]}"
                         f"{' ...' if len(tables) > 1 else ''}), which are not modelled; only "
                         "absolute positions (embeddings outside the encoder) are supported")


def _from_module(model):
    bert = optional_import("transformers.models.bert.modeling_bert", "from_hf_bert")
    BertEncoder, BertModel = bert.BertEncoder, bert.BertModel
    if isinstance(model, BertModel):
        encoder = model.encoder
    elif isinstance(model, BertEncoder):
        encoder = model
    else:
        raise TypeError(
            "from_hf_bert supports transformers BertModel and BertEncoder (or a .safetensors path); "
            f"got {type(model).__module__}.{type(model).__qualname__}"
        )
    cfg = encoder.config.to_dict() if hasattr(encoder, "config") else model.config.to_dict()
    return encoder.state_dict(), cfg


def _load_safetensors(path: Path, config):
    if path.is_dir():
        path = path / "model.safetensors"
    if not path.is_file():
        raise ValueError(f"from_hf_bert: no safetensors file at {path}; pass a local .safetensors file or a "
                         "directory holding model.safetensors (nothing is downloaded: for a Hub name, load the "
                         "model with transformers and pass the BertModel)")
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
    for prefix in ("encoder.", "bert.encoder."):
        found = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix + "layer.")}
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

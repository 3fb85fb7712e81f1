r"""The one converter: a HuggingFace network and its :class:`~ctformer.bridges.spec.ArchitectureSpec`
to a :class:`~ctformer.model.ContinuousTransformer`.

The discrete-limit dictionary (design notes, section 2): an ``nn.Linear`` weight :math:`A`
(``out x in``) is the piecewise-constant kernel whose midpoint matrix is :math:`A`, a bias or
a norm gain the piecewise-constant function of its entries, and the score scale :math:`c` of
:math:`q \cdot k` the temperature :math:`\beta_h = c\, d_h` (midpoint weights :math:`1/d_h`);
RoPE's attention scaling :math:`a` multiplies it by :math:`a^2` (with partial rotary, the rows
of the rotated query and key features are multiplied by :math:`a` instead). Each weight is held
once in float64: a view of a float64 tensor's memory, or one exact conversion
(:func:`~ctformer.bridges.common.shared_weight`); a parameter tied under several names is
converted once and stays one array. A fused query-key-value weight is split into views (per
head where the heads are interleaved, GPT-NeoX); only partial rotary copies, once, the query
and key rows it reorders.
"""
from __future__ import annotations

import math
import re
import warnings

import numpy as np

from ..discretizations import Midpoint
from ..model import Block, ContinuousTransformer
from ..shared_tensors import watch
from .common import (feedforward_from_weights, gated_feedforward_from_weights, grouped_attention_from_weights,
                     layer_norm_from_weights, rms_norm_from_weights, shared_weight)
from .composite import EulerNetwork, OutputNormalized
from .rotary import check_rotary, partial_rotary_gains, partial_rotary_order, rope_positions, rope_scaling_of
from .spec import HF_ACTIVATIONS, ArchitectureSpec, config_value

__all__ = ["Weights", "convert", "build", "layer_windows", "TrainModeWarning", "warn_train_mode"]

#: Configuration keys of dropout probabilities applied inside the layers (attention dropout is
#: functional in HuggingFace's attention: no ``nn.Dropout`` module holds it).
_DROPOUT_KEYS = ("attention_dropout", "attention_probs_dropout_prob", "attn_pdrop", "hidden_dropout",
                 "hidden_dropout_prob", "resid_pdrop")


class TrainModeWarning(UserWarning):
    """A network converted in ``train()`` mode with dropout: the continuum is its eval-mode network."""


def warn_train_mode(model, stacklevel: int = 3) -> None:
    r"""Warn when ``model`` is in train mode with a dropout probability :math:`p > 0`.

    Dropout is a random mask on the activations; the continuous model is the deterministic
    eval-mode network (dropout off), which is what ``run`` computes.
    """
    if not getattr(model, "training", False):
        return
    cfg = getattr(model, "config", None)
    rates = {f"config.{key}": float(config_value(cfg, key, 0.0)) for key in _DROPOUT_KEYS
             if isinstance(config_value(cfg, key, 0.0), (int, float)) and config_value(cfg, key, 0.0) > 0}
    rates.update({f"{name}.p": float(m.p) for name, m in model.named_modules()
                  if type(m).__name__ == "Dropout" and float(getattr(m, "p", 0.0)) > 0.0})
    if rates:
        listed = ", ".join(f"{k}={v:g}" for k, v in list(rates.items())[:4]) + (" ..." if len(rates) > 4 else "")
        warnings.warn(f"{type(model).__name__} is in train() mode with dropout ({listed}): the continuous model "
                      "is the eval-mode network (no dropout), so run() matches model.eval(), not this model's "
                      "random training forward; call model.eval() before converting to silence this",
                      TrainModeWarning, stacklevel=stacklevel)

_LAYER_TYPES = ("full_attention", "sliding_attention")


class Weights:
    """The one weight fetcher of every bridge: ``state[name]`` as a read-only float64 array.

    A float64 tensor is shared (a view of its memory), any other dtype converted once
    (:func:`~ctformer.bridges.common.shared_weight`): the converted model holds one copy of
    each weight, shared by its operators and ``parameters()``. Names over the same memory
    (tied parameters) return the same array, whatever the dtype.

    Parameters
    ----------
    state : mapping name -> tensor or array
    label : str
        Names the network in the message of a missing weight.
    transposed : bool
        Matrices are stored ``(in, out)`` (``Conv1D``): they are transposed.
    """

    def __init__(self, state, label: str, transposed: bool = False):
        self.state, self.label, self.transposed = state, label, transposed
        self.shared: dict = {}  # id -> (name, _Sampled): the tensors whose memory the model shares
        self._converted: dict = {}  # memory key -> array: a tensor under two names converts once

    def __call__(self, name: str, optional: bool = False):
        if name not in self.state:
            if optional:
                return None
            raise ValueError(f"missing {self.label} weight {name}")
        tensor = self.state[name]
        # one float64 copy at most: a float64 tensor is shared; a conversion keeps the module's
        # layout (A C-contiguous, read as A^T by BLAS and row by row by the few-row kernel).
        # Tied parameters appear under several names (as different detached tensors over the
        # same memory): keyed by that memory, they convert once and stay one array
        key = _memory_key(tensor)
        array = self._converted.get(key) if key is not None else None
        if array is None:
            array = shared_weight(tensor, name)
            if key is not None:
                self._converted[key] = array
        if _shares_memory(tensor):
            self.shared.setdefault(id(tensor), (name, _Sampled(tensor, array)))
        return array.T if self.transposed and array.ndim == 2 else array


class _Sampled:
    """A shared tensor as the staleness check (:func:`~ctformer.shared_tensors.watch`) reads it:
    its version counter together with up to 64 of its values, evenly spaced.

    ``p.data`` is a new tensor over ``p``'s memory with a counter of its own, so a write through
    it (``p.data.add_``, a LoRA merge ``weight.data += B @ A``) changes the shared memory without
    counting a version of ``p``: the model then ran on, neither network. The sample catches a
    write that reaches any of its entries, in about 1 us per tensor."""

    __slots__ = ("tensor", "_sample", "_index")

    def __init__(self, tensor, array: np.ndarray):
        self.tensor, self._index = tensor, None
        step = max(1, -(-array.size // 64))  # at most 64 entries, evenly spaced
        if array.flags.c_contiguous:  # a strided view of the memory: read in place, never copied
            self._sample = array.reshape(-1)[::step]
        else:
            self._sample, self._index = array, np.unravel_index(np.arange(0, array.size, step), array.shape)

    @property
    def _version(self):
        values = self._sample if self._index is None else self._sample[self._index]
        return self.tensor._version, values.tobytes()


def _memory_key(tensor):
    """What identifies a tensor's values by its memory (address, shape, strides, dtype,
    device), or None for an object without an address (a list): equal keys, equal values."""
    if hasattr(tensor, "data_ptr") and hasattr(tensor, "stride"):
        return (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype),
                str(tensor.device))
    if isinstance(tensor, np.ndarray):
        return (tensor.__array_interface__["data"][0], tensor.shape, tensor.strides, tensor.dtype.str, "cpu")
    return None


def _shares_memory(tensor) -> bool:
    """Whether :func:`~ctformer.bridges.common.shared_weight` returns a view of ``tensor``'s
    memory: a float64 torch tensor on the CPU."""
    return (str(getattr(tensor, "dtype", "")) == "torch.float64"
            and getattr(getattr(tensor, "device", None), "type", None) == "cpu")


def convert(spec: ArchitectureSpec, model) -> ContinuousTransformer:
    """Convert a model in memory: its ``state_dict()`` and ``config`` walked by ``spec``; a model
    in train mode with dropout converts with a :class:`TrainModeWarning`."""
    state = {name[len(spec.prefix):]: tensor for name, tensor in model.state_dict().items()
             if name.startswith(spec.prefix)}
    rotary = getattr(model, "rotary_emb", None) if spec.rope else None
    network = build(spec, state, model.config, rotary)
    warn_train_mode(model, stacklevel=4)
    return network


def _check_config(spec, cfg):
    for refusal in spec.refusals:
        value = config_value(cfg, refusal.key)
        if refusal.refused(value):
            hint = f"; supported: {refusal.supported}" if refusal.supported else ""
            raise ValueError(f"{spec.hf_class}: {refusal.key}={value!r} is not modelled ({refusal.why}){hint}")
    keys = spec.names.activation
    if callable(keys):  # the class decides which key its installed code reads (Gemma)
        key, act = keys(cfg)
    else:
        for key in keys:
            act = config_value(cfg, key)
            if act is not None:
                break
    if not isinstance(act, str) or act not in HF_ACTIVATIONS:
        raise ValueError(
            f"{spec.hf_class}: {key}={act!r} is not modelled; supported: {sorted(HF_ACTIVATIONS)}. A network "
            "trained with another activation is another network: to convert it, register the function with "
            "ctformer.operators.activations.register_activation(name, function) and map the HuggingFace name "
            f"to it, ctformer.bridges.HF_ACTIVATIONS[{act!r}] = name")
    return HF_ACTIVATIONS[act]


def layer_windows(cfg, n_layers, per_layer=True):
    """Sliding window of each layer (None = full attention) from ``sliding_window`` and, with
    ``per_layer``, ``layer_types`` (without it the window is on every layer)."""
    window = config_value(cfg, "sliding_window")
    types_ = config_value(cfg, "layer_types") if per_layer else None
    if types_ is None:
        return [window] * n_layers
    out = []
    for i, kind in enumerate(list(types_)[:n_layers]):
        if kind not in _LAYER_TYPES:
            raise ValueError(f"layer_types[{i}]={kind!r} is not modelled; supported: {list(_LAYER_TYPES)}")
        if kind == "sliding_attention" and window is None:
            raise ValueError(f"layer_types[{i}]='sliding_attention' without a sliding_window")
        out.append(window if kind == "sliding_attention" else None)
    return out


def _layer_fields(spec, state, cfg):
    pattern = re.compile("^" + re.escape(spec.layer).replace(re.escape("{i}"), r"(\d+)"))
    indices = sorted({int(m.group(1)) for m in map(pattern.match, state) if m})
    if spec.layer_keys is not None:
        return spec.layer_keys(cfg, indices)
    n_layers = int(config_value(cfg, spec.names.layers, len(indices)))
    if indices != list(range(n_layers)):
        raise ValueError(f"expected weights of layers 0..{n_layers - 1}, found layers {indices}")
    return [{"i": i} for i in indices]


def _norm(spec, w, template, eps):
    if template is None:
        return None
    if spec.norm_kind == "layer":
        return layer_norm_from_weights(w(template + ".weight", True), w(template + ".bias", True), eps)
    weight = w(template + ".weight", True)
    if spec.norm_kind == "rms_offset":
        weight = 1.0 + weight
    return rms_norm_from_weights(weight, eps)


def _projections(spec, w, p, sizes, order):
    """``(W_q, W_k, W_v, W_o)`` and ``(b_q, b_k, b_v, b_o)`` of one layer; ``order`` (partial
    rotary) is the head-feature order and the factor of each feature of queries and keys."""
    heads, kv_heads, head_dim = sizes
    if spec.qkv is not None:
        fused, bias = w(p + spec.qkv + ".weight"), w(p + spec.qkv + ".bias", True)
        _check_fused_rows(spec, p, fused.shape[0], sizes)
        if spec.qkv_layout == "per_head":  # rows (heads, [q, k, v], head_dim): per-head views, no copy
            split = [fused.reshape(heads, 3, head_dim, -1)[:, j] for j in range(3)]
            biases = [None] * 3 if bias is None else [bias.reshape(heads, 3, head_dim)[:, j].reshape(-1)
                                                     for j in range(3)]
        else:
            cuts = np.cumsum([heads * head_dim, kv_heads * head_dim])
            split = np.split(fused, cuts)
            biases = [None] * 3 if bias is None else np.split(bias, cuts)
    else:
        split = [w(p + name + ".weight") for name in (spec.query, spec.key, spec.value)]
        biases = [w(p + name + ".bias", True) for name in (spec.query, spec.key, spec.value)]
    if order is not None:  # partial rotary: reorder the head features of queries and keys, scale the rotated
        order, gains = order
        for j, count in ((0, heads), (1, kv_heads)):
            rows = (np.arange(count)[:, None] * head_dim + order[None, :]).reshape(-1)
            split[j] = split[j].reshape(count, head_dim, -1)[:, order]  # (head, feature, d): one copy
            biases[j] = None if biases[j] is None else biases[j][rows]
            if np.any(gains != 1.0):  # the reordered rows are copies already: scaled in place
                split[j] *= gains[:, None]
                if biases[j] is not None:
                    biases[j] *= np.tile(gains, count)
    return (*split, w(p + spec.output + ".weight")), (*biases, w(p + spec.output + ".bias", True))


def _check_fused_rows(spec, p, rows, sizes):
    """A fused query-key-value weight must have (H + 2 H_kv) d_h rows: otherwise the
    configuration's head size is not the weights' (a split would mix heads silently)."""
    heads, kv_heads, head_dim = sizes
    expected = (heads + 2 * kv_heads) * head_dim
    if rows != expected and spec.names.head_dim is None:  # d_h = d / H: the weights are not the configuration's
        raise ValueError(f"{spec.hf_class}: {p}{spec.qkv}.weight has {rows} rows, but {spec.names.hidden} / "
                         f"{spec.names.heads} = {head_dim} with {heads} heads gives {expected}: the weights do not "
                         "belong to this configuration; load them with the configuration they were saved with")
    if rows != expected:
        raise ValueError(
            f"{spec.hf_class}: {p}{spec.qkv}.weight has {rows} rows, but {spec.names.head_dim}={head_dim} with "
            f"{heads} heads and {kv_heads} key/value heads gives {expected}: the attention heads of the weights "
            f"have {rows // (heads + 2 * kv_heads)} features (a head_dim that sizes only the rotary features, "
            f"as GPT-NeoX reads it, is not modelled); set config.{spec.names.head_dim} to "
            f"{rows // (heads + 2 * kv_heads)} or None")


def _feedforward(spec, w, p, activation):
    """The feed-forward operator of one layer and its hidden width."""
    down, b_down = w(p + spec.down + ".weight"), w(p + spec.down + ".bias", True)
    if spec.gate_up is not None:
        gate, up = np.split(w(p + spec.gate_up + ".weight"), 2)
        return gated_feedforward_from_weights(gate, None, up, None, down, b_down, activation), up.shape[0]
    up = w(p + spec.up + ".weight")
    if spec.gate is not None:
        return gated_feedforward_from_weights(w(p + spec.gate + ".weight"), w(p + spec.gate + ".bias", True), up,
                                              w(p + spec.up + ".bias", True), down, b_down, activation), up.shape[0]
    return feedforward_from_weights(up, w(p + spec.up + ".bias", True), down, b_down, activation), up.shape[0]


def _sizes(spec, cfg, w, first):
    """``d`` and ``(heads, kv_heads, head_dim)``; ``d`` from the first query weight when the
    configuration does not give it (a BERT ``.safetensors`` file with a minimal config)."""
    names = spec.names
    d = config_value(cfg, names.hidden)
    if d is None:
        d = w(spec.layer.format(**first) + (spec.query or spec.qkv) + ".weight").shape[1]
    d, heads = int(d), int(config_value(cfg, names.heads))
    kv_heads = int(config_value(cfg, names.kv_heads, heads))
    head_dim = config_value(cfg, names.head_dim) if names.head_dim else None
    if head_dim is None:
        if d % heads:
            raise ValueError(f"embedding size {d} is not divisible by the number of heads {heads}")
        head_dim = d // heads
    return d, (heads, kv_heads, int(head_dim))


def build(spec: ArchitectureSpec, state, cfg, rotary=None) -> ContinuousTransformer:
    """The continuous Transformer of ``state`` (names relative to ``spec.prefix``) and ``cfg``.

    Raises
    ------
    ValueError
        For a refused option (named with its value and the reason), an unknown activation,
        a RoPE that is not modelled, missing weights or layers.
    TypeError
        For weights of another dtype (named).
    """
    activation = _check_config(spec, cfg)
    w = Weights(state, spec.hf_class, spec.transposed)
    fields = _layer_fields(spec, state, cfg)
    d, sizes = _sizes(spec, cfg, w, fields[0])
    heads, kv_heads, head_dim = sizes
    eps = float(config_value(cfg, spec.names.eps))
    positions, order, temperature = None, None, 1.0
    if spec.rope:
        scaling = rope_scaling_of(cfg, spec.family, spec.partial_rotary)
        if rotary is not None:
            check_rotary(rotary, scaling)
        positions, temperature = rope_positions(scaling), scaling.attention_scaling ** 2
        if scaling.rotary_dim != head_dim:  # a on the rotated features only, not a^2 on the whole score
            order = (partial_rotary_order(head_dim, scaling.rotary_dim),
                     partial_rotary_gains(head_dim, scaling.rotary_dim, scaling.attention_scaling))
            temperature = 1.0
    windows = (layer_windows(cfg, len(fields), per_layer=spec.windows is True) if spec.windows
               else [None] * len(fields))
    built, blocks, widths = {}, [], []
    for layer, key in enumerate(fields):
        frozen = tuple(sorted(key.items()))
        if frozen not in built:
            built[frozen], width = _block(spec, w, spec.layer.format(**key), layer, cfg, sizes, order, activation, eps,
                                   positions, temperature, windows[layer])
            widths.append(width)
        blocks.append(built[frozen])
    final = _norm(spec, w, spec.final, eps)
    d_ff = widths[0]
    network = EulerNetwork if spec.parallel and config_value(cfg, spec.parallel, False) else ContinuousTransformer
    network = network(blocks, final_normalization=final, head_features=Midpoint(head_dim), hidden=Midpoint(d_ff),
                      features=Midpoint(d))
    watch(network, spec.hf_class, w.shared.values())  # a solve refuses the model once they change
    return network


def _block(spec, w, p, layer, cfg, sizes, order, activation, eps, positions, temperature, window):
    heads, kv_heads, head_dim = sizes
    (w_q, w_k, w_v, w_o), (b_q, b_k, b_v, b_o) = _projections(spec, w, p, sizes, order)
    beta = spec.beta(cfg, layer, head_dim) if spec.beta is not None else math.sqrt(head_dim)
    if temperature != 1.0:
        beta = beta * temperature
    attention = grouped_attention_from_weights(
        w_q, w_k, w_v, w_o, b_q, b_k, b_v, b_o, heads=heads, kv_heads=kv_heads, head_dim=head_dim, beta=beta,
        mask="causal" if spec.causal else None, positions=positions, window=window,
        softcap=config_value(cfg, spec.softcap, None) if spec.softcap else None)
    feedforward, width = _feedforward(spec, w, p, activation)
    post1, post2 = _norm(spec, w, spec.post1 and p + spec.post1, eps), _norm(spec, w, spec.post2 and p + spec.post2, eps)
    if post1 is not None:
        attention = OutputNormalized(attention, post1)
    if post2 is not None:
        feedforward = OutputNormalized(feedforward, post2)
    norm1, norm2 = _norm(spec, w, p + spec.norm1, eps), _norm(spec, w, p + spec.norm2, eps)
    return Block(attention, feedforward, norm1, norm2, placement=spec.placement), width

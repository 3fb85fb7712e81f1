r"""Bridges as data: one :class:`ArchitectureSpec` per HuggingFace class, and the registry.

A spec says where a network keeps its weights and what its layers compute; the one generic
converter (:func:`ctformer.bridges.convert.convert`) walks it. Weight names are templates
relative to the model's ``state_dict()``: ``{i}`` (or the fields of :attr:`ArchitectureSpec.layer_keys`)
is the layer, and ``.weight`` / ``.bias`` are appended. A block of layer :math:`l` is

.. math::

    u \leftarrow u + P_1\big(\mathrm{Attn}(N_1 u)\big), \qquad
    u \leftarrow u + P_2\big(F(N_2 u)\big) \qquad (\text{placement} = \text{pre}),

with :math:`N_1, N_2` the normalizations ``norm1``, ``norm2`` and :math:`P_1, P_2` the optional
output normalizations ``post1``, ``post2`` (Gemma 2; the identity otherwise); post-norm
blocks project after each sub-step instead. The registry (:data:`ARCHITECTURES`, filled by
:func:`register`) is what :func:`ctformer.bridges.from_hf` dispatches on,
:func:`supported` lists and the refusal message names.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

__all__ = ["HF_ACTIVATIONS", "ConfigNames", "ENCODER_NAMES", "Refusal", "ArchitectureSpec", "ARCHITECTURES",
           "register", "supported", "spec_for", "config_value", "hf_relative_positions", "relative_refusal"]

#: HuggingFace ``hidden_act`` / ``activation_function`` -> the continuous model's activation: the
#: erf GELU :math:`z \Phi(z)` (``gelu``, ``gelu_python``), its tanh form (``gelu_new``,
#: ``gelu_pytorch_tanh``, ``gelu_python_tanh``, ``gelu_accurate``: the same constant
#: :math:`\sqrt{2/\pi}`), ReLU and SiLU. ``gelu_fast`` (the constant rounded to 0.7978845608),
#: ``quick_gelu`` and the others compute other functions and are refused.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_python": "gelu", "relu": "relu", "gelu_new": "gelu_tanh",
                  "gelu_pytorch_tanh": "gelu_tanh", "gelu_python_tanh": "gelu_tanh", "gelu_accurate": "gelu_tanh",
                  "silu": "silu", "swish": "silu"}

#: The normalization kinds: LayerNorm (gain and shift), RMSNorm with gain w, RMSNorm with gain 1 + w.
NORM_KINDS = ("layer", "rms", "rms_offset")
#: How a fused query-key-value weight is split: [Q; K; V] rows, or per head [q_h; k_h; v_h].
QKV_LAYOUTS = ("stacked", "per_head")


def config_value(cfg, name: str, default=None):
    """``cfg.name`` of a configuration object, or ``cfg[name]`` of a mapping (``default`` if absent)."""
    if isinstance(cfg, dict):
        value = cfg.get(name, default)
    else:
        value = getattr(cfg, name, default)
    return default if value is None else value


@dataclass(frozen=True)
class ConfigNames:
    """The configuration attributes holding the sizes and options a converter reads.

    ``kv_heads`` is ``heads``' name where the class has no grouped-query attention, and
    ``head_dim`` is None where the class sizes its heads :math:`d_h = d / H` whatever the
    configuration says (BERT, ALBERT, GPT-2): a ``head_dim`` or ``num_key_value_heads`` key such
    a configuration carries is then ignored, as HuggingFace ignores it. ``activation`` is the
    keys of the activation's name, the first one set being read, or a callable
    ``cfg -> (key, name)`` where the installed HuggingFace code decides (Gemma).
    """

    hidden: str = "hidden_size"
    heads: str = "num_attention_heads"
    kv_heads: str = "num_key_value_heads"
    head_dim: str | None = "head_dim"
    intermediate: str = "intermediate_size"
    eps: str = "layer_norm_eps"
    activation: tuple | Callable = ("hidden_act",)
    layers: str = "num_hidden_layers"


#: BERT and ALBERT: heads of d / H features, no key/value head count (their attention reads neither).
ENCODER_NAMES = ConfigNames(kv_heads="num_attention_heads", head_dim=None)


@dataclass(frozen=True)
class Refusal:
    """A configuration option that is not modelled: refused when ``refused(value)`` is true.

    The message is ``"{HF class}: {key}={value!r} is not modelled ({why}); supported:
    {supported}"``: ``supported`` says which values of the option the continuous model
    implements (the message names the remedy, not only the fault).
    """

    key: str
    refused: Callable
    why: str
    supported: str = ""


def truthy(value) -> bool:
    """Refusal predicate: the option is set (``True``, a number, a non-empty value)."""
    return bool(value)


@lru_cache(maxsize=None)
def hf_relative_positions(module: str) -> bool:
    r"""Whether the installed HuggingFace ``module`` computes relative position scores.

    Shaw-style relative positions (``position_embedding_type="relative_key"`` or
    ``"relative_key_query"``) add :math:`q_i \cdot e_{i - j}` (and :math:`k_j \cdot e_{i - j}`)
    to the score of query :math:`i` and key :math:`j`, with a table :math:`e` held by the
    attention as ``distance_embedding``. transformers 5 removed them from BERT-like models:
    their layers then ignore the option and add nothing. The installed code decides, so the
    test is whether some class of ``module`` creates a ``distance_embedding`` in its
    ``__init__`` (an attribute name the compiled code lists), not a version number.

    Parameters
    ----------
    module : str
        The dotted name, e.g. ``"transformers.models.bert.modeling_bert"``.

    Returns
    -------
    bool
        False also when the module cannot be imported (no transformers: nothing to follow).
    """
    try:
        found = importlib.import_module(module)
    except ImportError:
        return False
    for cls in vars(found).values():
        init = getattr(cls, "__dict__", {}).get("__init__") if isinstance(cls, type) else None
        if "distance_embedding" in getattr(getattr(init, "__code__", None), "co_names", ()):
            return True
    return False


def relative_refusal(module: str) -> Refusal:
    """The refusal of ``position_embedding_type`` other than ``"absolute"`` where the installed
    ``module`` computes relative positions (:func:`hf_relative_positions`); where it ignores
    the option, so does the converted model (HuggingFace's answer, absolute positions)."""
    return Refusal("position_embedding_type",
                   lambda v: v not in (None, "absolute") and hf_relative_positions(module),
                   "the installed transformers adds relative position scores to the attention, "
                   "which the continuous model does not; only 'absolute' (embeddings outside the "
                   "encoder) is supported")


@dataclass(frozen=True)
class ArchitectureSpec:
    r"""What the generic converter needs to know about one HuggingFace class.

    Attributes
    ----------
    hf_class : str
        The HuggingFace class converted (``"LlamaModel"``), the registry key.
    family : str
        The short name of its family (``"llama"``): the ``ctformer limit --model`` choice
        when :attr:`small` is set.
    layer : str
        Prefix of layer ``{i}`` in the state dict (``"layers.{i}."``).
    prefix : str
        Prefix of the state-dict names that is dropped first (``"encoder."`` for ``BertModel``,
        ``"transformer."`` for a head model around GPT-2); messages name weights without it.
    query, key, value, output : str or None
        Templates of the four projections, relative to :attr:`layer`, without ``.weight``.
    qkv : str or None
        A fused query-key-value projection instead (GPT-2, Phi-3, GPT-NeoX), split by
        :attr:`qkv_layout`: ``"stacked"`` (rows :math:`[Q; K; V]`, sizes :math:`H d_h,
        H_{kv} d_h, H_{kv} d_h`) or ``"per_head"`` (rows of head :math:`h` hold
        :math:`q_h, k_h, v_h`).
    transposed : bool
        Weights are stored ``(in, out)`` (GPT-2's ``Conv1D``) instead of ``nn.Linear``'s ``(out, in)``.
    up, down, gate : str or None
        The feed-forward: ``down(act(up u))``, or with a ``gate`` ``down(act(gate u) * up u)``.
    gate_up : str or None
        A fused gate-up projection (Phi-3): rows :math:`[W_{gate}; W_{up}]`.
    norm_kind : {"layer", "rms", "rms_offset"}
        LayerNorm, RMSNorm with gain :math:`w`, or RMSNorm with gain :math:`1 + w` (Gemma).
    norm1, norm2, final, post1, post2 : str or None
        Templates of the normalizations (without ``.weight``/``.bias``); ``final`` is applied
        once at :math:`t = T`, ``post1``/``post2`` to the sub-flows' outputs (Gemma 2).
    placement : {"pre", "post"}
    causal, rope : bool
        Causal mask; rotary positions (frequencies from the configuration in float64,
        :func:`~ctformer.bridges.rope_scaling.rope_from_config`).
    partial_rotary : bool
        Whether a ``partial_rotary_factor`` below 1 is honoured (HuggingFace rotates the first
        :math:`\rho d_h` head features); otherwise it is refused.
    parallel : str or None
        The configuration flag of the parallel residual (GPT-NeoX ``use_parallel_residual``):
        the layer is one explicit Euler step on both sub-flows.
    windows : bool or "uniform"
        ``True``: ``sliding_window`` on the layers ``layer_types`` marks ``sliding_attention``
        (every layer when there is no ``layer_types``; Qwen2, Gemma 2); ``"uniform"``:
        ``sliding_window`` on every layer, ``layer_types`` unread, as HuggingFace's Mistral and
        Phi-3 do; ``False``: neither is read (HuggingFace's Llama ignores a ``sliding_window``).
    softcap : str or None
        The configuration field of the attention score's soft cap :math:`c` (Gemma 2's
        ``attn_logit_softcapping``): the kernel :math:`e^{c \tanh(s/c)}`; None or a value of
        None in the configuration: no cap.
    beta : callable or None
        ``(cfg, layer, head_dim) -> beta``: the temperature :math:`\beta_h = c\, d_h` of a score
        :math:`c\, q \cdot k` (default :math:`\sqrt{d_h}`, the scale :math:`d_h^{-1/2}`), before
        the RoPE temperature :math:`a^2`.
    layer_keys : callable or None
        ``(cfg, indices) -> list of dict``: the template fields of each block, in depth order
        (equal fields share one block: ALBERT); default ``[{"i": i}]`` for the layers found.
    names : ConfigNames
        Where the configuration keeps sizes and options.
    refusals : tuple of Refusal
        Options that are not modelled.
    small : callable or None
        ``transformers -> model``: a small random network for the discrete-limit report.
    """

    hf_class: str
    family: str
    layer: str
    prefix: str = ""
    query: str | None = None
    key: str | None = None
    value: str | None = None
    output: str = ""
    qkv: str | None = None
    qkv_layout: str = "stacked"
    transposed: bool = False
    up: str = ""
    down: str = ""
    gate: str | None = None
    gate_up: str | None = None
    norm_kind: str = "layer"
    norm1: str | None = None
    norm2: str | None = None
    final: str | None = None
    post1: str | None = None
    post2: str | None = None
    placement: str = "pre"
    causal: bool = False
    rope: bool = False
    partial_rotary: bool = False
    parallel: str | None = None
    windows: bool | str = False
    softcap: str | None = None
    beta: Callable | None = None
    layer_keys: Callable | None = None
    names: ConfigNames = field(default_factory=ConfigNames)
    refusals: tuple = ()
    small: Callable | None = None

    def __post_init__(self):
        if self.norm_kind not in NORM_KINDS:
            raise ValueError(f"norm_kind must be one of {NORM_KINDS}, got {self.norm_kind!r}")
        if self.qkv_layout not in QKV_LAYOUTS:
            raise ValueError(f"qkv_layout must be one of {QKV_LAYOUTS}, got {self.qkv_layout!r}")
        if self.placement not in ("pre", "post"):
            raise ValueError(f"placement must be 'pre' or 'post', got {self.placement!r}")
        if self.windows not in (False, True, "uniform"):
            raise ValueError(f"windows must be False, True or 'uniform', got {self.windows!r}")
        if (self.qkv is None) == (self.query is None):
            raise ValueError(f"{self.hf_class}: give either qkv or query/key/value templates")


#: HuggingFace class name -> its spec, in registration order (the order of the messages).
ARCHITECTURES: dict[str, ArchitectureSpec] = {}


def register(spec: ArchitectureSpec) -> ArchitectureSpec:
    """Add ``spec`` to :data:`ARCHITECTURES` under its ``hf_class`` (replacing an older one)."""
    if not isinstance(spec, ArchitectureSpec):
        raise TypeError(f"register takes an ArchitectureSpec, got {type(spec).__name__}")
    ARCHITECTURES[spec.hf_class] = spec
    return spec


def supported() -> tuple:
    """The HuggingFace class names :func:`ctformer.bridges.from_hf` converts, in registry order."""
    return tuple(ARCHITECTURES)


def spec_for(model):
    """The spec of ``model``'s class or of its nearest HuggingFace base class, or ``None``."""
    for cls in type(model).__mro__:
        spec = ARCHITECTURES.get(cls.__name__)
        if spec is not None and cls.__module__.startswith("transformers."):
            return spec
    return None

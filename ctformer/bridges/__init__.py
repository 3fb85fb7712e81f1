"""Bridges from discrete networks to continuous Transformers (design notes, sections 2 and 10).

- :func:`from_torch`: ``torch.nn.TransformerEncoderLayer`` / ``torch.nn.TransformerEncoder``;
- :func:`from_hf`: a HuggingFace model in memory, dispatched on its class (``BertModel``,
  ``GPT2Model``, ``LlamaModel``, ``MistralModel``, ``Qwen2Model``, ``AlbertModel``,
  ``ViTModel``, ``Phi3Model``, ``GPTNeoXModel``, ``GemmaModel``, ``Gemma2Model``, ``DeiTModel``);
- :func:`supported`: the HuggingFace class names :func:`from_hf` converts, one
  :class:`~ctformer.bridges.spec.ArchitectureSpec` each (:mod:`ctformer.bridges.spec`; the
  generic converter is :mod:`ctformer.bridges.convert`);
- :func:`from_hf_bert`: HuggingFace ``BertModel`` / ``BertEncoder`` or a ``.safetensors`` file;
- :func:`from_gpt2`, :func:`from_llama`, :func:`from_albert`, :func:`from_hf_vit`: the
  class-specific converters (:func:`patch_position_table` evaluates a ViT's learned position
  table on another patch grid);
- :func:`rope_frequencies`: the RoPE frequencies of a Llama-family configuration, in float64;
- :func:`rope_from_config`, :func:`scaled_frequencies`: every HuggingFace RoPE scaling
  (:data:`SUPPORTED_ROPE_TYPES`: linear, dynamic, yarn, llama3, longrope) as float64
  frequencies and an attention temperature (:mod:`ctformer.bridges.rope_scaling`);
- :mod:`ctformer.bridges.minilm`: the packaged all-MiniLM-L6-v2 and ``discrete_limit_report``;
- :func:`limit_report`: the discrete limit and continuous-depth refinement of a small random
  network of each class (``ctformer limit --model``);
- :class:`StaleConversionError`: raised by a solve of a model converted from a float64
  module whose tensors were changed in place since (:mod:`ctformer.shared_tensors`).

torch and transformers are imported only when a bridge is called.
"""
from . import hf  # noqa: F401, I001  (registers the architectures in the order of the messages)
from .albert import from_albert
from .gpt2 import from_gpt2
from .hf import from_hf, limit_report
from .huggingface import from_hf_bert
from .llama import float64_reference, from_llama, rope_frequencies
from .rope_scaling import SUPPORTED_ROPE_TYPES, rope_from_config, scaled_frequencies
from .spec import HF_ACTIVATIONS, ArchitectureSpec, register, supported
from .torch import from_torch
from .vit import from_hf_vit, patch_position_table
from ..shared_tensors import StaleConversionError

__all__ = ["from_torch", "from_hf", "from_hf_bert", "from_gpt2", "from_llama", "from_albert",
           "from_hf_vit", "patch_position_table", "float64_reference", "rope_frequencies", "limit_report",
           "rope_from_config", "scaled_frequencies", "SUPPORTED_ROPE_TYPES", "supported", "register",
           "ArchitectureSpec", "HF_ACTIVATIONS", "StaleConversionError"]

"""Bridges from discrete networks to continuous Transformers (design notes, section 2).

- :func:`from_torch`: ``torch.nn.TransformerEncoderLayer`` / ``torch.nn.TransformerEncoder``;
- :func:`from_hf_bert`: HuggingFace ``BertModel`` / ``BertEncoder`` or a ``.safetensors`` file;
- :mod:`ctformer.bridges.minilm`: the packaged all-MiniLM-L6-v2 and ``discrete_limit_report``.

torch and transformers are imported only when a bridge is called.
"""
from .huggingface import from_hf_bert
from .torch import from_torch

__all__ = ["from_torch", "from_hf_bert"]

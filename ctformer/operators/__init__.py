"""Operators of the continuous Transformer: attention, feature maps, normalizations."""
from .quadrature_attention import quadrature_attention

__all__ = ["quadrature_attention"]

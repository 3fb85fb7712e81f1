"""Operators of the continuous Transformer: attention, feature maps, normalizations.

Every operator acts on values at quadrature points, arrays shaped
``(..., Nq_tokens, Nq_features)`` on a :class:`Grids`, and is discretized once per grids.
"""
from .quadrature_attention import quadrature_attention
from .base import Grids, Normalization, Operator, check_state  # noqa: F401  (check_state stays importable)
from .functions import FeatureFunction, as_feature_function
from .attention import Attention
from .feature import (ACTIVATIONS, FeatureMap, FeedForward, GatedFeedForward, gelu, gelu_tanh,
                      get_activation, relu, silu)
from .normalization import LayerNormProjection, RMSNorm, SphereProjection
from .positions import (ALiBi, AxialRoPE, LengthFrequencies, NoPositions, PositionEncoding, RoPE, alibi_slopes,
                        interpolate_table, sinusoidal_encoding)
from .masks import Causal, Intersection, Mask, Padding, SlidingWindow
from .local_attention import local_attention, mask_pattern, window_pattern

__all__ = [
    "quadrature_attention",
    "Grids",
    "Operator",
    "Normalization",
    "FeatureFunction",
    "as_feature_function",
    "Attention",
    "FeatureMap",
    "FeedForward",
    "GatedFeedForward",
    "ACTIVATIONS",
    "get_activation",
    "relu",
    "gelu",
    "gelu_tanh",
    "silu",
    "LayerNormProjection",
    "SphereProjection",
    "RMSNorm",
    "PositionEncoding",
    "NoPositions",
    "RoPE",
    "AxialRoPE",
    "LengthFrequencies",
    "ALiBi",
    "Mask",
    "Causal",
    "SlidingWindow",
    "Padding",
    "Intersection",
    "alibi_slopes",
    "sinusoidal_encoding",
    "interpolate_table",
    "local_attention",
    "window_pattern",
    "mask_pattern",
]

r"""DeiT (``DeiTModel``): a ViT encoder with a class and a distillation token.

The layers are ViT's (pre-norm, LayerNorm, GELU, final ``layernorm``;
:mod:`ctformer.bridges.vit`). The embedding output is the class token, the distillation token
and the patches in raster order: in the continuum two atoms of the token measure on the patch
square, ``WithAtoms(Product(Midpoint(g), Midpoint(g)), count=2)`` (every token weighs
:math:`1/(g^2 + 2)`), and ``run`` on the :math:`g^2 + 2` tokens computes exactly that.
"""
from __future__ import annotations

from dataclasses import replace

from .spec import register
from .vit import VIT

__all__ = ["DEIT"]

#: DeiT: ViT's layers; the distillation token is part of the embedding.
DEIT = register(replace(VIT, hf_class="DeiTModel", family="deit"))

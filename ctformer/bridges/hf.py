r"""HuggingFace networks as continuous Transformers: one entry point, and the discrete-limit report.

:func:`from_hf` dispatches on the class of a model in memory:

================================================  =============================================
HuggingFace class                                 continuous model
================================================  =============================================
``BertModel`` (``BertEncoder``)                   post-norm, :func:`~ctformer.bridges.from_hf_bert`
``GPT2Model``                                     pre-norm, causal, :mod:`~ctformer.bridges.gpt2`
``LlamaModel``, ``MistralModel``, ``Qwen2Model``  pre-norm, RMSNorm, RoPE, GQA, SwiGLU, sliding
                                                  windows, :mod:`~ctformer.bridges.llama`
``AlbertModel``                                   post-norm, shared layers, :mod:`~ctformer.bridges.albert`
``ViTModel``, ``DeiTModel``                       pre-norm, patches on the square and one or two
                                                  atoms, :mod:`~ctformer.bridges.vit`
``Phi3Model``                                     fused qkv and gate-up, :mod:`~ctformer.bridges.phi3`
``GPTNeoXModel``                                  partial rotary, parallel residual (Euler),
                                                  :mod:`~ctformer.bridges.gpt_neox`
``GemmaModel``, ``Gemma2Model``                   RMSNorm 1 + w, GeGLU, output norms, alternating
                                                  sliding layers, :mod:`~ctformer.bridges.gemma`
================================================  =============================================

Each result's :meth:`~ctformer.model.ContinuousTransformer.run` takes the embedding output
(``hidden_states[0]``) and an optional padding mask and returns ``last_hidden_state``: with
midpoint grids, Lie splitting and one step per layer it is the network (design notes,
sections 2 and 10).

Every class is an :class:`~ctformer.bridges.spec.ArchitectureSpec` in the registry
(:data:`~ctformer.bridges.spec.ARCHITECTURES`, :func:`~ctformer.bridges.spec.supported`): a
new architecture is one spec module that calls :func:`~ctformer.bridges.spec.register`.
:data:`BRIDGES` groups the registered classes by family for :func:`limit_report` and
``ctformer limit --model`` (the families with a small random network).

:func:`limit_report` is the demonstration behind ``ctformer limit --model``: it builds a
small random network of a class, measures the per-layer discrete-limit error against the
float64 HuggingFace model, and, where the network has a consistent continuous-depth limit
(pre-norm), refines depth with the ``lie`` and ``strang`` schemes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..validation import boolean, integer, one_of
# registration order = the order of supported() and of the messages
from . import huggingface  # noqa: F401, I001
from . import gpt2, llama  # noqa: F401
from . import albert, vit  # noqa: F401
from . import phi3, gpt_neox, gemma, deit  # noqa: F401
from .common import optional_import
from .composite import EulerNetwork
from .convert import convert
from .spec import ARCHITECTURES, spec_for, supported

__all__ = ["Bridge", "BRIDGES", "SUPPORTED", "from_hf", "small_models", "small_model", "limit_report"]


@dataclass(frozen=True)
class Bridge:
    """A family of registered HuggingFace classes, as ``ctformer limit --model`` offers it.

    Attributes
    ----------
    classes : tuple of str
        The HuggingFace class names of the family.
    convert : callable
        ``model -> ContinuousTransformer`` (:func:`from_hf`).
    small : callable, optional
        ``transformers -> model``: a small network of the family with the library's random
        initialization (:func:`small_model` draws the weights again); ``None`` where the
        discrete-limit report has no random network of the family.
    """

    classes: tuple
    convert: Callable
    small: Callable | None = None

    def resolved(self, transformers) -> tuple:
        """The classes of the family that the installed ``transformers`` has."""
        found = (getattr(transformers, name, None) for name in self.classes)
        return tuple(c for c in found if c is not None)


def _families() -> dict:
    families: dict = {}
    for spec in ARCHITECTURES.values():
        old = families.get(spec.family)
        classes = (old.classes if old else ()) + (spec.hf_class,)
        small = old.small if old and old.small is not None else spec.small
        families[spec.family] = Bridge(classes, from_hf, small)
    return families


def from_hf(model):
    """The continuous Transformer whose discrete limit is a HuggingFace model in memory.

    Parameters
    ----------
    model : transformers model
        An instance of a registered class (:func:`~ctformer.bridges.supported`), or of a
        subclass of one, with float16, bfloat16, float32 or float64 weights. The converted
        model holds each weight once in float64: a float64 model's tensors are shared
        (read-only views of their memory; once one is changed in place, through ``p.data``
        too where the write reaches one of up to 64 sampled entries, a solve of the converted
        model raises :class:`~ctformer.shared_tensors.StaleConversionError`: convert again
        after training),
        other dtypes are converted exactly (every half-precision number is a float64), so a
        bfloat16 model converts to the network of its bfloat16 weights computed in float64;
        RoPE frequencies come from the configuration in float64.

    Returns
    -------
    ContinuousTransformer

    Raises
    ------
    TypeError
        For any other class (the message lists the supported ones), or a weight of another
        dtype (integer, quantized; the message names it).
    ValueError
        For a configuration option that the continuous model does not implement (named in
        the message with the reason).
    """
    optional_import("transformers", "from_hf")
    spec = spec_for(model)
    if spec is None:
        raise TypeError(f"from_hf does not support {type(model).__module__}.{type(model).__qualname__}; "
                        f"supported HuggingFace classes: {', '.join(supported())} (base models, "
                        "not task heads: pass e.g. model.model, model.transformer, model.vit or "
                        "model.deit)")
    if spec.hf_class in ("BertModel", "BertEncoder"):
        return huggingface.from_hf_bert(model)  # also checks the BERT config keys
    return convert(spec, model)


#: The families of registered classes by name: what :func:`limit_report` and ``ctformer limit
#: --model`` offer (those with a small network), built from the registry.
BRIDGES: dict[str, Bridge] = _families()

#: Supported HuggingFace class names at import, in the order of the messages (:func:`supported` is live).
SUPPORTED = supported()


# -- small random networks and the report --------------------------------------------------

def small_models() -> tuple:
    """Names of the bridges with a small random network: the choices of :func:`small_model`."""
    return tuple(name for name, bridge in BRIDGES.items() if bridge.small is not None)


def small_model(kind: str, seed: int = 0):
    """A small float64 HuggingFace network of class ``kind`` with O(1) random weights.

    Parameters
    ----------
    kind : str
        One of :func:`small_models` (``"bert"``, ``"gpt2"``, ``"llama"``, ``"albert"``, ``"phi3"``,
        ``"gpt_neox"``, ``"gemma"``, ``"gemma2"``).
    seed : int
        A non-negative integer.

    Returns
    -------
    transformers model
        In evaluation mode, float64 (the RoPE networks through
        :func:`ctformer.bridges.llama.float64_reference`); weights :math:`\\sim N(0, 1/\\text{fan-in})`,
        LayerNorm/RMSNorm gains :math:`1 + N(0, 0.1^2)`.
    """
    import torch
    import transformers
    from transformers.pytorch_utils import Conv1D

    one_of(kind, "model", small_models())
    torch.manual_seed(integer(seed, "seed", minimum=0))
    model = BRIDGES[kind].small(transformers).double().eval()
    conv1d = {f"{name}.weight" for name, module in model.named_modules()
              if isinstance(module, Conv1D)}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embeddings" in name or "wte" in name or "wpe" in name or "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            elif p.ndim == 2:
                fan_in = p.shape[0] if name in conv1d else p.shape[1]  # Conv1D (GPT-2) is (in, out)
                p.normal_(0.0, 1.0 / math.sqrt(fan_in))
            elif "norm" in name.lower() and name.endswith("weight") or name.startswith("ln_") \
                    or ".ln_" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p)) if name.endswith("weight") else p.normal_(0.0, 0.1)
            else:
                p.normal_(0.0, 0.1)
    return model


def _hf_states(model, kind, seed, batch=2, tokens=9):
    """Embedding output, padding mask and hidden states of ``model`` on random right-padded ids."""
    import torch

    g = torch.Generator().manual_seed(int(seed) + 1)
    ids = torch.randint(1, model.config.vocab_size, (batch, tokens), generator=g)
    mask = torch.ones(batch, tokens, dtype=torch.long)
    mask[1:, tokens - 3:] = 0  # right padding in the second sequence
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    hidden = [h.numpy() for h in out.hidden_states]
    return hidden[0], mask.numpy().astype(bool), hidden


def _relative(ours, ref, keep):
    diff = np.abs(ours - ref)[keep]
    return float(diff.max() / np.abs(ref[keep]).max())


def limit_report(model: str = "bert", pretrained: bool = False, seed: int = 0) -> str:
    """The discrete limit of a HuggingFace network class, and its continuous-depth refinement.

    Parameters
    ----------
    model : str
        The network class, one of :func:`small_models` (``"bert"``, ``"gpt2"``, ``"llama"``,
        ``"albert"``, ``"phi3"``, ``"gpt_neox"``, ``"gemma"``, ``"gemma2"``). A small random float64
        network is built (:func:`small_model`); ``"bert"`` with ``pretrained=True`` is the packaged
        all-MiniLM-L6-v2 on real sentences (:func:`ctformer.bridges.minilm.discrete_limit_report`).
    pretrained : bool
        Only for ``"bert"``.
    seed : int
        Seed of the random weights and token ids.

    Returns
    -------
    str
        The sizes, the max relative error after each layer (real tokens of a right-padded
        batch of two sequences), and for pre-norm networks the error of ``lie`` and
        ``strang`` with 1, 2, 4, 8 steps per layer against ``strang`` with 64 steps, with the
        observed orders. Post-norm networks (BERT, ALBERT) have per-feature affine
        LayerNorms and no consistent depth limit; the report says so.

    Raises
    ------
    ValueError
        For an unknown ``model``, ``pretrained=True`` with a model other than ``"bert"``, or a
        negative ``seed``.
    TypeError
        For a ``pretrained`` that is not a bool, or a ``seed`` that is not an integer.
    """
    one_of(model, "model", small_models())
    if boolean(pretrained, "pretrained"):
        if model != "bert":
            raise ValueError(f"pretrained=True is available for model='bert' (MiniLM) only, got {model!r}")
        from .minilm import discrete_limit_report

        return discrete_limit_report()
    from ..discretizations import Midpoint
    from ..studies import fit_order

    hf = small_model(model, seed)
    ct = from_hf(hf)
    x, keep, hidden = _hf_states(hf, model, seed)
    grids = dict(tokens=Midpoint(x.shape[1]), features=Midpoint(x.shape[2]), context_length=x.shape[1])
    native = "euler" if isinstance(ct, EulerNetwork) else "lie"  # parallel residual: one Euler step
    states = ct.solve(x, scheme=native, steps_per_layer=1, trajectory=True, padding_mask=keep, **grids)
    layer_states = states[1:]
    references = hidden[1:]
    if len(references) != len(layer_states):  # several blocks per recorded layer: compare the end
        layer_states, references = layer_states[-1:], references[-1:]
    errors = [_relative(s, h, keep) for s, h in zip(layer_states, references)]
    cls = type(hf).__name__
    placement = ct.blocks[0].placement
    lines = [
        f"{cls} (HuggingFace, float64, random weights, seed {seed}) vs ctformer discrete limit",
        f"  {x.shape[0]} sequences, {int(keep.sum())} real tokens (padded to N = {x.shape[1]}), "
        f"d = {x.shape[2]}, {ct.layers} {placement}-norm layers",
        f"  grids: midpoint tokens/features, {'explicit Euler' if native == 'euler' else 'Lie splitting'}, "
        "1 Euler step per layer",
    ]
    lines += [f"  layer {i + 1}: max relative error {e:.2e}" for i, e in enumerate(errors)]
    lines.append(f"max relative error: {max(errors):.2e}")
    if ct.warns_inconsistent_depth:
        lines.append("continuous depth: post-norm with per-feature affine LayerNorm has no consistent "
                     "depth limit (refinement skipped)")
        return "\n".join(lines)
    reference = ct.solve(x, scheme="strang", steps_per_layer=64, padding_mask=keep, **grids)
    steps = (1, 2, 4, 8)
    lines.append("continuous depth: error vs strang with 64 steps per layer (real tokens)")
    for scheme in ("lie", "strang"):
        errs = [_relative(ct.solve(x, scheme=scheme, steps_per_layer=k, padding_mask=keep, **grids),
                          reference, keep) for k in steps]
        lines.append(f"  {scheme:>6}: " + "  ".join(f"k={k}: {e:.2e}" for k, e in zip(steps, errs)))
        lines.append(_order_line(scheme, ct, [1.0 / k for k in steps], errs))
    return "\n".join(lines)


def _order_line(scheme: str, ct, h, errors) -> str:
    """The fitted order beside the scheme's order on this network and the neighbour orders,
    with a note where the fit misses by more than 0.3 (the studies' rule)."""
    from ..discretizations.report import neighbour_orders
    from ..solvers import get
    from ..studies import fit_order

    expected = get(scheme).order(ct)
    order = fit_order(h, errors)
    neighbours = [o for o in neighbour_orders(h, errors) if o is not None]
    line = (f"          observed order {order:.2f} (expected {expected:g}; neighbour orders "
            + ", ".join(f"{o:.2f}" for o in neighbours) + ")")
    if abs(order - expected) > 0.3 and len(neighbours) >= 2 and \
            abs(neighbours[-1] - expected) < abs(neighbours[0] - expected):
        line += f": they move towards {expected:g}, the coarse steps are pre-asymptotic"
    elif abs(order - expected) > 0.3:
        line += ": off the expected order; the network's depth limit may be rough"
    return line

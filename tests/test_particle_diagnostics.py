"""Clustering diagnostics against direct formulas, scipy and the hemisphere theorem."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize
from scipy.special import softmax
from scipy.stats import entropy

from ctformer.particles import (
    SelfAttentionDynamics,
    attention_matrix,
    attention_rank,
    cluster_count,
    energy,
    gram,
    in_open_hemisphere,
    inner_product_histogram,
    row_entropy,
    single_cluster_distance,
)


def sphere_points(rng, *shape):
    x = rng.standard_normal(shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_gram_and_histogram(rng):
    x = sphere_points(rng, 11, 4)
    g = gram(x)
    for i in range(11):
        for j in range(11):
            assert g[i, j] == pytest.approx(float(np.dot(x[i], x[j])), abs=1e-15)
    pairs = [float(np.dot(x[i], x[j])) for i in range(11) for j in range(i + 1, 11)]
    counts, edges = inner_product_histogram(x, 8)
    ref_counts, ref_edges = np.histogram(pairs, bins=8, range=(-1, 1))
    np.testing.assert_array_equal(counts, ref_counts)
    np.testing.assert_allclose(edges, ref_edges)
    assert counts.sum() == 11 * 10 // 2
    dens, _ = inner_product_histogram(np.stack([x, x]), 8, density=True)  # a batch pools pairs
    assert np.sum(dens * np.diff(edges)) == pytest.approx(1.0, rel=1e-14)


def test_cluster_count_on_constructed_clusters(rng):
    centers = sphere_points(rng, 4, 5)
    assert np.min(np.linalg.norm(centers[:, None] - centers[None], axis=-1) + 10 * np.eye(4)) > 0.3
    points = np.repeat(centers, 6, axis=0) + 1e-4 * rng.standard_normal((24, 5))
    points /= np.linalg.norm(points, axis=1, keepdims=True)
    assert cluster_count(points, 0.01) == 4
    assert cluster_count(points, 0.0) == 24
    assert cluster_count(points, 2.0) == 1
    assert cluster_count(points[:6], 0.01) == 1
    np.testing.assert_array_equal(cluster_count(np.stack([points, np.tile(points[:1], (24, 1))]), 0.01), [4, 1])
    with pytest.raises(ValueError, match="tol"):
        cluster_count(points, -1.0)


def test_energy_direct_formula_and_single_cluster(rng):
    beta = 2.5
    x = sphere_points(rng, 7, 3)
    w = rng.random(7) + 0.1
    direct = sum(w[i] * w[j] * math.exp(beta * float(np.dot(x[i], x[j])))
                 for i in range(7) for j in range(7)) / (2 * beta)
    assert energy(x, beta, w) == pytest.approx(direct, rel=1e-14)
    assert energy(x, beta, w, log=True) == pytest.approx(math.log(direct), rel=1e-14)
    cluster = np.tile(x[:1], (7, 1))
    assert energy(cluster, beta) == pytest.approx(math.exp(beta) / (2 * beta), rel=1e-14)
    # the uniform weights' maximum e^beta / (2 beta) bounds every configuration
    assert energy(x, beta) < math.exp(beta) / (2 * beta)
    # large beta: the log form is finite and exact at a cluster, the plain form refuses
    assert energy(cluster, 1e3, log=True) == pytest.approx(1e3 - math.log(2e3), rel=1e-15)
    with pytest.raises(OverflowError, match="log=True"):
        energy(cluster, 1e3)
    with pytest.raises(ValueError, match="beta > 0"):
        energy(x, 0.0)
    with pytest.raises(ValueError, match="weights"):
        energy(x, 1.0, np.ones(3))


def test_single_cluster_distance_is_the_minimum_over_the_sphere(rng):
    x = sphere_points(rng, 9, 3)
    w = rng.random(9) + 0.1

    def objective(angles):
        a, b = angles
        z = np.array([np.sin(a) * np.cos(b), np.sin(a) * np.sin(b), np.cos(a)])
        return np.sum(w * np.sum((x - z) ** 2, axis=1)) / w.sum()

    best = min((optimize.minimize(objective, s, method="Nelder-Mead", options=dict(xatol=1e-12, fatol=1e-15))
                for s in [(0.5, 0.5), (2.0, 3.0), (1.5, -2.0)]), key=lambda r: r.fun)
    assert single_cluster_distance(x, w) == pytest.approx(math.sqrt(best.fun), rel=1e-8)
    assert single_cluster_distance(np.tile(x[:1], (5, 1))) == pytest.approx(0.0, abs=1e-7)


def test_in_open_hemisphere_matches_the_gap_criterion(rng):
    """On the circle, points lie in an open half-circle iff their largest angular gap exceeds pi."""
    for trial in range(40):
        n = int(rng.integers(2, 8))
        theta = rng.uniform(0, 2 * np.pi, n)
        gaps = np.diff(np.sort(np.concatenate([theta, [theta.min() + 2 * np.pi]])))
        expected = gaps.max() > np.pi + 1e-6
        if abs(gaps.max() - np.pi) < 1e-6:
            continue
        assert in_open_hemisphere(np.stack([np.cos(theta), np.sin(theta)], 1)) == expected
    assert not in_open_hemisphere(np.array([[1.0, 0, 0], [-1.0, 0, 0]]))  # antipodal pair
    assert in_open_hemisphere(np.abs(sphere_points(rng, 30, 4)) + [0.01, 0, 0, 0])
    assert not in_open_hemisphere(np.vstack([np.eye(3), -np.eye(3)]))


def test_hemisphere_start_collapses_to_one_cluster(rng):
    """Theorem: points in an open hemisphere converge to a single point (here d = 2, beta = 3)."""
    theta = rng.uniform(-1.4, 1.4, 12)
    x0 = np.stack([np.cos(theta), np.sin(theta)], 1)
    assert in_open_hemisphere(x0)
    final = SelfAttentionDynamics(3.0).solve(x0, 60.0, 0.1, save_every=600).final
    assert single_cluster_distance(final) < 1e-6
    assert cluster_count(final, 1e-3) == 1


def test_attention_matrix_rank_and_entropy(rng):
    beta = 2.0
    x = sphere_points(rng, 6, 3)
    Q, K = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    w = rng.random(6) + 0.1
    a = attention_matrix(x, beta, Q=Q, K=K, weights=w, mask="causal")
    scores = beta * (x @ Q.T) @ (x @ K.T).T + np.log(w)
    scores[np.triu_indices(6, 1)] = -np.inf
    np.testing.assert_allclose(a, softmax(scores, axis=1), rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(row_entropy(a), entropy(softmax(scores, axis=1), axis=1), rtol=1e-12)
    assert attention_rank(a) == np.linalg.matrix_rank(softmax(scores, axis=1))
    # beta = 0: uniform rows, entropy log n, rank 1; a single cluster: rank 1 as well
    uniform = attention_matrix(x, 0.0)
    np.testing.assert_allclose(row_entropy(uniform), math.log(6), rtol=1e-14)
    assert attention_rank(uniform) == 1
    assert attention_rank(attention_matrix(np.tile(x[:1], (6, 1)), 5.0)) == 1
    # large beta stays finite: rows become one-hot at each token itself
    sharp = attention_matrix(x, 1e4)
    np.testing.assert_allclose(sharp, np.eye(6), atol=1e-12)
    assert attention_rank(sharp) == 6
    np.testing.assert_allclose(row_entropy(sharp), 0.0, atol=1e-9)
    with pytest.raises(ValueError, match="Q must have shape"):
        attention_matrix(x, 1.0, Q=np.eye(4))

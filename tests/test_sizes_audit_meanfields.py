"""Mean fields of a huge degree or mode count are refused before anything is allocated, naming
the argument and the largest size that fits; sizes just within the budget still build and give
the closed-form numbers."""
from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest
from scipy import special

from ctformer.discretizations import SizeTooLargeError
from ctformer.particles import CircleMeanField, SphericalMeanField, ZonalMeanField
from ctformer.particles.meanfield import circle_bytes
from ctformer.particles.spherical import spherical_bytes
from ctformer.particles.zonal import zonal_bytes


def _refused_without_allocating(build):
    """The refusal, and the peak traced bytes before it (no basis matrix, no grid)."""
    tracemalloc.start()
    try:
        with pytest.raises(SizeTooLargeError) as info:
            build()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return str(info.value), peak


REFUSALS = [  # (build, size asked, what it names, largest that fits, its byte count), budget 1e6
    # zonal degree 400 built 7.7 MB of basis matrices, 10**5 ran for minutes
    (lambda n: ZonalMeanField(1.0, 3, n), 400, "ZonalMeanField's Gegenbauer basis matrices with degree",
     "degree", 142, zonal_bytes),
    (lambda n: ZonalMeanField(1.0, 3, n), 10**5, "ZonalMeanField's Gegenbauer basis matrices with degree",
     "degree", 142, zonal_bytes),
    # 10**6 circle modes built 29 MB
    (lambda n: CircleMeanField(1.0, n), 10**6, "CircleMeanField's grid and multipliers with n_modes",
     "n_modes", 34089, circle_bytes),
    # spherical degree 3000 ran for over a minute (multipliers per (l, m) pair)
    (lambda n: SphericalMeanField(1.0, n), 3000, "SphericalMeanField's grid and harmonic coefficients with degree",
     "degree", 118, spherical_bytes),
]


@pytest.mark.parametrize("build, size, what, argument, fits, nbytes", REFUSALS,
                         ids=["zonal 400", "zonal 1e5", "circle 1e6", "spherical 3000"])
def test_sizes_beyond_the_budget_are_refused_before_anything_is_built(monkeypatch, build, size, what,
                                                                       argument, fits, nbytes):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e6")
    message, peak = _refused_without_allocating(lambda: build(size))
    assert peak < 200_000
    assert message.startswith(f"{what}={size} would need")
    assert f"use {argument} <= {fits} (argument {argument})" in message
    assert nbytes(fits) <= 1e6 < nbytes(fits + 1)


def _largest_within_budget(monkeypatch, build, size: int, bytes_of, name: str):
    """``build(size)`` under a budget of exactly its bytes, after ``build(size + 1)`` is
    refused naming ``name`` and the largest size that fits."""
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(math.ceil(bytes_of(size))))
    with pytest.raises(SizeTooLargeError, match=rf"with {name}={size + 1} would need .*; use {name} <= {size}"):
        build(size + 1)
    return build(size)


def test_zonal_degree_just_within_the_budget_builds_the_closed_forms(monkeypatch):
    degree, d, beta = 40, 3, 2.0
    field = _largest_within_budget(monkeypatch, lambda g: ZonalMeanField(beta, d, g), degree, zonal_bytes, "degree")
    # the uniform density 1/|S^2| has c_0 = 1/sqrt(4 pi) and no other degree
    c = field.coefficients_of(np.full(field.grid.shape, 1 / (4 * math.pi)))
    assert c[0] == pytest.approx(1 / math.sqrt(4 * math.pi), rel=1e-14)
    assert np.abs(c[1:]).max() < 1e-13  # rounding of the Gauss sum, 1e-14 here
    # SA on S^2: sigma_l = l (l + 1) I_{l+1/2}(beta) / (beta I_{1/2}(beta))
    l = np.arange(1, 6)
    expected = l * (l + 1) * special.iv(l + 0.5, beta) / (beta * special.iv(0.5, beta))
    np.testing.assert_allclose(field.growth_rate(l), expected, rtol=1e-13)


def test_circle_n_modes_just_within_the_budget_gives_the_bessel_velocity(monkeypatch):
    n, beta, eps = 1000, 1.5, 0.5
    field = _largest_within_budget(monkeypatch, lambda m: CircleMeanField(beta, m, normalized=False), n,
                                   circle_bytes, "n_modes")
    rho = (1 + eps * np.cos(field.grid)) / (2 * math.pi)
    # USA: X = int e^{beta cos psi} sin psi rho(theta + psi) dpsi = -eps I_1(beta) sin(theta) / beta
    expected = -eps * special.iv(1, beta) * np.sin(field.grid) / beta
    np.testing.assert_allclose(field.velocity(rho), expected, rtol=0, atol=1e-14)


def test_spherical_degree_just_within_the_budget_gives_the_funk_hecke_velocity(monkeypatch):
    degree, beta, eps = 30, 1.0, 0.5
    field = _largest_within_budget(monkeypatch, lambda g: SphericalMeanField(beta, g, normalized=False), degree,
                                   spherical_bytes, "degree")
    theta = field.colatitude[:, None] * np.ones(field.n_phi)
    rho = (1 + eps * np.cos(theta)) / (4 * math.pi)
    # USA: G = lambda_0 / (4 pi) + eps lambda_1 cos(theta) / (4 pi), X = grad G / beta, with
    # lambda_1 = (2 pi)^{3/2} beta^{-1/2} I_{3/2}(beta) (Funk-Hecke on S^2)
    lam1 = (2 * math.pi) ** 1.5 * beta ** -0.5 * special.iv(1.5, beta)
    velocity = field.velocity(rho)
    np.testing.assert_allclose(velocity[0], -eps * lam1 * np.sin(theta) / (4 * math.pi * beta), rtol=0, atol=1e-14)
    np.testing.assert_allclose(velocity[1], 0.0, atol=1e-14)


def test_spherical_multipliers_per_degree_match_the_bessel_ratios():
    # the multipliers are formed per degree and spread over the (l, m) pairs (seconds, not minutes)
    field = SphericalMeanField(2.0, 12)
    expected = special.iv(field.l + 0.5, 2.0) / special.iv(0.5, 2.0)  # SA: lambda_l / lambda_0
    np.testing.assert_allclose(field._lambda, expected, rtol=1e-13)

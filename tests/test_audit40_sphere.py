"""Audit of the sphere and circle mean fields: input checks, scale safety, the saved states' memory.

Each test compares against an independent reference: a closed form (Bessel values of
:mod:`scipy.special`), the homogeneity of the normalized (SA) flow, whose velocity
:math:`\\nabla G/(\\beta G)` does not see the mass, or the bytes NumPy allocates.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import special

from ctformer.discretizations import SizeTooLargeError
from ctformer.particles import CircleMeanField, ResolutionWarning, SphericalMeanField, ZonalMeanField
from ctformer.particles.linear_stability import linear_growth_rate

from .conftest import require


def test_circle_normalized_must_be_true_or_false():
    """``bool("False")`` is True: the string made an SA field, None a USA one, without a word.

    A NumPy boolean is still accepted: np.False_ is USA, whose velocity for
    rho = (1 + a cos theta)/(2 pi) is -a sin(theta) I_1(beta)/beta in closed form."""
    for bad in ("False", None, 1):
        with pytest.raises(TypeError, match="normalized must be True or False"):
            CircleMeanField(1.0, 16, normalized=bad)
    beta, a = 1.3, 0.5
    field = CircleMeanField(beta, 16, normalized=np.False_)
    theta = field.grid
    velocity = field.velocity((1 + a * np.cos(theta)) / (2 * math.pi))
    np.testing.assert_allclose(velocity, -a * np.sin(theta) * special.iv(1, beta) / beta, rtol=0, atol=1e-15)


def test_circle_growth_rate_normalized_must_be_true_or_false():
    """The circle's own formula read ``normalized`` by truth value ("False" gave the SA rate 0.446
    at beta = 2); the sphere's formula already refused it. USA: k^2 I_k(beta)/beta."""
    for bad in ("False", None):
        with pytest.raises(TypeError, match="normalized must be True or False"):
            linear_growth_rate(1, 2.0, normalized=bad)
    k = np.arange(1, 5)
    np.testing.assert_allclose(linear_growth_rate(k, 2.0, normalized=np.False_),
                               k ** 2 * special.iv(k, 2.0) / 2.0, rtol=1e-14)


@pytest.mark.parametrize("scale", [1e-300, 1e-200, 1e200, 1e300])
def test_zonal_sa_is_scale_invariant(scale):
    """SA does not see the mass: rho0 -> scale * rho0 scales the solution. The resolution check
    formed c @ c, 0 below |c| ~ 1e-162 (ZeroDivisionError) and inf above 1e154 (a ResolutionWarning
    "nan of ||rho||^2" on a smooth, resolved density)."""
    field = ZonalMeanField(1.0, 3, 8)
    reference = field.solve(lambda s: 1 + 0.5 * s, 0.5, 0.01).coefficients
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaled = field.solve(lambda s: scale * (1 + 0.5 * s), 0.5, 0.01).coefficients
    np.testing.assert_allclose(scaled / scale, reference, rtol=0, atol=1e-15 * np.abs(reference).max())


def _resolution_warnings(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in caught if issubclass(w.category, ResolutionWarning)]


@pytest.mark.parametrize("scale", [1e-300, 1e200])
def test_spherical_resolution_check_is_scale_safe(scale):
    """On S^2 the check's power sum_m |a_lm|^2 was 0/0 or inf/inf for a scaled density, so the
    tail test silently never fired: at beta = 9, L = 8 the unscaled solve warns between t = 4.58
    and 4.6 (top degrees), the scaled one only at t = 6.64 (negative density). SA does not see
    the mass, so the scaled solve must warn where the unscaled one does, with its states."""
    require("ducc0")
    field = SphericalMeanField(9.0, 8)
    reference, expected = _resolution_warnings(lambda: field.solve(lambda x: 1 + 0.5 * x[..., 2], 6.0, 0.02))
    scaled, got = _resolution_warnings(lambda: field.solve(lambda x: scale * (1 + 0.5 * x[..., 2]), 6.0, 0.02))
    assert len(expected) == 1 and "between t=4.58 and t=4.6 its top degrees" in expected[0]
    assert got == expected
    a = reference.coefficients
    np.testing.assert_allclose(scaled.coefficients / scale, a, rtol=0, atol=1e-13 * np.abs(a).max())


def test_overflowing_density_is_refused_by_name():
    """Values near 1e308 overflow the mass and the coefficients: refused naming rho0, not a
    FloatingPointError that blamed the step ("the step may be too large") after the first step.
    Below the overflow the circle's SA flow scales (1e300: the same solution times 1e300)."""
    zonal, circle = ZonalMeanField(1.0, 3, 6), CircleMeanField(1.0, 16)
    require("ducc0")
    sphere = SphericalMeanField(1.0, 4)
    fields = [(zonal, np.full(zonal.grid.shape, 1e308)), (circle, np.full(16, 1e308)),
              (sphere, np.full(sphere.weights.shape, 1e308))]
    for field, values in fields:
        with pytest.raises(ValueError, match=r"rho0 must be a nonnegative density with positive.*rescale values"):
            field.solve(values, 0.1, 0.01)
    rho = (1 + 0.5 * np.cos(circle.grid)) / (2 * math.pi)
    reference = circle.solve(rho, 0.5, 0.01).density
    np.testing.assert_allclose(circle.solve(1e300 * rho, 0.5, 0.01).density / 1e300, reference, rtol=1e-14)


def test_complex_saved_states_count_sixteen_bytes(monkeypatch):
    """The circle's and S^2's states are complex128: 16 bytes an entry, which the memory check
    counted as 8 (finfo's bits are the real part's). 10001 states of 101 coefficients are
    16161616 bytes (what NumPy allocates), past a 12e6 budget the check let through at 8080808."""
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "12e6")
    field = CircleMeanField(0.5, 301)  # K = 100
    needed = np.empty((10001, 101), dtype=np.complex128).nbytes
    assert needed == 16161616
    with pytest.raises(SizeTooLargeError, match=f"{needed} bytes needed"):
        field.solve(np.ones(301), 1.0, 1e-4)
    # half the steps fit: 5001 * 1616 = 8081616 bytes, and the states are those bytes
    states = field.solve(np.ones(301), 0.5, 1e-4).coefficients
    assert states.nbytes == 5001 * 101 * 16 <= 12e6


def test_particle_trajectories_record_their_system_and_refuse_a_string_normalized():
    """A trajectory's file said nothing of the system that made it (the labelled docs promised
    beta, normalized and dt); ``SelfAttentionDynamics(normalized="False")`` was SA by ``bool``.
    The step is t1 / ceil(t1 / dt): 0.7 / ceil(0.7 / 0.3) = 0.7 / 3."""
    require("xarray")
    from ctformer.particles import SelfAttentionDynamics

    x0 = np.random.default_rng(5).standard_normal((6, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    path = SelfAttentionDynamics(beta=2.5, normalized=False).solve(x0, t1=0.7, dt=0.3)
    attrs = path.to_xarray().attrs
    assert (attrs["beta"], attrs["normalized"], attrs["dt"]) == (2.5, 0, 0.7 / 3)
    assert np.array_equal(path.times, np.arange(4) * (0.7 / 3))
    for bad in ("False", None):
        with pytest.raises(TypeError, match="normalized must be True or False"):
            SelfAttentionDynamics(beta=1.0, normalized=bad)


def test_an_overflowing_negative_beta_energy_names_its_logarithm():
    """beta < 0 refuses log=True (E < 0), yet the overflow message told users to pass it. For the
    uniform density on S^2 (c_0 = 1, orthonormal), E = 4 pi sinh(beta) / (2 beta^2): at beta = -740,
    log|E| = log(pi) + 740 - 2 log(740) (sinh(-740) = -e^740 / 2 in float64's reach of logs)."""
    field = ZonalMeanField(-740.0, 3, 8)
    with pytest.raises(OverflowError, match=r"E is negative \(beta < 0\), log\|E\| = (\S+), and log=True") as info:
        field.energy(np.eye(9)[0])
    reported = float(str(info.value).split("log|E| = ")[1].split(",")[0])
    assert abs(reported - (math.log(math.pi) + 740.0 - 2 * math.log(740.0))) < 1e-12 * 740
    assert abs(ZonalMeanField(740.0, 3, 8).energy(np.eye(9)[0], log=True) - reported) < 1e-12 * 740

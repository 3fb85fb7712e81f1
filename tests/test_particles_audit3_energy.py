"""Mean-field energies at large beta: log E in closed form, a clear OverflowError for E itself.

Before the fix ``energy`` of ZonalMeanField and SphericalMeanField stopped at beta > 709.78
(SA) with the bare ``OverflowError: math range error`` of ``math.exp(beta)``; there was no
``log=True``.
"""
import math

import numpy as np
import pytest
from scipy import special

from ctformer.particles import SphericalMeanField, ZonalMeanField, empirical_density

POLE = np.array([[0.0, 0.0, 1.0]])


def _log_energy_of_pole(beta, degree):
    # E_L = (1/(2 beta)) sum_{l <= L} lambda_l (2l + 1)/(4 pi), lambda_l = 4 pi sqrt(pi/(2 beta)) I_{l+1/2}(beta)
    l = np.arange(degree + 1)
    series = np.sum((2 * l + 1) * special.ive(l + 0.5, beta))
    return beta + math.log(series) + 0.5 * math.log(math.pi / (2 * beta)) - math.log(2 * beta)


@pytest.mark.parametrize("beta", [800.0, 5000.0])
def test_log_energy_of_a_point_mass_at_large_beta(beta):
    zonal, sphere = ZonalMeanField(beta, 3, 8), SphericalMeanField(beta, 8)
    expected = _log_energy_of_pole(beta, 8)
    assert zonal.energy(empirical_density(POLE, zonal), log=True) == pytest.approx(expected, rel=1e-14)
    assert sphere.energy(empirical_density(POLE, sphere), log=True) == pytest.approx(expected, rel=1e-14)


def test_energy_beyond_float64_names_log_true():
    zonal, sphere = ZonalMeanField(800.0, 3, 8), SphericalMeanField(800.0, 8)
    with pytest.raises(OverflowError, match=r"beta=800.0 is beyond the float64 range; use energy\(\.\.\., log=True\)"):
        zonal.energy(empirical_density(POLE, zonal))
    with pytest.raises(OverflowError, match=r"log=True"):
        sphere.energy(empirical_density(POLE, sphere))


@pytest.mark.parametrize("dimension", [2, 3, 5])
def test_log_energy_is_the_log_of_the_energy(dimension):
    field = ZonalMeanField(3.0, dimension, 6)
    c = field.coefficients_of(lambda s: np.exp(2 * s))
    assert field.energy(c, log=True) == pytest.approx(math.log(field.energy(c)), rel=1e-14)


def test_log_energy_refused_for_negative_beta():
    field = ZonalMeanField(-1.0, 3, 4)
    c = field.coefficients_of(lambda s: 1.0 + 0 * s)
    assert field.energy(c) < 0
    with pytest.raises(ValueError, match=r"log=True\) needs beta > 0"):
        field.energy(c, log=True)

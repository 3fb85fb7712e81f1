"""Particle systems and mean fields are fixed at construction: what they compute from their
parameters is cached (converted matrices, log-weights, spectral multipliers), so a later
change of an attribute, or of the caller's arrays, must not give a result that belongs to
neither the old nor the new parameters. References: systems built afresh from the same
numbers, and the circle's closed-form multipliers (scipy.special.ive)."""
import numpy as np
import pytest
from scipy import special

from ctformer.particles import CircleMeanField, SelfAttentionDynamics, SphericalMeanField, ZonalMeanField


def _sphere_points(n=6, d=3, seed=0):
    x = np.random.default_rng(seed).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize("normalized", [True, False])
def test_editing_the_callers_arrays_leaves_the_system_as_built(normalized):
    rng = np.random.default_rng(1)
    x = _sphere_points()
    q, w, mask = rng.standard_normal((3, 3)), np.linspace(1.0, 2.0, 6), np.tril(np.ones((6, 6), bool))
    system = SelfAttentionDynamics(1.5, Q=q, weights=w, mask=mask, normalized=normalized)
    system.velocity(x)  # fills the caches of converted constants
    reference = SelfAttentionDynamics(1.5, Q=q.copy(), weights=w.copy(), mask=mask.copy(),
                                      normalized=normalized).velocity(x)
    q[0, 0], w[0], mask[3, 0] = 5.0, 10.0, False  # the caller's arrays, edited
    np.testing.assert_array_equal(system.velocity(x), reference)
    assert not system.weights.flags.writeable and not system.Q[0].flags.writeable


@pytest.mark.parametrize("build", [lambda: CircleMeanField(1.3, 16), lambda: ZonalMeanField(1.3, 3, 8),
                                   lambda: SphericalMeanField(1.3, 8), lambda: SelfAttentionDynamics(1.3)],
                         ids=["circle", "zonal", "spherical", "particles"])
@pytest.mark.parametrize("name", ["beta", "normalized"])
def test_setting_a_parameter_after_construction_is_refused(build, name):
    system = build()
    with pytest.raises(AttributeError, match=rf"{type(system).__name__}\.{name} cannot be set: .*build a new"):
        setattr(system, name, 3.0)
    with pytest.raises(AttributeError, match="cannot be set"):
        delattr(system, name)
    assert system.beta == 1.3


def test_the_circle_multipliers_stay_those_of_its_beta():
    # before: field.beta = 3 kept the multipliers of beta = 1.3 under a repr saying beta=3.0
    field = CircleMeanField(1.3, 16)
    with pytest.raises(AttributeError):
        field.beta = 3.0
    k = np.arange(field.max_wavenumber + 1)
    expected = 2j * np.pi * 0.5 * (special.ive(k - 1, 1.3) - special.ive(k + 1, 1.3))
    np.testing.assert_allclose(field._numerator, expected, rtol=1e-15)
    assert "beta=1.3" in repr(field)

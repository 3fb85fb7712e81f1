"""Particle and mean-field ``evolve`` refuse error control beside fixed steps, a value equal
to the default included.

``dt=0.1, rtol=1e-6`` could not be told apart from ``dt=0.1`` (1e-6 is rtol's default), so
the explicit tolerance was ignored without a word; the defaults are now marked objects equal
to 1e-6, 1e-9 and 100 000, and anything passed is refused. Leaving them out still gives the
fixed-step solve, bit for bit the same as before, and the controller sees plain numbers.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.particles import CircleMeanField, SelfAttentionDynamics, SphericalMeanField, ZonalMeanField

_CASES = {
    "particles": (lambda: SelfAttentionDynamics(beta=1.0), lambda: np.eye(3)),
    "circle": (lambda: CircleMeanField(2.0, 16), lambda: (lambda th: (1 + 0.3 * np.cos(th)) / (2 * np.pi))),
    "zonal": (lambda: ZonalMeanField(2.0, 3, 8), lambda: (lambda s: (1 + 0.3 * s) / (4 * np.pi))),
    "sphere": (lambda: SphericalMeanField(2.0, 6), lambda: (lambda x: (1 + 0.3 * x[..., 2]) / (4 * np.pi))),
}


@pytest.mark.parametrize("kind", _CASES)
@pytest.mark.parametrize("given", [dict(rtol=1e-6), dict(atol=1e-9), dict(max_steps=100_000)])
def test_an_explicit_default_beside_dt_is_refused(kind, given):
    system, start = (make() for make in _CASES[kind])
    name, value = next(iter(given.items()))
    with pytest.raises(ValueError, match=rf"dt=0.1 and {name}={value!r} both given"):
        system.evolve(start, 0.5, dt=0.1, **given)
    fixed = system.evolve(start, 0.5, dt=0.1)           # the defaults left out: fixed steps
    assert fixed.stats["accepted"] == 5 and fixed.stats["rejected"] == 0   # t1 / dt steps

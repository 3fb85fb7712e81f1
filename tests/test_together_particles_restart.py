"""A particle restart with ``normalize=True`` continues from the saved state as it is.

Normalizing the saved (already unit) rows once more moved their last bits, so the continued
solve ended 4.4e-16 from the uninterrupted one; a restart's promise is the same bits.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import SaveAt
from ctformer.particles import SelfAttentionDynamics
from ctformer.solvers import MaxStepsReached


@pytest.mark.parametrize("dt", [None, 0.1])
def test_a_normalized_restart_gives_the_uninterrupted_bits(dt):
    x0 = 3.0 * np.random.default_rng(0).standard_normal((12, 3))
    system = SelfAttentionDynamics(beta=2.0)
    options = dict(normalize=True, save_at=SaveAt(steps=True))
    options.update(rtol=1e-8) if dt is None else options.update(dt=dt)
    full = system.evolve(x0, 2.0, **options)
    if dt is None:
        with pytest.raises(MaxStepsReached) as stop:
            system.evolve(x0, 2.0, max_steps=5, **options)
        part = stop.value.solution
    else:
        part = system.evolve(x0, 0.5, **options)
    rest = system.evolve(None, 2.0, initial=part, **options)
    np.testing.assert_array_equal(rest.final, full.final)
    np.testing.assert_allclose(np.linalg.norm(rest.final, axis=-1), 1.0, rtol=0, atol=4e-16)

"""A noisy zonal mean field's event occurrences hold densities, not the solver's internal
variables: every stored occurrence is the state the dense output gives at its depth, and the
first is ``event_state`` bit for bit."""
from __future__ import annotations

import numpy as np

from ctformer import SaveAt, solvers
from ctformer.particles import ZonalMeanField


def _rho(s):
    return (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)


def test_noisy_zonal_event_occurrences_are_densities():
    field = ZonalMeanField(4.0, 3, 12, noise=0.1)
    first = field.evolve(_rho, 1.0, rtol=1e-10, atol=1e-12, save_at=SaveAt(steps=True))
    level = 0.5 * (first.states[0][1] + first.final[1])
    assert abs(first.final[1] - first.states[0][1]) > 0.1 * abs(level)  # the degree-1 coefficient crosses it once
    event = solvers.Event(lambda t, c: c[1] - level)
    solution = field.evolve(_rho, 1.0, rtol=1e-10, atol=1e-12, events=[event])
    (times,), (states,) = solution.t_events, solution.y_events
    assert len(times) == 1 and 0.0 < times[0] < 1.0 and np.array_equal(states[0], solution.event_state)
    assert abs(states[0][1] - level) <= 1e-9 * abs(level)
    # the same density as a plain solve to that depth
    reference = field.evolve(_rho, float(times[0]), rtol=1e-10, atol=1e-12).final
    assert np.max(np.abs(states[0] - reference)) <= 1e-8 * np.max(np.abs(reference))

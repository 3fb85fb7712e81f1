"""Particle and mean-field ``evolve`` keep their saved states and dense records within the
memory budget (``CTFORMER_MEMORY_BUDGET``), as a model's ``evolve`` does: refused at the first
state or record that does not fit, with the solution so far. Reference: the same solve
without a budget (its first states, bit for bit)."""
import numpy as np
import pytest

from ctformer import solvers
from ctformer.discretizations.memory import SizeTooLargeError
from ctformer.particles import CircleMeanField, SelfAttentionDynamics


def _points(n=64, d=3):
    x = np.random.default_rng(0).standard_normal((n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_particle_steps_beyond_the_budget_are_refused_with_the_states_so_far(monkeypatch):
    x = _points()
    system = SelfAttentionDynamics(1.0)
    whole = system.evolve(x, 5.0, save_at=solvers.SaveAt(steps=True), rtol=1e-8)
    assert whole.states.shape[0] == 48  # 73 KiB of states, against the 19.5 KiB below
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "20000")
    with pytest.raises(SizeTooLargeError, match=r"keeps a state of 1\.5 KiB at every accepted step.*holds 6") as info:
        system.evolve(x, 5.0, save_at=solvers.SaveAt(steps=True), rtol=1e-8)
    kept = info.value.solution
    assert kept.states.shape == (6, 64, 3)
    np.testing.assert_array_equal(kept.states, whole.states[:6])
    np.testing.assert_array_equal(kept.times, whole.times[:6])


def test_particle_dense_output_counts_in_the_budget(monkeypatch):
    x = _points()
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "20000")
    with pytest.raises(SizeTooLargeError, match=r"keeps the dense output of every accepted step.*kept the "
                                                r"records of 1 step up to"):
        SelfAttentionDynamics(1.0).evolve(x, 5.0, save_at=solvers.SaveAt(dense=True), rtol=1e-8)
    # the final state alone is never refused
    final = SelfAttentionDynamics(1.0).evolve(x, 5.0, rtol=1e-8)
    assert final.states.shape == (1, 64, 3)


def test_mean_field_steps_beyond_the_budget_are_refused(monkeypatch):
    field = CircleMeanField(2.0, 256)
    rho0 = lambda theta: 1.0 + 0.5 * np.cos(theta)  # noqa: E731
    whole = field.evolve(rho0, 4.0, save_at=solvers.SaveAt(steps=True), rtol=1e-9)
    count = whole.states.shape[0]
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(whole.states[0].nbytes * count))  # holds count // 2
    with pytest.raises(SizeTooLargeError, match="at every accepted step") as info:
        field.evolve(rho0, 4.0, save_at=solvers.SaveAt(steps=True), rtol=1e-9)
    kept = info.value.solution.states
    assert 0 < kept.shape[0] <= count // 2
    np.testing.assert_array_equal(kept, whole.states[:kept.shape[0]])


@pytest.mark.parametrize("option", [dict(rtol=1e-3), dict(atol=1e-4), dict(max_steps=10),
                                    dict(controller=solvers.PIController(rtol=1e-3))],
                         ids=["rtol", "atol", "max_steps", "controller"])
def test_fixed_step_evolve_refuses_error_control_settings(option):
    # before: ignored beside dt (the result of dt alone, bit for bit)
    name = next(iter(option))
    with pytest.raises(ValueError, match=rf"dt=0\.1 and {name}.* both given: fixed steps take no error control"):
        SelfAttentionDynamics(1.0).evolve(_points(8), 1.0, dt=0.1, **option)
    with pytest.raises(ValueError, match=rf"dt=0\.1 and {name}"):
        CircleMeanField(2.0, 64).evolve(lambda t: 1.0 + 0.5 * np.cos(t), 1.0, dt=0.1, **option)
    fixed = SelfAttentionDynamics(1.0).evolve(_points(8), 1.0, dt=0.1)
    assert fixed.stats["accepted"] == 10

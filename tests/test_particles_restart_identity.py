"""A restart of a particle system or a mean field continues only the computation it belongs to.

The reference is the uninterrupted solve: a restart of the same system with the same control
gives its bits; one of another system (another beta, other head matrices, another mask, degree
or noise) or with other tolerances, error norm or controller settings is refused by name,
where it used to continue silently (beta 2 continuing a beta 1 solve cut at t = 0.49 ended 0.082
off the uninterrupted positions).
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import SaveAt, solvers
from ctformer.particles import CircleMeanField, SelfAttentionDynamics, ZonalMeanField

from .conftest import require

EVERY = SaveAt(steps=True)
X0 = np.random.default_rng(3).standard_normal((6, 3))
ANOTHER = r"initial belongs to another computation \(model_fingerprint: saved '[0-9a-f]{32}', now"


def _circle_rho(theta):
    return (1 + 0.4 * np.cos(theta) + 0.1 * np.sin(2 * theta)) / (2 * np.pi)


def _zonal_rho(s):
    return (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)


def _cases():
    q = np.diag([1.0, 2.0, 0.5])
    yield ("particles", SelfAttentionDynamics(1.0), SelfAttentionDynamics(2.0), X0, {"normalize": True})
    yield ("heads", SelfAttentionDynamics(1.0, Q=q), SelfAttentionDynamics(1.0, Q=q.T * 1.5), X0,
           {"normalize": True})
    yield ("unnormalized", SelfAttentionDynamics(1.0, normalized=False), SelfAttentionDynamics(1.0),
           X0, {"normalize": True})
    yield ("circle", CircleMeanField(2.0, 32), CircleMeanField(2.5, 32), _circle_rho, {})
    yield ("zonal noise", ZonalMeanField(2.0, 3, 12, noise=0.05), ZonalMeanField(2.0, 3, 12, noise=0.06),
           _zonal_rho, {})


@pytest.mark.parametrize("label, system, other, start, options", list(_cases()),
                         ids=[case[0] for case in _cases()])
def test_a_restart_of_another_system_is_refused_and_of_the_same_one_exact(label, system, other,
                                                                            start, options):
    full = system.evolve(start, 1.0, rtol=1e-7, save_at=EVERY, **options)
    k = len(full.times) // 2
    with pytest.raises(solvers.MaxStepsReached) as info:
        system.evolve(start, 1.0, rtol=1e-7, save_at=EVERY, max_steps=k, **options)
    part = info.value.solution
    rest = system.evolve(None, 1.0, rtol=1e-7, save_at=EVERY, initial=part)
    assert np.array_equal(rest.final, full.final)
    with pytest.raises(ValueError, match=ANOTHER):
        other.evolve(None, 1.0, rtol=1e-7, initial=part)
    with pytest.raises(ValueError, match=r"rtol: saved 1e-07, now 1e-05"):
        system.evolve(None, 1.0, rtol=1e-5, initial=part)
    with pytest.raises(ValueError, match=r"safety: saved 0\.9, now 0\.8"):
        system.evolve(None, 1.0, controller=solvers.PIController(rtol=1e-7, atol=1e-9, safety=0.8),
                      initial=part)


def test_the_system_is_kept_in_the_file_and_checked_from_there(tmp_path):
    require("h5netcdf")
    from ctformer import labelled

    system = SelfAttentionDynamics(1.0)
    with pytest.raises(solvers.MaxStepsReached) as info:
        system.evolve(X0, 1.0, normalize=True, save_at=EVERY, max_steps=4)
    info.value.solution.to_netcdf(tmp_path / "part.nc")
    saved = labelled.open_dataset(tmp_path / "part.nc")
    full = system.evolve(X0, 1.0, normalize=True)
    assert np.array_equal(system.evolve(None, 1.0, initial=saved).final, full.final)
    with pytest.raises(ValueError, match=ANOTHER):
        SelfAttentionDynamics(2.0).evolve(None, 1.0, initial=saved)


def test_a_fixed_step_restart_of_another_system_is_refused():
    system, other = SelfAttentionDynamics(1.0), SelfAttentionDynamics(1.0, mask=np.tril(np.ones((6, 6), bool)))
    full = system.evolve(X0, 1.0, dt=0.05, scheme="rk4", normalize=True, save_at=EVERY)
    part = system.evolve(X0, 1.0, dt=0.05, scheme="rk4", normalize=True, save_at=EVERY)
    part.times, part.states = part.times[:9], part.states[:9]
    rest = system.evolve(None, 1.0, dt=0.05, scheme="rk4", initial=part)
    assert np.array_equal(rest.final, full.final)
    with pytest.raises(ValueError, match=ANOTHER):
        other.evolve(None, 1.0, dt=0.05, scheme="rk4", initial=part)

"""Audit 41 of the time integrators (ctformer/solvers, ctformer/evolution.py).

Each test states what was wrong before the fix, with the number measured then.
"""
import numpy as np
import pytest
import scipy.linalg

import ctformer
from ctformer import solvers
from ctformer.model import Block
from ctformer.particles import SelfAttentionDynamics

GRIDS = dict(tokens="midpoint:6", features="midpoint:6")


def _u0(x, y):
    return np.cos(2.0 * y + np.sin(np.pi * x))


def _sphere_points(n=8, d=3, seed=0):
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# -- events: a bare function is refused by name ---------------------------------------------

def test_bare_function_in_events_is_refused_by_name():
    """Before: AttributeError: 'function' object has no attribute 'condition'."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)

    def half(t, u):
        return t - 0.5

    with pytest.raises(TypeError, match=r"events\[0\] must be a ctformer.Event, got function; "
                                        r"wrap it: ctformer.Event\(half\)"):
        model.evolve(_u0, **GRIDS, events=[half])
    with pytest.raises(TypeError, match=r"events must be a sequence of ctformer.Event, got function"):
        model.evolve(_u0, **GRIDS, events=half)
    with pytest.raises(TypeError, match=r"events must be a sequence of ctformer.Event, got Event"):
        model.evolve(_u0, **GRIDS, events=ctformer.Event(half))
    with pytest.raises(TypeError, match=r"events\[1\] must be a ctformer.Event, got str"):
        model.evolve(_u0, **GRIDS, events=[ctformer.Event(half), "half"])
    with pytest.raises(TypeError, match=r"events\[0\] must be a ctformer.Event"):
        SelfAttentionDynamics(beta=1.0).evolve(_sphere_points(), 1.0, events=[half])
    for single in (half, ctformer.Event(half)):  # the particles' evolve had failed on tuple(events)
        with pytest.raises(TypeError, match=r"events must be a sequence of ctformer.Event"):
            SelfAttentionDynamics(beta=1.0).evolve(_sphere_points(), 1.0, events=single)
    # the wrapped condition fires where the root-finder on t - 0.5 puts it
    sol = model.evolve(_u0, **GRIDS, events=[ctformer.Event(half)])
    assert abs(sol.event_time - 0.5) < 1e-12


def test_save_at_must_be_a_save_at():
    """Before: AttributeError: 'list' object has no attribute 'final_only'."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    with pytest.raises(TypeError, match=r"save_at must be a ctformer.SaveAt or None, got list"):
        model.evolve(_u0, **GRIDS, save_at=[0.5])
    with pytest.raises(TypeError, match=r"save_at must be a ctformer.SaveAt or None, got str"):
        SelfAttentionDynamics(beta=1.0).evolve(_sphere_points(), 1.0, save_at="steps")
    sol = model.evolve(_u0, **GRIDS, save_at=ctformer.SaveAt(times=[0.5]))
    assert sol.times.tolist() == [0.5]


def test_an_array_tolerance_beside_a_controller_is_refused_by_name():
    """Before: ValueError: The truth value of an array with more than one element is ambiguous."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    control = solvers.PIController(rtol=1e-6)
    with pytest.raises(ValueError, match=r"rtol=array\(\[1.e-06, 1.e-05\]\) contradicts the controller's"):
        model.evolve(_u0, **GRIDS, controller=control, rtol=np.array([1e-6, 1e-5]))
    assert model.evolve(_u0, **GRIDS, controller=control, rtol=1e-6).rtol == 1e-6


# -- statistics ------------------------------------------------------------------------------

def _counted(A, calls):
    def flow(u):
        calls.append(1)
        return A @ u
    return flow


def test_rhs_evaluations_count_each_segment_by_its_own_flows():
    """Segments of 2 and 1 flows (a layer without attention). Before: every sub-flow call was
    divided by the first segment's flow count: rk4, 4 steps a segment, reported 24 right-hand
    sides for 32 (and 37.5 for tsit5's 50)."""
    rng = np.random.default_rng(0)
    A, B, C = (0.5 * rng.normal(size=(4, 4)) for _ in range(3))
    u0 = rng.normal(size=4)
    for name, stages in (("rk4", 4), ("euler", 1)):
        first, second = [], []
        problem = solvers.Piecewise((0.0, 1.0, 2.0), (
            solvers.SplitProblem((_counted(A, first), _counted(B, first))),
            solvers.SplitProblem((_counted(C, second),))))
        sol = solvers.integrate(problem, u0, 4, scheme=solvers.get(name))
        assert sol.stats["rhs_evaluations"] == len(first) / 2 + len(second) == 8 * stages
        exact = scipy.linalg.expm(C) @ scipy.linalg.expm(A + B) @ u0
        assert np.abs(sol.final - exact).max() < (2e-3 if name == "rk4" else 1.0)  # h = 1/4


def test_model_rhs_evaluations_with_a_feedforward_only_layer():
    """A 2-layer model whose second layer has no attention: tsit5 with 4 fixed steps a layer is
    FSAL, 7 + 3 * 6 = 25 right-hand sides a layer (before: 37.5 reported)."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    b0, b1 = model.blocks
    second = Block(feedforward=b1.feedforward, normalization2=b1.normalization2, placement=b1.placement)
    mixed = ctformer.ContinuousTransformer([b0, second], final_normalization=model.final_normalization)
    sol = mixed.evolve(_u0, **GRIDS, scheme="tsit5", steps_per_layer=4)
    assert sol.stats["rhs_evaluations"] == 2 * (7 + 3 * 6)
    controlled = mixed.evolve(_u0, **GRIDS, scheme="tsit5", rtol=1e-8, atol=1e-8)
    assert float(controlled.stats["rhs_evaluations"]).is_integer()


def test_fixed_step_times_list_every_accepted_step():
    """Before: a fixed-step solve that kept only layers or the final state reported the layer
    ends, [1, 2], as step_times for 8 accepted steps (the same solve with SaveAt(times=...)
    reported all 8)."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    expected = np.arange(1, 9) / 4.0
    for save_at in (None, ctformer.SaveAt(layers=True), ctformer.SaveAt(times=[0.3])):
        sol = model.evolve(_u0, **GRIDS, scheme="rk4", steps_per_layer=4, save_at=save_at)
        assert sol.stats["accepted"] == len(sol.stats["step_times"]) == 8
        np.testing.assert_allclose(sol.stats["step_times"], expected, rtol=0, atol=1e-15)
    x0 = _sphere_points()
    sol = SelfAttentionDynamics(beta=1.0).evolve(x0, 1.0, dt=0.25, scheme="rk4")
    np.testing.assert_allclose(sol.stats["step_times"], [0.25, 0.5, 0.75, 1.0], rtol=0, atol=1e-15)


def test_fixed_step_times_of_sequence_groups(monkeypatch):
    """The batch path that advances groups of sequences side by side (8 sequences of 64
    tokens: 2 groups on 2 CPUs). Before: step_times [1, 2] for 6 steps."""
    from ctformer._numerics import sequence_groups

    monkeypatch.setattr(sequence_groups, "machine_cpus", lambda: 2)
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    u = np.random.default_rng(0).normal(size=(8, 64, 4))
    assert sequence_groups.slices(u) is not None
    sol = model.evolve(u, tokens="midpoint:64", features="midpoint:4", scheme="rk4", steps_per_layer=3)
    np.testing.assert_allclose(sol.stats["step_times"], np.arange(1, 7) / 3.0, rtol=0, atol=1e-15)
    assert sol.stats["accepted"] == 6


# -- registry ----------------------------------------------------------------------------------

def test_register_tableau_refuses_a_scheme_name():
    """Before: a tableau named "strang" silently replaced the Strang splitting: get("strang")
    returned a Runge-Kutta method, of order 2 on the unsplit right-hand side."""
    ralston = solvers.ButcherTableau("strang", a=((), (2.0 / 3.0,)), b=(0.25, 0.75), order=2.0)
    with pytest.raises(ValueError, match=r"tableau name 'strang' is the name of a registered scheme"):
        solvers.register_tableau(ralston)
    assert "strang" not in solvers.TABLEAUS
    strang = solvers.get("strang")
    assert isinstance(strang, solvers.Strang)
    # still the splitting: half B (Heun), A (Heun), half B against exp(A + B) at order 2
    rng = np.random.default_rng(1)
    A, B = 0.5 * rng.normal(size=(3, 3)), 0.5 * rng.normal(size=(3, 3))
    u0 = rng.normal(size=3)
    problem = solvers.Piecewise.single(solvers.SplitProblem((lambda u: A @ u, lambda u: B @ u)), 1.0)
    exact = scipy.linalg.expm(A + B) @ u0
    errors = [np.abs(solvers.integrate(problem, u0, n, scheme=strang).final - exact).max()
              for n in (16, 32)]
    assert abs(np.log2(errors[0] / errors[1]) - 2.0) < 0.1

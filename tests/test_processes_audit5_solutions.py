"""Results that cross a process boundary: pickled solutions, errors and particle results.

A process pool or a Dask worker sends results and exceptions back pickled. Before the fixes:
a ``MaxStepsReached`` raised on a worker could not be unpickled (``TypeError: __init__()
missing 1 required positional argument: 'solution'``; a ``ProcessPoolExecutor`` turned it into
``BrokenProcessPool``), a ``Solution`` with dense output did not pickle (``Can't pickle local
object '_Counter.wrap.<locals>.counted.<locals>.flow'``), ``==`` on a particle ``Trajectory`` or
a mean-field solution raised ``ValueError`` (truth value of an array), and
``Solution.evaluate`` of an array of times crashed on a mean field with noise (``'_ClockRecord'
object has no attribute 'u0'``). References: the uninterrupted solve, the original solution's
own values in this process (bit for bit), and the states the solve saved at its step ends.
"""
from __future__ import annotations

import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest

import ctformer
from ctformer import SaveAt, solvers
from ctformer.discretizations import GaussLegendre
from ctformer.particles import CircleMeanField, SelfAttentionDynamics, SphericalMeanField, ZonalMeanField

GRIDS = dict(tokens=GaussLegendre(6), features=GaussLegendre(8))


def _u0(x, y):
    return np.cos(3 * y + np.sin(np.pi * x))


def _in_child(code: str, payload=None):
    """Run ``code`` in a fresh interpreter with ``data`` unpickled from stdin; what it
    assigns to ``out`` comes back unpickled."""
    program = ("import pickle, sys, warnings\nwarnings.simplefilter('ignore')\nimport numpy as np\n"
               "data = pickle.loads(sys.stdin.buffer.read())\n" + code
               + "\nsys.stdout.buffer.write(pickle.dumps(out))\n")
    done = subprocess.run([sys.executable, "-c", program], input=pickle.dumps(payload),
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    return pickle.loads(done.stdout)


_INTERRUPTED = """
import ctformer
from ctformer import SaveAt, solvers
from ctformer.discretizations import GaussLegendre
model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
try:
    model.evolve(data, tokens=GaussLegendre(6), features=GaussLegendre(8), rtol=1e-7,
                 save_at=SaveAt(steps=True, dense=True), max_steps=5)
except solvers.MaxStepsReached as exc:
    out = exc
"""


def test_max_steps_reached_on_another_process_comes_back_and_restarts_bit_for_bit():
    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=3)
    u0 = _u0(*np.meshgrid(GRIDS["tokens"].nodes, GRIDS["features"].nodes, indexing="ij"))
    full = model.evolve(u0, **GRIDS, rtol=1e-7, save_at=SaveAt(steps=True))
    # before: TypeError on unpickling (the exception came back as BrokenProcessPool)
    exc = _in_child(_INTERRUPTED, u0)
    assert isinstance(exc, solvers.MaxStepsReached) and "max_steps" in str(exc)
    part = exc.solution
    k = part.stats["accepted"]
    assert k == 5 and len(part.records) == 5 and 0 < part.times[-1] < 3
    np.testing.assert_array_equal(part.states, full.states[:k + 1])  # the same steps there
    rest = model.evolve(None, **GRIDS, rtol=1e-7, save_at=SaveAt(steps=True), initial=part)
    np.testing.assert_array_equal(rest.states, full.states[k:])
    np.testing.assert_array_equal(rest.final, full.final)


@pytest.mark.parametrize("exc", [
    solvers.MaxStepsReached("spent max_steps=5", {"kept": np.arange(3.0)}),
    solvers.StepSizeTooSmall("the step fell below dt_min", None),
    solvers.SolveInterrupted("interrupted at t=0.5", [1.0, 2.0]),
])
def test_early_ends_pickle_with_what_they_kept(exc):
    for back in (pickle.loads(pickle.dumps(exc)), copy.deepcopy(exc)):
        assert type(back) is type(exc) and str(back) == str(exc)
        kept = back.result if isinstance(exc, solvers.SolveInterrupted) else back.solution
        original = exc.result if isinstance(exc, solvers.SolveInterrupted) else exc.solution
        assert solvers.solution._same(kept, original)


_EVALUATE = """
solutions, depths = data
out = [s.evaluate(depths) for s in solutions] + [s.stats["rhs_evaluations"] for s in solutions]
"""


def _dense_solutions():
    model = ctformer.ContinuousTransformer.random_smooth(seed=2, layers=2)
    u0 = _u0(*np.meshgrid(GRIDS["tokens"].nodes, GRIDS["features"].nodes, indexing="ij"))
    dense = SaveAt(steps=True, dense=True)
    x0 = np.random.default_rng(1).standard_normal((6, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    return [model.evolve(u0, **GRIDS, scheme="rk4", steps_per_layer=3, save_at=dense),   # Hermite
            model.evolve(u0, **GRIDS, scheme="strang", rtol=1e-5, save_at=dense),      # Hermite
            model.evolve(u0, **GRIDS, scheme="tsit5", rtol=1e-6, save_at=dense),       # stages
            SelfAttentionDynamics(1.0).evolve(x0, 2.0, scheme="heun", rtol=1e-6, save_at=dense),
            ZonalMeanField(1.0, 3, 6, noise=0.1).evolve(lambda s: 1 + 0.1 * s, 1.0, scheme="rk4",
                                                        dt=0.1, save_at=dense)]


def test_dense_solutions_pickle_and_evaluate_the_same_bits_in_another_process():
    solutions = _dense_solutions()
    # before: "Can't pickle local object '_Counter.wrap.<locals>.counted.<locals>.flow'"
    there = _in_child(_EVALUATE, (solutions, np.linspace(0.0, 1.0, 11)))
    here = [s.evaluate(np.linspace(0.0, 1.0, 11)) for s in solutions]
    for a, b in zip(here, there):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    # the Hermite slopes were evaluated once, before pickling, and counted in both
    assert [s.stats["rhs_evaluations"] for s in solutions] == there[len(solutions):]
    for s in solutions:
        for back in (pickle.loads(pickle.dumps(s)), copy.deepcopy(s)):
            steps = [getattr(r, "record", r) for r in back.records]   # under the noise clock
            assert back == s and all(r.problem is None for r in steps)
        # the interpolant goes through every saved state (at the steps' ends), and the
        # array of depths gives what the depths one by one give
        ends = np.asarray(s.times)
        np.testing.assert_array_equal(s.evaluate(ends), s.states)
        assert all(np.array_equal(s.evaluate(ends[1:])[i], s.evaluate(float(t)))
                   for i, t in enumerate(ends[1:]))


def test_dense_hermite_slopes_are_counted_once_when_pickled():
    model = ctformer.ContinuousTransformer.random_smooth(seed=2, layers=2)
    u0 = _u0(*np.meshgrid(GRIDS["tokens"].nodes, GRIDS["features"].nodes, indexing="ij"))
    sol = model.evolve(u0, **GRIDS, scheme="rk4", steps_per_layer=3, save_at=SaveAt(dense=True))
    before = sol.stats["rhs_evaluations"]
    assert before == 4 * 6   # rk4: 4 right-hand sides per step, 6 steps
    back = pickle.loads(pickle.dumps(sol))
    # 2 per interpolated step (F(u_n), F(u_n+1)), as a first evaluate() would count them
    assert sol.stats["rhs_evaluations"] == back.stats["rhs_evaluations"] == before + 2 * 6
    pickle.dumps(sol)
    assert sol.stats["rhs_evaluations"] == before + 2 * 6


def test_noisy_mean_field_dense_output_takes_arrays_of_times():
    field = ZonalMeanField(1.0, 3, 6, noise=0.1)
    sol = field.evolve(lambda s: 1 + 0.1 * s, 1.0, scheme="rk4", dt=0.1,
                       save_at=SaveAt(steps=True, dense=True))
    # before: AttributeError '_ClockRecord' object has no attribute 'u0'
    got = sol.evaluate(sol.times)
    np.testing.assert_array_equal(got, sol.states)   # the saved coefficients, at the step ends
    assert sol.evaluate(np.array([])).shape == (0,) + sol.final.shape
    sph = SphericalMeanField(1.0, 3, noise=0.1).evolve(lambda p: 1 + 0.1 * p[..., 2], 0.5, scheme="rk4",
                                                       dt=0.1, save_at=SaveAt(steps=True, dense=True))
    np.testing.assert_array_equal(sph.evaluate(sph.times), sph.states)


def _particle_results():
    x0 = np.random.default_rng(1).standard_normal((6, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    theta = np.linspace(0.0, 2 * np.pi, 32, endpoint=False)
    return [SelfAttentionDynamics(1.0).solve(x0, 1.0, 0.1),
            CircleMeanField(1.0, 32).solve(1 + 0.1 * np.cos(theta), 1.0, 0.05, tracers=np.array([0.1, 1.0])),
            ZonalMeanField(1.0, 3, 6).solve(lambda s: 1 + 0.1 * s, 1.0, 0.05),
            SphericalMeanField(1.0, 4).solve(lambda p: 1 + 0.1 * p[..., 2], 1.0, 0.05)]


def test_particle_results_compare_by_value_across_pickling():
    results = _particle_results()
    for r in results:
        # before: ValueError "The truth value of an array with more than one element is ambiguous"
        assert pickle.loads(pickle.dumps(r)) == r and copy.deepcopy(r) == r
        with pytest.raises(TypeError, match="unhashable"):
            hash(r)
    there = _in_child("out = data", results)
    assert all(a == b for a, b in zip(results, there))
    shorter = SelfAttentionDynamics(1.0).solve(results[0].positions[0], 1.0, 0.2)
    assert results[0] != shorter and results[2] != results[3] and results[0] != "a trajectory"

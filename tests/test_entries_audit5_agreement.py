"""Audit of a model's entry points against each other: ``run``, ``solve`` (fixed steps and
tolerances), ``evolve`` (fixed steps and error control) and padded against unpadded sequences.

References: the entries' documented identities (``run`` is ``solve`` with ``lie``, one step per
layer, on midpoint grids; ``solve(..., rtol)`` is ``evolve(..., rtol).final`` normalized), a
model truncated to its first layers, the sequence solved alone, a fine fixed-step RK4 solve, and
the norm's formula written out in NumPy."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import ContinuousTransformer
from ctformer.discretizations import Midpoint
from ctformer.solvers import PIController, SaveAt, weighted_rms

N, D = 7, 8
GRIDS = dict(tokens=Midpoint(N), features=Midpoint(D))
MODEL = ContinuousTransformer.random_smooth(seed=2, layers=2)
TOLERANCES = dict(rtol=1e-6, atol=1e-9)


def _start(shape=(N, D), seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def _normalized(model, u, grids):
    """``u`` after the model's final normalization on ``grids`` (what ``solve`` returns)."""
    final = model.final_normalization
    return u if final is None else grids.lift(final.discretize(grids))(u)


def _fine(u, n):
    """A fixed-step RK4 reference of ``n`` tokens: 400 steps per layer, error far below 1e-10."""
    return MODEL.solve(u, tokens=Midpoint(n), features=Midpoint(D), scheme="rk4",
                       steps_per_layer=400)


def test_run_solve_and_fixed_step_evolve_are_one_computation():
    x = _start()
    run = MODEL.run(x)
    assert np.array_equal(run, MODEL.solve(x, **GRIDS, scheme="lie", steps_per_layer=1))
    sol = MODEL.evolve(x, **GRIDS, scheme="rk4", steps_per_layer=3, save_at=SaveAt(layers=True))
    solved = MODEL.solve(x, **GRIDS, scheme="rk4", steps_per_layer=3, trajectory=True)
    assert np.array_equal(_normalized(MODEL, sol.final, MODEL.grids(**GRIDS)), solved[-1])
    # the state at layer j is the final state of the model's first j layers
    first = ContinuousTransformer(MODEL.blocks[:1], context_length=MODEL.context_length)
    one_layer = first.solve(x, **GRIDS, scheme="rk4", steps_per_layer=3)
    assert np.array_equal(one_layer, sol.states[1]) and np.array_equal(one_layer, solved[1])


def test_solve_refuses_steps_per_layer_none_instead_of_switching_to_error_control():
    # before: None reached evolve as "no fixed steps", and lie under error control ran
    # 100000 steps and raised MaxStepsReached at depth 0.437 of 2
    with pytest.raises(ValueError, match="steps_per_layer must be a positive integer, got None"):
        MODEL.solve(_start(), **GRIDS, steps_per_layer=None)


@pytest.mark.parametrize("setting", [dict(rtol=1e-3), dict(atol=1e-3), dict(max_steps=3),
                                     dict(controller=PIController(rtol=1e-3, atol=1e-3))])
def test_fixed_step_evolve_refuses_error_control_settings_by_name(setting):
    # before: ignored; rtol=1e-3 beside steps_per_layer=2 gave the bits of the solve without it
    name = next(iter(setting))
    with pytest.raises(ValueError, match=rf"steps_per_layer=2 and {name}.* both given.*drop {name}"):
        MODEL.evolve(_start(), **GRIDS, scheme="rk4", steps_per_layer=2, **setting)


def test_solve_with_tolerances_is_evolve_with_solves_own_scheme():
    # solve keeps its default "lie" under rtol/atol (evolve's default is "tsit5"), as documented
    x = _start()
    grids = MODEL.grids(**GRIDS)
    loose = dict(rtol=1e-2, atol=1e-4)
    solved = MODEL.solve(x, **GRIDS, **loose)
    evolved = MODEL.evolve(x, **GRIDS, scheme="lie", **loose)
    assert np.array_equal(solved, _normalized(MODEL, evolved.final, grids))
    assert np.abs(solved - _fine(x, N)).max() < 1e-2
    tight = MODEL.solve(x, **GRIDS, scheme="tsit5", **TOLERANCES)
    assert np.array_equal(tight, _normalized(MODEL, MODEL.evolve(x, **GRIDS, **TOLERANCES).final, grids))
    assert np.abs(tight - _fine(x, N)).max() < 1e-8


def test_padded_sequence_under_error_control_is_the_sequence_alone():
    x = _start()
    alone = MODEL.evolve(x[:5], tokens=Midpoint(5), features=Midpoint(D), **TOLERANCES)
    mask = np.arange(N) < 5
    finals = []
    for scale in (0.1, 30.0):   # the padding's values must not steer the steps
        padded = x.copy()
        padded[5:] = scale * _start((2, D), seed=1)
        sol = MODEL.evolve(padded, **GRIDS, padding_mask=mask, **TOLERANCES)
        # before: 11 steps instead of 6 with padding of size 0.1, 3.5e-11 from the sequence alone
        assert sol.stats["accepted"] == alone.stats["accepted"] == 6
        # products of 7 and of 5 rows may round differently (the same bits on an AVX-512
        # OpenBLAS kernel, 1.3e-15 apart on its Haswell kernel, AMD EPYC family 25 model 1)
        assert np.abs(sol.final[:5] - alone.final).max() <= 1e-14 * np.abs(alone.final).max()
        finals.append(sol.final[:5])
    assert np.array_equal(*finals)  # the padded values themselves never reach a real token
    assert np.abs(alone.final - MODEL.evolve(x[:5], tokens=Midpoint(5), features=Midpoint(D),
                                             scheme="rk4", steps_per_layer=400).final).max() < 1e-9


def test_padding_values_of_a_batch_do_not_change_its_real_tokens():
    x = _start((3, N, D))
    mask = np.ones((3, N), bool)
    mask[0, 5:] = False
    mask[1, :3] = False
    other = x.copy()
    other[~mask] = 50.0 * _start((int((~mask).sum()), D), seed=3)
    a = MODEL.evolve(x, **GRIDS, padding_mask=mask, **TOLERANCES)
    b = MODEL.evolve(other, **GRIDS, padding_mask=mask, **TOLERANCES)
    # before: 7 and 6 steps, real tokens 7.4e-12 apart
    assert a.stats["accepted"] == b.stats["accepted"]
    assert np.array_equal(a.final[mask], b.final[mask])


def test_weighted_norm_with_token_weights_per_sequence_is_the_formula():
    rng = np.random.default_rng(4)
    e, u, v = (rng.normal(size=(2, 5, 3)) for _ in range(3))
    w_x = rng.uniform(0.0, 1.0, size=(2, 5))
    w_y = rng.uniform(0.5, 1.0, size=3)
    scale = 1e-3 + 1e-2 * np.maximum(np.abs(u), np.abs(v))
    weight = w_x[:, :, None] * w_y[None, None, :]
    expected = np.sqrt(np.sum(weight * (e / scale) ** 2) / np.sum(weight))
    got = weighted_rms(e, u, v, 1e-2, 1e-3, (w_x, w_y))
    assert abs(got - expected) <= 1e-14 * expected
    with pytest.raises(ValueError, match=r"token weights must have shape \(5,\) or \(2, 5\)"):
        weighted_rms(e, u, v, 1e-2, 1e-3, (w_x[:, :4], w_y))

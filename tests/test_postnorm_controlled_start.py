"""An error-controlled solve of a post-norm model from a state off its constraint sets: the
layers' limit jumps onto each layer's set as the layer starts, so the solve starts every
layer from the projection (before, the first step's error was O(1) at every size and the
solve ended in StepSizeTooSmall). The reference is Richardson extrapolation of the
first-order fixed-step scheme."""
import numpy as np
import pytest

import ctformer as ct
from ctformer import SaveAt
from ctformer import discretizations as d

TOKENS, FEATURES = d.get("gauss-legendre:8"), d.get("gauss-legendre:6")


def _u0(x, y):
    return 1 + np.sin(3 * x + 2 * y) + 0.5 * x * y


@pytest.fixture(scope="module")
def model():
    return ct.ContinuousTransformer.random_smooth(seed=0, layers=2, placement="post-projection")


def test_controlled_post_norm_solve_from_off_the_set_converges(model):
    fixed = {k: model.evolve(_u0, tokens=TOKENS, features=FEATURES, scheme="rk4", steps_per_layer=k).final
             for k in (1000, 2000)}
    reference = 2 * fixed[2000] - fixed[1000]  # the fixed steps are first order here
    errors = []
    for rtol in (1e-3, 1e-5):
        solution = model.evolve(_u0, tokens=TOKENS, features=FEATURES, scheme="tsit5", rtol=rtol, atol=rtol,
                                save_at=SaveAt(steps=True))
        errors.append(np.max(np.abs(solution.final - reference)))
        assert errors[-1] <= 10 * rtol
    assert errors[1] < errors[0] / 10
    # the saved state at depth 0 is the given one (the left limit), not its projection
    u0 = _u0(TOKENS.nodes[:, None], FEATURES.nodes[None, :])
    assert np.array_equal(solution.states[0], u0)


def test_a_restart_at_a_layer_boundary_keeps_the_bits(model):
    full = model.evolve(_u0, tokens=TOKENS, features=FEATURES, scheme="tsit5", rtol=1e-5, atol=1e-5,
                        save_at=SaveAt(layers=True))
    part = model.evolve(_u0, tokens=TOKENS, features=FEATURES, scheme="tsit5", rtol=1e-5, atol=1e-5,
                        save_at=SaveAt(layers=True), max_steps=10_000, events=())
    part.times, part.states = part.times[:2], part.states[:2]  # stopped at depth 1
    rest = model.evolve(None, tokens=TOKENS, features=FEATURES, scheme="tsit5", rtol=1e-5, atol=1e-5,
                        save_at=SaveAt(layers=True), initial=part)
    assert np.array_equal(rest.final, full.final)

"""Fixed steps or a controller together with tolerances equal to their defaults.

``evolve(steps_per_layer=2, rtol=1e-6)`` ran the fixed steps and dropped the explicit ``rtol``
(1e-6 is the default, and a default was told from a value passed by equality), and
``evolve(rtol=1e-6, controller=PIController(rtol=1e-3))`` solved at 1e-3. The defaults are now
marked objects, equal to the plain numbers and shown as them, told apart by identity.
"""
from __future__ import annotations

import inspect
import pickle

import numpy as np
import pytest

from ctformer import evolution
from ctformer.discretizations import Midpoint
from ctformer.model import ContinuousTransformer
from ctformer import SaveAt
from ctformer.solvers import MaxStepsReached, PIController
from ctformer.solvers.restart_identity import recorded

MODEL = ContinuousTransformer.random_smooth(seed=1, layers=2)
U0 = np.random.default_rng(0).standard_normal((2, 6, 4))
GRIDS = dict(tokens=Midpoint(6), features=Midpoint(4))


@pytest.mark.parametrize("name, value", [("rtol", 1e-6), ("atol", 1e-9), ("max_steps", 100_000)])
@pytest.mark.parametrize("entry", ["method", "function"])
def test_an_explicit_default_beside_fixed_steps_is_refused(entry, name, value):
    """Before: ran, the value ignored (the fixed steps' bits); now refused by name."""
    solve = MODEL.evolve if entry == "method" else (lambda u, **kw: evolution.evolve(MODEL, u, **kw))
    with pytest.raises(ValueError, match=rf"steps_per_layer=2 and {name}={value!r} both given: "
                                         rf"fixed steps take no error control.*drop {name}"):
        solve(U0, **GRIDS, steps_per_layer=2, **{name: value})


def test_an_explicit_default_that_contradicts_the_controller_is_refused():
    """Before: ``rtol=1e-6`` beside a controller of rtol 1e-3 solved at 1e-3 silently."""
    with pytest.raises(ValueError, match=r"rtol=1e-06 contradicts the controller's"):
        MODEL.evolve(U0, **GRIDS, rtol=1e-6, controller=PIController(rtol=1e-3))
    with pytest.raises(ValueError, match=r"max_steps=100000 contradicts the controller's"):
        MODEL.evolve(U0, **GRIDS, max_steps=100_000, controller=PIController(max_steps=50))
    # agreeing with the controller stays allowed, as before
    agree = MODEL.evolve(U0, **GRIDS, rtol=1e-3, controller=PIController(rtol=1e-3))
    alone = MODEL.evolve(U0, **GRIDS, controller=PIController(rtol=1e-3))
    assert np.array_equal(agree.final, alone.final)


def test_defaults_left_out_are_the_controllers_defaults_as_plain_numbers():
    """The signature shows the numbers; a solve with them left out is the solve with
    ``PIController()`` and with the same numbers passed (same bits), and what a restart
    compares holds plain floats (no private type reaches a file or a pickle)."""
    shown = inspect.signature(MODEL.evolve).parameters
    assert (repr(shown["rtol"].default), repr(shown["atol"].default),
            repr(shown["max_steps"].default)) == ("1e-06", "1e-09", "100000")
    left_out = MODEL.evolve(U0, **GRIDS)
    passed = MODEL.evolve(U0, **GRIDS, rtol=1e-6, atol=1e-9, max_steps=100_000)
    control = MODEL.evolve(U0, **GRIDS, controller=PIController())
    assert np.array_equal(left_out.final, passed.final)
    assert np.array_equal(left_out.final, control.final)
    assert left_out.stats["accepted"] == control.stats["accepted"] > 0
    saved = recorded(left_out)
    assert type(saved["rtol"]) is float and type(saved["atol"]) is float
    assert saved["rtol"] == 1e-6 and saved["atol"] == 1e-9


def test_a_restart_with_the_default_tolerance_passed_continues_the_saved_solve():
    """A solve stopped by ``max_steps`` and restarted with ``rtol=1e-6`` passed (the saved
    solve's default) is the same computation: the uninterrupted solve's bits."""
    full = MODEL.evolve(U0, **GRIDS, save_at=SaveAt(steps=True))
    with pytest.raises(MaxStepsReached) as stopped:
        MODEL.evolve(U0, **GRIDS, save_at=SaveAt(steps=True), max_steps=3)
    part = pickle.loads(pickle.dumps(stopped.value.solution))
    rest = MODEL.evolve(None, **GRIDS, initial=part, rtol=1e-6, atol=1e-9)
    assert 0 < part.times[-1] < full.times[-1]
    assert np.array_equal(rest.final, full.final)

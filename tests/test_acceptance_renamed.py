"""Every name that 0.2 renamed (the CHANGELOG's "Renamed" table) is refused with its new name.

Without a word about the replacement, a user of 0.1 met Python's own "unexpected keyword
argument" and had to search the changelog; the new name is now in the message, and the new
call gives the number the old one did.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import ctformer.solvers as solvers
from ctformer import Grids
from ctformer.discretizations import Midpoint
from ctformer.model import Block, ContinuousTransformer
from ctformer.solvers import runge_kutta
from ctformer.studies import convergence

MODEL = ContinuousTransformer.random_smooth(seed=0, layers=1)
X = np.random.default_rng(0).standard_normal((5, 8))
MASK = np.array([True, True, True, True, False])


@pytest.mark.parametrize("old, new", [
    (lambda: MODEL.run(X, mask=MASK), r"run\(mask=\) was renamed padding_mask="),
    (lambda: MODEL.solve(lambda x, y: x + y, tokens=Midpoint(4), features=Midpoint(4), key_mask=None),
     r"solve\(key_mask=\) was renamed padding_mask="),
    (lambda: Block(norm1=None), r"Block\(norm1=\) was renamed normalization1="),
    (lambda: Block(norm2=None), r"Block\(norm2=\) was renamed normalization2="),
    (lambda: ContinuousTransformer([], final_norm=None), "final_norm=\\) was renamed final_normalization="),
    (lambda: convergence(MODEL, refine="tokens", levels=[4, 8], norm="l2"), "norm=\\) was renamed error_norm="),
    (lambda: MODEL.blocks[0].attention(X, Grids(Midpoint(5), Midpoint(8)), key_mask=None),
     "key_mask=\\) was renamed padding_mask="),
])
def test_a_renamed_keyword_names_its_new_name(old, new):
    with pytest.raises(TypeError, match=new):
        old()


def test_the_new_keyword_gives_what_the_old_one_gave():
    """The padding mask under its new name: the real tokens equal the same sequence alone
    (a padded token is never attended), to rounding."""
    padded = MODEL.run(X, padding_mask=MASK)
    np.testing.assert_allclose(padded[:4], MODEL.run(X[:4]), rtol=0, atol=1e-13)


@pytest.mark.parametrize("module, old, new", [
    (solvers, "ClassicalRK4", "renamed ctformer.solvers.RK4"),
    (runge_kutta, "EULER", "renamed EULER_TABLEAU"),
    (runge_kutta, "HEUN", "renamed HEUN_TABLEAU"),
])
def test_a_renamed_module_attribute_names_its_new_name(module, old, new):
    with pytest.raises(AttributeError, match=new):
        getattr(module, old)
    assert not hasattr(module, old)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        getattr(module, "NoSuchName")


def test_the_renamed_class_and_tableaus_are_the_classical_ones():
    """What the new names hold: RK4 integrates y' = y over one step of h = 0.1 as the Taylor
    polynomial of e^h of degree 4 (Butcher's classical method)."""
    h = 0.1
    b, a = np.array(solvers.RK4_TABLEAU.b), solvers.RK4_TABLEAU.a
    k = []
    for row in a:
        k.append(1.0 + h * sum(c * kj for c, kj in zip(row, k)))
    assert abs(1.0 + h * float(np.dot(b, k)) - sum(h ** j / math.factorial(j) for j in range(5))) < 1e-16
    assert isinstance(solvers.get("rk4"), solvers.RK4)

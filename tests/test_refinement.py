"""Refinements as objects: what a level's h, steps and expected order are, per refined variable.

References: h of a level is 1/k for k steps per layer and (b - a)/n for n midpoint cells; the
expected order of time refinement is the scheme's order on the model (1 on post-norm); the
order of a composite Gauss rule with q points per element is 2q; a study given a refinement
object is the same computation (same case keys, same numbers) as one given its name.
"""
import dataclasses
import math

import pytest

from ctformer import ContinuousTransformer, solvers
from ctformer.discretizations import Midpoint
from ctformer.studies import (ConvergenceResult, Row, SpaceRefinement, StudySpec, TimeRefinement,
                              as_refinement, comparison_table, convergence)

GRID = dict(tokens="midpoint:6", features="midpoint:6", progress=False)


def test_names_become_objects_once():
    assert as_refinement("time") == TimeRefinement()
    assert as_refinement("hidden") == SpaceRefinement("hidden")
    space = SpaceRefinement("tokens")
    assert as_refinement(space) is space
    with pytest.raises(ValueError, match="refine must be one of tokens, features, hidden, time or "
                                         "a Refinement .*got 'depth'"):
        as_refinement("depth")
    with pytest.raises(ValueError, match="refines one of tokens, features, hidden, got 'time'; "
                                         "use TimeRefinement"):
        SpaceRefinement("time")
    with pytest.raises(dataclasses.FrozenInstanceError):
        space.variable = "features"


def test_h_steps_and_discretizations_of_a_level():
    time, tokens = TimeRefinement(), SpaceRefinement("tokens")
    assert time.h(8, {}) == 0.125 and time.steps(8, 3) == 8 and time.refines_depth
    family = ("midpoint", (0.0, 2.0))
    level = tokens.discretizations({"tokens": None, "features": Midpoint(4)}, family, 10)
    assert level["tokens"] == Midpoint(10, domain=(0.0, 2.0)) and level["features"] == Midpoint(4)
    assert tokens.h(10, level) == pytest.approx(0.2, rel=1e-15) and tokens.steps(10, 3) == 3
    assert (time.size_name, time.step_name, tokens.size_name, tokens.step_name) == \
        ("steps", "dt", "n", "h")


def test_expected_orders_come_from_the_scheme_on_the_model_or_the_discretization():
    post = ContinuousTransformer.random_smooth(seed=0, layers=1, placement="post-projection")
    pre = ContinuousTransformer.random_smooth(seed=0, layers=1)
    rk4, time = solvers.get("rk4"), TimeRefinement()
    assert time.expected_order(rk4, pre, None, 1) == 4.0
    assert time.expected_order(rk4, post, None, 1) == 1.0
    assert time.expected_order(rk4, object(), None, 1) == 4.0   # a model without blocks
    tokens, hidden = SpaceRefinement("tokens"), SpaceRefinement("hidden")
    assert tokens.expected_order(rk4, pre, ("midpoint", (0.0, 1.0)), 4) == 2.0
    assert math.isinf(tokens.expected_order(rk4, pre, ("gauss-legendre", (0.0, 1.0)), 4))
    # P1 / P2 elements in the hidden variable: composite Gauss rules with 3 / 4 points
    assert hidden.gauss_points(("p1", (0.0, 1.0)), 5) == 3
    assert hidden.gauss_points(("p2", (0.0, 1.0)), 5) == 4
    assert tokens.gauss_points(("p1", (0.0, 1.0)), 5) is None
    assert hidden.gauss_points(("midpoint", (0.0, 1.0)), 5) is None


@pytest.mark.parametrize("name, refinement, levels", [
    ("time", TimeRefinement(), [1, 2, 4, 16]),
    ("tokens", SpaceRefinement("tokens"), [4, 8, 32]),
])
def test_a_refinement_object_is_the_same_study_as_its_name(tmp_path, name, refinement, levels):
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    grid = dict(GRID, tokens="midpoint") if name == "tokens" else GRID
    by_name = convergence(model, refine=name, levels=levels, store=tmp_path, **grid)
    stored = sorted(p.name for p in tmp_path.iterdir())
    by_object = convergence(model, refine=refinement, levels=levels, store=tmp_path, **grid)
    assert sorted(p.name for p in tmp_path.iterdir()) == stored   # the same case keys: reused
    assert [r.error for r in by_object.table] == [r.error for r in by_name.table]
    assert by_object.refine == name and by_object.refinement == refinement
    assert by_object.expected_order == by_name.expected_order


def _result(method, gauss_points, expected=2.0, refine="hidden"):
    table = [Row(0, 4, 0.25, 1e-2, None, 0.0), Row(1, 8, 0.125, 1.5625e-4, 6.0, 0.0)]
    return ConvergenceResult(table=table, observed_order=6.0, expected_order=expected,
                             refine=refine, method=method, reference="finest", norm="l2",
                             min_feature_std=1.0, wall_seconds=0.0, gauss_points=gauss_points)


def test_the_composite_rule_order_is_carried_not_parsed_from_the_label():
    # the label is display text: a renamed method keeps its composite order 2 q = 6
    res = _result("my elements", gauss_points=3)
    assert "expected 6:" in res.headline() and res.to_dict()["gauss_points"] == 3
    assert "expected order" in comparison_table([res]) and "6" in \
        comparison_table([res]).splitlines()[-2]
    # and a label that names P1 does not make a study a composite rule
    assert _result("p1", gauss_points=None).headline().startswith(
        "observed order 6.00 (expected 2); above it")


def test_hidden_p1_study_carries_its_gauss_points():
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    res = convergence(model, refine="hidden", levels=[4, 8, 16], hidden="p1", **GRID)
    assert res.gauss_points == 3 and res.expected_order == 2.0


def test_the_study_spec_is_checked_once_and_frozen():
    spec = StudySpec.checked(refine="time", levels=[1, 2], scheme="strang", error_norm="max")
    assert spec.refinement == TimeRefinement() and spec.levels == (1, 2)
    assert spec.scheme == solvers.Strang("heun") and spec.error_norm == "max"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.levels = (1, 2, 4)
    with pytest.raises(ValueError, match="error_norm must be one of 'l2', 'max'; got 'l1'"):
        StudySpec.checked(refine="time", levels=[1, 2], error_norm="l1")
    with pytest.raises(TypeError, match="fine must be an integer >= 2, got 2.5"):
        StudySpec.checked(refine="time", levels=[1, 2], fine=2.5)
    with pytest.raises(ValueError, match="expected_order must be a finite positive number"):
        StudySpec.checked(refine="time", levels=[1, 2], expected_order=-1)

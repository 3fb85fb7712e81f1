"""Study edge cases found in an audit: identities needed only with a store, resume after an
interrupt inside a case, and observed orders against a closed form."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations.quadrature import GaussLegendre
from ctformer.model import ContinuousTransformer
from ctformer.state import Grids
from ctformer.studies import StudyInterrupted, convergence

STUDY = dict(refine="tokens", levels=[4, 8, 16], tokens="midpoint", progress=False)


def test_local_discretization_class_runs_without_store_and_is_refused_with_one(tmp_path):
    class LocalGaussLegendre(GaussLegendre):   # a local class: no stable identity
        pass

    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    plain = convergence(model, features=GaussLegendre(4), **STUDY)
    local = convergence(model, features=LocalGaussLegendre(4), **STUDY)   # was a TypeError
    assert [r.error for r in local.table] == [r.error for r in plain.table]
    assert local.observed_order == plain.observed_order
    with pytest.raises(TypeError, match="no stable description"):
        convergence(model, features=LocalGaussLegendre(4), store=tmp_path, **STUDY)
    assert list(tmp_path.glob("*.json")) == []


def test_interrupt_inside_a_case_keeps_finished_cases(tmp_path, monkeypatch):
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    study = dict(STUDY, levels=[4, 8, 16, 32], features="gauss-legendre:4")
    solve = type(model).solve
    solved = []

    def interrupted(self, u0, **kwargs):
        if kwargs["tokens"].n == 16:
            raise KeyboardInterrupt
        solved.append(kwargs["tokens"].n)
        return solve(self, u0, **kwargs)

    monkeypatch.setattr(type(model), "solve", interrupted)
    with pytest.raises(StudyInterrupted) as info:
        convergence(model, store=tmp_path, **study)
    assert (info.value.stored, info.value.total) == (2, 4) and solved == [4, 8]
    assert len(list(tmp_path.glob("*.json"))) == 2
    monkeypatch.setattr(type(model), "solve", lambda self, u0, **kw: (solved.append(kw["tokens"].n),
                                                                     solve(self, u0, **kw))[1])
    resumed = convergence(model, store=tmp_path, **study)
    assert solved == [4, 8, 16, 32]                      # nothing computed twice
    fresh = convergence(model, **study)
    assert [r.error for r in resumed.table] == [r.error for r in fresh.table]


class SampledInitialState:
    """A 'model' whose solution is its sampled initial state: the error is the rule's own."""

    def solve(self, u0, *, tokens, features, head_features, hidden, scheme, steps_per_layer,
              trajectory):
        u = Grids(tokens, features, head_features, hidden).sample(u0)
        return [u, u]


def _u0(x, y):
    return np.sin(np.pi * x) * np.cos(y)


def test_midpoint_reconstruction_order_matches_closed_form():
    # midpoint nodes do not nest when n doubles: at the coarsest nodes each finer level
    # interpolates between its midpoints, an error O(h^2) with a smooth leading term
    result = convergence(SampledInitialState(), refine="tokens", levels=[8, 16, 32, 64, 128],
                         tokens="midpoint", features="gauss-legendre:6", u0=_u0,
                         reference=_u0, evaluate="coarsest-nodes", progress=False)
    assert result.table[0].error == 0.0                   # its own nodes: exact
    errors = [r.error for r in result.table[1:]]
    orders = np.log(np.divide(errors[:-1], errors[1:])) / np.log(2.0)
    np.testing.assert_allclose(orders, 2.0, atol=0.02)
    assert result.observed_order == pytest.approx(2.0, abs=0.02)
    assert result.headline() == f"observed order {result.observed_order:.2f} (expected 2)"


def test_progress_must_be_true_or_false():
    """``progress="no"`` was accepted as true (a non-empty string)."""
    from ctformer.studies.execution import run_cases

    with pytest.raises(TypeError, match="progress must be True or False"):
        run_cases(lambda context, case: {"x": 1.0}, None, [("a", 1)], progress="no")


@pytest.mark.parametrize("output", [{1: 2.0}, {"x": {1: 2.0}, "y": 1.0}, {"x": [{2: 1.0}]}])
def test_a_record_with_keys_that_are_not_strings_is_refused(output):
    """A top-level int key crashed while the record was sealed ("'<' not supported"); a nested
    one was stored as "1" by JSON, so a resumed study read back another record."""
    from ctformer.studies.execution import run_cases

    with pytest.raises(TypeError, match="case a: the task's output has the key"):
        run_cases(lambda context, case: output, None, [("a", 1)], progress=False)
    # string keys: the record as computed
    assert run_cases(lambda context, case: {"x": {"1": 2.0}}, None, [("a", 1)], progress=False)["a"]["x"] == {"1": 2.0}

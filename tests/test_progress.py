"""The progress bar of a study counts work, not cases: the reference level is most of it."""
from __future__ import annotations

import io
import re

import pytest

from ctformer.studies import SpaceRefinement, TimeRefinement, run_cases
from ctformer.studies.execution import _shares


def _task(context, case):
    return {"value": [float(case)]}


def test_shares_follow_the_cost_of_each_level():
    levels = [16, 32, 64, 512]
    tokens = SpaceRefinement("tokens")
    cases = [(f"k{n}", n) for n in levels]
    shares = _shares(cases, [tokens.cost(n) for n in levels])
    assert sum(shares.values()) == pytest.approx(100.0)
    # attention is quadratic in N: the 512-token reference is 512^2 / sum n^2 of the work
    assert shares["k512"] == pytest.approx(100 * 512 ** 2 / sum(n * n for n in levels))
    assert shares["k16"] + shares["k32"] + shares["k64"] < 2.1  # (16^2 + 32^2 + 64^2) / total
    assert TimeRefinement().cost(8) == 8.0 and SpaceRefinement("hidden").cost(8) == 8.0
    with pytest.raises(ValueError, match="one positive number per case"):
        _shares(cases, [1.0, 2.0])


def test_bar_reaches_one_hundred_percent(capsys):
    cases = [("a", 1), ("b", 2), ("c", 3)]
    records = run_cases(_task, None, cases, costs=[1.0, 1.0, 8.0], description="demo")
    assert [records[k]["value"] for k, _ in cases] == [[1.0], [2.0], [3.0]]
    err = capsys.readouterr().err
    assert re.search(r"demo: 100%\|.*\| 100% of the work, 3/3 cases", err), err
    # after the two cheap cases the bar shows 20% of the work, not 67%
    assert re.search(r"demo:  20%\|.*\| 20% of the work, 2/3 cases", err), err

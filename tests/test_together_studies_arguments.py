"""Studies with their arguments together: an argument a study does not read is refused by
name (it was silently ignored), and a time study's JSON names its columns as its table and
CSV do (``steps, dt``), reading back files written with ``n, h``.

References: the same study without the ignored argument (identical numbers before the fix),
the CSV header and the rows of the result itself, and for Richardson with a resumed store
the extrapolation written out from direct solves.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import ctformer
from ctformer.discretizations import GaussLegendre
from ctformer.studies import ConvergenceResult, convergence

MODEL = ctformer.ContinuousTransformer.random_smooth(seed=1)
TOKENS, FEATURES = GaussLegendre(6), GaussLegendre(5)
U = np.cos(np.arange(30.0).reshape(6, 5) / 7)
TIME = dict(refine="time", levels=[1, 2, 4, 8], u0=U, tokens=TOKENS, features=FEATURES,
            progress=False)


@pytest.mark.parametrize("refine, levels", [("time", [1, 2, 4]), ("hidden", [4, 8, 16])])
def test_fine_is_refused_where_no_evaluation_points_are_read(refine, levels):
    # before: fine=7 ran and gave the very errors of the study without it (0.0752, ... in time)
    with pytest.raises(ValueError, match=rf"fine=7 sets the evaluation points .* with "
                                         rf"refine='{refine}' .* leave fine out"):
        convergence(MODEL, refine=refine, levels=levels, fine=7, progress=False)


@pytest.mark.parametrize("refine, levels", [("time", [1, 2, 4]), ("hidden", [4, 8, 16])])
def test_evaluate_is_refused_where_no_refined_axis_is_compared(refine, levels):
    with pytest.raises(ValueError, match=rf"evaluate='coarsest-nodes' chooses where .* "
                                         rf"refine='{refine}' .* leave evaluate out"):
        convergence(MODEL, refine=refine, levels=levels, evaluate="coarsest-nodes",
                    progress=False)
    # the default, written out, is the study without it
    plain = convergence(MODEL, refine=refine, levels=levels, progress=False)
    spelled = convergence(MODEL, refine=refine, levels=levels, evaluate="interpolate",
                          progress=False)
    assert [r.error for r in spelled.table] == [r.error for r in plain.table]


def test_fine_is_refused_with_the_coarsest_nodes():
    study = dict(refine="tokens", levels=[4, 12, 36], tokens="midpoint", progress=False)
    # before: fine=3 gave the errors of the study without it, and recorded fine=3
    with pytest.raises(ValueError, match=r"fine=3 .* with evaluate='coarsest-nodes' no such "
                                         r"points are used .* leave fine out"):
        convergence(MODEL, evaluate="coarsest-nodes", fine=3, **study)


def test_steps_per_layer_is_refused_when_time_is_refined():
    # before: steps_per_layer=4 was ignored (the levels are the steps per layer)
    with pytest.raises(ValueError, match=r"steps_per_layer=4 fixes the steps when time is not "
                                         r"refined; .* leave steps_per_layer out"):
        convergence(MODEL, steps_per_layer=4, **TIME)


def test_a_time_study_writes_steps_and_dt_everywhere_and_reads_old_files(tmp_path):
    result = convergence(MODEL, **TIME)
    header = result.to_csv(tmp_path / "t.csv").read_text().splitlines()[0].split(",")
    rows = json.loads(result.to_json(tmp_path / "t.json").read_text())["table"]
    # before: the CSV said steps,dt and the JSON rows n, h
    assert header[:3] == ["level", "steps", "dt"]
    assert [sorted(row) for row in rows] == [sorted(header)] * 4
    assert [row["steps"] for row in rows] == [1, 2, 4, 8]
    assert [row["dt"] for row in rows] == [1.0, 0.5, 0.25, 0.125]
    back = ConvergenceResult.from_json(tmp_path / "t.json")
    assert back.table == result.table and back.observed_order == result.observed_order
    assert str(back).splitlines()[0] == str(result).splitlines()[0]
    # a file written before (rows n, h) reads back to the same table
    old = json.loads((tmp_path / "t.json").read_text())
    old["table"] = [{("n" if k == "steps" else "h" if k == "dt" else k): v for k, v in row.items()}
                    for row in old["table"]]
    assert ConvergenceResult.from_dict(old).table == result.table
    with pytest.raises(ValueError, match=r"table row 0 .* expected 'steps' and 'dt' "
                                         r"\(or 'n' and 'h'\)"):
        ConvergenceResult.from_dict(dict(old, table=[{"level": 0, "error": 1.0}]))


def test_a_tokens_study_keeps_n_and_h_and_a_spectral_order_reads_back(tmp_path):
    result = convergence(MODEL, refine="tokens", levels=[4, 8, 16], progress=False)
    assert math.isinf(result.expected_order)            # Gauss-Legendre: spectral
    rows = json.loads(result.to_json(tmp_path / "x.json").read_text())["table"]
    assert sorted(rows[0]) == sorted(["level", "n", "h", "error", "order", "seconds"])
    back = ConvergenceResult.from_json(tmp_path / "x.json")
    assert back.table == result.table and math.isinf(back.expected_order)


def test_richardson_of_an_array_state_resumed_from_a_store_is_the_extrapolation(tmp_path):
    first = convergence(MODEL, reference="richardson", scheme="heun", store=tmp_path, **TIME)
    again = convergence(MODEL, reference="richardson", scheme="heun", store=tmp_path, **TIME)
    alone = convergence(MODEL, reference="richardson", scheme="heun", **TIME)
    assert [r.error for r in first.table] == [r.error for r in again.table] \
        == [r.error for r in alone.table]
    # written out: u_f + (u_f - u_c) / (2**2 - 1) of direct heun solves, the grids' L2 norm
    final = {k: MODEL.solve(U, tokens=TOKENS, features=FEATURES, scheme="heun",
                            steps_per_layer=k, trajectory=True)[-1] for k in (1, 2, 4, 8)}
    ref = final[8] + (final[8] - final[4]) / 3.0
    weights = np.outer(TOKENS.quadrature_weights, FEATURES.quadrature_weights)
    expected = [math.sqrt(np.sum(weights * (final[k] - ref) ** 2)) for k in (1, 2, 4, 8)]
    np.testing.assert_allclose([r.error for r in first.table], expected, rtol=1e-12)


def test_a_sized_name_for_the_refined_variable_is_refused():
    # before: tokens="midpoint:99" ran as "midpoint", the 99 dropped without a word
    with pytest.raises(ValueError, match=r"tokens='midpoint:99' is refined, so its sizes are the "
                                         r"levels: give the name only \('midpoint'\)"):
        convergence(MODEL, refine="tokens", levels=[4, 8, 16], tokens="midpoint:99",
                    progress=False)

"""Acceptance of issue 9 ("Nothing silently wrong"): study identity, record integrity,
scale-safe projections through a whole solve, atomic exports.

Items already asserted elsewhere (not repeated here): 1 and 2 in ``test_study_identity.py``
(the issue's own reproducers), 3, 15 and 16 in ``test_store_integrity.py`` (a record edited
through ``run_cases``), 4 for the operators in ``test_modern_operators.py`` and
``test_particles_core.py``, 18 in ``test_thread_independence.py`` and
``test_attention_threads.py``.
"""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.studies import CorruptRecordWarning, convergence, run_cases, smooth_initial_state
from ctformer.studies.execution import record_checksum

from .conftest import require

STUDY = dict(refine="tokens", levels=[4, 8, 16], tokens="midpoint", features="midpoint:8",
             progress=False)


def _errors(result):
    return [r.error for r in result.table]


def _record_of_level(store, level):
    for path in sorted(store.glob("*.json")):
        record = json.loads(path.read_text())
        if record["case"] == level:
            return path, record
    raise AssertionError(f"no record of level {level} in {store}")


# -- item 1: the key holds the scheme, the steps and the discretizations ----------------------
@pytest.mark.parametrize("change", [dict(scheme="strang"), dict(steps_per_layer=2),
                                    dict(features="gauss-legendre:8")],
                         ids=["scheme", "steps", "discretization"])
def test_item1_scheme_steps_and_discretizations_are_part_of_the_key(tmp_path, change):
    """Issue 9, item 1: "the key hashes ... the discretizations, scheme, steps": a study that
    differs only there, run into the same store, equals the same study run without a store."""
    model = ContinuousTransformer.random_smooth(seed=2, layers=1)
    first = convergence(model, store=tmp_path, **STUDY)
    changed = {**STUDY, **change}
    stored = convergence(model, store=tmp_path, **changed)
    assert _errors(stored) == _errors(convergence(model, **changed))
    assert _errors(stored) != _errors(first)
    assert len(list(tmp_path.glob("*.json"))) == 6   # three cases each, none shared


# -- item 3: records are not trusted blindly, through convergence ---------------------------
def test_item3_an_edited_number_in_a_study_record_is_reported_and_recomputed(tmp_path):
    """Issue 9, item 3: "Editing one number of a record changes a level's error from 1.16e-9
    to 0.0177 on the next run": the edit is reported naming the file, and the errors are
    those of the study run without a store."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    fresh = _errors(convergence(model, **STUDY))
    assert _errors(convergence(model, store=tmp_path, **STUDY)) == fresh
    path, record = _record_of_level(tmp_path, 8)
    record["values"][0][0] += 0.0177
    path.write_text(json.dumps(record))
    with pytest.warns(CorruptRecordWarning, match="checksum mismatch") as caught:
        again = convergence(model, store=tmp_path, **STUDY)
    assert str(path) in str(caught[0].message)
    assert _errors(again) == fresh


def square_task(context, level):
    """Module level (picklable): values = level * base, a known answer."""
    context["calls"].append(level)
    return {"level": level, "values": level * np.asarray(context["base"]), "seconds": 0.5}


BASE = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


@pytest.mark.parametrize("bad, reason", [
    (None, "field 'values' must be an array of numbers of shape (2, 3)"),
    ("nan", "field 'values' must be an array of numbers of shape (2, 3)"),
    ("0.5", "field 'values' must be an array of numbers of shape (2, 3)"),
    (True, "field 'values' must be an array of numbers of shape (2, 3)"),
    (10 ** 400, "field 'values' holds NaN or inf (or an integer beyond float64's range)"),
], ids=["null", "string-nan", "string-number", "boolean", "huge-integer"])
def test_item3_a_non_number_in_a_stored_array_is_reported_and_recomputed(tmp_path, bad, reason):
    """Issue 9, item 3: "a wrong schema ... or a non-finite value is reported with the
    record's file name and the case is recomputed". A null or the string "nan" read as NaN
    (NumPy's float64 conversion) and passed the schema check; ``true`` and "0.5" passed as 1
    and 0.5; an integer of 400 digits raised OverflowError from inside NumPy."""
    cases = [(f"level-{n}", n) for n in (1, 2)]
    context = {"base": BASE, "calls": []}
    run_cases(square_task, context, cases, store=tmp_path, progress=False)
    path = tmp_path / "level-2.json"
    record = json.loads(path.read_text())
    record["values"][1][2] = bad
    record["checksum"] = record_checksum(record)   # a consistent file: only the schema can tell
    path.write_text(json.dumps(record))
    context["calls"].clear()
    with pytest.warns(CorruptRecordWarning) as caught:
        records = run_cases(square_task, context, cases, store=tmp_path, progress=False)
    message = str(caught[0].message)
    assert str(path) in message and reason in message, message
    assert context["calls"] == [2]
    assert records["level-2"]["values"] == (2 * np.asarray(BASE)).tolist()


@pytest.mark.parametrize("shape", [None, 5])
def test_item15_a_malformed_array_declaration_is_reported_not_raised(tmp_path, shape):
    """Issue 9, item 15: "Record files that are valid JSON but structurally wrong raise
    KeyError: 'values' or a broadcast error without the file name". A declared shape that is
    not a list of sizes (``null`` or ``5`` raised TypeError from inside the check) is
    reported naming the file, and the case recomputed."""
    cases = [("level-1", 1)]
    context = {"base": BASE, "calls": []}
    run_cases(square_task, context, cases, store=tmp_path, progress=False)
    path = tmp_path / "level-1.json"
    record = json.loads(path.read_text())
    record["fields"]["values"] = ["array", shape]
    record["checksum"] = record_checksum(record)
    path.write_text(json.dumps(record))
    context["calls"].clear()
    with pytest.warns(CorruptRecordWarning, match="field 'values' has an invalid declaration") as caught:
        records = run_cases(square_task, context, cases, store=tmp_path, progress=False)
    assert str(path) in str(caught[0].message)
    assert context["calls"] == [1] and records["level-1"]["values"] == BASE


def test_item3_a_null_in_a_study_record_is_not_reported_as_a_blown_up_solution(tmp_path):
    """Issue 9, item 3 through ``convergence``: a record whose number became ``null`` (checksum
    consistent) made the study raise "the solution there is finite but has blown up"; it is
    now reported as corrupt and the errors are those of the study run without a store."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    fresh = _errors(convergence(model, **STUDY))
    convergence(model, store=tmp_path, **STUDY)
    path, record = _record_of_level(tmp_path, 8)
    record["values"][0][0] = None
    record["checksum"] = record_checksum(record)
    path.write_text(json.dumps(record))
    with pytest.warns(CorruptRecordWarning, match="must be an array of numbers"):
        again = convergence(model, store=tmp_path, **STUDY)
    assert _errors(again) == fresh


@pytest.mark.parametrize("field, kind", [("values", None), ("values", "abc"),
                                         ("min_feature_std", None), ("seconds", "abc")])
def test_item15_a_study_record_without_a_field_the_study_reads_is_recomputed(tmp_path, field, kind):
    """Issue 9, item 15: structurally wrong records "raise KeyError: 'values' ... without the
    file name". A record consistent in itself (its declaration and checksum edited too) that
    lacks ``values`` raised exactly that KeyError from the measurement, after every case; one
    whose ``values`` became a string raised NumPy's conversion error. It is now reported
    naming the file and recomputed: the errors are those of the study without a store."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    fresh = _errors(convergence(model, **STUDY))
    convergence(model, store=tmp_path, **STUDY)
    path, record = _record_of_level(tmp_path, 8)
    if kind is None:
        del record[field], record["fields"][field]
    else:
        record[field], record["fields"][field] = kind, ["str", None]
    record["checksum"] = record_checksum(record)
    path.write_text(json.dumps(record))
    with pytest.warns(CorruptRecordWarning, match=f"field '{field}' ") as caught:
        again = convergence(model, store=tmp_path, **STUDY)
    assert str(path) in str(caught[0].message)
    assert _errors(again) == fresh


def test_item15_run_cases_checks_the_fields_its_caller_reads(tmp_path):
    """``run_cases(required=...)``: a stored record that lacks a field the caller reads, or
    declares another kind or trailing shape, is reported and recomputed; one that has them is
    read without a warning."""
    cases = [("level-1", 1)]
    context = {"base": BASE, "calls": []}
    run_cases(square_task, context, cases, store=tmp_path, progress=False)
    context["calls"].clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        run_cases(square_task, context, cases, store=tmp_path, progress=False,
                  required={"values": ("array", (3,)), "seconds": "number"})
    assert context["calls"] == []
    for required, reason in [({"values": ("array", (4,))}, r"has shape \(2, 3\), this case needs \(\.\.\., 4\)"),
                             ({"seconds": "array"}, "field 'seconds' must be of kind array, declared number"),
                             ({"eps": "number"}, "field 'eps' is missing")]:
        with pytest.warns(CorruptRecordWarning, match=reason):
            run_cases(square_task, context, cases, store=tmp_path, progress=False, required=required)
    assert context["calls"] == [1, 1, 1]


@pytest.mark.parametrize("shape", [(2, 6, 5), (1, 6, 5)])
def test_a_batch_of_initial_states_is_refused_before_any_case_runs(shape):
    """Issue 9's rule "a crash inside NumPy instead of a clear message": an array u0 with a
    batch axis, refining time, ran every case and then failed inside ``numpy.einsum``
    ("output has more dimensions than subscripts"). It is refused at once, naming u0 and its
    shape; a single (tokens, features) state still gives the direct solves' errors."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    study = dict(refine="time", levels=[1, 2], tokens="midpoint:6", features="midpoint:5",
                 progress=False)
    u = np.random.default_rng(0).standard_normal(shape)
    with pytest.raises(ValueError, match=r"u0 must be one state of shape \(tokens, features\), "
                                         rf"got shape \({shape[0]}, 6, 5\)"):
        convergence(model, u0=u, **study)
    result = convergence(model, u0=u[0], **study)
    tokens, features = Midpoint(6), Midpoint(5)
    one, two = (model.solve(u[0], tokens=tokens, features=features, steps_per_layer=k) for k in (1, 2))
    weights = np.outer(tokens.quadrature_weights, features.quadrature_weights)
    assert result.table[0].error == pytest.approx(np.sqrt(np.sum(weights * (one - two) ** 2)), rel=1e-12)


def test_item3_task_outputs_that_are_not_number_arrays_still_round_trip(tmp_path):
    """A task's list of booleans or strings is declared as JSON, not as an array of numbers,
    so it reads back without a warning (the stricter array check must not reject it)."""
    cases = [("flags", 1)]
    records = run_cases(_flag_task, {}, cases, store=tmp_path, progress=False)
    assert records["flags"]["fields"]["flags"] == ["json", None]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = run_cases(_flag_task, {}, cases, store=tmp_path, progress=False)
    assert again == records


def _flag_task(context, level):
    return {"flags": [True, False], "names": ["a", "b"], "values": np.ones((2, 2))}


# -- item 4: a whole solve is scale-safe -----------------------------------------------------
def _feature_function(f, y):
    """The closed form offset + amplitude sin(pi frequency y + phase) of a smooth random
    feature function, from its parameters."""
    p = f.parameters()
    return p["offset"] + p["amplitude"] * np.sin(np.pi * p["frequency"] * y + p["phase"])


@pytest.mark.parametrize("c", [1e155, 1e300])
def test_item4_solve_of_huge_initial_data_is_the_final_layernorm_of_u0(c):
    """Issue 9, item 4: "random_smooth().solve(1e155 * u0) returns finite rows of norm 0.169".
    For c u0 with c = 1e155 the residual updates are 1e-155 of the state, so the pre-norm
    model's output is its final LayerNorm of u0: gain(y) (u0 - mean) / std + shift(y), the
    mean and standard deviation taken with the feature weights (closed form)."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    tokens, features = GaussLegendre(8), GaussLegendre(8)
    y, w = features.nodes, features.weights
    u0 = smooth_initial_state(tokens.nodes[:, None], y[None, :])
    centred = u0 - (u0 * w).sum(1, keepdims=True)
    std = np.sqrt((centred ** 2 * w).sum(1, keepdims=True))
    final = model.final_normalization
    expected = _feature_function(final.gain, y) * centred / std + _feature_function(final.shift, y)
    got = model.solve(c * u0, tokens=tokens, features=features)
    assert np.abs(got - expected).max() < 1e-14


def test_item4_solve_of_tiny_initial_data_does_not_depend_on_the_scale():
    """Issue 9, item 4: "at 1e-160 the variance is off by 4e-4". u0 scaled by 1e-160 or
    1e-300 contributes 1e-100 of the state after the first update, so the outputs equal the
    one at 1e-100 (where squaring is exact in float64) to rounding."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    tokens, features = GaussLegendre(8), GaussLegendre(8)
    u0 = smooth_initial_state(tokens.nodes[:, None], features.nodes[None, :])
    reference = model.solve(1e-100 * u0, tokens=tokens, features=features)
    for c in (1e-160, 1e-300):
        got = model.solve(c * u0, tokens=tokens, features=features)
        assert np.abs(got - reference).max() < 1e-14, c


# -- item 17: to_csv, to_json and plot write atomically --------------------------------------
@pytest.mark.parametrize("export", ["to_csv", "to_json", "plot"])
def test_item17_an_interrupted_export_leaves_the_old_file(tmp_path, monkeypatch, export):
    """Issue 9, item 17: "to_csv, to_json and plot write in place: write atomically
    (temporary file, fsync, rename)". A write that fails at the fsync leaves the old file
    byte for byte and no temporary file; a write that succeeds replaces it whole."""
    if export == "plot":
        require("matplotlib")
    result = convergence(ContinuousTransformer.random_smooth(seed=1, layers=1), **STUDY)
    target = tmp_path / f"out.{ {'to_csv': 'csv', 'to_json': 'json', 'plot': 'png'}[export] }"
    target.write_bytes(b"old contents")

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space left on device"):
        getattr(result, export)(target)
    assert target.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    monkeypatch.undo()
    getattr(result, export)(target)
    written = target.read_bytes()
    assert written != b"old contents" and sorted(p.name for p in tmp_path.iterdir()) == [target.name]
    if export == "to_json":
        assert [row["error"] for row in json.loads(written)["table"]] == _errors(result)

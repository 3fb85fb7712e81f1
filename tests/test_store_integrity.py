"""Study store integrity: checksums, schema checks, writability, key validation, Ctrl-C and
lost Dask workers (issue 9, items 3, 9, 10, 12, 15, 16)."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from ctformer.studies import (CaseStore, CorruptRecordWarning, StudyInterrupted, WorkerLost,
                              case_key, run_cases)
from ctformer.studies.execution import RECORD_SCHEMA, record_checksum

from .conftest import require


def square_task(context, level):
    """A case with a known answer: values = level * context (a 2 x 3 array)."""
    calls = context.get("calls")
    if calls is not None:
        calls.append(level)
    return {"level": level, "values": level * np.asarray(context["base"]),
            "seconds": 0.5 * level}


BASE = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


def _cases(levels=(1, 2, 3)):
    return [(case_key({"test": "integrity", "level": n}), n) for n in levels]


def _run(store, levels=(1, 2, 3), **kwargs):
    calls = []
    records = run_cases(square_task, {"base": BASE, "calls": calls}, _cases(levels),
                        store=store, progress=False, **kwargs)
    return records, calls


def test_records_carry_schema_and_checksum(tmp_path):
    records, calls = _run(tmp_path)
    assert calls == [1, 2, 3]
    key, _ = _cases()[1]
    on_disk = json.loads((tmp_path / f"{key}.json").read_text())
    assert on_disk["schema"] == RECORD_SCHEMA
    assert on_disk["checksum"] == record_checksum(on_disk)
    assert on_disk["fields"] == {"level": ["number", []], "values": ["array", [2, 3]],
                                 "seconds": ["number", []]}
    np.testing.assert_array_equal(on_disk["values"], 2 * np.asarray(BASE))
    assert records[key] == on_disk
    # a second run reuses every record and computes nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again, calls = _run(tmp_path)
    assert calls == [] and again == records


def _rewrite(path, edit, fix_checksum):
    record = json.loads(path.read_text())
    edit(record)
    if fix_checksum:
        record["checksum"] = record_checksum(record)
    path.write_text(json.dumps(record, allow_nan=True))


def _set_value(record):
    record["values"][0][1] = 0.0177  # one number of the results edited by hand


def _drop_values(record):
    del record["values"]


def _short_values(record):
    record["values"][1] = record["values"][1][:2]


def _bad_seconds(record):
    record["seconds"] = "abc"


def _nan_value(record):
    record["values"][0][0] = float("nan")


def _no_schema(record):
    del record["schema"]


@pytest.mark.parametrize("edit, fix_checksum, reason", [
    (_set_value, False, "checksum mismatch"),
    (_drop_values, True, "field 'values' is missing"),
    (_short_values, True, "field 'values' must be an array of numbers of shape (2, 3)"),
    (_bad_seconds, True, "field 'seconds' must be of kind number"),
    (_nan_value, True, "field 'values' holds NaN or inf"),
    (_no_schema, True, "schema version None is not 2"),
])
def test_corrupt_record_is_reported_and_recomputed(tmp_path, edit, fix_checksum, reason):
    fresh, _ = _run(tmp_path)
    key, level = _cases()[1]
    path = tmp_path / f"{key}.json"
    _rewrite(path, edit, fix_checksum)
    with pytest.warns(CorruptRecordWarning) as caught:
        records, calls = _run(tmp_path)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1
    assert str(path) in messages[0] and reason in messages[0], messages[0]
    assert calls == [level]  # only the corrupt case is recomputed
    np.testing.assert_array_equal(records[key]["values"], level * np.asarray(BASE))
    assert records == fresh
    # the record was rewritten: a third run trusts it and computes nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, calls = _run(tmp_path)
    assert calls == []


def test_unreadable_record_names_the_file(tmp_path):
    _run(tmp_path)
    key, level = _cases()[0]
    path = tmp_path / f"{key}.json"
    path.write_text('{"values": [1, 2')
    with pytest.warns(CorruptRecordWarning, match="unreadable JSON") as caught:
        records, calls = _run(tmp_path)
    assert str(path) in str(caught[0].message)
    assert calls == [level] and records[key]["values"] == BASE


def test_record_of_another_case_is_not_reused(tmp_path):
    _run(tmp_path)
    (k1, _), (k2, _) = _cases()[:2]
    os.replace(tmp_path / f"{k2}.json", tmp_path / f"{k1}.json")  # level 2's record under level 1's key
    with pytest.warns(CorruptRecordWarning, match="belongs to another case"):
        records, calls = _run(tmp_path)
    assert calls == [1, 2] and records[k1]["values"] == BASE


@pytest.mark.parametrize("key", ["../x", "/etc/passwd", "a/b", "a\\b", "x.json", "", "a" * 129])
def test_invalid_keys_are_refused(tmp_path, key):
    with pytest.raises(ValueError, match="invalid case key") as info:
        run_cases(square_task, {"base": BASE}, [(key, 1)], store=tmp_path / "store",
                  progress=False)
    assert repr(key) in str(info.value)
    with pytest.raises(ValueError, match="never a path"):
        CaseStore(tmp_path).path(key)


def test_unwritable_store_is_refused_before_computing():
    # /proc refuses new files even to root, unlike a chmod 0o555 directory
    calls = []
    with pytest.raises(PermissionError, match=r"the study store '/proc' is not writable .*nothing was computed"):
        run_cases(square_task, {"base": BASE, "calls": calls}, _cases(), store="/proc",
                  progress=False)
    assert calls == []


def test_uncreatable_store_names_the_directory():
    with pytest.raises(PermissionError, match="cannot create the study store '/proc/ctformer-store'"):
        CaseStore("/proc/ctformer-store")


def test_unwritable_store_with_every_record_present_is_still_read(tmp_path, monkeypatch):
    records, _ = _run(tmp_path)

    def refuse(*args, **kwargs):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr("ctformer.studies.store.tempfile.mkstemp", refuse)
    again, calls = _run(tmp_path)  # nothing to compute: no writability needed
    assert calls == [] and again == records
    with pytest.raises(PermissionError, match="Operation not permitted"):
        _run(tmp_path, levels=(1, 2, 3, 4))


def interrupting_task(context, level):
    if level == context["stop_at"]:
        raise KeyboardInterrupt
    return square_task(context, level)


def test_ctrl_c_reports_stored_cases_and_rerun_resumes(tmp_path):
    calls = []
    context = {"base": BASE, "calls": calls, "stop_at": 3}
    with pytest.raises(StudyInterrupted) as info:
        run_cases(interrupting_task, context, _cases((1, 2, 3, 4)), store=tmp_path, progress=False)
    err = info.value
    assert isinstance(err, KeyboardInterrupt)
    assert (err.stored, err.total, err.directory) == (2, 4, str(tmp_path))
    assert str(err) == (f"interrupted: 2 of 4 cases are stored in {tmp_path}; "
                        "rerun the same command to resume")
    assert len(list(tmp_path.glob("*.json"))) == 2 and calls == [1, 2]
    context["stop_at"] = None
    calls.clear()
    records = run_cases(interrupting_task, context, _cases((1, 2, 3, 4)), store=tmp_path,
                        progress=False)
    assert calls == [3, 4]
    assert [r["values"] for r in records.values()] == [(n * np.asarray(BASE)).tolist() for n in (1, 2, 3, 4)]


def test_ctrl_c_without_store_says_nothing_was_kept():
    with pytest.raises(StudyInterrupted) as info:
        run_cases(interrupting_task, {"base": BASE, "stop_at": 2}, _cases(), progress=False)
    assert (info.value.stored, info.value.total, info.value.directory) == (1, 3, None)
    assert str(info.value) == ("interrupted: 1 of 3 cases were finished but nothing was kept "
                               "(no store); pass a store directory to keep finished cases")


def test_nonfinite_result_is_returned_but_not_stored(tmp_path):
    def task(context, level):
        return {"values": [float("nan"), 1.0]}

    with pytest.warns(RuntimeWarning, match=r"fields \['values'\] hold NaN or inf"):
        records = run_cases(task, None, _cases((1,)), store=tmp_path, progress=False)
    assert np.isnan(records[_cases((1,))[0][0]]["values"][0])
    assert list(tmp_path.glob("*.json")) == []


def test_dask_worker_lost_is_one_line_and_rerun_resumes(tmp_path):
    distributed = require("distributed")
    marker = tmp_path / "killed-once"
    store = tmp_path / "store"
    done = tmp_path / "done"
    done.mkdir()

    def dying_task(context, level):
        # the worker process dies (as if killed) on level 3, the first time only
        if level == 3 and not os.path.exists(context["marker"]):
            open(context["marker"], "w").close()
            os._exit(1)
        open(os.path.join(context["done"], f"{level}-{os.urandom(4).hex()}"), "w").close()
        return {"values": [float(level)]}

    context = {"marker": str(marker), "done": str(done)}
    cases = _cases((1, 2, 3, 4))
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=":0") as cluster, \
            distributed.Client(cluster) as client:
        with pytest.raises(WorkerLost) as info:
            run_cases(dying_task, context, cases, executor=client, store=store, progress=False)
        err = info.value
        stored = len(list(store.glob("*.json")))
        assert (err.stored, err.total, err.directory) == (stored, 4, str(store))
        assert str(err) == (f"worker lost: a Dask worker holding the model died; {stored} of 4 "
                            f"cases are stored in {store}; rerun to resume")
        assert "\n" not in str(err)
        stored_levels = [json.loads(p.read_text())["case"] for p in store.glob("*.json")]
        computed_before = sorted(p.name.split("-")[0] for p in done.iterdir())
        client.wait_for_workers(1, timeout=60)
        records = run_cases(dying_task, context, cases, executor=client, store=store, progress=False)
    assert [r["values"] for r in records.values()] == [[1.0], [2.0], [3.0], [4.0]]
    computed_after = sorted(p.name.split("-")[0] for p in done.iterdir())
    for level in stored_levels:  # a stored case is reused, never recomputed
        assert computed_after.count(str(level)) == computed_before.count(str(level)) == 1
    assert sorted(set(computed_after)) == ["1", "2", "3", "4"]


@pytest.mark.parametrize("text, reason", [
    ('{"num_attention_heads": 2,', "not valid JSON (Expecting property name enclosed in double quotes at line 1, column 27)"),
    ("[1, 2]", "expected a JSON object of BERT settings, got a JSON list"),
    (b"\xff\xfe{}", "not UTF-8 text (invalid start byte at byte 0)"),
])
def test_corrupt_hf_config_names_the_file(tmp_path, text, reason):
    safetensors = require("safetensors.numpy")
    from ctformer.bridges import from_hf_bert

    safetensors.save_file({"encoder.layer.0.output.dense.bias": np.zeros(4, dtype=np.float32)},
                          str(tmp_path / "model.safetensors"))
    config = tmp_path / "config.json"
    config.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ValueError) as info:
        from_hf_bert(tmp_path)
    assert str(info.value).startswith(f"{config}: {reason}")


def test_corrupt_safetensors_names_the_file(tmp_path):
    safetensors = require("safetensors.numpy")
    from ctformer.bridges import from_hf_bert

    path = tmp_path / "model.safetensors"
    safetensors.save_file({"encoder.layer.0.output.dense.bias": np.zeros(4, dtype=np.float32)}, str(path))
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 1, "layer_norm_eps": 1e-12,
                                                      "hidden_act": "gelu"}))
    path.write_bytes(path.read_bytes()[:-7])  # truncated download
    with pytest.raises(ValueError, match=r"not a valid \.safetensors file \(SafetensorError: ") as info:
        from_hf_bert(tmp_path)
    assert str(info.value).startswith(f"{path}: not a valid .safetensors file")
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")  # header that is not JSON
    with pytest.raises(ValueError, match=f"{path}: not a valid .safetensors file"):
        from_hf_bert(tmp_path)

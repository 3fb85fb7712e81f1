"""Audit of the store of measured choices at the machine's edges: a damaged file, a file a
newer version shares, and a directory that cannot be written.

* A file that was not JSON read as empty without a word: its choices were measured again,
  and could differ from those of every earlier run. It now warns.
* One entry of a provider this version does not know (a newer version's, in the same file:
  the file is named by the libraries, not by ctformer's version) made the whole file read as
  empty: every choice was measured again and the rewrite dropped the newer version's entries.
* Where the directory could not be written, each call measured the choice again: the FFT
  engine of one transform alternated between two calls of one process (``fftw``, ``numpy``,
  ``fftw``, ...) where the module promised a choice held for the process; and nothing said so.
"""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from ctformer._numerics import store


def _alternating(calls):
    """A measurement that chooses ``fftw`` then ``numpy`` then ``fftw`` ...: a choice measured
    twice shows."""
    count = itertools.count()

    def measure(_dtype):
        calls.append(1)
        return {"provider": ("fftw", "numpy")[next(count) % 2]}

    return measure


def test_a_damaged_file_warns_and_is_measured_again(fresh_store):
    path = store.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text('{"edges damaged float64": {"provider": "fftw", "check')  # a write cut short
    calls = []
    with pytest.warns(UserWarning, match=r"cannot read the store of measured choices .* measured again"):
        chosen = store.entry("edges damaged", "float64", _alternating(calls), "t", needs_torch=False)
    assert chosen["provider"] == "fftw" and len(calls) == 1
    assert json.loads(path.read_text())["edges damaged float64"]["provider"] == "fftw"


def test_a_file_of_another_shape_warns_that_it_is_damaged(fresh_store):
    path = store.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2, 3]")
    with pytest.warns(UserWarning, match=r"is damaged \(not a JSON object of entries\)"):
        assert store.read(path) == {}


def test_a_newer_versions_entries_are_kept_and_the_stored_choices_still_read(fresh_store):
    path = store.cache_file()
    path.parent.mkdir(parents=True)
    newer = {"provider": "cuda graphs", "checked": "a newer version's bounds"}
    path.write_text(json.dumps({"edges kept float64": {"provider": "numpy", "checked": "t"},
                                "edges newer float64": newer}))

    def never(_dtype):
        raise AssertionError("a stored choice was measured again")

    assert store.entry("edges kept", "float64", never, "t", needs_torch=False)["provider"] == "numpy"
    calls = []
    store.entry("edges other", "float64", _alternating(calls), "t", needs_torch=False)  # rewrites the file
    assert json.loads(path.read_text())["edges newer float64"] == newer
    # an entry this version cannot use is measured for it, not handed to its callers
    assert store.entry("edges newer", "float64", _alternating(calls), "a newer version's bounds",
                       needs_torch=False)["provider"] in ("fftw", "numpy")


def test_an_unwritable_store_warns_once_and_keeps_each_choice_for_the_process(fresh_store, monkeypatch):
    blocker = fresh_store / "a file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))  # mkdir fails: not a directory
    calls = []
    measure = _alternating(calls)
    with pytest.warns(UserWarning, match=r"cannot write the store .* this process only.*XDG_CACHE_HOME"):
        first = store.entry("edges unwritable", "float64", measure, "t", needs_torch=False)
    again = [store.entry("edges unwritable", "float64", measure, "t", needs_torch=False)["provider"]
             for _ in range(3)]
    assert again == [first["provider"]] * 3 and len(calls) == 1


def test_the_fft_engine_of_one_transform_holds_in_a_process_whose_store_is_unwritable(fresh_store, monkeypatch):
    blocker = fresh_store / "a file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    count = itertools.count()
    with pytest.warns(UserWarning, match="cannot write the store"):
        engines = [store.fft_engine("edges rfft (8,) axis 0", "float64", lambda: ("fftw", "numpy")[next(count) % 2])
                   for _ in range(4)]
    assert engines == ["fftw"] * 4


def test_a_verdict_measured_with_the_compiled_loops_off_is_not_read_with_them_on(fresh_store, monkeypatch):
    """One process run with ``CTFORMER_LOOP_ENGINE=numpy`` stored the few-row kernel's verdict
    "the compiled loops are off" in the machine's only store; every later process, loops on,
    read it and never used the kernel. That setting now opens its own store."""
    from ctformer._numerics import compiled, few_rows, gemm

    monkeypatch.setattr(gemm, "_PEERS_DECIDED", set())  # each store decides its products first
    few_rows._kernels.cache_clear()
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    off = store.cache_file()
    assert gemm.prepared_products(np.float64) is False
    assert "loops are off" in store.read(off)["few rows float64"]["reason"]
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "auto")
    gemm.forget_choices()
    gemm._PEERS_DECIDED.clear()
    few_rows._kernels.cache_clear()  # the process's own record of the engine, read once
    on = store.cache_file()
    assert on != off and compiled.loop_engine() == "numba"
    gemm.prepared_products(np.float64)
    assert "loops are off" not in store.read(on)["few rows float64"].get("reason", "")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")  # the same loops as auto: the same store
    assert store.cache_file() == on
    gemm.forget_choices()
    few_rows._kernels.cache_clear()

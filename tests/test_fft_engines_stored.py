"""The engine of each FFT (ctformer.fft with ``engine="auto"``) is timed once per machine and
kept in its store of measured choices (ctformer._numerics.store): a later process runs the
stored engine, bit for bit numpy.fft's or FFTW's, without timing; a damaged entry is timed again;
a pinned engine stores nothing."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ctformer._numerics import store
from ctformer.fft import PlannedFFT

from .conftest import stored_choices

_KEY = "fft engine {kind} (6, 96) axis 1 n 96 threads 1 FFTW_ESTIMATE float64"


def _data():
    return np.random.default_rng(3).standard_normal((6, 96))


def test_the_engine_is_timed_once_and_stored(fresh_store):
    x = _data()
    got = PlannedFFT(threads=1, engine="auto").rfft(x)
    np.testing.assert_allclose(got, np.fft.rfft(x), rtol=0, atol=1e-13 * np.abs(np.fft.rfft(x)).max())
    _, stored = stored_choices(fresh_store)
    entry = stored[_KEY.format(kind="rfft")]
    assert entry["provider"] in ("fftw", "numpy")
    import pyfftw

    assert entry["checked"] == f"pyfftw {pyfftw.__version__}; {PlannedFFT.ENGINE_TIMING}"


def test_a_choice_timed_before_the_fast_path_is_timed_again(fresh_store, monkeypatch):
    """An entry checked as "pyfftw <version>" alone was timed while every FFTW call still went
    through the first call's checks (which made numpy.fft look faster at 64 x 256): such a
    choice is timed again, and the new one is kept."""
    import pyfftw

    PlannedFFT(threads=1, engine="auto").rfft(_data())
    path, stored = stored_choices(fresh_store)
    stored[_KEY.format(kind="rfft")] = {"provider": "numpy", "checked": f"pyfftw {pyfftw.__version__}"}
    path.write_text(json.dumps(stored))
    timed = []
    monkeypatch.setattr(PlannedFFT, "_numpy_is_faster", lambda *a: timed.append(1) or False)
    x = _data()
    got = PlannedFFT(threads=1, engine="auto").rfft(x)
    assert timed == [1]
    np.testing.assert_array_equal(got, PlannedFFT(threads=1, engine="fftw").rfft(x))
    entry = stored_choices(fresh_store)[1][_KEY.format(kind="rfft")]
    assert entry["provider"] == "fftw" and entry["checked"].endswith(PlannedFFT.ENGINE_TIMING)


@pytest.mark.parametrize("engine", ["numpy", "fftw"])
def test_a_later_process_runs_the_stored_engine_without_timing(fresh_store, monkeypatch, engine):
    x = _data()
    PlannedFFT(threads=1, engine="auto").irfft(np.fft.rfft(x), n=96)  # stores the inverse's entry
    path, stored = stored_choices(fresh_store)
    key = _KEY.format(kind="irfft")
    stored[key]["provider"] = engine
    path.write_text(json.dumps(stored))
    monkeypatch.setattr(PlannedFFT, "_numpy_is_faster", lambda *a: pytest.fail("stored: nothing to time"))
    spectrum = np.fft.rfft(x)
    got = PlannedFFT(threads=1, engine="auto").irfft(spectrum, n=96)
    np.testing.assert_array_equal(got, PlannedFFT(threads=1, engine=engine).irfft(spectrum, n=96))
    if engine == "numpy":
        np.testing.assert_array_equal(got, np.fft.irfft(spectrum, n=96))
    np.testing.assert_allclose(got, x, rtol=0, atol=1e-14 * np.abs(x).max())


def test_a_damaged_entry_is_timed_again(fresh_store, monkeypatch):
    PlannedFFT(threads=1, engine="auto").rfft(_data())
    path, stored = stored_choices(fresh_store)
    stored[_KEY.format(kind="rfft")]["provider"] = "torch"  # not an FFT engine
    path.write_text(json.dumps(stored))
    timed = []
    monkeypatch.setattr(PlannedFFT, "_numpy_is_faster", lambda *a: timed.append(1) or True)
    got = PlannedFFT(threads=1, engine="auto").rfft(_data())
    assert timed == [1]
    np.testing.assert_array_equal(got, np.fft.rfft(_data()))  # timed "numpy is faster": numpy.fft's bits
    assert stored_choices(fresh_store)[1][_KEY.format(kind="rfft")]["provider"] == "numpy"


@pytest.mark.parametrize("engine", ["numpy", "fftw"])
def test_a_pinned_engine_stores_nothing(fresh_store, monkeypatch, engine):
    monkeypatch.setattr(store, "entry", lambda *a, **k: pytest.fail("a pinned engine is not measured"))
    x = _data()
    np.testing.assert_allclose(PlannedFFT(threads=1, engine=engine).rfft(x), np.fft.rfft(x),
                               rtol=0, atol=1e-13 * np.abs(np.fft.rfft(x)).max())

"""The engine of each FFT (ctformer.fft with ``engine="auto"``) is timed once per machine and
kept in its store of measured choices (ctformer._numerics.store): a later process runs the
stored engine, bit for bit numpy.fft's or FFTW's, without timing; a damaged entry is timed again;
a pinned engine stores nothing. The ``auto`` planner's measured FFTW plans are kept as FFTW's
wisdom in the same store: a later process plans from it, with the same bits, measuring nothing."""
from __future__ import annotations

import json

import numpy as np
import pytest

from ctformer._numerics import store
from ctformer.fft import PlannedFFT

from .conftest import stored_choices

# the default planner (auto) measures transforms of fewer than 2^18 points: FFTW_MEASURE
_KEY = "fft engine {kind} (6, 96) axis 1 n 96 threads 1 FFTW_MEASURE float64"


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


_PLAN_IN_A_PROCESS = """
import sys
import numpy as np
from ctformer.fft import PlannedFFT
first = sys.argv[1]
if first != "none":  # an explicit FFTW_MEASURE plan of rows x n first (timed in this process, not stored)
    PlannedFFT(threads=1, effort="FFTW_MEASURE", engine="fftw").rfft(np.ones(tuple(map(int, first.split("x")))))
x = np.random.default_rng(4).standard_normal((8, 200))
np.save(sys.argv[2], PlannedFFT(threads=1, engine="fftw").rfft(x))
"""


def _plan_in_a_process(root, first, out):
    import os
    import subprocess
    import sys

    env = dict(os.environ, XDG_CACHE_HOME=str(root))
    subprocess.run([sys.executable, "-c", _PLAN_IN_A_PROCESS, str(first), str(out)], env=env, check=True,
                   timeout=300)
    return np.load(out)


def _records(root):
    """The stored wisdom's records (one per line), double precision."""
    wisdom = stored_choices(root)[1]["fftw wisdom"]["wisdom"][0].splitlines()
    return wisdom[1:-1]


def test_measured_plans_are_stored_once_and_replanned_from_wisdom(fresh_store, tmp_path):
    """The first process measures the plan (8 x 200 points, below 2^18) and stores FFTW's
    wisdom; a second plans from it: the same bits, nothing new stored."""
    import pyfftw

    first = _plan_in_a_process(fresh_store, "none", tmp_path / "a.npy")
    path, stored = stored_choices(fresh_store)
    kept = stored["fftw wisdom"]
    assert kept["checked"] == f"pyfftw {pyfftw.__version__}" and len(kept["wisdom"]) == 3
    assert _records(fresh_store) and kept["wisdom"][0].startswith("(fftw-3")
    text = path.read_text()
    second = _plan_in_a_process(fresh_store, "none", tmp_path / "b.npy")
    assert np.array_equal(first, second)
    assert path.read_text() == text  # planned from the stored wisdom: nothing measured, nothing added
    x = np.random.default_rng(4).standard_normal((8, 200))
    np.testing.assert_allclose(first, np.fft.rfft(x), rtol=0, atol=1e-13 * np.abs(first).max())


def _store_alone_plans(root, shape) -> bool:
    """Whether the stored wisdom alone (this process's own set aside) plans the one-thread
    ``rfft`` of float64 ``shape`` along its last axis without measuring: FFTW's
    ``FFTW_WISDOM_ONLY`` refuses a plan unless wisdom covers every part of it."""
    import pyfftw

    texts = stored_choices(root)[1]["fftw wisdom"]["wisdom"]
    held = pyfftw.export_wisdom()
    pyfftw.forget_wisdom()
    try:
        pyfftw.import_wisdom(tuple(text.encode("ascii") for text in texts))
        source = pyfftw.empty_aligned(shape, dtype="float64", n=pyfftw.simd_alignment)
        target = pyfftw.empty_aligned((*shape[:-1], shape[-1] // 2 + 1), dtype="complex128",
                                      n=pyfftw.simd_alignment)
        pyfftw.FFTW(source, target, axes=(-1,), direction="FFTW_FORWARD",
                    flags=("FFTW_MEASURE", "FFTW_WISDOM_ONLY"), threads=1)
        return True
    except RuntimeError:  # "No FFTW wisdom is known for this plan."
        return False
    finally:
        pyfftw.forget_wisdom()
        pyfftw.import_wisdom(held)


@pytest.mark.parametrize("first", ["3x1000", "8x200"])
def test_an_explicit_measured_plan_neither_enters_the_store_nor_steers_the_auto_planner(
        fresh_store, tmp_path, first):
    """An FFTW_MEASURE plan of the user's (timed in its own process, as FFTW does) made before
    the auto planner's, of another transform (3 x 1000) or of the same one (8 x 200): the
    auto planner plans from the store alone, so the stored wisdom alone plans its transform
    (every part of it; FFTW's ``FFTW_WISDOM_ONLY`` refuses anything less), it does not plan
    the user's 3 x 1000 transform, and a later process plans from it the same bits and stores
    nothing new."""
    mixed = _plan_in_a_process(fresh_store, first, tmp_path / "a.npy")
    assert _store_alone_plans(fresh_store, (8, 200))
    assert not _store_alone_plans(fresh_store, (3, 1000))
    path = stored_choices(fresh_store)[0]
    text = path.read_text()
    assert np.array_equal(_plan_in_a_process(fresh_store, "none", tmp_path / "b.npy"), mixed)
    assert path.read_text() == text
    x = np.random.default_rng(4).standard_normal((8, 200))
    np.testing.assert_allclose(mixed, np.fft.rfft(x), rtol=0, atol=1e-13 * np.abs(mixed).max())


def test_the_auto_planner_measures_only_transforms_that_run_on_one_thread():
    """Below 2^18 points a transform always runs on one thread: measured. From 2^18 FFTW's
    threads may run it, and a threaded plan is kept only with a one-thread plan's bits, which
    two measured plans do not share: estimated. An explicit effort is used as it is."""
    auto = PlannedFFT(threads=2)
    assert auto.planner_effort == "auto"
    assert auto._effort((1 << 18) - 1) == "FFTW_MEASURE" and auto._effort(1 << 18) == "FFTW_ESTIMATE"
    assert PlannedFFT(effort="FFTW_PATIENT")._effort(1 << 20) == "FFTW_PATIENT"


@pytest.mark.parametrize("damage", ["not wisdom", "non-ASCII"])
def test_damaged_wisdom_is_measured_again(fresh_store, tmp_path, damage):
    """Text that is no wisdom, and wisdom with a non-ASCII character (a UnicodeEncodeError
    when it was planned from), are measured again."""
    _plan_in_a_process(fresh_store, "none", tmp_path / "a.npy")
    path, stored = stored_choices(fresh_store)
    wisdom = stored["fftw wisdom"]["wisdom"]
    stored["fftw wisdom"]["wisdom"] = "not wisdom" if damage == "not wisdom" else [wisdom[0] + "\u00e9", *wisdom[1:]]
    path.write_text(json.dumps(stored))
    got = _plan_in_a_process(fresh_store, "none", tmp_path / "b.npy")
    x = np.random.default_rng(4).standard_normal((8, 200))
    np.testing.assert_allclose(got, np.fft.rfft(x), rtol=0, atol=1e-13 * np.abs(got).max())
    assert _records(fresh_store)  # stored afresh


def test_plans_made_inside_a_measurement_are_stored_with_it(fresh_store):
    """A measured choice whose timing plans a transform (the store's lock held by the
    measuring thread): the plan is made from the stored wisdom without taking the lock
    again, and what it measured is stored with the choice."""
    import pyfftw

    pyfftw.forget_wisdom()  # this process's own plans of the transform, if any, measured again

    def measure(dtype):
        for n in (301, 602):  # the second planned with the first's wisdom at hand
            x = np.random.default_rng(5).standard_normal((5, n))
            got = PlannedFFT(threads=1, engine="fftw").rfft(x)
            np.testing.assert_allclose(got, np.fft.rfft(x), rtol=0, atol=1e-13 * np.abs(got).max())
        return {"provider": "numpy"}

    store.entry("planning inside a measurement", "float64", measure, needs_torch=False)
    stored = stored_choices(fresh_store)[1]
    assert stored["planning inside a measurement float64"]["provider"] == "numpy"
    assert _store_alone_plans(fresh_store, (5, 301)) and _store_alone_plans(fresh_store, (5, 602))


_PLAN_IN_THREADS = """
import threading
import numpy as np
from ctformer.fft import PlannedFFT
wrong = []

def measured(i):  # the auto planner: measured plans, the process's wisdom set aside meanwhile
    for n in range(100 + 7 * i, 120 + 7 * i):
        x = np.random.default_rng(n).standard_normal((4, n))
        if not np.allclose(PlannedFFT(threads=1).rfft(x), np.fft.rfft(x), rtol=0, atol=1e-12):
            wrong.append(n)

def estimated(i):  # explicit estimated plans and pyFFTW's interfaces, planning meanwhile
    for n in range(3000 + 11 * i, 3030 + 11 * i):
        x = np.random.default_rng(n).standard_normal((3, n))
        fft = PlannedFFT(threads=1, effort="FFTW_ESTIMATE", engine="fftw")
        if not (np.allclose(fft.rfft(x), np.fft.rfft(x), rtol=0, atol=1e-11)
                and np.allclose(fft.fft(x + 0j), np.fft.fft(x), rtol=0, atol=1e-11)):
            wrong.append(n)

threads = [threading.Thread(target=f, args=(i,)) for i in range(3) for f in (measured, estimated)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(len(wrong), "wrong")
"""


def test_plans_made_on_many_threads_at_once(fresh_store):
    """FFTW's planner and wisdom are not thread-safe: the auto planner sets the process's
    wisdom aside while explicit plans and pyFFTW's interfaces plan on other threads. Every
    transform equals numpy.fft's, and the process ends normally (without the planner's lock
    it aborted with a corrupted heap or a floating-point exception, three runs of three)."""
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _PLAN_IN_THREADS], env=dict(os.environ, XDG_CACHE_HOME=str(fresh_store)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "wrong"]

"""A large transform's plan and engine depend on where it is called (one FFTW thread inside
the library's worker tasks), never on which call came first in the process.

Before: the plan cache and the fast path of repeated calls were keyed without the FFTW thread
count, so a transform of 2^18 points or more first called inside a worker kept that call's
one-thread engine for every later call from outside, and the reverse: the same call gave the
bits of ``numpy.fft`` or of FFTW depending on the process's history. The reference is the same
call made first in a fresh ``PlannedFFT``.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import _fftw_shared

pytest.importorskip("pyfftw")
from ctformer.fft import PlannedFFT  # noqa: E402

POINTS = 1 << 18


@pytest.fixture
def context(monkeypatch):
    """Two workers, and a switch for "inside a worker task"; the engine of a one-thread plan is
    numpy.fft, of a threaded one FFTW (as a machine may measure them)."""
    inside = [False]
    monkeypatch.setattr(_fftw_shared, "_WORKERS", (lambda: 2, lambda: inside[0]))
    monkeypatch.setattr(PlannedFFT, "_stored_engine",
                        lambda self, entry, transform: "numpy" if transform[-1] == 1 else "fftw")
    return inside


def _fresh(x, inside, where, kind):
    inside[0] = where
    fft = PlannedFFT(threads=2, engine="auto")
    return getattr(fft, kind)(x)


@pytest.mark.parametrize("kind", ["rfft", "irfft"])
@pytest.mark.parametrize("first", [True, False])
def test_a_large_transform_follows_its_calling_context_not_the_first_call(context, kind, first):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(POINTS) if kind == "rfft" else \
        rng.standard_normal(POINTS // 2 + 1) + 1j * rng.standard_normal(POINTS // 2 + 1)
    expected = {where: _fresh(x, context, where, kind) for where in (True, False)}
    fft = PlannedFFT(threads=2, engine="auto")
    for where in (first, not first, first, not first):  # first call, then alternating, twice
        context[0] = where
        assert np.array_equal(getattr(fft, kind)(x), expected[where]), where
    reference = np.fft.rfft(x) if kind == "rfft" else np.fft.irfft(x)
    assert np.allclose(expected[True], reference, rtol=0, atol=1e-9 * np.abs(reference).max())
    assert np.allclose(expected[False], reference, rtol=0, atol=1e-9 * np.abs(reference).max())

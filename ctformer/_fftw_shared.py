"""What every FFTW plan of a process shares: the planner settings, the lock around FFTW's
planner and wisdom, the hooks through which the layers above give the worker count and keep
the measured choices, and the two checks a plan is chosen by (the same bits on FFTW's threads
as on one, and which engine is faster).

FFTW's planner and its wisdom are one per process and not thread-safe, and FFTW's threads do
not survive a fork; :class:`ctformer.fft.PlannedFFT` reads all of this from here.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np

from .environment import _ENCODED, positive_int

__all__ = ["PLANNER_LOCK", "SETTINGS", "fft_engine", "fft_threads", "planner_effort", "raw_settings", "same_bits",
           "settings", "use_engine_store", "use_wisdom_store", "use_workers"]

_EFFORTS = ("FFTW_ESTIMATE", "FFTW_MEASURE", "FFTW_PATIENT", "FFTW_EXHAUSTIVE")
# the planner settings: FFTW's efforts, or "auto" (one-thread plans measured once per machine)
_PLANNERS = ("auto",) + _EFFORTS
_ENGINES = ("auto", "fftw", "numpy")


def planner_effort() -> str:
    """``CTFORMER_FFTW_PLANNER`` (default ``auto``), validated; in any case, as the library's
    other settings (``fftw_measure`` is ``FFTW_MEASURE``, ``AUTO`` is ``auto``)."""
    raw = os.environ.get("CTFORMER_FFTW_PLANNER", "auto")
    effort = raw.strip().upper() or "AUTO"
    effort = "auto" if effort == "AUTO" else effort
    if effort not in _PLANNERS:
        raise ValueError(f"CTFORMER_FFTW_PLANNER must be one of {', '.join(_PLANNERS)}, got {raw.strip()!r}")
    return effort


def fft_engine() -> str:
    """``CTFORMER_FFT_ENGINE`` (default ``auto``), validated."""
    engine = os.environ.get("CTFORMER_FFT_ENGINE", "auto").strip().lower() or "auto"
    if engine not in _ENGINES:
        raise ValueError(f"CTFORMER_FFT_ENGINE must be one of {', '.join(_ENGINES)}, got {engine!r}")
    return engine


# The library's worker count and whether this thread runs a worker task, as two functions:
# given by ctformer._numerics.threads (a layer above this module) when it is imported, which
# every operator imports; one thread until then.
_WORKERS = (lambda: 1, lambda: False)


# Forks this process descends from. FFTW's threads do not survive a fork: in a forked child a
# threaded plan waits forever for them (measured: a hang), so a child plans on one thread.
_FORKS = [0]


def _forked() -> None:
    _FORKS[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


def use_workers(count, inside_worker) -> None:
    """Set the functions that give the library's worker count and whether the calling thread
    runs a worker task (:mod:`ctformer._numerics.threads` calls this when it is imported)."""
    global _WORKERS
    _WORKERS = (count, inside_worker)


# Who keeps the engine chosen for a transform: ``remember(signature, dtype name, time_it)``
# returns "fftw" or "numpy", calling ``time_it()`` (the same answer) only where nothing is
# stored. Given by ctformer._numerics.store (a layer above this module) when it is imported,
# which every operator imports; until then each process times its own.
_ENGINES_STORE = [lambda signature, dtype, time_it: time_it()]


def use_engine_store(remember) -> None:
    """Set the function that keeps each transform's engine (:mod:`ctformer._numerics.store`
    calls this when it is imported)."""
    _ENGINES_STORE[0] = remember


# FFTW's planner and its wisdom are one per process and not thread-safe: every plan this
# module makes, and every change of the process's wisdom around one, holds this lock (pyFFTW's
# own lock covers the planning, not the wisdom). The store takes it after its own lock.
PLANNER_LOCK = threading.Lock()


def _planned(make):
    with PLANNER_LOCK:
        return make()


# Who keeps FFTW's wisdom (the measured plans): ``with_wisdom(make)`` loads the machine's
# stored wisdom, calls ``make()`` (which plans, measuring only what the wisdom lacks) and
# stores what it added, all under the store's lock and then PLANNER_LOCK. Given by
# ctformer._numerics.store, like the engines' store; until then each process measures its own
# plans.
_WISDOM_STORE = [_planned]


def use_wisdom_store(with_wisdom) -> None:
    """Set the function that plans with the machine's stored FFTW wisdom
    (:mod:`ctformer._numerics.store` calls this when it is imported)."""
    _WISDOM_STORE[0] = with_wisdom


#: Most FFTW threads a plan may ask for: FFTW takes the count as a C ``int`` (pyFFTW raised an
#: OverflowError from inside the planner for ``CTFORMER_FFT_THREADS=2147483648``).
MAX_FFT_THREADS = 2**31 - 1


#: The environment variables of the FFT settings: read at every call (:func:`raw_settings`)
#: by a :class:`ctformer.fft.PlannedFFT` that was not given its own.
SETTINGS = ("CTFORMER_FFT_THREADS", "CTFORMER_FFTW_PLANNER", "CTFORMER_FFT_ENGINE")
_ENCODED_SETTINGS = tuple(name.encode() for name in SETTINGS)


def _settings_reader():
    """:func:`raw_settings`: on POSIX CPython three lookups in ``os.environ``'s own dict of
    encoded variables, the names bound once (0.27 us a call on a loaded AMD EPYC)."""
    if _ENCODED is None:
        return lambda: tuple(os.environ.get(name) for name in SETTINGS)
    get, (threads, planner, engine) = _ENCODED.get, _ENCODED_SETTINGS

    def raw_settings() -> tuple:
        """The raw values of :data:`SETTINGS` (None where unset), cheap enough for every call:
        what a plan was chosen under, so that a setting changed between two calls takes
        effect at the next one instead of being hidden behind the plans of the first."""
        return get(threads), get(planner), get(engine)

    return raw_settings


raw_settings = _settings_reader()


def settings(threads, effort, engine) -> tuple:
    """``(threads, effort, engine)``: those given (not None), the others read from their
    variables and validated (:func:`fft_threads`, :func:`planner_effort`, :func:`fft_engine`).

    Raises
    ------
    ValueError
        If a variable read holds a value it does not take (naming it and those it takes).
    """
    return (fft_threads() if threads is None else threads, planner_effort() if effort is None else effort,
            fft_engine() if engine is None else engine)


def fft_threads() -> int | None:
    """``CTFORMER_FFT_THREADS``, validated (1 to :data:`MAX_FFT_THREADS`); None when unset (the
    library's worker count, :func:`ctformer._numerics.threads.num_threads`, read when a plan is
    made)."""
    return positive_int("CTFORMER_FFT_THREADS", maximum=MAX_FFT_THREADS)


def same_bits(threaded, single, source) -> bool:
    """Whether the plans ``threaded`` and ``single`` (the same transform, from ``source``, the
    threaded plan's input) give the same bits on random data; ``source`` is left filled."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal(source.shape)
    if source.dtype.kind == "c":
        data = data + 1j * rng.standard_normal(source.shape)
    data = data.astype(source.dtype)
    results = []
    for plan in (threaded, single):
        plan.input_array[...] = data  # c2r plans destroy their input: filled afresh each time
        plan.execute()
        results.append(np.array(plan.output_array))
    return np.array_equal(*results)


def _best_times(first, second, calls=5, seconds=0.004) -> tuple:
    """The fastest of at least ``calls`` calls of each of ``first`` and ``second``, called in
    turn until ``seconds`` have passed (so that transforms of a few microseconds are compared
    on many calls, and a machine whose speed drifts slows both alike)."""
    first(), second()  # first calls: caches, page faults
    best, spent, done = [float("inf")] * 2, 0.0, 0
    while done < calls or spent < seconds:
        for index, call in enumerate((first, second) if done % 2 == 0 else (second, first)):
            side = index if done % 2 == 0 else 1 - index
            start = time.perf_counter()
            call()
            elapsed = time.perf_counter() - start
            best[side], spent = min(best[side], elapsed), spent + elapsed
        done += 1
    return best[0], best[1]

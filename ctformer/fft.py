"""Planned FFTs on the CPU: pyFFTW plans executed on the caller's arrays, with a plan cache.

:class:`PlannedFFT` is the ``fft`` of the NumPy backend (:attr:`ctformer.backend.Backend.fft`):
``scipy.fft``-style functions, of which the two used inside time steps, ``rfft`` and ``irfft``
(FFT convolution kernels, the mean-field flux), run cached :class:`pyfftw.FFTW` plans directly:

* one plan per (transform, shape, dtype, axis, n), made once with the planner effort
  ``CTFORMER_FFTW_PLANNER`` and kept in a small LRU cache. The three settings
  (``CTFORMER_FFTW_PLANNER``, ``CTFORMER_FFT_ENGINE``, ``CTFORMER_FFT_THREADS``) not given
  to the constructor are read at every call: a change drops the plans made before it. The
  default, ``auto``, measures (``FFTW_MEASURE``) the plans of transforms of fewer than
  ``2**18`` points in all, which always run on one thread, once per machine: FFTW's wisdom
  for them is kept with the library's other measured choices
  (:func:`ctformer._numerics.store.with_fftw_wisdom`), so later processes plan from it in
  microseconds, with the same plan and the same bits, and measure only transforms it lacks
  (0.15-0.4 s each for 64 rows of 256-2048 points). Larger
  transforms, which FFTW's threads may run, get ``FFTW_ESTIMATE`` plans (below). On an AMD
  EPYC (family 23, model 49) the measured plans made FFT convolutions of 64 rows of 256-2048
  points 0.63-0.71 of ``numpy.fft``'s time, against 0.76-1.05 with estimated ones. An
  explicit ``FFTW_ESTIMATE``, ``FFTW_MEASURE``, ``FFTW_PATIENT`` or ``FFTW_EXHAUSTIVE`` is
  used for every plan; the measuring ones are then timed in each process, as FFTW does, and
  not stored. FFTW's own rule applies to them within a process: a plan of any effort uses
  the wisdom the process holds for its transform, so an estimated plan made after a measured
  one of the same transform is the measured plan. The ``auto`` planner's measured plans come
  from the stored wisdom alone (the process's own is set aside while they are made), so
  explicit plans never steer them;
* each call executes the plan on new arrays (``update_arrays`` + ``execute``): a C-contiguous,
  16-byte aligned input of the plan's dtype (any NumPy array of that kind) is read in place,
  any other input is copied once into the plan's own aligned buffer; the output is a fresh
  array (``numpy.empty``: 16-byte aligned, as FFTW's SIMD codelets need; ``pyfftw.empty_aligned``
  costs 10 us a call), so results of earlier calls are never overwritten;
* ``irfft`` always copies its input first (complex-to-real transforms destroy their input)
  and scales by ``1/n`` in place;
* transforms of at least ``2**18`` points in all run on ``CTFORMER_FFT_THREADS`` FFTW
  threads, by default the library's worker count (:func:`ctformer._numerics.threads.num_threads`:
  ``CTFORMER_NUM_THREADS``, else the BLAS library's thread count), read when the transform's
  plan is made; smaller ones, and those called inside the library's worker tasks, on one
  thread (threads cost more than they give there), and so do all transforms in a process
  forked from another (FFTW's threads do not survive a fork: a threaded plan made before it
  waited forever in the child; the child's copy of a :class:`PlannedFFT` drops the parent's
  plans at its first call). A threaded plan is kept only where it gives
  the bits of a one-thread plan of the same transform (checked once, on random data, when it
  is made; otherwise the one-thread plan runs), so the thread count never changes a result of
  a pinned engine. On an AMD EPYC (family 26, model 2), FFT convolutions of 64 rows of
  8192-65536 points took 0.44-0.71 of ``numpy.fft``'s time on two threads (``numpy.fft`` has
  none) and 0.83-0.99 on one;
* each plan has a lock, so threads may share the object; plans are made one at a time
  (:data:`PLANNER_LOCK`, which the interface transforms below hold too): FFTW's planner and
  its wisdom are one per process and not thread-safe;
* the engine of each (transform, shape, dtype, axis, n) is chosen when its plan is made:
  with ``CTFORMER_FFT_ENGINE=auto`` (the default) the FFTW plan and ``numpy.fft`` (pocketfft)
  are each timed on the plan's buffers (best of at least five calls each, in turn, and 4 ms)
  and the faster one is kept, so a transform is never slower than ``numpy.fft`` and FFTW is
  used where its plans pay (long or batched transforms, ``FFTW_MEASURE``, threads). The
  timing happens once per machine: the answer is stored with the library's other measured
  choices (:func:`ctformer._numerics.store.fft_engine`, keyed by the transform, its FFTW
  threads and the planner effort), so a machine runs each transform on the same engine run
  after run. ``fftw`` or ``numpy`` pins the engine. The two engines agree to rounding (1e-15
  relative), not bit for bit: where two machines must give the same bits, pin the engine
  and, for ``fftw``, ``FFTW_ESTIMATE`` (measured plans are each machine's own).
  FFTW's threads speed its plans and not ``numpy.fft``, so a transform of at least 2^18
  points may run on different engines, and differ in the last bits, at different thread
  counts; pin the engine where that matters.

Going through ``pyfftw.interfaces`` instead re-validates arguments, re-plans or copies on
every call and was 1.2-2.3x slower than ``numpy.fft``; executing the plan directly removes that
overhead. Every other function (``fft``, ``ifft``, ``dct``, ...) goes through
``pyfftw.interfaces.scipy_fft`` with its own plan cache. Results equal ``numpy.fft`` to
rounding (1e-13 relative in float64).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from . import _fftw_shared as _shared
from ._fftw_shared import (_ENGINES, _FORKS, _PLANNERS, MAX_FFT_THREADS, PLANNER_LOCK, _best_times, _planned,
                           fft_engine, fft_threads, planner_effort, raw_settings, same_bits, settings,
                           use_engine_store, use_wisdom_store, use_workers)
from .validation import integer, one_of

__all__ = ["PLANNER_LOCK", "PlannedFFT", "fft_engine", "fft_threads", "planner_effort", "use_engine_store",
           "use_wisdom_store", "use_workers"]

# Transforms with fewer points (all rows together) than this run on one thread.
_THREADED_MIN_POINTS = 1 << 18
# Plans kept (each holds aligned buffers of its transform's size).
_MAX_PLANS = 64


class PlannedFFT:
    """``scipy.fft``-style functions backed by pyFFTW (see the module docstring).

    Parameters
    ----------
    threads : int, optional
        Threads for large transforms, a positive integer; default ``CTFORMER_FFT_THREADS``,
        else the library's worker count when each plan is made.
    effort : str, optional
        FFTW planner effort, or ``"auto"``: plans on one thread ``FFTW_MEASURE``, measured
        once per machine and stored (FFTW's wisdom), threaded plans ``FFTW_ESTIMATE``;
        default ``CTFORMER_FFTW_PLANNER`` (``auto``).
    engine : {"auto", "fftw", "numpy"}, optional
        Who runs ``rfft`` / ``irfft``: the faster of the two, timed once per plan (``auto``),
        or always FFTW or ``numpy.fft``; default ``CTFORMER_FFT_ENGINE`` (``auto``). Variables
        are read at every call; a change drops the plans made under the old values.
    """

    def __init__(self, threads: int | None = None, effort: str | None = None,
                 engine: str | None = None):
        import pyfftw
        import pyfftw.interfaces.cache
        import pyfftw.interfaces.scipy_fft as pfft

        pyfftw.interfaces.cache.enable()
        pyfftw.interfaces.cache.set_keepalive_time(60.0)
        self._pyfftw = pyfftw
        self._interfaces = pfft
        # None: the variable's, read at every call; threads 0 or -1 were read as 1 (C int: < 2**31)
        self._given = (None if threads is None else integer(threads, "threads", maximum=MAX_FFT_THREADS),
                       None if effort is None else one_of(effort, "effort", _PLANNERS),
                       None if engine is None else one_of(engine, "engine", _ENGINES))
        self._alignment = pyfftw.simd_alignment
        self._forget()

    def __repr__(self) -> str:
        return (f"PlannedFFT(threads={self.threads}, effort={self.planner_effort!r}, "
                f"engine={self.engine!r})")

    # -- planned real transforms ---------------------------------------------------------------
    def _forget(self):
        """Drop every plan (new locks), read the settings not given: at creation, in a forked
        child (the parent's threaded plans waited forever for FFTW threads the fork did not
        copy), when a setting changed (the first call's plans served every later call)."""
        raw = raw_settings()
        self.threads, self.planner_effort, self.engine = settings(*self._given)
        self._raw = raw
        self._plans: OrderedDict = OrderedDict()
        self._ready: dict = {}  # (kind, type, shape, dtype, axis, n) of a call -> its plan entry
        self._lock = threading.Lock()
        self._forks = _FORKS[0]

    def rfft(self, x, n=None, axis=-1):
        """Real-to-complex FFT along ``axis`` (``scipy.fft.rfft`` / ``numpy.fft.rfft`` semantics).

        float32 and float64 input (of either byte order) gives complex64 and complex128; every
        other real dtype (float16, longdouble, integers) is computed in float64, on every call."""
        if self._forks != _FORKS[0] or self._raw != raw_settings():
            self._forget()
        # a call seen before (same array kind, shape, dtype, axis, n) skips the checks; the
        # types of axis and n are part of it: 1.0 == 1, but only the int is an axis
        ready = self._ready.get(("rfft", type(x), getattr(x, "shape", None), getattr(x, "dtype", None), axis, n,
                                 type(axis), type(n)))
        if ready is None:
            return self._rfft_first(x, n, axis)
        entry, axis = ready
        return self._run_rfft(entry, x, axis)

    def _rfft_first(self, x, n, axis):
        call = ("rfft", type(x), getattr(x, "shape", None), getattr(x, "dtype", None), axis, n, type(axis), type(n))
        given = x
        x = _native(np.asarray(x))
        if x.dtype.char not in "fd":
            if x.dtype.kind == "c":
                raise TypeError(f"rfft needs real input, got dtype {x.dtype}")
            x = x.astype(np.float64)
        axis = _axis(axis, x.ndim)
        if n is not None:
            x = _fit(x, _length(n), axis)
        if x.shape[axis] < 1:
            raise ValueError(f"rfft needs at least one point along axis {axis}, got shape {x.shape}")
        if x.size == 0:  # no transforms to run (FFTW plans need at least one)
            return np.fft.rfft(x, axis=axis)
        entry = self._plan("rfft", x.shape, x.dtype, axis, x.shape[axis])
        if x is given and n is None:  # only unconverted ndarray calls without padding repeat
            self._remember(call, (entry, axis), x.size)
        return self._run_rfft(entry, x, axis)

    def _run_rfft(self, entry, x, axis):
        plan, buffer, lock = entry
        if plan is None:
            return np.fft.rfft(x, axis=axis)
        with lock:
            out = np.empty(plan.output_shape, dtype=plan.output_dtype)
            try:  # read in place (r2c plans preserve their input); pyFFTW checks the alignment
                if not x.flags.c_contiguous:
                    raise ValueError("strided input")
                plan.update_arrays(x, out)
            except ValueError:
                np.copyto(buffer, x)
                out = self._output(plan, buffer, out)
            plan.execute()
        return out

    def irfft(self, x, n=None, axis=-1):
        """Complex-to-real inverse FFT along ``axis`` (``scipy.fft.irfft`` semantics, 1/n scaling).

        complex64 (or float32) input gives float32, every other dtype float64, on every call."""
        if self._forks != _FORKS[0] or self._raw != raw_settings():
            self._forget()
        ready = self._ready.get(("irfft", type(x), getattr(x, "shape", None), getattr(x, "dtype", None), axis, n,
                                 type(axis), type(n)))
        if ready is None:
            return self._irfft_first(x, n, axis)
        entry, axis, n = ready
        return self._run_irfft(entry, x, axis, n)

    def _irfft_first(self, x, n, axis):
        call = ("irfft", type(x), getattr(x, "shape", None), getattr(x, "dtype", None), axis, n, type(axis), type(n))
        given = x
        x = _native(np.asarray(x))
        if x.dtype.char not in "FD":
            x = x.astype(np.complex64 if x.dtype.char == "f" else np.complex128)
        axis = _axis(axis, x.ndim)
        n = 2 * (x.shape[axis] - 1) if n is None else _length(n)
        if n < 1:
            raise ValueError(f"irfft needs n >= 1, got n = {n}")
        fitted = _fit(x, n // 2 + 1, axis)
        if fitted.size == 0:
            return np.fft.irfft(fitted, n=n, axis=axis)
        real = np.float32 if x.dtype == np.complex64 else np.float64
        shape = x.shape[:axis] + (n,) + x.shape[axis + 1:]
        entry = self._plan("irfft", shape, np.dtype(real), axis, n)
        if fitted is given:  # unconverted ndarray calls of the plan's length repeat
            self._remember(call, (entry, axis, n), int(np.prod(shape)))
        return self._run_irfft(entry, fitted, axis, n)

    def _run_irfft(self, entry, x, axis, n):
        plan, buffer, lock = entry
        if plan is None:
            return np.fft.irfft(x, n=n, axis=axis)
        with lock:
            # c2r transforms destroy their input, so it is copied (never the caller's), and the
            # 1/n of the inverse is applied in that copy: one pass fewer over the result
            np.multiply(x, buffer.real.dtype.type(1.0 / n), out=buffer)
            out = self._output(plan, buffer, np.empty(plan.output_shape, dtype=plan.output_dtype))
            plan.execute()
        return out

    def _remember(self, call, ready, points):
        if points >= _THREADED_MIN_POINTS:  # its plan depends on the calling context: looked up
            return                          # by _plan at each call (a few us on a large transform)
        with self._lock:
            if len(self._ready) >= 4 * _MAX_PLANS:
                self._ready.clear()
            self._ready[call] = ready

    # -- everything else -----------------------------------------------------------------------
    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        func = getattr(self._interfaces, name)

        def call(*args, **kwargs):
            if self._forks != _FORKS[0] or self._raw != raw_settings():
                self._forget()
            kwargs.setdefault("workers", 1 if _FORKS[0] else self.threads or 1)
            with PLANNER_LOCK:  # pyFFTW's interfaces may plan, and read the process's wisdom
                return func(*args, **kwargs)

        call.__name__ = name
        return call

    # -- plans ---------------------------------------------------------------------------------
    def _output(self, plan, source, out):
        """Point ``plan`` at ``source`` and a fresh output (NumPy's own, else an aligned one)."""
        try:
            plan.update_arrays(source, out)
        except ValueError:  # an output of unusual alignment (NumPy's are 16-byte aligned)
            out = self._empty(plan.output_shape, plan.output_dtype)
            plan.update_arrays(source, out)
        return out

    def _stored_engine(self, entry, transform) -> str:
        """``"fftw"`` or ``"numpy"``: the faster engine of the ``transform`` ``(kind, real
        shape, real dtype name, axis, n, FFTW threads)`` of the plan ``entry`` on this machine,
        timed once (:meth:`_numpy_is_faster`) and kept in its store of measured choices."""
        kind, shape, dtype, axis, n, threads = transform
        signature = f"{kind} {tuple(shape)} axis {axis} n {n} threads {threads} {self._effort(int(np.prod(shape)))}"
        return _shared._ENGINES_STORE[0](signature, dtype,
                                 lambda: "numpy" if self._numpy_is_faster(kind, entry, axis, n) else "fftw")

    #: What an engine's stored timing measured (the store's ``checked``, with pyFFTW's
    #: version): a choice timed otherwise is timed again. Choices stored before repeated calls
    #: took their fast path had timed FFTW with every call's checks and plan lookup, which
    #: favoured numpy.fft at 64 x 256 and 64 x 512 (0.72 and 0.67 of its time in fact, AMD
    #: EPYC, family 23 model 49).
    ENGINE_TIMING = "a repeated call of each engine, FFTW through its fast path"

    def _numpy_is_faster(self, kind, entry, axis, n) -> bool:
        """Time the plan as a call runs it (a fresh output, the input copied where its
        alignment needs it, irfft's scaling) against ``numpy.fft`` on the same data: is numpy
        faster? (Timing the bare ``execute`` on the plan's own warm arrays favoured FFTW.)"""
        buffer = entry[1]
        buffer[...] = 0.5  # any finite data: the time of an FFT does not depend on the values
        source = np.array(buffer)  # an ordinary NumPy array, as callers pass
        if kind == "rfft":
            fftw_time, numpy_time = _best_times(lambda: self._run_rfft(entry, source, axis),
                                                lambda: np.fft.rfft(source, axis=axis))
        else:
            fftw_time, numpy_time = _best_times(lambda: self._run_irfft(entry, source, axis, n),
                                                lambda: np.fft.irfft(source, n=n, axis=axis))
        return numpy_time < fftw_time

    def _empty(self, shape, dtype):
        return self._pyfftw.empty_aligned(shape, dtype=dtype, n=self._alignment)

    def _plan(self, kind, real_shape, real_dtype, axis, n):
        """(plan, its aligned input buffer, its lock) for a transform, made once; the plan is
        None where ``numpy.fft`` runs the transform (the faster engine, or the pinned one)."""
        # the FFTW threads in the key: inside a worker task a large transform has its own plan
        # and engine (keyed without them, the first call's context served every later one)
        threads = self._threads(int(np.prod(real_shape)))
        key = (kind, real_shape, np.dtype(real_dtype).str, axis, n, threads, self.planner_effort, self.engine)
        with self._lock:
            entry = self._plans.get(key)
            if entry is not None:
                self._plans.move_to_end(key)
                return entry
        complex_dtype = np.complex64 if np.dtype(real_dtype) == np.float32 else np.complex128
        complex_shape = real_shape[:axis] + (n // 2 + 1,) + real_shape[axis + 1:]
        real = self._empty(real_shape, real_dtype)
        spectrum = self._empty(complex_shape, complex_dtype)
        source, target = (real, spectrum) if kind == "rfft" else (spectrum, real)
        plan = self._fftw(kind, source, target, axis, threads)
        if threads > 1 and not same_bits(plan, self._fftw(kind, self._empty(source.shape, source.dtype),
                                                          self._empty(target.shape, target.dtype), axis, 1), source):
            plan, threads = self._fftw(kind, source, target, axis, 1), 1
        entry = (plan, source, threading.Lock())
        if self.engine == "numpy" or (self.engine == "auto" and self._stored_engine(
                entry, (kind, real_shape, np.dtype(real_dtype).name, axis, n, threads)) == "numpy"):
            entry = (None, None, None)
        with self._lock:
            entry = self._plans.setdefault(key, entry)
            while len(self._plans) > _MAX_PLANS:
                self._plans.popitem(last=False)
                self._ready.clear()  # calls may point at the evicted plan
        return entry

    def _threads(self, points: int) -> int:
        """FFTW threads of a plan of ``points`` points in all (module docstring)."""
        count, inside_worker = _shared._WORKERS
        if points < _THREADED_MIN_POINTS or inside_worker() or _FORKS[0]:
            return 1
        return self.threads if self.threads is not None else count()

    def _effort(self, points: int) -> str:
        """FFTW's planner effort for a transform of ``points`` points in all: ``auto`` measures
        those of fewer than ``_THREADED_MIN_POINTS``, which always run on one thread, and
        estimates the larger ones, which FFTW's threads may run: a threaded plan is kept only
        where it gives the bits of a one-thread plan, and a measured threaded plan and a
        measured one-thread plan choose apart."""
        if self.planner_effort != "auto":
            return self.planner_effort
        return "FFTW_MEASURE" if points < _THREADED_MIN_POINTS else "FFTW_ESTIMATE"

    def _fftw(self, kind, source, target, axis, threads):
        """An FFTW plan from ``source`` to ``target`` (c2r plans may destroy their input);
        one the ``auto`` planner measures comes from the machine's stored wisdom, measured and
        stored where it lacks the transform (:func:`use_wisdom_store`). Measuring overwrites
        ``source``."""
        effort = self._effort(source.size if kind == "rfft" else target.size)
        flags = (effort,) if kind == "rfft" else (effort, "FFTW_DESTROY_INPUT")
        direction = "FFTW_FORWARD" if kind == "rfft" else "FFTW_BACKWARD"

        def make():
            return self._pyfftw.FFTW(source, target, axes=(axis,), direction=direction, flags=flags,
                                     threads=threads)

        measured_once = self.planner_effort == "auto" and effort != "FFTW_ESTIMATE"
        return _shared._WISDOM_STORE[0](make) if measured_once else _planned(make)


def _native(x):
    """``x`` in the machine's byte order (a big-endian float32 array from a file stays float32)."""
    return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))


def _axis(axis, ndim):
    if ndim == 0:
        raise ValueError("FFT input must have at least one axis")
    axis = integer(axis, "axis", minimum=None)  # 0.0 is no axis: a TypeError naming it
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for an array with {ndim} axes")
    return axis % ndim


def _length(n):
    return integer(n, "n")


def _fit(x, length, axis):
    """Truncate or zero-pad ``x`` along ``axis`` to ``length`` (numpy.fft semantics)."""
    have = x.shape[axis]
    if have == length:
        return x
    if have > length:
        index = [slice(None)] * x.ndim
        index[axis] = slice(0, length)
        return x[tuple(index)]
    shape = list(x.shape)
    shape[axis] = length
    padded = np.zeros(shape, dtype=x.dtype)
    index = [slice(None)] * x.ndim
    index[axis] = slice(0, have)
    padded[tuple(index)] = x
    return padded

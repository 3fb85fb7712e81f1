r"""Fused loops compiled by Numba for the NumPy path (optional; NumPy stays the reference).

A NumPy expression such as ``exp(s - max(s))`` or the erfc approximation inside GELU is a
sequence of passes, each reading and writing the whole block; these kernels do the same
arithmetic in one pass per element, in SIMD registers. Two pieces make that possible:

* an exponential that the compiler can vectorize. With :math:`k = \mathrm{round}(x/\ln 2)`
  and :math:`r = x - k \ln 2` (Cody-Waite: :math:`\ln 2` split into a head and a tail so that
  :math:`k \ln 2_{\mathrm{head}}` is exact), :math:`e^x = 2^k e^r`, :math:`|r| \le \ln 2 / 2`.
  :math:`e^r` is a polynomial (Taylor, degree 13 in float64; Cephes-style minimax, degree 7
  in float32), :math:`2^k` is built from its bits, and :math:`k` is read from the low bits of
  :math:`x/\ln 2 + 1.5 \cdot 2^{52}` (no float-to-integer conversion, which AVX2 lacks for
  64-bit integers). Relative error at most one ulp in float64 and 1.5 ulp in float32 over the
  whole range (tested against 50-digit arithmetic); results below the smallest normal number
  (:math:`x < -707.7` in float64, :math:`-86.6` in float32) are flushed to zero, above
  :math:`\ln(\text{max})` they are ``inf``, and NaN stays NaN;
* per-row kernels: the numerator of quadrature attention,
  :math:`p_{ij} = \exp(s_{ij} + \log w_j - \max_l (s_{il} + \log w_l))`, with the causal mask
  applied by the loop bounds, and its row sums :math:`\sum_j p_{ij}` (accumulated in float64, in SIMD lanes);
  the activations of :mod:`ctformer.operators.activations` with the same formulas as its
  NumPy path (float64 GELU by :mod:`ctformer._numerics.normal_tail`).

``CTFORMER_LOOP_ENGINE`` chooses: ``auto`` (the default: Numba when it is installed, else
NumPy), ``numba`` (required: an ImportError if it is missing) or ``numpy``. The two engines
agree to rounding (a few ulps), not bit for bit. Each kernel is compiled on first use (a few
seconds for all of them, the first time on a machine; then loaded from Numba's cache in
``__pycache__``, a fraction of a second) and releases the GIL, so the callers' worker threads
run it in parallel; results never depend on the thread count. The kernels live in
:mod:`ctformer._numerics.loops`, imported (with Numba) only when one is used. Ctrl-C while
a kernel compiles takes effect when that compile ends (at most a second or two): LLVM cannot
be interrupted cleanly (:func:`sigint_deferred`). A first compile may run on a worker thread,
where a SIGINT cannot be held back: the main thread then holds it while it waits for the workers
(:func:`ctformer._numerics.threads.run_workers`), so the interrupt never overtakes a compile.
"""
from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from functools import lru_cache, wraps
from types import SimpleNamespace

from ..environment import choice

try:  # the C module itself: the signal module's wrappers convert every handler to and from
    # its enum, raising and catching a ValueError for a function (sigint_deferred took 20.7 us
    # a parallel pass against 3.4; AMD EPYC, family 23 model 49)
    import _signal as _handlers
except ImportError:  # an interpreter without it
    _handlers = signal

__all__ = ["loop_engine", "kernels", "sigint_deferred"]

_ENGINES = ("auto", "numba", "numpy")


def loop_engine() -> str:
    """``"numba"`` or ``"numpy"``: who runs the fused loops, from ``CTFORMER_LOOP_ENGINE``."""
    engine = choice("CTFORMER_LOOP_ENGINE", _ENGINES)  # read several times per solver step
    if engine == "numpy":
        return "numpy"
    if _numba_installed():
        return "numba"
    if engine == "numba":
        raise ImportError('CTFORMER_LOOP_ENGINE=numba needs Numba: pip install "ctformer[fast]"')
    return "numpy"


@lru_cache(maxsize=1)
def _numba_installed() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def kernels():
    """The compiled kernels (a namespace), or ``None`` when the NumPy engine is in use."""
    return _build() if loop_engine() == "numba" else None


_KERNELS = ("exp_array", "exp_rows", "exp_rows_online", "rescale_add", "silu32", "silu64", "gelu_tanh32",
            "gelu_tanh64", "gelu32", "gelu64", "silu_over32", "silu_over64", "gelu_tanh_over32",
            "gelu_tanh_over64", "gelu_over32", "gelu_over64", "activation_over", "rotate_pairs", "add_distance")


@lru_cache(maxsize=None)
def _build() -> SimpleNamespace:
    """The compiled kernels (Numba compiles, or loads from its cache, per signature on first
    call, with Ctrl-C held back until that compile ends: :func:`sigint_deferred`)."""
    from . import loops as _loops

    return SimpleNamespace(**{name: _compiling_uninterrupted(getattr(_loops, name)) for name in _KERNELS})


def _compiling_uninterrupted(dispatcher):
    """``dispatcher`` with its compile step (Numba's ``_compile_for_args``, called only when no
    compiled version fits the arguments) run under :func:`sigint_deferred`; calls that find a
    compiled version do not pass through Python at all and cost nothing more."""
    compile_for_args = dispatcher._compile_for_args

    @wraps(compile_for_args)
    def deferred(*args, **kws):
        with sigint_deferred():
            return compile_for_args(*args, **kws)

    dispatcher._compile_for_args = deferred
    return dispatcher


@contextmanager
def sigint_deferred(on_signal=None):
    """Hold back Ctrl-C (SIGINT) for the duration of the block, then act on it.

    LLVM calls back into Python while it compiles (llvmlite's object-cache notification, a
    ctypes callback). A ``KeyboardInterrupt`` raised there cannot propagate: Python prints
    ``Exception ignored on calling ctypes callback function ... KeyboardInterrupt`` with a
    traceback and the compile goes on, so Ctrl-C was both noisy and lost. Inside this block a
    SIGINT is only recorded; at the end the previous handler runs (Python's default raises
    ``KeyboardInterrupt`` there, in ordinary code, which the command line reports in one line
    with exit status 130). Only the main thread receives signals and may change their
    handlers: elsewhere, or when SIGINT has no Python handler (ignored or default), the block
    runs as it is. ``on_signal()``, when given, is called (on the main thread) as each SIGINT
    is recorded: :func:`ctformer._numerics.threads.run_workers` uses it to stop handing out
    tasks, so that the interrupt is raised once every worker, and any compile in one, is done.
    """
    previous = _handlers.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield
        return
    received = []

    def record(signum, frame):
        received.append(frame)
        if on_signal is not None:
            on_signal()

    _handlers.signal(signal.SIGINT, record)
    try:
        yield
    finally:
        _handlers.signal(signal.SIGINT, previous)
        if received:
            previous(signal.SIGINT, received[0])

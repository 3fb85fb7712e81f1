r"""torch as this machine's BLAS: loading it, its threads, and MKL's strict reproducibility mode.

A threaded MKL product can round differently from a one-thread one (it may split the inner
dimension between threads: on an Intel Xeon with AVX-512, 47 of 168 products at the shapes of the
networks, e.g. ``(16, 1536) @ (1536, 384)``). MKL's *strict conditional numerical
reproducibility* mode (``MKL_CBWR=AUTO,STRICT``) removes that: its ``?gemm`` then gives the
same bits for every thread count, at the same speed (measured within noise). So when ctformer
loads torch, or is imported after torch, it turns that mode on (:func:`threaded_products`),
unless ``MKL_CBWR`` is set in the environment (the user's choice stands). MKL accepts the mode
only before its first computation; where it is on (checked, not assumed: one-thread and
two-thread products must agree bit for bit on shapes that differ without it), the products
outside worker tasks (:func:`ctformer._numerics.gemm.rows_product`) and torch's fused attention
(:mod:`ctformer._numerics.fused`) use torch's threads. Bits then depend on whether the mode is
on, never on the thread count.

The rest of the library reaches torch through :func:`_torch` (imported once, and only when
needed), :func:`_tensor` (a view of a NumPy array) and :class:`_torch_threads` (a thread
count for one block, restored after).

``torch.set_num_threads`` sets the calling thread's count *and* the count that every thread
which has not used torch yet starts with (torch keeps the last value set in one global). The
library's pool threads keep one torch thread, so a parallel pass gives that global back
(:func:`caller_count` when it starts, :func:`pass_ended` when it ends): else a user's thread,
or a main thread that had not used torch yet, ran torch on one thread after a pass, with
the bits of one thread (torch's reductions split by thread count).
"""
from __future__ import annotations

import os
import sys
import threading
from functools import lru_cache

import numpy as np

from . import openmp as _openmp
from . import placement as _placement

__all__ = ["threaded_products"]

_LOCK = threading.Lock()
_POOL_PREFIX = "ctformer-"  # the worker pool's thread names (ctformer._numerics.threads)
_MKL_AUTO_STRICT = 2 | 0x10000  # MKL_CBWR_AUTO | MKL_CBWR_STRICT (mkl_cbwr_set's settings)
_STRICT_ASKED: list = []  # [bool]: MKL's strict mode was asked for and accepted
_STRICT_MKL: list = []  # [bool] once threaded_products has checked
_READ_ONLY_WARNED: list = []  # non-empty once torch has warned (once) about a read-only array
_DEFAULT: list = []  # [torch's thread count for a new thread when _torch loaded it]
_POOL_SET: list = []  # non-empty: a pool thread kept a count it set, since the last pass ended


def threaded_products() -> bool:
    """True when torch's MKL multiplies with the same bits on every thread count: its strict
    reproducibility mode is on (accepted when :func:`_torch` asked, or asked for by
    ``MKL_CBWR`` in the environment) and a check confirms it (one- and two-thread products
    agree bit for bit on three shapes whose inner dimension MKL otherwise splits)."""
    if _STRICT_MKL:
        return _STRICT_MKL[0]
    torch = _torch()
    with _LOCK:
        if not _STRICT_MKL:
            _STRICT_MKL.append(torch is not None and _STRICT_ASKED == [True] and _thread_count_invariant(torch))
    return _STRICT_MKL[0]


def _tensor(torch, x):
    """A torch view of ``x`` (no copy); read-only arrays too, which a product only reads.

    torch.from_numpy warns about a read-only array once per process (a warn-once), so only
    the first such view is made with that warning silenced: ``warnings.catch_warnings`` costs
    about 4 us per call (a network's weights are read-only: every product would pay it) and
    is not thread-safe, which the later calls then need not be."""
    if x.flags.writeable or _READ_ONLY_WARNED:
        return torch.from_numpy(x)
    import warnings

    with _LOCK:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            view = torch.from_numpy(x)
        _READ_ONLY_WARNED.append(True)
    return view


def _strict_mkl(torch) -> None:
    """Ask torch's MKL for its strict reproducibility mode; note in ``_STRICT_ASKED`` whether
    the mode is on: MKL accepted it (it refuses once it has computed), or ``MKL_CBWR`` in the
    environment asks for it. Nothing is asked where ``MKL_CBWR`` is set (the user's choice) or
    where torch carries no MKL with ``mkl_serv_cbwr_set``."""
    if "MKL_CBWR" in os.environ:
        _STRICT_ASKED[:] = ["STRICT" in os.environ["MKL_CBWR"].upper()]
        return
    if _STRICT_ASKED or not torch.backends.mkl.is_available():
        return
    import ctypes

    try:
        library = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        set_mode = library.mkl_serv_cbwr_set
    except (OSError, AttributeError):  # another platform or build of torch
        return
    set_mode.restype, set_mode.argtypes = ctypes.c_int, [ctypes.c_int]
    _STRICT_ASKED[:] = [set_mode(_MKL_AUTO_STRICT) == 0]  # MKL_CBWR_SUCCESS


# Shapes whose inner dimension MKL splits between threads outside its strict mode. The second
# one also differs between 1 and 2 threads *inside* the mode on an AMD EPYC (family 25, MKL
# 2024.2), as (16, 1536, 384) does between 1 and 3: there the threaded paths stay off.
_INVARIANCE_SHAPES = ((16, 1536, 384, np.float64), (33, 4096, 64, np.float64), (128, 4096, 64, np.float64),
                      (16, 2048, 512, np.float32))


def _thread_count_invariant(torch) -> bool:
    """Whether torch's products on one, two and three threads agree bit for bit on
    ``_INVARIANCE_SHAPES``."""
    rng = np.random.default_rng(1)
    for m, k, n, dtype in _INVARIANCE_SHAPES:
        a, b = (torch.from_numpy(rng.standard_normal(shape).astype(dtype)) for shape in ((m, k), (k, n)))
        with _torch_threads(torch, 1):
            one = torch.mm(a, b)
        for count in (2, 3):
            with _torch_threads(torch, count):
                if not torch.equal(one, torch.mm(a, b)):
                    return False
    return True


class _torch_threads:
    """torch on ``count`` threads on this thread for the block (OpenMP's setting is per thread,
    so other threads keep theirs). The caller's thread gets its count back after the block;
    the library's own pool threads keep one thread (they never need more, and a count above
    one would give each of them an OpenMP team of its own). In a forked child of a process
    that had imported torch, one thread whatever ``count`` (:func:`_one_thread_after_fork`)."""

    __slots__ = ("torch", "count", "before")

    def __init__(self, torch, count=1):
        self.torch, self.count = torch, 1 if _FORKED else count

    def __enter__(self):
        self.before = self.torch.get_num_threads()
        if self.before != self.count:
            self.torch.set_num_threads(self.count)
        if self.count > 1:  # OpenMP's team off this thread's CPU during a solve
            _openmp.keep_team_apart(self.count)

    def __exit__(self, *exc):
        if self.before != self.count:
            if self.count != 1 or not threading.current_thread().name.startswith(_POOL_PREFIX):
                self.torch.set_num_threads(self.before)
            elif not _POOL_SET:  # kept; torch's count for new threads is given back by pass_ended
                _POOL_SET.append(True)


def caller_count():
    """The calling thread's torch thread count where the library has loaded torch, else None:
    read when a parallel pass starts, for :func:`pass_ended`."""
    return _torch().get_num_threads() if _DEFAULT else None


def pass_ended(count) -> None:
    """After a parallel pass on the calling thread: where a pool thread set torch's count (one),
    torch's count for threads that have not used it yet back to ``count`` (the caller's, from
    :func:`caller_count`; where torch was loaded during the pass, the count torch gave a new
    thread then). The caller's own count is ``count`` already; the pool threads keep one."""
    if _POOL_SET:
        _POOL_SET.clear()
        _torch().set_num_threads(count if count is not None else _DEFAULT[0])


def _one_torch_thread(torch):
    return _torch_threads(torch, 1)


@lru_cache(maxsize=1)
def _torch():
    from .compiled import sigint_deferred

    # an interrupted import of torch cannot be retried in the process: Ctrl-C waits for it;
    # on all of the thread's CPUs: OpenMP counts them when torch loads it (placement)
    with sigint_deferred(), _placement.whole_cpus():
        try:
            import torch
        except ImportError:
            return None
        if not _DEFAULT:  # before any count set here (pass_ended)
            _DEFAULT.append(torch.get_num_threads())
    _strict_mkl(torch)
    return torch


def _torch_version() -> str | None:
    """torch's installed version (from its metadata: no import), or None."""
    return installed_version("torch")


@lru_cache(maxsize=8)
def installed_version(package: str) -> str | None:
    """The installed version of ``package`` (from its metadata: no import), or None."""
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


_FORKED: list = []  # non-empty in a process forked from one that had imported torch


def _one_thread_after_fork() -> None:
    """In a forked child, torch on one thread from the start.

    torch's OpenMP team does not survive a fork: a child of a process that had computed with
    torch on several threads waited for ever in its first threaded torch call (a study's cases
    on a forking ``ProcessPoolExecutor``, torch states). On one thread torch never enters that
    team (as its own data loader's workers do). The bits do not change where ctformer chose the
    threads: its worker tasks multiply on one thread anyway, and its threaded products only
    where MKL's strict mode gives every thread count the same bits (:func:`threaded_products`).
    """
    torch = sys.modules.get("torch")
    if torch is None or getattr(torch, "set_num_threads", None) is None:  # not (fully) imported
        return
    _FORKED.append(True)
    if _DEFAULT:
        _DEFAULT[:] = [1]
    torch.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_one_thread_after_fork)

if getattr(sys.modules.get("torch"), "backends", None) is not None:  # imported after torch:
    _strict_mkl(sys.modules["torch"])  # ask while MKL may not have computed yet

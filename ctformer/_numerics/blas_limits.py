"""The BLAS libraries' thread counts, limited to one for the duration of a parallel pass.

:func:`single_thread_blas` gives a context (:class:`_OneBlasThread`, None where no BLAS library
can be limited) that sets the loaded BLAS libraries to one thread while any block holds it and
gives each library its own count back when the last block leaves: a library's count is one
per process, so all threads share one limit, and a forked child starts it afresh. The library
controllers are ``threadpoolctl``'s (:func:`blas_controller`). The worker pool and the worker
count that use the limit are in :mod:`ctformer._numerics.threads`.
"""
from __future__ import annotations

import os
import threading

__all__ = ["blas_controller", "single_thread_blas"]

_LOCK = threading.Lock()
_CONTROLLER: list = []
_BLAS: list = []  # [tuple of BLAS library controllers]


def blas_controller():
    """threadpoolctl's controller of the loaded BLAS libraries, or None without threadpoolctl."""
    with _LOCK:
        if not _CONTROLLER:
            try:
                from threadpoolctl import ThreadpoolController

                _CONTROLLER.append(ThreadpoolController())
            except Exception:  # not installed, or an unknown library layout
                _CONTROLLER.append(None)
        return _CONTROLLER[0]


def _blas_libraries() -> tuple:
    """threadpoolctl's controllers of the BLAS libraries (each reads its thread count from
    the library when asked: a few microseconds, where the controller's ``info()`` takes 10-20)."""
    if not _BLAS:
        controller = blas_controller()
        libraries = getattr(controller, "lib_controllers", None) or ()
        _BLAS.append(tuple(lib for lib in libraries if getattr(lib, "user_api", None) == "blas"))
    return _BLAS[0]


def single_thread_blas():
    """A context limiting BLAS to one thread for the duration of a call (None if impossible)."""
    libraries = _blas_libraries()
    return _OneBlasThread(libraries) if libraries else None


class _OneBlasThread:
    """Each BLAS library at one thread inside the block, its own count restored after it.

    What threadpoolctl's ``limit(limits=1, user_api="blas")`` does, through the same library
    controllers (and so with their rule for OpenBLAS: only the thread that controls its
    shared pool changes it), without building a new limiter each time: 3 us per block
    against 8 (a parallel pass takes one, a batched attention pass another).

    A BLAS library's thread count is one per process, so the blocks of all threads share one
    limit: the first to enter sets the counts to one, the last to leave restores them (each
    block restoring its own would let a pass on one of the caller's threads end another's
    limit). Any thread may set them (:func:`_set_threads`): threadpoolctl lets only the first
    thread that set OpenBLAS's count set it again, and silently ignored the others, so a pass
    called from any other thread (a Dask or joblib worker thread, a ``threading.Thread``) ran
    its one-thread products on OpenBLAS's threads, with other bits: streamed attention of
    333-1500 tokens called from a second thread differed from the main thread's result in
    the last bits for every shape."""

    __slots__ = ("libraries",)

    def __init__(self, libraries):
        self.libraries = libraries

    def __enter__(self):
        counted = False
        try:
            with _LIMIT_LOCK:
                if _LIMIT["blocks"] == 0:
                    _limit_all(self.libraries)
                _LIMIT["blocks"] += 1
                counted = True  # no call between: an interrupt sees both or neither
        except BaseException:
            # an exception here (a signal handler's KeyboardInterrupt) leaves __exit__ uncalled:
            # the block is undone now, else BLAS kept one thread for the rest of the process
            self._leave(counted)
            raise
        return self

    def __exit__(self, *exc):
        self._leave(True)

    @staticmethod
    def _leave(counted) -> None:
        with _LIMIT_LOCK:
            if counted:
                if _LIMIT["blocks"] == 0:  # a block entered before a fork, left in the child
                    return
                _LIMIT["blocks"] -= 1
            if _LIMIT["blocks"] == 0:
                _restore_all()


def _limit_all(libraries) -> None:
    """Each library at one thread, its count recorded *before* it is changed (under
    :data:`_LIMIT_LOCK`, no block held): a count recorded by a limit that was interrupted
    while it restored them is the user's one, not the one it left."""
    restore = _LIMIT["restore"] = list(_LIMIT["restore"])
    recorded = {id(library) for library, _ in restore}
    for library in libraries:
        count = library.num_threads
        if count is not None and count != 1:  # None: a library that cannot say, left alone
            if id(library) not in recorded:  # else restored but not yet forgotten: recorded
                restore.append((library, count))
            _set_threads(library, 1)


def _restore_all() -> None:
    """The recorded counts back (under :data:`_LIMIT_LOCK`, no block held), each forgotten only
    once it is set."""
    restore = _LIMIT["restore"] = list(_LIMIT["restore"])
    while restore:
        library, count = restore[-1]
        _set_threads(library, count)
        restore.pop()
    _LIMIT["restore"] = ()


def _set_threads(library, count) -> None:
    """``library`` (a threadpoolctl controller) at ``count`` threads, from whichever thread
    calls (under :data:`_LIMIT_LOCK`). threadpoolctl's controller of a process-wide OpenBLAS
    pool obeys only the thread that took control (the first to set a count) and ignores the
    others without a word, since threads that limit it independently would undo each other's
    limits; the shared limit above is that coordination, so the library's own setter is
    called (``_real_set_num_threads``, 1 us), else control is released before and after the
    public setter (3 us more a call; with a threadpoolctl without the rule, the public setter
    alone)."""
    setter = getattr(library, "_real_set_num_threads", None)
    if setter is not None:
        setter(count)
        return
    release = getattr(type(library), "clear_controlling_thread", None)
    if release is not None:
        release(force=True)
    library.set_num_threads(count)
    if release is not None:
        release(force=True)


_LIMIT_LOCK = threading.Lock()
_LIMIT = {"blocks": 0, "restore": ()}  # the blocks inside the shared limit, the counts to restore


def _limit_after_fork() -> None:
    """In a forked child no pass of the parent's other threads goes on: the shared limit
    starts afresh (a lock that such a thread held at the fork would never be released) and
    the BLAS libraries get back the counts a parent's pass had limited (else the child kept
    one thread for good, and its passes read one worker)."""
    global _LIMIT_LOCK
    _LIMIT_LOCK = threading.Lock()
    restore, _LIMIT["blocks"], _LIMIT["restore"] = _LIMIT["restore"], 0, ()
    for library, count in restore:
        _set_threads(library, count)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_limit_after_fork)

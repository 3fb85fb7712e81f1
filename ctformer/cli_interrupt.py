"""Ctrl-C in the ``ctformer`` command line: one line and exit status 130.

:func:`loading` guards the import of the package in the command line (a SIGINT there is
held until the import completes, since raised mid-import it can be swallowed or turned into
another error); :func:`_interrupted` is the line
printed after a ``KeyboardInterrupt`` in a command (how many cases are stored, and where).
"""
from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def _interrupted(exc: KeyboardInterrupt, args) -> str:
    from .studies import StudyInterrupted

    if isinstance(exc, StudyInterrupted):
        if exc.directory:
            return (f"interrupted; {exc.stored} of {exc.total} cases stored in {exc.directory}; "
                    "rerun the same command to resume")
        return f"interrupted; {exc.stored} of {exc.total} cases finished (none stored: no --out)"
    if args is not None and args.command in ("study", "demo") and args.out:
        return (f"interrupted; finished cases are stored in {Path(args.out) / 'cases'}; rerun "
                "the same command to resume")
    return "interrupted"


def carried_interrupt(exc: BaseException):
    """The ``KeyboardInterrupt`` that ``exc`` was raised in place of, or None.

    Python turns some exceptions into others on their way out: in Python 3.11 one raised in a
    ``__set_name__`` while a class is created (a Ctrl-C while Numba's lowering module loads at
    a first compile) leaves as ``RuntimeError: Error calling __set_name__ ...``, the interrupt
    as its cause. The command line reports such an error as the interrupt it carries, not as
    a crash with status 1: the chain of causes and contexts is searched for one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return None


def _is_command_line() -> bool:
    """Whether this process is the ``ctformer`` command (``python -m ctformer`` or the console
    script), not a program that imports the library."""
    argv = list(getattr(sys, "orig_argv", ()))
    if "-m" in argv[:-1] and argv[argv.index("-m") + 1] in ("ctformer", "ctformer.cli"):
        return True
    script = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    return Path(script).name in ("ctformer", "ctformer.exe", "ctformer-script.py")


@contextmanager
def loading():
    """Guard the import of the package in the command line against Ctrl-C.

    A ``KeyboardInterrupt`` raised at an arbitrary moment of an import is not reliable: some
    extension modules turn it into another error (NumPy's C core reports an ``ImportError``),
    an optional-import guard may then swallow it, and one raised inside a weakref callback of
    the import machinery is printed as "Exception ignored" and lost, so the command went on
    and finished with status 0. In the command line (:func:`_is_command_line`) the first
    SIGINT is therefore only recorded: the import completes (a second or two on a first run)
    and the command then ends with the one line ``ctformer: interrupted`` and exit status 130.
    A second SIGINT stops the import where it is; any exception that then leaves the block,
    or none, ends the command the same way. Elsewhere the block runs as it is.
    """
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or not _is_command_line() \
            or threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def record(signum, frame):
        received.append(signum)
        if len(received) > 1:        # Ctrl-C again: the user will not wait for the import
            previous(signum, frame)  # Python's handler: KeyboardInterrupt here

    signal.signal(signal.SIGINT, record)
    try:
        yield
    except BaseException:
        if not received:
            raise
        _exit_interrupted()
    finally:
        if signal.getsignal(signal.SIGINT) is record:
            signal.signal(signal.SIGINT, previous)
    if received:
        _exit_interrupted()


def _exit_interrupted():
    print("ctformer: interrupted", file=sys.stderr, flush=True)
    # a KeyboardInterrupt out of an exec() of a string (dataclasses) leaves a flag with which
    # `python -m` kills itself by SIGINT after exiting 130; the next exec clears it
    exec("pass")
    raise SystemExit(EXIT_INTERRUPTED) from None

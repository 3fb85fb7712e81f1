"""The ``ctformer study`` and ``ctformer list`` commands.

``study`` refines one variable of a smooth random model (here, or on a Dask cluster), prints
the error table and writes CSV, JSON and a plot; ``list`` prints the registered
discretizations and schemes with their orders, their docstrings as plain text.
"""
from __future__ import annotations

import difflib
import math
import re
from pathlib import Path

from .cli_common import (_WARNINGS, INSTALL_DASK, NO_MATPLOTLIB, UserError, _close, _have_matplotlib,
                         _progress)
from .cli_parser import _levels, _out_directory, _window

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
    if not (math.isfinite(timeout) and timeout > 0):
        raise UserError(f"--connect-timeout must be a positive number of seconds, got {timeout!r}")
    try:
        from distributed import Client
    except ImportError as exc:
        # no extra of ctformer carries Dask: name the package that does
        raise UserError(f"--scheduler needs dask.distributed, which is not installed ({exc}): "
                        f"{INSTALL_DASK}, or leave --scheduler out to run here") from None
    try:
        return Client(address, timeout=f"{timeout}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


# -- study ----------------------------------------------------------------------------------

def _study_spec(args, levels):
    from .studies import as_refinement

    refinement = as_refinement(args.refine)
    if refinement.refines_depth and args.discretization is not None:
        raise UserError("--discretization names the refined spatial variable; with --refine time "
                        "choose the scheme with --scheme")
    # the library reads neither when time is refined: refuse rather than ignore them
    if refinement.refines_depth and args.steps_per_layer is not None:
        raise UserError(f"--steps-per-layer {args.steps_per_layer} fixes the steps when time is "
                        "not refined; with --refine time the steps per layer are the --levels "
                        "(leave --steps-per-layer out)")
    if refinement.refines_depth and args.window is not None:
        raise UserError(f"--window {args.window} measures the error on a sub-interval of the "
                        "refined tokens or features; with --refine time leave it out")
    if args.evaluate != "interpolate" and (refinement.refines_depth or
                                           refinement.variable not in ("tokens", "features")):
        raise UserError(f"--evaluate {args.evaluate} chooses where a refined token or feature "
                        f"axis is compared; with --refine {args.refine} it would be ignored "
                        "(leave --evaluate out)")
    if args.fine is not None and (refinement.refines_depth or refinement.variable not in
                                  ("tokens", "features") or args.evaluate != "interpolate"):
        # the library reads fine only for a refined token or feature axis that it interpolates
        where = (f"--evaluate {args.evaluate}" if not refinement.refines_depth and
                 refinement.variable in ("tokens", "features") else f"--refine {args.refine}")
        raise UserError(f"--fine {args.fine} sets the evaluation grid of a refined token or "
                        f"feature axis with --evaluate interpolate; with {where} it would be "
                        "ignored (leave --fine out)")
    spec = {"tokens": args.tokens, "features": args.features, "hidden": args.hidden}
    if not refinement.refines_depth:
        if spec[refinement.variable] is not None:
            raise UserError(f"--{refinement.variable} fixes a variable; the refined one is chosen "
                            "by --discretization")
        if ":" in (args.discretization or ""):
            # the library drops the size of a refined rule: say so rather than ignore it
            raise UserError(f"--discretization {args.discretization!r}: give the name only "
                            f"(e.g. {args.discretization.partition(':')[0]!r}); the sizes of the "
                            "refined variable are --levels")
        spec[refinement.variable] = args.discretization or "gauss-legendre"
        _check_refined(spec[refinement.variable], levels, args.levels)
    for name, text in spec.items():
        if text is not None and (refinement.refines_depth or name != refinement.variable):
            _check_fixed(name, text)
    return spec


def _check_refined(name: str, levels: list, text: str) -> None:
    """Build the refined rule at every level once here (as the study does, on [0, 1]), so that
    an unknown name or a size the rule cannot take is reported with its option."""
    from . import discretizations

    known = discretizations.available()
    if name not in known:
        close = difflib.get_close_matches(name.lower(), known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserError(f"--discretization {name!r}: unknown discretization {name!r}{hint}; "
                        f"known: {', '.join(known)} (see 'ctformer list')")
    for n in levels:
        try:
            discretizations.get(name, n)
        except (ValueError, TypeError) as exc:
            raise UserError(f"--levels {text}: level {n} of --discretization {name}: "
                            f"{' '.join(str(exc).split())}") from None


def _check_fixed(name: str, text: str) -> None:
    """Build a fixed ``NAME:N`` once here, so that a bad one is reported with its option."""
    from .studies.arguments import fixed_discretization

    try:
        fixed_discretization(text, f"--{name}", None)
    except (ValueError, TypeError) as exc:
        message = " ".join(str(exc).split())
        raise UserError(message if f"--{name}" in message else
                        f"--{name} {text!r}: {message}") from None


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
    spec = _study_spec(args, levels)
    scheme = _scheme(args.scheme, args.substep)
    window = _window(args.window)
    out = _out_directory(args.out)
    names = _output_names()
    _check_outputs(args.out, out, names)  # before the study runs: its time is not wasted
    model = ContinuousTransformer.random_smooth(
        seed=args.model_seed, layers=args.layers, heads=args.heads, placement=args.placement,
        activation=args.activation, mask=args.mask, diagonal=args.diagonal, beta=args.beta)
    client = _connect(args.scheduler, args.connect_timeout) if args.scheduler else None
    before = _stamps(out / "cases")
    # only a given --fine is passed: the library's default stays the one default
    fine = {} if args.fine is None else {"fine": args.fine}
    try:
        result = convergence(
            model, refine=args.refine, levels=levels, tokens=spec["tokens"],
            features=spec["features"], hidden=spec["hidden"], scheme=scheme,
            steps_per_layer=args.steps_per_layer or 1, reference=args.reference,
            error_norm=args.error_norm, evaluate=args.evaluate, window=window, executor=client,
            store=out / "cases", progress=_progress(args), **fine)
    finally:
        if client is not None:
            client.close()
    if _WARNINGS.seen("InconsistentDepthLimitWarning"):
        result.consistent_limit = False
    reused = _reused(out / "cases", before, len(levels))
    # the files first: a reader that closes standard output early (| head) loses no result
    paths = _write_outputs(result, out, names)
    print(result)
    if reused:
        print(f"reused {reused} of {len(levels)} cases stored in {out / 'cases'} by an earlier run "
              f"(their seconds are that run's); delete that directory to recompute them")
    print("wrote " + ", ".join(str(p) for p in paths))
    if not _have_matplotlib():
        print(f"convergence.png {NO_MATPLOTLIB}")
    return 0


def _output_names() -> list[str]:
    """The files ``study`` writes to ``--out`` (the plot only with matplotlib)."""
    return ["convergence.csv", "convergence.json"] + (["convergence.png"] if _have_matplotlib() else [])


def _check_outputs(text: str, out: Path, names: list) -> None:
    """Refuse, before anything is computed or written, an output that is a directory."""
    taken = [name for name in names if (out / name).is_dir()]
    if taken:
        verb = "is a directory" if len(taken) == 1 else "are directories"
        raise UserError(f"--out {text!r}: {', '.join(taken)} {verb} there, where the study writes "
                        "a file; move or remove it, or give another --out (nothing was written)")


def _write_outputs(result, out: Path, names: list) -> list:
    """Write the files in turn; a failure says which of them were written before it."""
    writers = {"convergence.csv": result.to_csv, "convergence.json": result.to_json,
               "convergence.png": lambda path: (_close(result.plot(path)), path)[1]}
    paths = []
    for name in names:
        try:
            paths.append(writers[name](out / name))
        except OSError as exc:
            # the writer's own "(nothing was written)" is about its file only: say it for all
            why = " ".join(str(exc).replace("(nothing was written)", "").split())
            done = ", ".join(str(p) for p in paths)
            written = f"written before it: {done}" if done else "nothing was written"
            raise UserError(f"cannot write {out / name} ({why}); {written}") from None
    return paths


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

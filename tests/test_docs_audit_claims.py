"""The numbers the documentation pages state hold, each recomputed here from its setup.

Each test reads the number from the page (so the page and the check cannot drift apart) and
recomputes it independently of the page: orders as least-squares slopes, tape sizes from
torch's saved-tensor hooks, the test names a page cites against the test files themselves.
The gallery scripts are checked for their own asserts, which the docs build runs.
"""
from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

from .conftest import fitted_order, require, solve_and_saved_bytes

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("theory.rst", "design.rst", "decisions.rst", "gradients.rst", "particles.rst",
         "performance.rst", "images.rst", "index.rst")


def page(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())   # one line: numbers wrap


def stated(name: str, pattern: str) -> tuple:
    """The groups of ``pattern`` in ``docs/NAME`` as floats (the page's stated numbers)."""
    found = re.search(pattern, page(name))
    assert found, f"docs/{name} no longer says {pattern!r}: update this test with the page"
    return tuple(float(g) for g in found.groups())


# -- the gallery -------------------------------------------------------------------------------
@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("plot_*.py")), ids=lambda p: p.stem)
def test_every_gallery_script_asserts_its_claims(path):
    """The docs build runs the scripts: a claim in a script's text holds only if it asserts it."""
    tree = ast.parse(path.read_text())
    asserts = [node for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    assert asserts, f"{path.name} states results but asserts none of them"


# -- pages citing tests ------------------------------------------------------------------------
@pytest.mark.parametrize("name", PAGES)
def test_tests_cited_by_a_page_exist(name):
    cited = re.findall(r"``(test_[a-z0-9_]+\.py)::(test_[a-z0-9_]+)``", page(name))
    for file, test in cited:
        source = (ROOT / "tests" / file).read_text()
        assert re.search(rf"^def {test}\(", source, re.M), f"docs/{name} cites {file}::{test}"


def test_particles_page_block_asserts_its_results():
    text = (ROOT / "docs" / "particles.rst").read_text()
    block = re.search(r"\.\. code-block:: python\n\n((?:(?: {4}.*)?\n)+)", text).group(1)
    assert "assert" in block
    exec(compile(textwrap.dedent(block), "docs/particles.rst", "exec"), {})


# -- gradients.rst -----------------------------------------------------------------------------
def _model_and_start(tokens, features):
    from ctformer import ContinuousTransformer, Grids
    from ctformer.studies import smooth_initial_state

    model = ContinuousTransformer.random_smooth(seed=3, layers=2)   # the page's model
    return model, Grids(tokens, features).sample(smooth_initial_state)


def test_gradients_checkpoint_tape_size_is_the_stated_one():
    torch = require("torch")
    from ctformer.discretizations import GaussLegendre

    full, kept = stated("gradients.rst", r"the tape shrinks from ([\d.]+) MiB to ([\d.]+) MiB")
    tokens, features = GaussLegendre(16), GaussLegendre(12)
    model, start = _model_and_start(tokens, features)
    saved = {}
    for checkpoint in (False, True):
        u0 = torch.tensor(start, requires_grad=True)
        out, saved_bytes = solve_and_saved_bytes(
            lambda: model.solve(u0, tokens=tokens, features=features, steps_per_layer=256,
                                checkpoint=checkpoint))
        (out ** 2).sum().backward()
        saved[checkpoint] = saved_bytes / 2 ** 20
    assert abs(saved[False] - full) < 0.05 * full, saved
    assert abs(saved[True] - kept) < 0.01, saved


def test_gradients_rk4_adjoint_orders_are_the_stated_ones():
    torch = require("torch")
    from ctformer.adjoint import gradient
    from ctformer.discretizations import GaussLegendre

    (u0_order,) = stated("gradients.rst", r"and ([\d.]+) for ``rk4`` \(fitted over 1 to 8 steps")
    (parameter_order,) = stated("gradients.rst", r"2\.00 for ``strang``, ([\d.]+) for ``rk4``\)")

    tokens, features = GaussLegendre(6), GaussLegendre(5)
    model, start = _model_and_start(tokens, features)
    u0 = torch.tensor(start)
    target = torch.tensor(np.random.default_rng(0).standard_normal(tuple(u0.shape)))
    differences = []
    for k in (1, 2, 4, 8):
        kw = dict(tokens=tokens, features=features, scheme="rk4", steps_per_layer=k)
        a = gradient(model, u0, lambda u: ((u - target) ** 2).sum(), route="autograd", **kw)
        b = gradient(model, u0, lambda u: ((u - target) ** 2).sum(), route="adjoint", **kw)
        differences.append(float((a - b).abs().max() / a.abs().max()))
    assert abs(fitted_order([1, 1 / 2, 1 / 4, 1 / 8], differences) - u0_order) < 0.05, differences

    tokens, features = GaussLegendre(5), GaussLegendre(4)
    _, start = _model_and_start(tokens, features)
    u0 = torch.tensor(start)
    differences = []
    for k in (2, 4, 8):
        kw = dict(tokens=tokens, features=features, scheme="rk4", steps_per_layer=k, parameters=True)
        _, a = gradient(model, u0, lambda u: (u ** 3).sum(), route="autograd", **kw)
        _, b = gradient(model, u0, lambda u: (u ** 3).sum(), route="adjoint", **kw)
        scale = max(float(g.abs().max()) for g in a.values())
        differences.append(max(float((a[n] - b[n]).abs().max()) for n in a) / scale)
    assert abs(fitted_order([1 / 2, 1 / 4, 1 / 8], differences) - parameter_order) < 0.05, differences


# -- theory.rst --------------------------------------------------------------------------------
def test_theory_observed_numbers_are_the_stated_ones():
    from ctformer.discretizations import GaussLegendre, Midpoint
    from ctformer.model import ContinuousTransformer

    (least_std,) = stated("theory.rst", r"feature standard deviation at least ([\d.]+) at every token")
    e16, e32 = stated("theory.rst", r"pre-norm: error :math:`([\d.]+) \\times 10\^\{-6\}` at 16 tokens, "
                                    r":math:`([\d.]+) \\times 10\^\{-11\}` at 32")
    features = GaussLegendre(16)
    w = features.weights / features.length

    def u0(x, y):
        return np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)

    def smallest_std(states):
        mean = (states * w).sum(-1, keepdims=True)
        return float(np.sqrt((((states - mean) ** 2) * w).sum(-1)).min())

    fine = GaussLegendre(96)
    for placement in ("pre", "post", "none"):
        model = ContinuousTransformer.random_smooth(seed=1, placement=placement)
        states = np.stack(model.solve(u0, tokens=fine, features=features, trajectory=True))
        assert least_std <= smallest_std(states) < least_std + 0.01, placement
    model = ContinuousTransformer.random_smooth(seed=1, placement="pre")
    reference = model.solve(u0, tokens=fine, features=features)
    for n, expected in ((16, e16 * 1e-6), (32, e32 * 1e-11)):
        tokens = GaussLegendre(n)
        error = np.abs(model.solve(u0, tokens=tokens, features=features)
                       - fine.interpolate(reference, tokens.nodes, axis=-2)).max()
        assert abs(error / expected - 1) < 0.1, (n, error)
    # and the midpoint tokens of the same model are second order
    levels = (8, 16, 32, 64)
    errors = [np.abs(model.solve(u0, tokens=Midpoint(n), features=features)
                     - fine.interpolate(reference, Midpoint(n).nodes, axis=-2)).max() for n in levels]
    assert abs(fitted_order([1 / n for n in levels], errors) - 2.0) < 0.05


# -- images.rst --------------------------------------------------------------------------------
def test_images_axial_rope_numbers_are_the_stated_ones():
    from ctformer import ContinuousTransformer
    from ctformer.discretizations import GaussLegendre, Midpoint, Product
    from ctformer.studies import convergence

    from .test_product_tokens import _u0_2d as u0   # the setup of the page's measurement

    order, fall = stated("images.rst", r"converges at order ([\d.]+), and on Gauss-Legendre patches its "
                                       r"error \(against 32 x 32 patches\) falls (\d+)-fold")

    model = ContinuousTransformer.random_smooth(seed=1, layers=1, positions="rope", context_length=(8, 8))
    kw = dict(refine="tokens", features="gauss-legendre:8", u0=u0, progress=False, fine=100)
    mid = convergence(model, levels=[4, 8, 16, 32, 64], tokens=Product(Midpoint(2), Midpoint(2)), **kw)
    gauss = convergence(model, levels=[8, 16, 32], tokens=Product(GaussLegendre(2), GaussLegendre(2)), **kw)
    assert abs(mid.observed_order - order) < 0.01, mid.observed_order
    assert abs(gauss.table[0].error / gauss.table[1].error / fall - 1) < 0.05

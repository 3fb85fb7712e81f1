"""Pages whose code blocks no other test runs, and statements of the pages checked against
what they describe: the package metadata, the module a block quotes, a measured range.

Each number is read from the page and recomputed here, so page and check cannot drift apart.
"""
from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import pytest

from .test_docs_pages import python_blocks

ROOT = Path(__file__).resolve().parents[1]


def page(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())   # one line: sentences wrap


@pytest.mark.parametrize("name", ["adaptive_depth.rst", "discretizations.rst", "labelled.rst",
                                  "positions.rst", "design.rst"])
def test_page_blocks_run_as_written(name, tmp_path, monkeypatch):
    """A reader pastes the blocks in order into one session: every name they use is defined
    (in a scratch directory: the blocks write files)."""
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks(name)
    assert blocks, name
    namespace = {}
    for k, block in enumerate(blocks):
        exec(compile(block, f"docs/{name} block {k}", "exec"), namespace)


def test_discretizations_table_block_is_the_gallery_table():
    namespace = {}
    for block in python_blocks("discretizations.rst"):
        exec(compile(block, "docs/discretizations.rst", "exec"), namespace)
    rows = namespace["rows"]
    assert sorted({r["n"] for r in rows if r["name"] == "midpoint"}) == [4, 8, 16, 32, 64]
    exact = namespace["exact_integral"]
    # the closed form against an independent quadrature
    from scipy.integrate import quad

    assert abs(exact - quad(namespace["f"], 0.0, 1.0, epsabs=1e-15)[0]) < 1e-14


def test_numba_comes_with_the_core_install_as_the_pages_say():
    """pydata ``sparse`` (a core dependency) requires Numba: no page may call it optional."""
    required = importlib.metadata.requires("sparse") or []
    assert any(re.match(r"numba\b", r) for r in required), required
    core = importlib.metadata.requires("ctformer") or []
    assert any(re.match(r"sparse\b", r) and "extra ==" not in r for r in core), core
    assert "pydata ``sparse`` requires it, so a core install has it too" in page("decisions.rst")
    for name in ("decisions.rst", "performance.rst"):
        assert "optional dependency" not in page(name), name
        assert "(Numba, the ``fast`` extra)" not in page(name), name


def _spec_keywords(source: str) -> dict:
    """Keyword -> AST dump of the ``ArchitectureSpec(...)`` call in ``source``."""
    calls = [node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
             and getattr(node.func, "id", None) == "ArchitectureSpec"]
    assert len(calls) == 1
    return {k.arg: ast.dump(k.value) for k in calls[0].keywords}


def test_bridges_page_quotes_the_phi3_spec_whole():
    block = next(b for b in python_blocks("bridges.rst") if "ArchitectureSpec(" in b)
    quoted = _spec_keywords(block)
    actual = _spec_keywords((ROOT / "ctformer" / "bridges" / "phi3.py").read_text())
    assert quoted == actual
    assert "small" in quoted      # without it phi3 would be no ``ctformer limit --model`` choice


def test_studies_min_feature_std_range_is_the_stated_one():
    from ctformer.model import ContinuousTransformer
    from ctformer.studies import convergence

    found = re.search(r"seeds 0 to (\d) \(every placement\) it lies between ([\d.]+) and ([\d.]+) "
                      r"\(([\d.]+) for seed 0, pre-norm\)", page("studies.rst"))
    assert found, "docs/studies.rst no longer states the range of min_feature_std"
    last, low, high, seed0 = int(found[1]), float(found[2]), float(found[3]), float(found[4])
    seen = {}
    for seed in range(last + 1):
        for placement in ("pre", "post", "none"):
            model = ContinuousTransformer.random_smooth(seed=seed, placement=placement)
            result = convergence(model, refine="tokens", levels=[8, 16, 32], tokens="midpoint",
                                 progress=False)
            seen[seed, placement] = result.min_feature_std
    assert round(min(seen.values()), 2) == low and round(max(seen.values()), 2) == high, seen
    assert round(seen[0, "pre"], 3) == seed0, seen


def test_particles_random_model_mean_inner_product_is_the_stated_one():
    """The page's numbers for the non-clustering random model, one step per layer (the coarsest
    run of the page, whose statistics agree with 8 steps per layer to 0.003)."""
    from ctformer.particles.minilm import continuous_model_clustering

    found = re.search(r"mean inner product falls from ([\d.]+) at :math:`t = 0` to ([\d.]+) at "
                      r":math:`t = 6`, though not at every layer \(([\d.]+) at :math:`t = 3`, "
                      r"([\d.]+) at :math:`t = 4`\)", page("particles.rst"))
    assert found, "docs/particles.rst no longer states the mean inner products"
    first, last, third, fourth = (float(g) for g in found.groups())
    means = [float(s.mean_inner_product) for s in continuous_model_clustering((1,))[1].stats]
    assert [round(means[i], 2) for i in (0, 6, 3, 4)] == [first, last, third, fourth], means
    assert means[4] > means[3]             # the fall is not monotone, as the page says


@pytest.mark.parametrize("keyword, hint", [("norm", "placement= says where the norms sit"),
                                           ("activaton", "did you mean 'activation'"),
                                           ("zzz", "the keywords are seed, layers")])
def test_random_smooth_names_an_unknown_keyword_and_the_one_meant(keyword, hint):
    """Before: "random_layers() got an unexpected keyword argument 'norm'", a function the
    caller never called, and no remedy."""
    from ctformer import ContinuousTransformer

    with pytest.raises(TypeError, match=rf"^random_smooth / random_layers got an unexpected keyword "
                                        rf"argument '{keyword}'.*{re.escape(hint)}"):
        ContinuousTransformer.random_smooth(**{keyword: 1})

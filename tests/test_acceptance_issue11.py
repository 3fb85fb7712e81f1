"""Acceptance of issue 11 ("First contact: an honest install, docs that render offline and teach
the three jobs, a CLI that explains itself"), for the items no earlier test asserts.

Each test quotes the issue. The other items are asserted elsewhere: the install sentence and
the core install (``test_install_core.py``), the tutorial (``test_getting_started.py``), the
spectral and Galerkin headlines, warnings, Ctrl-C, the CLI's rough edges, ``cluster`` and the
demo (``test_cli.py``, ``test_first_hour_cli.py``).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ctformer import InconsistentDepthLimitWarning, cli
from ctformer.model import ContinuousTransformer
from ctformer.solvers.base import warn_inconsistent_depth
from ctformer.studies import convergence

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "MPLBACKEND": "Agg"}


def _shipped_texts():
    """Every text a user gets: the package, the docs sources, the gallery, the README."""
    paths = sorted((ROOT / "ctformer").rglob("*.py")) + sorted((ROOT / "docs").glob("*.rst"))
    paths += [ROOT / "docs" / "conf.py", ROOT / "README.md"] + sorted((ROOT / "examples").glob("*.py"))
    return {p.relative_to(ROOT): p.read_text() for p in paths}


def test_nothing_cites_a_file_outside_the_repository():
    """Issue 11, item 2: "nothing in the package, docs or messages refers to a file outside the
    repository" (the issue counted "DESIGN.md section N" 23 times on the API page alone, and in
    the runtime warning "... no consistent continuous-depth limit (DESIGN.md section 1)")."""
    texts = _shipped_texts()
    assert len(texts) > 80
    cited = {str(p): len(re.findall(r"DESIGN\.md", t)) for p, t in texts.items() if "DESIGN.md" in t}
    assert cited == {}
    # the warning of the issue: the one function that words it (every solve that warns calls it)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_inconsistent_depth("refining depth")
    messages = [str(w.message) for w in caught if issubclass(w.category, InconsistentDepthLimitWarning)]
    assert len(messages) == 1 and "no consistent continuous-depth limit" in messages[0]
    assert ".md" not in messages[0]


def test_math_is_served_by_the_docs_themselves():
    """Issue 11, item 3: "Math does not render offline ... because MathJax is loaded from a CDN.
    Render math without the network (a MathJax bundled in the docs, e.g. from a packaged
    distribution ...)". The configured script is a relative path inside the built pages, and
    the packaged MathJax that ``html_static_path`` copies there holds it."""
    import importlib.util

    conf = (ROOT / "docs" / "conf.py").read_text()
    path = re.search(r'^mathjax_path = "([^"]+)"', conf, re.M).group(1)
    assert "://" not in path and not path.startswith("/")
    assert "sphinx-mathjax-offline" in conf and '"sphinx.ext.mathjax"' in conf
    spec = importlib.util.find_spec("sphinx-mathjax-offline")
    script = Path(spec.origin).parent / "static" / path
    assert script.is_file() and script.stat().st_size > 100_000   # the real tex-chtml bundle
    assert "https://" not in script.read_text(errors="replace")[:2000]


def test_a_removed_option_is_refused_naming_its_new_name(tmp_path):
    """Issue 11, item 9 names ``study --norm`` among the options whose defaults help must show;
    0.2 renamed it ``--placement`` (CHANGELOG: "the old name is removed"). The real entry point
    refuses it in one line that names the new option (before: "unrecognized arguments: --norm
    pre" and nothing else), creates no output directory, and ``--placement`` runs."""
    out = tmp_path / "old"
    proc = subprocess.run([sys.executable, "-m", "ctformer", "study", "--refine", "time", "--norm",
                           "post", "--levels", "1,2,8", "--out", str(out)], cwd=ROOT, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "ctformer: error: unrecognized arguments: --norm post (--norm was renamed --placement in "
        "0.2: use --placement post)"]
    assert not out.exists()
    assert "--placement {pre,post,post-projection,none}" in " ".join(
        cli.build_parser()._subparsers._group_actions[0].choices["study"].format_help().split())


@pytest.mark.parametrize("argv, line", [
    (["study", "--refine", "time", "--levels", "1,2,8", "--norm=pre", "--out", "OUT"],
     "unrecognized arguments: --norm=pre (--norm was renamed --placement in 0.2: use --placement pre)"),
    # another command never had --norm: no note that would send the user to a missing option
    (["limit", "--norm", "pre"], "unrecognized arguments: --norm pre"),
])
def test_the_renamed_note_reads_both_spellings_and_only_where_it_applies(tmp_path, capsys, argv,
                                                                        line):
    """Issue 11, item 9: a CLI that explains itself; "--norm=pre" is the same option."""
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"ctformer: error: {line}"]


def test_no_command_can_set_a_context_length_because_none_reads_positions():
    """The known item beside issue 11: converted networks take ``context_length`` in studies, the
    CLI does not. ``study`` builds ``random_smooth`` from its options, none of which adds
    positions (RoPE, ALiBi, a window), so the context length cannot change a number: with every
    option that shapes attention (causal, half diagonal) the errors for ``context_length=7``
    equal those without, bit for bit. ``limit --model`` solves a converted network at
    ``context_length = N``, its own token count, the one length at which the discrete limit is
    HuggingFace's network."""
    study = cli.build_parser()._subparsers._group_actions[0].choices["study"]
    options = {o for a in study._actions for o in a.option_strings}
    assert not {o for o in options if re.search("position|rope|alibi|window-size|context", o)}
    for diagonal in ("full", "half"):
        model = ContinuousTransformer.random_smooth(seed=1, layers=2, heads=2, mask="causal",
                                                    diagonal=diagonal, beta=4.0)
        plain, at_seven = (convergence(model, refine="tokens", levels=[4, 8, 16],
                                       features="gauss-legendre:4", progress=False, **extra)
                           for extra in ({}, {"context_length": 7.0}))
        assert plain.errors[0] > 1e-3
        assert [e.hex() for e in map(float, plain.errors)] == \
            [e.hex() for e in map(float, at_seven.errors)]


@pytest.mark.parametrize("text", ["", "   \n"])
def test_cluster_names_an_empty_text_before_loading_the_model(capsys, monkeypatch, text):
    """Issue 11, item 10 (``ctformer cluster``) and item 9 (a CLI that explains itself): an empty
    ``--text`` loaded torch and the MiniLM weights (about 10 s) and then said "text must be a
    non-empty string", the library's name for it. Now one line naming ``--text``, status 2, and
    the weights are never loaded (the loader is replaced by one that fails the test)."""
    from ctformer.particles import minilm

    def never(*args, **kwargs):
        raise AssertionError("the MiniLM weights were loaded")

    monkeypatch.setattr(minilm, "load_minilm", never)
    assert cli.main(["cluster", "--text", text]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "ctformer: error: --text is empty; give the text to encode, or leave --text out for the "
        "built-in paragraph"]


@pytest.mark.parametrize("extra, where", [
    (["--refine", "time", "--levels", "1,2,4", "--tokens", "gauss-legendre:4"], "--refine time"),
    (["--refine", "hidden", "--levels", "4,8,16", "--tokens", "gauss-legendre:4"], "--refine hidden"),
    (["--refine", "tokens", "--levels", "4,8,16", "--evaluate", "coarsest-nodes"],
     "--evaluate coarsest-nodes"),
])
def test_fine_is_refused_where_the_study_would_ignore_it(tmp_path, capsys, extra, where):
    """Issue 11, item 9 (CLI rough edges; the CLI refuses ``--window`` and ``--steps-per-layer``
    where the study would ignore them): ``--fine 300`` with ``--refine time``, ``--refine
    hidden`` or ``--evaluate coarsest-nodes`` ran with exit 0 and the very errors of a study
    without it. The library refuses it too (it left every error bit for bit). Now one line
    naming both options, status 2, no directory made."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    with pytest.raises(ValueError, match=r"fine=300 sets the evaluation points .* refine='time'"):
        convergence(model, refine="time", levels=[1, 2, 4], tokens="gauss-legendre:4",
                    features="gauss-legendre:4", progress=False, fine=300)
    out = tmp_path / "out"
    assert cli.main(["study", *extra, "--features", "gauss-legendre:4", "--fine", "300",
                     "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "ctformer: error: --fine 300 sets the evaluation grid of a refined token or feature axis "
        f"with --evaluate interpolate; with {where} it would be ignored (leave --fine out)"]
    assert not out.exists()


@pytest.mark.parametrize("refine, levels", [("time", "1,2,4"), ("hidden", "4,8,16")])
def test_evaluate_is_refused_where_the_study_would_ignore_it(tmp_path, capsys, refine, levels):
    """``--evaluate coarsest-nodes`` with ``--refine time`` or ``hidden`` (which the library
    refuses: it compares no refined token or feature axis) is refused as ``--fine`` is: one
    line naming the option, status 2, no directory made."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    with pytest.raises(ValueError, match="evaluate='coarsest-nodes'"):
        convergence(model, refine=refine, levels=[int(v) for v in levels.split(",")],
                    tokens="gauss-legendre:4", features="gauss-legendre:4", progress=False,
                    evaluate="coarsest-nodes")
    out = tmp_path / "out"
    assert cli.main(["study", "--refine", refine, "--levels", levels, "--evaluate", "coarsest-nodes",
                     "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"ctformer: error: --evaluate coarsest-nodes chooses where a refined token or feature axis "
        f"is compared; with --refine {refine} it would be ignored (leave --evaluate out)"]
    assert not out.exists()

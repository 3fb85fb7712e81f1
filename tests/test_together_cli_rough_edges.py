"""The command line and the model's entry points where a user met rough edges: ``ctformer
cluster`` prints the continuous-depth refinement again, ``ctformer study`` says truly what it
wrote when an output cannot be written, and a ``"NAME:N"`` whose size agrees with the state is
accepted by ``solve`` and ``evolve``."""
import math
import re

import numpy as np
import pytest

from ctformer import cli
from ctformer.discretizations import Midpoint
from ctformer.model import ContinuousTransformer

STUDY = ["study", "--refine", "tokens", "--discretization", "midpoint", "--levels", "4,8,16",
         "--layers", "1", "--no-progress"]


def _one_error_line(capsys) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ctformer: error: "), lines
    return lines[0]


# -- ctformer cluster: the continuous-depth refinement ---------------------------------------

def _fake_minilm(monkeypatch):
    """MiniLM's study replaced by seven layers of random unit vectors (no weights load)."""
    import ctformer.particles.minilm as minilm

    states = np.random.default_rng(1).standard_normal((7, 5, 4))
    states /= np.linalg.norm(states, axis=-1, keepdims=True)

    def study(text=None, **kwargs):
        stats, edges = minilm.layer_statistics(states)
        return minilm.ClusteringStudy("fake", list("abcde"), states, stats, edges)

    monkeypatch.setattr(minilm, "minilm_clustering", study)


def _reference_means(steps: int) -> np.ndarray:
    """Mean pairwise inner product of u(t, x_i, .) / |u(t, x_i, .)| at t = 0..6, computed here
    with NumPy from the model's layer states (u0 in closed form at the midpoint nodes)."""
    base = ContinuousTransformer.random_smooth(seed=0, layers=6, placement="pre", beta=4.0)
    model = ContinuousTransformer(base.blocks, final_normalization=None,
                                  head_features=base.head_features, hidden=base.hidden)
    nodes = (np.arange(32) + 0.5) / 32
    x, y = nodes[:, None], nodes[None, :]
    u0 = np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)
    path = model.solve(u0, tokens=Midpoint(32), features=Midpoint(32), scheme="lie",
                       steps_per_layer=steps, trajectory=True)
    means = []
    for u in path:
        v = np.asarray(u, dtype=np.float64)
        v = v / np.linalg.norm(v, axis=1, keepdims=True)
        means.append((v @ v.T)[np.triu_indices(32, 1)].mean())
    return np.array(means)


def test_cluster_prints_the_continuous_depth_refinement(capsys, monkeypatch):
    """Before: ``ctformer cluster`` printed MiniLM's table only, although the closing note of
    the particles issue says it prints the continuous-depth refinement of a pre-norm model too
    (``cluster_report`` still computed it). Now a table of the mean inner product at
    t = 0..6 for 1, 2, 4, 8 Lie steps per layer follows, with the observed order (Lie: 1)."""
    _fake_minilm(monkeypatch)
    assert cli.main(["cluster"]) == 0
    out = capsys.readouterr().out
    assert "Continuous-depth refinement of a pre-norm model" in out
    rows = {int(m.group(1)): np.array(m.group(2).split(), dtype=float)
            for m in re.finditer(r"^\s+k = (\d+)\s+(.*)$", out, re.M)}
    assert sorted(rows) == [1, 2, 4, 8] and all(len(r) == 7 for r in rows.values())
    reference = {k: _reference_means(k) for k in rows}
    for k in rows:
        np.testing.assert_allclose(rows[k], reference[k], atol=6e-5)  # printed with 4 decimals
    changes = [max(abs(reference[a] - reference[b])) for a, b in ((1, 2), (2, 4), (4, 8))]
    expected = [math.log2(c0 / c1) for c0, c1 in zip(changes, changes[1:])]
    orders = [float(p) for p in re.search(r"observed order (\S+), (\S+) ", out).groups()]
    np.testing.assert_allclose(orders, expected, atol=0.006)           # printed with 2 decimals
    assert all(0.9 < p < 1.1 for p in orders), orders                   # lie: first order
    assert f"at most {', '.join(f'{c:.2e}' for c in changes)}:" in out


def test_cluster_leaves_the_refinement_out_on_request(capsys, monkeypatch):
    import ctformer.particles.minilm as minilm

    _fake_minilm(monkeypatch)

    def never(*args, **kwargs):
        raise AssertionError("the refinement ran although --no-refinement was given")

    monkeypatch.setattr(minilm, "continuous_model_clustering", never)
    assert cli.main(["cluster", "--no-refinement"]) == 0
    out = capsys.readouterr().out
    assert "Token clustering in fake: 5 tokens, 6 layers" in out
    assert "Continuous-depth" not in out and "k = 1" not in out


# -- ctformer study: what was written --------------------------------------------------------

def test_study_refuses_an_output_that_is_a_directory_before_writing_anything(tmp_path, capsys):
    """Before: with OUT/convergence.json a directory the study ran, wrote convergence.csv and
    then said "(nothing was written)". Now it is refused before the study runs, and indeed
    nothing is written."""
    out = tmp_path / "out"
    (out / "convergence.json").mkdir(parents=True)
    assert cli.main([*STUDY, "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert (f"--out {str(out)!r}: convergence.json is a directory there, where the study writes "
            "a file; move or remove it, or give another --out (nothing was written)") in line
    assert sorted(p.name for p in out.iterdir()) == ["convergence.json"]


def test_study_names_the_files_written_before_a_failed_write(tmp_path, capsys, monkeypatch):
    """A write that fails after the check (the directory appeared meanwhile) names the files
    that were written before it, not "nothing was written"."""
    import ctformer.cli_study as cli_study

    out = tmp_path / "out"
    (out / "convergence.json").mkdir(parents=True)
    monkeypatch.setattr(cli_study, "_check_outputs", lambda *args: None)
    assert cli.main([*STUDY, "--out", str(out)]) == 2
    line = _one_error_line(capsys)
    assert f"cannot write {out / 'convergence.json'} (" in line
    assert line.endswith(f"written before it: {out / 'convergence.csv'}")
    assert "nothing was written" not in line
    assert (out / "convergence.csv").read_text().startswith("level,n,")


# -- solve and evolve: a size given twice, consistently --------------------------------------

MODEL = ContinuousTransformer.random_smooth(seed=0, layers=1)
STATE = np.random.default_rng(0).standard_normal((8, 12))


@pytest.mark.parametrize("method", ["solve", "evolve"])
def test_a_matching_size_in_the_name_is_accepted(method):
    """Before: tokens="midpoint:8" with a state of 8 tokens raised "the size is given twice".
    Now it is the same solve as with the Discretization objects."""
    run = getattr(MODEL, method)
    reference = run(STATE, tokens=Midpoint(8), features=Midpoint(12))
    for tokens, features in (("midpoint:8", "midpoint"), ("midpoint", "midpoint:12"),
                             ("midpoint:8", "midpoint:12")):
        np.testing.assert_array_equal(run(STATE, tokens=tokens, features=features), reference)


@pytest.mark.parametrize("method", ["solve", "evolve"])
def test_a_different_size_in_the_name_is_refused_naming_both(method):
    run = getattr(MODEL, method)
    with pytest.raises(ValueError, match=re.escape(
            "tokens='midpoint:9' asks for 9 values but u0 of shape (8, 12) has 8 tokens: give "
            "tokens='midpoint' (the size is then 8) or tokens='midpoint:8'")):
        run(STATE, tokens="midpoint:9", features="midpoint")
    with pytest.raises(ValueError, match=re.escape(
            "features='midpoint:11' asks for 11 values but u0 of shape (8, 12) has 12 features")):
        run(STATE, tokens="midpoint", features="midpoint:11")


def test_a_callable_state_takes_its_sizes_from_the_names():
    """A callable u0 cannot give sizes, and "NAME:N" does: before, it was refused as a name
    without n."""
    def u0(x, y):
        return np.cos(3 * x + y) + x * y

    reference = MODEL.solve(u0, tokens=Midpoint(8), features=Midpoint(12))
    np.testing.assert_array_equal(MODEL.solve(u0, tokens="midpoint:8", features="midpoint:12"),
                                  reference)
    with pytest.raises(ValueError, match="needs n, which a callable u0 cannot provide; pass a "
                                         "Discretization object or 'NAME:N' \\(e.g. 'midpoint:16'\\)"):
        MODEL.solve(u0, tokens="midpoint", features="midpoint:12")


def test_hidden_and_head_features_take_the_size_in_the_name():
    """The hidden and head-feature sizes default to the features' size only when none is
    given: before, hidden="midpoint:24" with 12 features was refused as "given twice"."""
    for name, size in (("hidden", 24), ("head_features", 6)):
        reference = MODEL.solve(STATE, tokens="midpoint", features="midpoint",
                                **{name: Midpoint(size)})
        out = MODEL.solve(STATE, tokens="midpoint", features="midpoint",
                          **{name: f"midpoint:{size}"})
        np.testing.assert_array_equal(out, reference)

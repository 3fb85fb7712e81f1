"""Numbers stated by the pages, recomputed on the current code (fifth audit).

Each number is read from the page, so that page and check cannot drift apart, and compared
with an independent count: step counts of the page's own model, and the stage counts of the
published Butcher tableaux for the memory a dense record holds.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def page(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())   # one line: sentences wrap


def stated(pattern: str, text: str) -> tuple:
    found = re.search(pattern, text)
    assert found, f"the page no longer states {pattern!r}"
    return found.groups()


def _model_and_grids():
    from ctformer import ContinuousTransformer
    from ctformer.discretizations import Chebyshev, GaussLegendre

    def u0(x, y):       # the page's first block
        return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)

    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    return model, u0, dict(tokens=GaussLegendre(16), features=Chebyshev(9))


def _counts(text: str) -> list[float]:
    return [float(v) for v in re.split(r",\s*|\s+and\s+", text)]


def test_solve_default_lie_step_counts_are_the_stated_ones():
    """The page had said that lie "takes about rtol^-1 steps" (1e4 at rtol 1e-4); the two
    layers take 52 there. The counts grow as rtol^-1 (first order), far below rtol^-1."""
    lie, tsit5 = stated(r"whose steps grow as :math:`\\mathrm\{rtol\}\^\{-1\}` at order 1: "
                        r"([\d, and]+?) steps for the two layers above at ``rtol = atol =`` "
                        r":math:`10\^\{-4\}, 10\^\{-5\}, 10\^\{-6\}`, where tsit5 takes ([\d, and]+?), "
                        r"so pass", page("adaptive_depth.rst"))
    model, u0, grids = _model_and_grids()
    for scheme, claimed in (("lie", _counts(lie)), ("tsit5", _counts(tsit5))):
        got = [model.evolve(u0, **grids, scheme=scheme, rtol=r, atol=r).stats["accepted"]
               for r in (1e-4, 1e-5, 1e-6)]
        np.testing.assert_allclose(got, claimed, rtol=0.05, err_msg=scheme)
    assert 5 < _counts(lie)[2] / _counts(lie)[1] < 20     # first order: x10 per decade


def test_strang_step_counts_per_unit_depth_are_the_stated_ones():
    """The page had said "about 1e5 steps per unit depth" at rtol 1e-10; measured 877. The
    counts grow as rtol^-1/2 (second order under step doubling): about x10 per two decades."""
    strang, tsit5 = stated(r"``strang`` on the model above takes ([\d, and]+?) at ``rtol = atol =`` "
                           r":math:`10\^\{-6\}, 10\^\{-8\}, 10\^\{-10\}` \(tsit5: ([\d., and]+?)\)",
                           page("adaptive_depth.rst"))
    model, u0, grids = _model_and_grids()
    for scheme, claimed in (("strang", _counts(strang)), ("tsit5", _counts(tsit5))):
        got = [model.evolve(u0, **grids, scheme=scheme, rtol=r, atol=r).stats["accepted"] / 2
               for r in (1e-6, 1e-8, 1e-10)]                  # two layers: per unit depth
        np.testing.assert_allclose(got, claimed, rtol=0.05, err_msg=scheme)
    assert _counts(strang)[2] < 1e4                           # not the 1e5 once stated


# Stages of the published tableaux (Bogacki-Shampine 1989, Dormand-Prince 1980, Tsitouras
# 2011), all first-same-as-last: a step shares its first stage with the step before.
STAGES = {"bosh3": 4, "dopri5": 7, "tsit5": 7}


@pytest.fixture
def record_sizes(monkeypatch):
    """The states each dense record adds, as the memory budget counts them."""
    from ctformer.solvers import saving

    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(10**12))
    sizes, cost = [], saving.Saver._record_cost

    def counted(self, record):
        nbytes = cost(self, record)
        sizes.append(nbytes // self.state_bytes)
        return nbytes

    monkeypatch.setattr(saving.Saver, "_record_cost", counted)
    return sizes


def test_dense_record_sizes_are_the_stated_ones(record_sizes):
    """End state + unshared stages: s states where FSAL shares one, s + 1 at the first step of a
    layer (the jump) and on particles (the retraction), 3 for a Hermite record."""
    import ctformer
    from ctformer.particles import SelfAttentionDynamics

    text = page("adaptive_depth.rst")
    pair = stated(r"(\d) states for dopri5 and tsit5, (\d) for bosh3, counting the end state; "
                  r"(\d) and (\d) for a step that shares none", text)
    assert [int(v) for v in pair] == [STAGES["tsit5"], STAGES["bosh3"],
                                      STAGES["tsit5"] + 1, STAGES["bosh3"] + 1]
    model, u0, grids = _model_and_grids()
    dense = ctformer.SaveAt(dense=True)
    for scheme, s in STAGES.items():
        record_sizes.clear()
        sol = model.evolve(u0, **grids, scheme=scheme, rtol=1e-6, atol=1e-6, save_at=dense)
        ends = np.asarray(sol.stats["step_times"])
        starts = np.concatenate([[0.0], ends[:-1]])
        first = np.isclose(starts, np.round(starts))                 # a step that opens a layer
        assert record_sizes == [s + 1 if f else s for f in first], scheme
    x0 = np.random.default_rng(0).normal(size=(8, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    for scheme in ("tsit5", "bosh3"):
        record_sizes.clear()
        SelfAttentionDynamics(beta=1.0).evolve(x0, 1.0, scheme=scheme, rtol=1e-6, atol=1e-6, save_at=dense)
        assert set(record_sizes) == {STAGES[scheme] + 1}, scheme
    record_sizes.clear()
    model.evolve(u0, **grids, scheme="rk4", steps_per_layer=3, save_at=dense)
    assert set(record_sizes) == {3}


def test_fixed_steps_refuse_error_control_other_than_the_defaults():
    """Every ``rtol``/``atol``/``max_steps`` passed beside fixed steps is refused, a value equal
    to the default included (``steps_per_layer=2, rtol=1e-6`` had run, 1e-6 not told apart from
    no value). The defaults stated are PIController's, the refusals name the argument."""
    from ctformer.particles import CircleMeanField, SelfAttentionDynamics
    from ctformer.solvers import PIController

    rtol, atol, max_steps = stated(r"a value equal to its default \(:math:`10\^\{(-\d+)\}`, "
                                   r":math:`10\^\{(-\d+)\}`, ([\d ]+)\)", page("adaptive_depth.rst"))
    control = PIController()
    assert (control.rtol, control.atol, control.max_steps) == (
        10.0 ** int(rtol), 10.0 ** int(atol), int(max_steps.replace(" ", "")))
    model, u0, grids = _model_and_grids()
    for name, value in (("rtol", 1e-3), ("atol", 1e-6), ("max_steps", 10)):
        with pytest.raises(ValueError, match=f"steps_per_layer=2 and {name}="):
            model.evolve(u0, **grids, steps_per_layer=2, **{name: value})
        with pytest.raises(ValueError, match=f"dt=0.1 and {name}="):
            SelfAttentionDynamics(beta=1.0).evolve(np.eye(3), 1.0, dt=0.1, **{name: value})
    with pytest.raises(ValueError, match="dt=0.05 and rtol=0.001"):
        CircleMeanField(beta=1.0, n_modes=16).evolve(lambda t: 1 + 0.1 * np.cos(t), 0.2, dt=0.05,
                                                     rtol=1e-3)
    with pytest.raises(ValueError, match="steps_per_layer=2 and rtol/atol both given"):
        model.solve(u0, **grids, steps_per_layer=2, rtol=1e-6)
    # a value equal to its default, passed, is refused too (it had been ignored silently)
    for name, value in (("rtol", 1e-6), ("atol", 1e-9), ("max_steps", 100_000)):
        with pytest.raises(ValueError, match=f"steps_per_layer=2 and {name}={value!r} both given"):
            model.evolve(u0, **grids, steps_per_layer=2, **{name: value})
    fixed = model.evolve(u0, **grids, steps_per_layer=2)    # the defaults left out: fixed steps
    assert fixed.stats["accepted"] == 2 * model.layers

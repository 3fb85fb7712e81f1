"""Studies on the inputs users have: padded batches, float32 states, converted networks.

References: the same sequence solved alone on its own midpoint grid (the padded study must
measure exactly that), a float64 rk4 solve with 256 steps per layer (error ~2e-9), and the
float64 study's slope over the same tolerances; for a converted Llama, Strang's order 2 and
direct solves at the study's context length.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import ctformer
from ctformer import solvers
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.studies import convergence, work_precision
from ctformer.studies.orders import fit_order

from .conftest import require

MODEL = ctformer.ContinuousTransformer.random_smooth(seed=1)
U = np.cos(np.arange(80.0).reshape(10, 8) / 7)


@pytest.mark.parametrize("fill", [0.01, 50.0])
def test_a_padded_sequence_is_measured_as_that_sequence_alone(fill):
    junk = np.random.default_rng(0).standard_normal((3, 8))
    padded = U.copy()
    padded[7:] = fill * junk  # whatever fills the padding is never read by a real token
    keep = np.ones((1, 10), dtype=bool)
    keep[:, 7:] = False
    rtols = (1e-4, 1e-6)
    study = work_precision(MODEL, padded[None], tokens=Midpoint(10), features=Midpoint(8),
                           schemes=("bosh3",), rtols=rtols, padding_mask=keep)
    alone = work_precision(MODEL, U[:7], tokens=Midpoint(7), features=Midpoint(8),
                           schemes=("bosh3",), rtols=rtols)
    # the controller reads the real tokens only, so both take the same steps ...
    assert [lv.accepted for lv in study.levels] == [lv.accepted for lv in alone.levels]
    # ... and the error must read them only too (it was 2.75e-8 at fill 50, 3.18e-6 at 0.01,
    # where the sequence alone has 1.01e-6)
    for padded_level, alone_level in zip(study.levels, alone.levels):
        assert padded_level.error == pytest.approx(alone_level.error, rel=1e-8)


class _Float32Guard:
    """The model, refusing a float32 solve at a tolerance below float32's rounding (which
    would take a million steps of 1.5e-7 before MaxStepsReached)."""

    def __init__(self, model):
        self.model = model

    def evolve(self, u0, **options):
        controller = options.get("controller")
        if u0.dtype == np.float32 and controller is not None and controller.rtol < 1e-10:
            raise AssertionError(f"a float32 solve at rtol={controller.rtol:g}")
        return self.model.evolve(u0, **options)


def _exact():
    """u(T) to ~2e-9: float64 rk4, 256 steps per layer."""
    return MODEL.evolve(U, scheme="rk4", steps_per_layer=256, tokens=GaussLegendre(10),
                        features=GaussLegendre(8)).final


def test_a_float32_study_is_measured_against_a_float64_reference():
    rtols = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
    study = work_precision(_Float32Guard(MODEL), U.astype(np.float32), tokens=GaussLegendre(10),
                           features=GaussLegendre(8), schemes=("bosh3",), rtols=rtols)
    assert study.reference.endswith("in float64")
    exact = _exact()
    weights = np.outer(GaussLegendre(10).weights, GaussLegendre(8).weights)
    for level in study.levels:
        sol = MODEL.evolve(U.astype(np.float32), scheme="bosh3", rtol=level.rtol,
                           atol=1e-3 * level.rtol, tokens=GaussLegendre(10),
                           features=GaussLegendre(8)).final
        diff = np.sum(weights * (sol.astype(np.float64) - exact) ** 2)
        # rk4's own error (~2e-9 relative) is far below float32's rounding (1.2e-7)
        assert level.error == pytest.approx(math.sqrt(diff / np.sum(weights * exact ** 2)),
                                            abs=1e-8)


def test_a_float32_slope_leaves_out_the_errors_at_its_rounding():
    rtols = (1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8)
    grids = dict(tokens=GaussLegendre(10), features=GaussLegendre(8), schemes=("bosh3",),
                 rtols=rtols)
    single = work_precision(MODEL, U.astype(np.float32), **grids)
    double = work_precision(MODEL, U, **grids)
    assert single.floor == pytest.approx(10 * 2.0 ** -23)
    errors = [lv.error for lv in single.levels]
    # float32 errors stall near 3e-7 from rtol 1e-5 on; over all six tolerances the slope
    # is 0.18 (tolerance proportionality reads 1)
    assert fit_order(rtols, errors, floor=1e-13) < 0.4
    kept = [r for r, e in zip(rtols, errors) if e > single.floor]
    assert kept == [1e-3, 1e-4]
    same_range = fit_order(kept, [lv.error for lv in double.levels][:len(kept)])
    assert single.slope("bosh3") == pytest.approx(same_range, abs=0.06)
    assert "errors <= 1.2e-06" in single.table()
    assert double.floor == 1e-13 and double.slope("bosh3") == pytest.approx(0.83, abs=0.05)


def _converted_llama():
    """A small float64 Llama (RoPE, causal) converted, and the embeddings of one sequence."""
    require("transformers")
    from ctformer.bridges.hf import from_hf, small_model

    hf = small_model("llama", 0)
    torch = require("torch")
    x = torch.randn(9, hf.config.hidden_size, generator=torch.Generator().manual_seed(1),
                    dtype=torch.float64).numpy()
    return from_hf(hf), x


@pytest.mark.transformers
def test_a_study_of_a_converted_network_takes_its_context_length(tmp_path):
    model, x = _converted_llama()
    assert model.context_length is None  # RoPE reads positions: no study ran without it
    tokens, features = Midpoint(9), Midpoint(x.shape[1])
    study = dict(refine="time", levels=[1, 2, 4, 8, 16, 128], u0=x, tokens=tokens,
                 features=features, scheme="strang", progress=False, store=tmp_path)
    result = convergence(model, context_length=9, **study)
    # Strang's order on this pre-norm network (the theorem), by a fitted slope
    assert solvers.get("strang").order(model) == 2
    assert result.observed_order == pytest.approx(2.0, abs=0.05)
    # the errors are those of direct solves at positions 0..8 (L = 9), in the grids' L2 norm
    grids = dict(tokens=tokens, features=features, context_length=9)
    finest = model.solve(x, scheme="strang", steps_per_layer=128, trajectory=True, **grids)[-1]
    weights = np.outer(tokens.quadrature_weights, features.quadrature_weights)
    for row in result.table[:-1]:
        level = model.solve(x, scheme="strang", steps_per_layer=row.n, trajectory=True, **grids)
        assert row.error == pytest.approx(
            math.sqrt(np.sum(weights * (level[-1] - finest) ** 2)), rel=1e-12)
    # another reference length is another computation: nothing stored is reused
    longer = convergence(model, context_length=12, **study)
    assert len(list(tmp_path.glob("*.json"))) == 12
    assert longer.table[0].error != pytest.approx(result.table[0].error, rel=1e-3)


def test_a_float32_time_study_fits_above_its_rounding():
    u = np.cos(np.arange(16 * 12.0).reshape(16, 12) / 7)
    study = dict(refine="time", levels=[1, 2, 4, 8, 16, 32, 256], scheme="rk4", progress=False)
    model = ctformer.ContinuousTransformer.random_smooth(seed=0)
    single = convergence(model, u0=u.astype(np.float32), **study)
    double = convergence(model, u0=u, **study)
    errors = [row.error for row in single.table[:-1]]
    # float32 errors stall near 5e-6 from 4 steps on; the fit over them read 1.50 for rk4
    assert fit_order(single.h, errors, 1e-12) < 2.0
    assert single.rounding == 2.0 ** -23 and single.floor >= 100 * 2.0 ** -23
    assert single.observed_order == pytest.approx(fit_order(single.h[:2], errors[:2]))
    # above the floor the float32 levels are the float64 ones (the theorem's 4 is reached
    # only at finer levels, where float32 has stalled)
    assert single.observed_order == pytest.approx(fit_order(double.h[:2], double.errors[:2]),
                                                  abs=0.02)
    assert "are rounding and left out of the fit" in str(single)
    assert double.floor < 1e-11 and "rounding and left out" not in str(double)


def test_interrupted_studies_pickle_with_their_counts():
    # before: TypeError: __init__() missing 2 required positional arguments: 'total' and 'directory'
    import pickle

    from ctformer.studies.execution import StudyInterrupted, WorkerLost

    for exc in (StudyInterrupted(2, 5, "/tmp/store", kept=("time level 1", "time level 2")),
                WorkerLost(1, 4, None, "worker tcp://x died", kept=("tokens level 1",))):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and str(back) == str(exc)
        assert (back.stored, back.total, back.directory, back.kept) == (exc.stored, exc.total, exc.directory, exc.kept)

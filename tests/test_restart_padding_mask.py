"""A restart continues the saved solve only with its padding mask: without it, or with
another, the real tokens were silently 0.037 off the uninterrupted solve; with it, they keep
the bits. The mask travels in solution files too."""
import numpy as np
import pytest

import ctformer as ct
from ctformer import SaveAt, labelled
from ctformer import discretizations as d
from ctformer.solvers import MaxStepsReached

from .conftest import require

TOKENS, FEATURES = d.get("midpoint:8"), d.get("gauss-legendre:6")


@pytest.fixture(scope="module")
def solves():
    model = ct.ContinuousTransformer.random_smooth(seed=0, layers=2)
    x = np.random.default_rng(0).standard_normal((2, 8, 6))
    mask = np.ones((2, 8), bool)
    mask[1, 5:] = False
    kw = dict(tokens=TOKENS, features=FEATURES, rtol=1e-6, atol=1e-9)
    full = model.evolve(x, padding_mask=mask, **kw)
    with pytest.raises(MaxStepsReached) as stopped:
        model.evolve(x, padding_mask=mask, max_steps=5, save_at=SaveAt(steps=True), **kw)
    return model, mask, kw, full, stopped.value.solution


def test_a_restart_with_another_padding_mask_is_refused(solves):
    model, mask, kw, full, part = solves
    other = mask.copy()
    other[1, 6] = True
    for given in (None, other):
        with pytest.raises(ValueError, match="padding_mask: saved"):
            model.evolve(None, padding_mask=given, initial=part, **kw)
    rest = model.evolve(None, padding_mask=mask, initial=part, **kw)
    assert np.array_equal(rest.final, full.final)


def test_the_padding_mask_travels_in_solution_files(solves, tmp_path):
    require("h5netcdf")
    model, mask, kw, full, part = solves
    path = tmp_path / "part.nc"
    labelled.to_netcdf(part, path)
    saved = labelled.open_dataset(path)
    with pytest.raises(ValueError, match="padding_mask: saved"):
        model.evolve(None, padding_mask=None, initial=saved, **kw)
    rest = model.evolve(None, padding_mask=mask, initial=saved, **kw)
    assert np.array_equal(rest.final, full.final)

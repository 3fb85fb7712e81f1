"""Audit 41 of the studies: Richardson and the expected order of Galerkin elements refined in
the hidden variable, and the rounding floor of a study written to JSON and read back."""
import numpy as np

import ctformer
import ctformer.discretizations as d
from ctformer.kernels import PiecewiseConstant
from ctformer.model import Block, ContinuousTransformer
from ctformer.operators import FeedForward
from ctformer.studies import ConvergenceResult, convergence, smooth_initial_state
from ctformer.studies.orders import effective_order

HIDDEN = dict(refine="hidden", hidden="p1", levels=[3, 5, 9, 17, 65],
              tokens="gauss-legendre:8", features="gauss-legendre:8", progress=False)


def _smooth():
    return ctformer.ContinuousTransformer.random_smooth(seed=1, layers=1)


def _piecewise(d_model=4, d_hidden=6):
    rng = np.random.default_rng(0)
    ff = FeedForward(PiecewiseConstant(rng.standard_normal((d_hidden, d_model))),
                     PiecewiseConstant(rng.standard_normal((d_model, d_hidden))))
    return ContinuousTransformer([Block(feedforward=ff)])


def test_richardson_of_hidden_p1_extrapolates_with_the_composite_gauss_order():
    # P1 in the hidden variable converges as a composite 3-point Gauss rule (order 6):
    # extrapolating with the element order 2 left a reference 1e-11 off, and the fit read
    # 4.90 where the finest reference gives 6.78
    model = _smooth()
    richardson = convergence(model, reference="richardson", **HIDDEN)
    finest = convergence(model, reference="finest", **HIDDEN)
    slope = np.polyfit(np.log(finest.h), np.log(finest.errors), 1)[0]
    assert abs(richardson.observed_order - slope) < 0.05
    # the errors of the measured levels agree with those against the finest level (was 7% off)
    np.testing.assert_allclose(richardson.errors[:4], finest.errors, rtol=1e-2)
    assert richardson.errors[-1] < 1e-12


def test_hidden_p1_with_piecewise_kernels_expects_the_limited_order():
    # the jumping kernels make every rule first order; the headline said "expected 6"
    result = convergence(_piecewise(), refine="hidden", hidden="p1",
                         levels=[3, 5, 9, 17, 33, 129], tokens="gauss-legendre:6",
                         features="gauss-legendre:8", progress=False)
    slope = np.polyfit(np.log(result.h), np.log(result.errors), 1)[0]
    assert abs(slope - 1.0) < 0.1 and abs(result.observed_order - slope) < 1e-9
    assert effective_order(result) == 1.0 and result.gauss_points == 3
    assert "expected 1:" in result.headline() and "expected 6" not in result.headline()
    assert "below it" not in result.headline() and "above it" not in result.headline()


def test_float32_study_read_back_from_json_keeps_its_rounding_floor(tmp_path):
    model = _smooth()
    tokens, features = d.get("gauss-legendre", 8), d.get("gauss-legendre", 8)
    u0 = np.asarray(model.grids(tokens, features).sample(smooth_initial_state), dtype=np.float32)
    result = convergence(model, refine="time", levels=[2, 4, 8, 32], scheme="rk4", tokens=tokens,
                         features=features, u0=u0, progress=False)
    eps = float(np.finfo(np.float32).eps)
    assert result.rounding == eps and result.floor >= 100 * eps
    back = ConvergenceResult.from_json(result.to_json(tmp_path / "study.json"))
    assert back.floor == result.floor and back.rounding == eps
    assert str(back) == str(result) and f"eps = {eps:.3g}" in str(back)

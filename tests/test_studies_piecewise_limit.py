"""A feature study of a model with piecewise-constant kernels (converted weight matrices)
expects first order where the rule's cells do not line up with the kernels' jumps: the
order those integrals converge with (fitted 1.00 for trapezoid, 2.00 for aligned midpoint,
tests/test_discretizations_audit_jumps.py)."""
import numpy as np

import ctformer.discretizations as d
from ctformer.kernels import PiecewiseConstant
from ctformer.model import Block, ContinuousTransformer
from ctformer.operators import FeedForward
from ctformer.studies.results import order_limits


def _model(d_model=4, d_hidden=6):
    rng = np.random.default_rng(0)
    ff = FeedForward(PiecewiseConstant(rng.standard_normal((d_hidden, d_model))),
                     PiecewiseConstant(rng.standard_normal((d_model, d_hidden))))
    return ContinuousTransformer([Block(feedforward=ff)])


def test_piecewise_kernels_limit_misaligned_feature_rules_to_first_order():
    model = _model()
    limits = order_limits(model, "features", d.get("trapezoid:9"))
    assert [p for p, _ in limits] == [1.0] and "piecewise-constant" in limits[0][1]
    assert order_limits(model, "features", d.get("midpoint:8")) == []       # 4 divides 8
    assert [p for p, _ in order_limits(model, "features", d.get("midpoint:6"))] == [1.0]
    # the hidden variable meets W_2's input cells (6 of them)
    assert order_limits(model, "hidden", d.get("midpoint:12")) == []
    assert [p for p, _ in order_limits(model, "hidden", d.get("gauss-legendre:8"))] == [1.0]


def test_smooth_kernels_keep_the_rules_order():
    smooth = ContinuousTransformer.random_smooth(seed=0, layers=1)
    assert order_limits(smooth, "features", d.get("trapezoid:9")) == []

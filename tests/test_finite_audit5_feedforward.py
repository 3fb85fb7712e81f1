"""Feature maps and feed-forward operators whose values overflow the state's dtype (audit:
finite inputs, finite outputs).

A finite float32 state of size 1e20 through a SwiGLU layer has gate x up products near 1e41,
beyond float32's largest number 3.4e38: no float32 result is right, and the operator returned
inf (a NumPy RuntimeWarning at most). Its public call now refuses with FloatingPointError, as
attention's does. Reference: the same operator in float64, whose values exceed 3.4e38.
"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.operators import FeatureMap, FeedForward, GatedFeedForward, Grids
from tests.conftest import require

D, H = 8, 16
GRIDS = Grids(Midpoint(4), Midpoint(D), Midpoint(H))
FLOAT32_MAX = float(np.finfo(np.float32).max)


def _weights():
    rng = np.random.default_rng(0)
    return rng.standard_normal((H, D)), rng.standard_normal((H, D)), rng.standard_normal((D, H))


def _operators():
    gate, up, down = _weights()
    return {"swiglu": GatedFeedForward(PiecewiseConstant(gate), PiecewiseConstant(up), PiecewiseConstant(down)),
            "gelu": FeedForward(PiecewiseConstant(gate), PiecewiseConstant(down), activation="gelu"),
            "map": FeatureMap(PiecewiseConstant(np.outer(np.arange(1.0, D + 1), np.ones(D))))}


def _state(scale):
    return np.random.default_rng(1).standard_normal((4, D)) * scale


@pytest.mark.parametrize("name, scale", [("swiglu", 1e20), ("gelu", 1e38), ("map", 1e38)])
@pytest.mark.parametrize("kind", ["numpy", "torch"])
def test_overflowing_float32_results_are_refused(name, scale, kind, loop_engine):
    """SwiGLU of a float32 state of 1e20 returned inf (float64: values near 1e41); a GELU
    feed-forward and a feature map of 1e38 likewise; now FloatingPointError naming the
    operator, the dtype and the remedy."""
    op = _operators()[name]
    u64 = _state(scale)
    assert float(np.max(np.abs(op(u64, GRIDS)))) > FLOAT32_MAX  # no float32 answer exists
    u = u64.astype(np.float32)
    if kind == "torch":
        u = require("torch").from_numpy(u)
    with pytest.raises(FloatingPointError, match=rf"{type(op).__name__} of u overflows float32: with max \|u\| = "
                                                 r".*scale u \(or the weights\) down or pass u as float64"):
        op(u, GRIDS)


def test_overflowing_float64_result_is_refused(loop_engine):
    """Float64 SwiGLU of a state of 1e160 (products near 1e321) returned inf; now refused."""
    with pytest.raises(FloatingPointError, match=r"GatedFeedForward of u overflows float64: .*down$"):
        _operators()["swiglu"](_state(1e160), GRIDS)


@pytest.mark.parametrize("name", ["swiglu", "gelu", "map"])
def test_representable_float32_results_are_unchanged(name, loop_engine):
    """Below the overflow the float32 result is the float64 one to float32's precision."""
    op = _operators()[name]
    u64 = _state(1e17)
    expected = op(u64, GRIDS)
    got = op(u64.astype(np.float32), GRIDS)
    assert got.dtype == np.float32
    assert float(np.max(np.abs(got - expected))) <= 1e-5 * float(np.max(np.abs(expected)))

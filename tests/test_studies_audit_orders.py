"""Orders and verdicts of convergence studies, audited against hand-computed slopes.

Neighbour orders refuse what the fitted order refuses, the fit keeps the finest levels
whatever their order, a verdict with one neighbour order still says its miss, an overflowed
error is named by level, and an evaluation grid too coarse for the measured levels warns.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from ctformer.model import ContinuousTransformer
from ctformer.studies import (ConvergenceResult, Row, UnderResolvedErrorWarning, convergence,
                              fit_order, neighbour_orders)

# a 'model' whose solution is its sampled initial state (the error is the rule's own), its u0
from .test_study_edge_cases import SampledInitialState as SampledState, _u0 as _wave

H = [0.5, 0.25, 0.125, 0.0625]


def _slope(h, e):
    """The least-squares slope of log e against log h, by numpy.polyfit."""
    return float(np.polyfit(np.log(h), np.log(e), 1)[0])


# -- neighbour_orders: the same contract as fit_order -----------------------------------------
@pytest.mark.parametrize("bad, shown", [(math.nan, "nan"), (math.inf, "inf"), (-2.5e-3, "-0.0025")])
def test_neighbour_orders_refuse_what_fit_order_refuses(bad, shown):
    """A NaN or negative error gave a NaN or None order where fit_order raised."""
    errors = [1e-2, bad, 6e-4, 1.5e-4]
    message = (r"errors must be norms \(finite, >= 0; None to skip a level\), got "
               rf"errors\[1\] = {shown}")
    for fitter in (neighbour_orders, fit_order):
        with pytest.raises(ValueError, match=message):
            fitter(H, errors)


def test_neighbour_orders_refuse_bad_mesh_widths_and_lengths():
    with pytest.raises(ValueError, match=r"h must hold finite mesh widths > 0, got h\[2\] = 0.0"):
        neighbour_orders([0.5, 0.25, 0.0], [1e-2, 2.5e-3, 6e-4])
    with pytest.raises(ValueError, match="h and errors must have the same length, got 3 mesh "
                                         "widths and 2 errors"):
        neighbour_orders([0.5, 0.25, 0.125], [1e-2, 2.5e-3])


def test_neighbour_orders_are_the_closed_form_and_skip_what_the_fit_skips():
    # e = 3 h^2 then a level with zero error (exact at its nodes) and the reference (None)
    errors = [3 * h**2 for h in H[:2]] + [0.0, None]
    assert neighbour_orders(H, errors) == [None, pytest.approx(2.0, rel=1e-14), None, None]
    assert fit_order(H, errors) == pytest.approx(2.0, rel=1e-14)     # the zero is left out
    h, e = [0.4, 0.2, 0.1, 0.05], [1e-2, 3e-3, 6e-4, 1e-4]
    expected = [math.log(a / b) / math.log(2.0) for a, b in zip(e, e[1:])]
    assert neighbour_orders(h, e)[1:] == pytest.approx(expected, rel=1e-14)


# -- fit_order against numpy.polyfit on log-log -------------------------------------------------
def test_fit_order_is_polyfit_over_the_levels_above_the_floor():
    h, e = [0.5, 0.25, 0.125, 0.0625, 0.03125], [0.2, 0.06, 0.013, 3.1e-3, 1e-17]
    assert fit_order(h, e, floor=1e-15) == pytest.approx(_slope(h[:4], e[:4]), rel=1e-12)
    assert fit_order(h, e, floor=1e-15, fit_levels=3) == pytest.approx(_slope(h[1:4], e[1:4]),
                                                                       rel=1e-12)


def test_fit_levels_keeps_the_finest_levels_in_any_order():
    """Given coarse-last (rtols ascending, say) the fit kept the coarsest levels: slope 1.00
    from the two of h = 0.25, 0.5 where the two finest (0.0625, 0.125) have slope 2."""
    h, e = [0.0625, 0.125, 0.25, 0.5], [1e-4, 4e-4, 1.6e-3, 3.2e-3]
    finest = _slope([0.0625, 0.125], [1e-4, 4e-4])
    assert finest == pytest.approx(2.0, rel=1e-12)
    assert fit_order(h, e, fit_levels=2) == pytest.approx(finest, rel=1e-12)
    assert fit_order(h[::-1], e[::-1], fit_levels=2) == pytest.approx(finest, rel=1e-12)
    assert fit_order(h, e, fit_levels=3) == pytest.approx(_slope(h[:3], e[:3]), rel=1e-12)


# -- verdicts -------------------------------------------------------------------------------------
def _result(errors, observed, expected=2.0):
    h = [0.25, 0.125, 0.0625][:len(errors)]
    orders = neighbour_orders(h, errors)
    table = [Row(level=i, n=int(round(1 / hi)), h=hi, error=e, order=o, seconds=0.0)
             for i, (hi, e, o) in enumerate(zip(h, errors, orders))]
    return ConvergenceResult(table=table, observed_order=observed, expected_order=expected,
                             refine="tokens", method="midpoint", reference="finest", norm="l2",
                             min_feature_std=0.4, wall_seconds=0.0)


def test_a_verdict_with_one_neighbour_order_says_its_miss():
    """One neighbour order far from the expected one added no note (the many-order case did)."""
    errors = [1e-2, 1e-2 / 2 ** 1.2, None]                # one order, 1.20, then the reference
    result = _result(errors, fit_order([0.25, 0.125, 0.0625], errors))
    assert result.observed_order == pytest.approx(1.2, rel=1e-12)
    assert result.headline() == (
        "observed order 1.20 (expected 2); below it, with one neighbour order (1.20): too few "
        "levels to tell pre-asymptotic levels from an error limited by something else; add levels")
    close = _result([1e-2, 1e-2 / 2 ** 1.9, None], 1.9)    # within 0.3: no note
    assert close.headline() == "observed order 1.90 (expected 2)"


def test_a_verdict_with_several_neighbour_orders_is_unchanged():
    errors = [1e-2, 1e-2 / 2 ** 1.2, 1e-2 / 2 ** 2.6]      # orders 1.20, 1.40: moving towards 2
    result = _result(errors, fit_order([0.25, 0.125, 0.0625], errors))
    assert result.observed_order == pytest.approx(_slope([0.25, 0.125, 0.0625], errors))
    assert "the neighbour orders (1.20, 1.40) move towards 2" in result.headline()


# -- studies: an overflowed error, an under-resolved evaluation --------------------------------------


def test_an_overflowed_error_is_named_by_level():
    """Finite values near 1e154 differ by 2e154, whose square is inf: NumPy warned of an
    overflow and fit_order refused the table with a message about its own argument."""
    huge = lambda x, y: 1e154 * _wave(x, y)       # noqa: E731
    with pytest.raises(FloatingPointError, match=r"the error at tokens level\(s\) 4 \(max \|u\| = "
                                                 r"[0-9.]+e\+153\), 8 .* overflows float64"):
        convergence(SampledState(), refine="tokens", levels=[4, 8, 16], tokens="midpoint",
                    features="gauss-legendre:4", u0=huge, reference=lambda x, y: -huge(x, y),
                    fine=400, progress=False)


def test_a_coarse_evaluation_grid_warns_before_the_study_runs():
    study = dict(refine="tokens", levels=[8, 16, 32, 64, 256], tokens="midpoint",
                 features="gauss-legendre:4", u0=_wave, progress=False)
    with pytest.warns(UnderResolvedErrorWarning,
                      match=r"fine=200 evaluation points under-resolve the error of tokens "
                            r"levels \[64\] of midpoint \(points per mesh width 64: 3.1; fewer "
                            r"than 6\).* pass fine=384 or more"):
        convergence(SampledState(), fine=200, **study)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnderResolvedErrorWarning)
        convergence(SampledState(), fine=384, **study)                   # 6 points per width
        # left out, fine is the 6 points per width of the finest measured level, 6 * 64
        assert convergence(SampledState(), **study).parameters["fine"] == 384
        convergence(SampledState(), evaluate="coarsest-nodes", **study)  # no reconstruction
        convergence(SampledState(), **dict(study, tokens="gauss-legendre", levels=[8, 16, 64]))
        # a window of length 1/4 holds fine points on a quarter of the interval: 4x denser
        convergence(SampledState(), fine=96, window=(0.5, 0.75), **study)


def test_the_drift_the_warning_names_against_the_closed_form():
    """Midpoint tokens 8..128 against 512: at 200 points the last order read 2.42; resolved
    (1024 points) it is the closed form of a finest reference, log2(63 / 15) = 2.07."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=2)
    mild = lambda x, y: np.cos(4.0 * y + 0.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)  # noqa: E731,E501
    study = dict(refine="tokens", levels=[8, 16, 32, 64, 128, 512], tokens="midpoint",
                 features="gauss-legendre:12", u0=mild, progress=False)
    # e_h ~ C (h^2 - h_ref^2): the order between h = 1/64 and 1/128 against h_ref = 1/512
    closed = math.log2((1 / 64**2 - 1 / 512**2) / (1 / 128**2 - 1 / 512**2))   # 2.070
    with pytest.warns(UnderResolvedErrorWarning, match="pass fine=768 or more"):
        coarse = convergence(model, fine=200, **study)
    resolved = convergence(model, fine=1024, **study)
    default = convergence(model, **study)                                 # 6 * 128 = 768 points
    assert abs(coarse.table[4].order - closed) > 0.3                      # 2.42
    assert resolved.table[4].order == pytest.approx(closed, abs=0.03)     # 2.05
    assert default.parameters["fine"] == 768
    assert default.table[4].order == pytest.approx(closed, abs=0.03)

"""Property-based robustness of the model and attention entry points: random shapes, dtypes
and values (NaN, inf, 1e300, 1e-300, empty, lists) give a documented exception with a message
that names the argument, or a finite answer that matches an independent reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp

from ctformer import ContinuousTransformer
from ctformer.discretizations import Midpoint
from ctformer.operators import quadrature_attention

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
SPECIAL = [0.0, 1e300, -1e300, 1e-300, 1.0, -2.5, math.nan, math.inf]
MODEL = ContinuousTransformer.random_smooth(seed=0, layers=1)


@st.composite
def states(draw):
    n = draw(st.integers(0, 5))
    d = draw(st.integers(0, 5))
    values = draw(st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(-10, 10)),
                           min_size=n * d, max_size=n * d))
    kind = draw(st.sampled_from(["float64", "float32", "list", "int"]))
    array = np.array(values, dtype=np.float64).reshape(n, d)
    if kind == "float32":
        with np.errstate(over="ignore"):
            array = array.astype(np.float32)
    elif kind == "int":
        assume(np.all(np.isfinite(array)) and np.all(np.abs(array) < 1e9))
        array = array.astype(np.int64)
    return (array.tolist() if kind == "list" else array), array


@SETTINGS
@given(states())
def test_solve_refuses_clearly_or_matches_float64(case):
    given_state, array = case
    n, d = array.shape
    try:
        out = MODEL.solve(given_state, tokens="midpoint", features="midpoint")
    except (ValueError, TypeError) as exc:
        message = str(exc)
        assert any(word in message for word in ("u0", "n must", "tokens", "features", "variance",
                                                "Midpoint", "needs n")), message
        return
    assert n >= 1 and d >= 1 and np.all(np.isfinite(out))
    reference = MODEL.solve(np.asarray(array, dtype=np.float64), tokens=Midpoint(n), features=Midpoint(d))
    tolerance = 1e-3 if np.asarray(array).dtype == np.float32 else 1e-12
    assert np.abs(np.asarray(out, dtype=np.float64) - reference).max() <= tolerance * (1 + np.abs(reference).max())


def _reference_attention(q, k, v, beta):
    scores = beta * (q @ k.T)
    weights = np.exp(scores - logsumexp(scores, axis=-1, keepdims=True))
    return weights @ v


@SETTINGS
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 3),
       st.lists(st.one_of(st.sampled_from(SPECIAL), st.floats(-3, 3)), min_size=48, max_size=48),
       st.sampled_from([0.5, 1e-8, 1e8, "1", True]), st.booleans())
def test_quadrature_attention_refuses_clearly_or_matches_logsumexp(n, m, e, values, beta, as_list):
    data = np.array(values)
    q, k, v = data[: n * 2].reshape(n, 2), data[16: 16 + m * 2].reshape(m, 2), data[32: 32 + m * e].reshape(m, e)
    args = [a.tolist() if as_list else a for a in (q, k, v)]
    try:
        out = quadrature_attention(*args, beta=beta)
    except (ValueError, TypeError) as exc:
        assert any(name in str(exc) for name in ("q ", "k ", "v ", "q must", "k must", "v must", "beta")), str(exc)
        assert not (np.all(np.isfinite(data[:48])) and not isinstance(beta, (str, bool)))
        return
    assert np.all(np.isfinite(out))
    with np.errstate(over="ignore", invalid="ignore"):
        scores_finite = np.all(np.isfinite(float(beta) * (q @ k.T)))
    if scores_finite:
        np.testing.assert_allclose(out, _reference_attention(q, k, v, float(beta)), rtol=1e-9,
                                   atol=1e-9 * (1 + np.abs(v).max()))


def test_empty_and_wrong_rank_states_are_refused():
    for bad in (np.zeros((0, 3)), np.zeros(4), [[1.0, 2.0], [3.0]]):
        with pytest.raises((ValueError, TypeError)):
            MODEL.solve(bad, tokens="midpoint", features="midpoint")

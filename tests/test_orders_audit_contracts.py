"""Expected orders of studies where the model, not the data, breaks the refined rule's contract.

Measured on one-layer ``random_smooth`` models: a periodic rule (``fourier``) refined in the
FFN hidden variable or in the features, and a spectral token rule under ALiBi without a mask,
each expected spectral convergence (``inf``) where the model caps the order. The references are
theorems about the rules: the equal-weight rule on ``[0, 1)`` is a left Riemann sum whose error
is ``(f(0) - f(1)) h / 2 + O(h^2)`` (Euler-Maclaurin) on a non-periodic integrand; the
trigonometric interpolant of a function whose periodic extension jumps has an L2 error
``O(h^1/2)``; a quadrature rule on an integrand whose derivative jumps inside a cell is
``O(h^2)``.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from ctformer.model import ContinuousTransformer
from ctformer.studies import convergence, fit_order
from ctformer.studies.results import NonPeriodicDataWarning


def _mild(x, y):
    return np.cos(4.0 * y + 0.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def _periodic_in_y(x, y):
    return (np.cos(2 * np.pi * y + 0.5 * np.sin(np.pi * x + 0.5))
            + 0.3 * np.sin(np.pi * x) * np.cos(2 * np.pi * y))


def _finest_order(h_coarse, h_fine, h_ref, p):
    """The neighbour order of e_h = C (h^p - h_ref^p): what a finest reference shows."""
    return math.log((h_coarse ** p - h_ref ** p) / (h_fine ** p - h_ref ** p)) / math.log(2.0)


def test_fourier_in_the_hidden_variable_is_a_left_riemann_sum():
    """The smooth random kernels are not periodic in r: expected inf, observed 1.04-1.08."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    with pytest.warns(NonPeriodicDataWarning, match="refining hidden with fourier"):
        result = convergence(model, refine="hidden", levels=[8, 16, 32, 64, 2048],
                             hidden="fourier", tokens="gauss-legendre:12",
                             features="gauss-legendre:12", u0=_mild, progress=False)
    assert result.expected_order == 1.0                                # was inf
    assert "left Riemann sum (order 1)" in result.limitation
    assert abs(result.observed_order - 1.0) < 0.1                      # 1.06
    closed = _finest_order(1 / 32, 1 / 64, 1 / 2048, 1.0)              # 1.023
    assert result.table[3].order == pytest.approx(closed, abs=0.05)    # 1.04
    # the same in the maximum norm: nothing is interpolated in r, so no Gibbs
    with pytest.warns(NonPeriodicDataWarning):
        peak = convergence(model, refine="hidden", levels=[8, 16, 32], hidden="fourier",
                           features="gauss-legendre:8", u0=_mild, error_norm="max",
                           progress=False)
    assert peak.expected_order == 1.0


def test_fourier_features_on_periodic_data_meet_the_models_kernels():
    """u0 is periodic in y, but W(y, y') and the biases are not: after one step the state is
    not periodic either. Expected inf; observed 0.59 (L2) and 1.11 at the coarsest nodes."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    study = dict(refine="features", levels=[8, 16, 32, 64, 256], features="fourier",
                 tokens="gauss-legendre:12", u0=_periodic_in_y, progress=False)
    with pytest.warns(NonPeriodicDataWarning, match="refining features with fourier"):
        l2 = convergence(model, **study)
    assert l2.expected_order == 0.5                                     # was inf
    assert "kernels are not periodic in the features" in l2.limitation
    assert abs(l2.observed_order - 0.5) < 0.2                           # 0.59
    with pytest.warns(NonPeriodicDataWarning):
        nodes = convergence(model, evaluate="coarsest-nodes", **study)
    assert nodes.expected_order == 1.0
    assert abs(nodes.observed_order - 1.0) < 0.2                        # 1.11


@pytest.mark.parametrize("name, levels", [("gauss-legendre", [8, 16, 32, 64, 256]),
                                          ("chebyshev", [9, 17, 33, 65, 257])])
def test_alibi_without_a_mask_caps_spectral_token_rules_at_two(name, levels):
    """-m |p(x) - p(x')| has a kink at x' = x: expected inf, neighbour orders 2.14, 2.05."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=1, positions="alibi",
                                                context_length=48)
    result = convergence(model, refine="tokens", levels=levels, tokens=name,
                         features="gauss-legendre:12", u0=_mild, progress=False)
    assert result.expected_order == 2.0                                 # was inf
    assert "ALiBi without a causal mask" in result.limitation
    orders = [r.order for r in result.table if r.order is not None]
    assert orders[-2:] == pytest.approx([2.0, 2.0], abs=0.2)            # 2.14, 2.05 (GL)
    # the coarsest level is pre-asymptotic (6.5): the three finest fit 2
    assert abs(fit_order(result.h[1:], result.errors[1:]) - 2.0) < 0.2


def test_alibi_leaves_the_other_contracts_alone():
    """A causal mask keeps its own limit (the kink is its edge), midpoint keeps 2 unlimited."""
    causal = ContinuousTransformer.random_smooth(seed=0, layers=1, positions="alibi",
                                                 context_length=48, mask="causal")
    plain = ContinuousTransformer.random_smooth(seed=0, layers=1, positions="alibi",
                                                context_length=48)
    study = dict(refine="tokens", levels=[8, 16, 64], features="gauss-legendre:6",
                 u0=_mild, progress=False)
    full = convergence(causal, tokens="gauss-legendre", **study)
    assert full.expected_order == 1.0 and "causal mask with the full diagonal" in full.limitation
    mid = convergence(plain, tokens="midpoint", **dict(study, levels=[8, 16, 32, 64, 256]))
    assert mid.expected_order == 2.0 and mid.limitation is None
    assert abs(mid.observed_order - 2.0) < 0.2                           # 2.04

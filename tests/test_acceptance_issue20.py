"""Acceptance of issue 20 (contracts): the expected order sees the problem, tableaus named as
tableaus, one order fitter, the 0.1 names refused; checked against the theorems and closed
forms they rest on."""
from __future__ import annotations

import math

import numpy as np
import pytest

import ctformer.solvers as solvers
from ctformer import ContinuousTransformer
from ctformer.discretizations import Chebyshev, GaussLegendre, Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.operators import ALiBi, Attention, Causal, Grids, SlidingWindow
from ctformer.solvers import runge_kutta
from ctformer.studies import fit_order

from .conftest import fitted_order

# the classical orders of each method (Hairer, Norsett, Wanner I; Bogacki-Shampine 1989,
# Dormand-Prince 1980, Tsitouras 2011; Lie splitting 1, Strang splitting 2)
NOMINAL = {"lie": 1.0, "strang": 2.0, "parallel": 1.0, "euler": 1.0, "heun": 2.0, "rk4": 4.0,
           "bosh3": 3.0, "dopri5": 5.0, "tsit5": 5.0}


@pytest.mark.parametrize("name", sorted(NOMINAL))
def test_order_sees_the_problem_for_every_registered_scheme(name):
    """Issue 20: '``Scheme.order(problem)`` (a method, as diffrax's): the order on that
    problem, 1 where projections are not the identity'; pre-norm keeps the nominal order."""
    assert name in solvers.available()
    scheme = solvers.get(name)
    pre = ContinuousTransformer.random_smooth(seed=1, placement="pre")
    assert scheme.order() == scheme.order(pre) == scheme.order(pre.blocks[0]) == NOMINAL[name]
    for placement in ("post-projection", "post"):
        post = ContinuousTransformer.random_smooth(seed=1, placement=placement)
        assert scheme.order(post) == scheme.order(list(post.blocks)) == 1.0


def test_rk4_on_a_post_norm_model_is_first_order_as_its_order_says():
    """Issue 20: the study 'prints "observed order 1.12 (expected 4)"' for rk4 on a
    post-projection model; the observed depth order (steps 2..16 against 256) is 1 within
    0.25, as ``order(problem)`` now says, and ``fit_order`` is the least-squares slope."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, placement="post-projection")
    tokens, features = Midpoint(6), GaussLegendre(6)
    x, y = tokens.nodes[:, None], features.nodes[None, :]
    u0 = np.cos(4 * y + 0.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)

    def solve(steps):
        return model.solve(u0, tokens=tokens, features=features, scheme="rk4", steps_per_layer=steps)

    reference = solve(256)
    steps = [2, 4, 8, 16]
    errors = [float(np.abs(solve(k) - reference).max()) for k in steps]
    h = [1.0 / k for k in steps]
    observed = fit_order(h, errors)
    assert abs(observed - fitted_order(h, errors)) < 1e-12
    assert abs(observed - solvers.get("rk4").order(model)) < 0.25, errors


def test_tableaus_are_named_as_tableaus_with_the_classical_coefficients():
    """Issue 20: '``ctformer.solvers.RK4`` is a scheme class but
    ``ctformer.solvers.runge_kutta.RK4`` a tableau' -> tableaus are ``EULER_TABLEAU``,
    ``HEUN_TABLEAU``, ``RK4_TABLEAU`` and ``RK4`` is the scheme class everywhere. Reference:
    the Butcher tableaus of Euler, Heun (explicit trapezoid) and Kutta's classical RK4."""
    assert runge_kutta.RK4 is solvers.RK4 and isinstance(solvers.get("rk4"), solvers.RK4)
    expected = {
        solvers.EULER_TABLEAU: (((),), (1.0,), (0.0,), 1.0),
        solvers.HEUN_TABLEAU: (((), (1.0,)), (0.5, 0.5), (0.0, 1.0), 2.0),
        solvers.RK4_TABLEAU: (((), (0.5,), (0.0, 0.5), (0.0, 0.0, 1.0)), (1 / 6, 1 / 3, 1 / 3, 1 / 6),
                              (0.0, 0.5, 0.5, 1.0), 4.0),
    }
    for tableau, (a, b, c, order) in expected.items():
        assert tableau.a == a and tableau.c == c and tableau.order == order
        np.testing.assert_allclose(tableau.b, b, rtol=1e-16, atol=0)
        assert solvers.TABLEAUS[tableau.name] is tableau
    for old in ("EULER", "HEUN"):
        assert not hasattr(runge_kutta, old)


@pytest.mark.parametrize("old, match", [
    (lambda: ContinuousTransformer.random_smooth(norm="pre"), "placement="),
    (lambda: ContinuousTransformer.random_smooth(placement="pre").run(np.zeros((4, 8)), mask=None), "mask"),
])
def test_removed_keywords_are_type_errors(old, match):
    """Issue 20: 'remove the deprecated shims (the version becomes 0.2 with a changelog entry
    that lists the renames)': an old keyword is a TypeError naming it."""
    with pytest.raises(TypeError, match=match):
        old()


HEADS, D, D_H, N = 2, 8, 4, 12
_MASKS = {  # name: (mask, positions, kept pairs as a weight of positions p, p_key)
    "causal": (Causal(), None, lambda p, r: (r <= p) * 1.0),
    "causal, half diagonal": (Causal(diagonal="half"), None, lambda p, r: np.where(p == r, 0.5, (r <= p) * 1.0)),
    "window": (SlidingWindow(3), None, lambda p, r: (np.abs(p - r) < 3) * 1.0),
    "causal window, ALiBi": (Causal() & SlidingWindow(4), ALiBi(), lambda p, r: ((r <= p) & (p - r < 4)) * 1.0),
}


def _reference(u, mats, weights, p, kept, slopes):
    """sum_h W_O^h [sum_j w_j m_ij e^{s_ij} v_j / sum_j w_j m_ij e^{s_ij}], s_ij = beta_h
    int q k dsigma - m_h |p_i - p_j| (midpoint head features: the integral is a mean)."""
    out = 0.0
    for h in range(HEADS):
        q, k, v = (u @ mats[name][h].T for name in "QKV")
        s = math.sqrt(D_H) * (q @ k.T) / D_H - slopes[h] * np.abs(p[:, None] - p[None, :])
        e = kept(p[:, None], p[None, :]) * weights * np.exp(s - s.max(axis=1, keepdims=True))
        out = out + (e @ v / e.sum(axis=1, keepdims=True)) @ mats["O"][h].T
    return out


@pytest.mark.parametrize("tokens", [GaussLegendre(N), Chebyshev(N)], ids=["gauss-legendre", "chebyshev"])
@pytest.mark.parametrize("name", list(_MASKS))
def test_composed_masks_and_positions_on_weighted_token_rules(tokens, name):
    """Issue 20: 'mask objects (causal with its diagonal rule, sliding window, padding)' and
    position encodings composed, 'the two attention kernels chosen by what the composed
    pattern needs', on token rules with non-uniform weights and positions p = L x - 1/2:
    against the quadrature formula written out."""
    rng = np.random.default_rng(4)
    mats = {"Q": rng.standard_normal((HEADS, D_H, D)) / 3, "K": rng.standard_normal((HEADS, D_H, D)) / 3,
            "V": rng.standard_normal((HEADS, D_H, D)) / 3, "O": rng.standard_normal((HEADS, D, D_H)) / 3}
    mask, positions, kept = _MASKS[name]
    attention = Attention(*([PiecewiseConstant(m) for m in mats[n]] for n in "QKVO"), beta=math.sqrt(D_H),
                          mask=mask, positions=positions)
    grids = Grids(tokens, Midpoint(D), Midpoint(D_H), context_length=N)
    u = rng.standard_normal((N, D))
    slopes = np.zeros(HEADS) if positions is None else positions.slopes_for(HEADS)
    ref = _reference(u, mats, tokens.weights, N * tokens.nodes - 0.5, kept, slopes)
    got = attention(u, grids)
    assert float(np.max(np.abs(got - ref))) < 1e-14 * float(np.max(np.abs(ref)))
    with pytest.raises(ValueError, match=r"combines with no other mask .* use Causal\(\) \(diagonal='full'\)"):
        Attention(*([PiecewiseConstant(m) for m in mats[n]] for n in "QKVO"), mask=Causal("half") & SlidingWindow(3))

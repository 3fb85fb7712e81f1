"""Edge cases of ctformer.particles checked against independent references.

* Noisy zonal and S^2 mean fields run an integrating factor: the loop's state is (v, tau),
  c = exp(-nu Lambda tau) v. States interpolated inside a step (SaveAt(times=...), dense
  output, events) must be the coefficients c, as a fixed-step reference solve gives them.
* in_open_hemisphere refuses a negative or NaN tol (a negative one called an antipodal pair
  "in an open hemisphere").
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from ctformer import solvers
from ctformer.particles import SphericalMeanField, ZonalMeanField, in_open_hemisphere

pytest.importorskip("ducc0")


def _zonal():
    field = ZonalMeanField(3.0, 3, 10, noise=0.3)
    mass = np.exp(0.8 * field.grid) @ field.basis.weights
    return field, (lambda s: np.exp(0.8 * s) / mass)


def _reference(field, rho, t):
    """A fixed-step RK4 solve to ``t`` with a small step (its error is about 1e-14)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return np.asarray(field.solve(rho, t, 5e-4).coefficients[-1])


@pytest.mark.parametrize("options", [dict(rtol=1e-10, atol=1e-12), dict(dt=0.05, scheme="rk4"),
                                     dict(dt=0.05, scheme="tsit5")])
def test_noisy_zonal_states_between_steps_are_the_coefficients(options):
    """Before: the (v, tau) of the integrating factor came back, 5.7e-4 off at t = 0.21 (tau =
    7.8e-3), 3.5e-4 with fixed steps; now the reference's coefficients to the interpolant's
    accuracy (1e-12 error controlled; 5e-10 with dt = 0.05, as without noise)."""
    field, rho = _zonal()
    times = [0.21, 0.2251, 1.0]
    solution = field.evolve(rho, 1.0, save_at=solvers.SaveAt(times=times), **options)
    states = np.asarray(solution.states)
    tol = 1e-11 if "rtol" in options else 5e-9
    for t, state in zip(times, states):
        assert state[-1] == 0.0  # the clock: a coefficient state (restartable)
        np.testing.assert_allclose(state[:-1], _reference(field, rho, t), rtol=0, atol=tol)


def test_noisy_zonal_dense_output_and_events_see_the_coefficients():
    """Before: evaluate(0.377) was 1.2e-3 off and an event on the order parameter fired at
    t = 0.49851 instead of 0.47563 (located on the reference path by a spline)."""
    field, rho = _zonal()
    dense = field.evolve(rho, 1.0, rtol=1e-10, atol=1e-12, save_at=solvers.SaveAt(dense=True))
    np.testing.assert_allclose(np.asarray(dense.evaluate(0.377))[:-1], _reference(field, rho, 0.377),
                               rtol=0, atol=1e-11)
    c0, c1 = _reference(field, rho, 1e-12), _reference(field, rho, 1.0)
    target = 0.5 * float(field.order_parameter(c0) + field.order_parameter(c1))
    event = solvers.Event(lambda t, c: field.order_parameter(c[:-1]) - target)
    fired = field.evolve(rho, 1.0, rtol=1e-10, atol=1e-12, events=[event])
    t_event = fired.event_time
    assert field.order_parameter(_reference(field, rho, t_event)) == pytest.approx(target, abs=1e-10)
    assert np.asarray(fired.event_state)[-1] == 0.0


def test_noisy_sphere_states_between_steps_are_the_coefficients():
    """S^2 (complex a_lm): before 9.0e-3 off at t = 0.13 with the clock 0.021 left in the state."""
    field = SphericalMeanField(3.0, 8, noise=0.2)

    def rho(p):
        return np.exp(0.7 * p[..., 0] + 0.3 * p[..., 2])

    solution = field.evolve(rho, 0.5, rtol=1e-10, atol=1e-12, save_at=solvers.SaveAt(times=[0.13]))
    state = np.asarray(solution.states)[0]
    assert state[-1] == 0.0
    np.testing.assert_allclose(state[:-1], _reference(field, rho, 0.13), rtol=0, atol=1e-11)


def test_open_hemisphere_tolerance_is_checked():
    antipodal = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert not in_open_hemisphere(antipodal)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="tol"):
            in_open_hemisphere(antipodal, tol=bad)


def test_row_entropy_refuses_what_is_not_a_probability_row():
    """NaN read as 0 before ([nan, 0.5] gave 0.347); valid rows match -sum p log p by SciPy."""
    import scipy.stats

    from ctformer.particles import row_entropy

    rows = np.array([[0.25, 0.25, 0.5], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(row_entropy(rows), scipy.stats.entropy(rows, axis=-1), rtol=1e-15)
    for bad in ([np.nan, 0.5], [np.inf, 0.0], [-0.1, 1.1]):
        with pytest.raises(ValueError, match="finite and >= 0"):
            row_entropy(np.array(bad))


def test_attention_rank_checks_rtol_and_entries():
    from ctformer.particles import attention_rank

    a = np.diag([1.0, 1e-3, 1e-9])
    assert attention_rank(a) == np.linalg.matrix_rank(a) == 3
    assert attention_rank(a, rtol=1e-6) == 2
    with pytest.raises(ValueError, match="rtol must be a finite non-negative number"):
        attention_rank(a, rtol=-1.0)
    with pytest.raises(ValueError, match="NaN or inf"):
        attention_rank(np.full((2, 2), np.nan))


def test_empirical_density_weights_are_a_measure():
    """Weights >= 0; the order parameter of the moments is |sum_i w_i <x_i, e>| (e the last
    coordinate vector): 0.5 for the north pole and a point of the equator, half each."""
    from ctformer.particles import empirical_density

    solver = ZonalMeanField(2.0, 3, 4)
    x = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    assert solver.order_parameter(empirical_density(x, solver)) == pytest.approx(0.5, rel=1e-14)
    with pytest.raises(ValueError, match=r"finite numbers >= 0 \(a measure\)"):
        empirical_density(x, solver, weights=[1.5, -0.5])


def test_circle_growth_rate_needs_integer_wavenumbers():
    """k^2 I_k(beta) / (beta I_0(beta)) by SciPy's iv; a non-integer k is no mode of the circle."""
    from scipy.special import iv

    from ctformer.particles import linear_growth_rate

    k = np.arange(5)
    np.testing.assert_allclose(linear_growth_rate(k, 2.5), k ** 2 * iv(k, 2.5) / (2.5 * iv(0, 2.5)),
                               rtol=1e-13, atol=1e-16)
    with pytest.raises(ValueError, match="non-negative integer wavenumbers"):
        linear_growth_rate(1.5, 2.5)
    with pytest.raises(ValueError, match="non-negative integer wavenumbers"):
        linear_growth_rate(-1, 2.5)

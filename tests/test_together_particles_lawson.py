"""Noise together with steps, error control, saved times and events of the spectral mean fields.

The noise nu Delta_S is taken exactly: a degree-l coefficient decays by e^{-nu l(l+d-2) t}
(the heat semigroup on S^{d-1}). References: that closed form, and SciPy's solve_ivp (DOP853
at rtol 1e-13) on the same Galerkin system c' = F(c) - nu l(l+d-2) c.
"""
import math

import numpy as np
import pytest
from scipy import integrate, optimize

from ctformer import solvers
from ctformer.particles import SphericalMeanField, ZonalMeanField


def _reference(field, c0, times):
    """solve_ivp of c' = transport(c) - nu l(l+d-2) c with l(l+d-2) written out here."""
    d = field.dimension
    lap = field.noise * np.arange(field.degree + 1) * (np.arange(field.degree + 1) + d - 2)
    return integrate.solve_ivp(lambda t, c: field.transport(c) - lap * c, (0.0, times[-1]), c0,
                               method="DOP853", rtol=1e-13, atol=1e-15, t_eval=times, dense_output=True)


def _heat_initial(field, degrees):
    """Mass one plus small zonal harmonics of degrees >= 2: at beta = 0 the transport vanishes."""
    c = np.zeros(field.degree + 1)
    c[0] = 1.0 / math.sqrt(4 * math.pi)
    for l, a in degrees:
        c[l] = a
    return c


@pytest.mark.parametrize("scheme", ["rk4", "tsit5", "heun"])
def test_zonal_heat_is_exact_past_the_old_noise_cap(scheme):
    """beta = 0, d = 3, L = 32, nu = 10, dt = 0.1: nu L(L+1) dt = 1056 overflowed the old
    integrating factor e^{nu l(l+d-2) tau}, so dt was refused above 700 / 10560 = 0.066. Lawson
    steps are exact for the heat part: c_2(0.2) = 0.01 e^{-12}, c_32 underflows to 0."""
    field = ZonalMeanField(0.0, 3, 32, noise=10.0)
    c0 = _heat_initial(field, [(2, 0.01), (5, 0.02), (32, 0.03)])
    assert field.stable_step(0.2, scheme) >= 0.1
    c1 = field.solve(c0 @ field.basis.values.T, 0.2, 0.1, scheme=scheme).coefficients[-1]
    l = np.arange(33)
    exact = c0 * np.exp(-10.0 * l * (l + 1) * 0.2)
    assert c1[2] == pytest.approx(0.01 * math.exp(-12.0), rel=1e-12)
    assert np.max(np.abs(c1 - exact)) < 1e-15


def test_spherical_heat_is_exact_past_the_old_noise_cap():
    """S^2, beta = 0, L = 32, nu = 10, dt = 0.1 (the old cap: 0.066): a_lm(t) = a_lm(0) e^{-nu l(l+1) t}."""
    field = SphericalMeanField(0.0, 32, noise=10.0)
    z = lambda x: x[..., 2]  # noqa: E731
    a0 = field.coefficients_of(lambda x: 1 / (4 * np.pi) + 0.01 * (3 * z(x) ** 2 - 1) + 0.005 * z(x) ** 30)
    a1 = field.solve(lambda x: 1 / (4 * np.pi) + 0.01 * (3 * z(x) ** 2 - 1) + 0.005 * z(x) ** 30,
                     0.2, 0.1).coefficients[-1]
    exact = a0 * np.exp(-10.0 * field.l * (field.l + 1.0) * 0.2)
    assert np.max(np.abs(a1 - exact)) < 1e-15
    assert np.max(np.abs(a1 - exact)[field.l == 2]) <= 1e-12 * np.max(np.abs(exact[field.l == 2]))


def test_zonal_noisy_rk4_converges_above_the_old_cap():
    """beta = 1, L = 32, nu = 10 against solve_ivp: rk4 at dt = 0.14 and 0.07 (above the old cap
    0.066, refused before) errs by 8.0e-5 and 1.0e-5 of max |c| = 11.8 (order 2.97 there: Lawson
    steps lose order while nu L(L+1) dt >> 1), and fourth order once it is small (3.97 between
    dt = 0.00875 and 0.004375)."""
    field = ZonalMeanField(1.0, 3, 32, noise=10.0)
    rho = lambda s: np.exp(3 * s)  # noqa: E731
    c0 = field.coefficients_of(rho)
    reference = _reference(field, c0, [0.0, 0.28]).y[:, -1]
    errors = [np.max(np.abs(field.solve(rho, 0.28, dt).coefficients[-1] - reference))
              for dt in (0.14, 0.07, 0.00875, 0.004375)]
    assert errors[0] < 1e-4 and errors[1] < 2e-5
    assert math.log2(errors[0] / errors[1]) > 2.5
    assert math.log2(errors[2] / errors[3]) == pytest.approx(4.0, abs=0.15)


def test_zonal_noisy_adaptive_rejects_few_steps_and_meets_the_tolerance():
    """beta = 9, L = 32, nu = 10 to t = 1 at rtol 1e-6: the error estimate of the integrating
    factor was taken on e^{nu l(l+d-2) tau} c (786 accepted, 375 rejected steps); on c itself,
    29 accepted and none rejected, with the final state within 1e-6 of solve_ivp."""
    field = ZonalMeanField(9.0, 3, 32, noise=10.0)
    rho = lambda s: np.exp(3 * s)  # noqa: E731
    reference = _reference(field, field.coefficients_of(rho), [0.0, 1.0]).y[:, -1]
    solution = field.evolve(rho, 1.0, rtol=1e-6, atol=1e-9)
    assert solution.stats["rejected"] <= solution.stats["accepted"] // 4
    assert solution.stats["accepted"] < 100
    assert np.max(np.abs(solution.final[:-1] - reference)) < 1e-6 * np.max(np.abs(reference))


@pytest.mark.parametrize("scheme,dt", [("rk4", None), ("tsit5", None), ("rk4", 0.1), ("bosh3", None)])
def test_zonal_noisy_saved_times_follow_the_solution(scheme, dt):
    """beta = 4, L = 16, nu = 1, SaveAt at 21 times: rk4 with error control returned states off by
    7.1e-5 at rtol 1e-8 (1.2e27 at rtol 1e-6: a cubic Hermite through e^{nu l(l+1) h} c); they now
    match solve_ivp to 1e-9 (2.8e-11 at rtol 1e-8)."""
    field = ZonalMeanField(4.0, 3, 16, noise=1.0)
    rho = lambda s: (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)  # noqa: E731
    times = np.linspace(0.0, 2.0, 21)
    reference = _reference(field, field.coefficients_of(rho), times).y.T
    control = {"dt": dt} if dt else {"rtol": 1e-8, "atol": 1e-11}
    solution = field.evolve(rho, 2.0, scheme=scheme, save_at=solvers.SaveAt(times=times), **control)
    assert np.max(np.abs(solution.states[:, :-1] - reference)) < 1e-8


@pytest.mark.parametrize("scheme,dt", [("rk4", 0.1), ("tsit5", 0.1), ("rk4", None), ("tsit5", None)])
def test_noisy_heat_between_steps_is_the_heat_semigroup(scheme, dt):
    """beta = 0, L = 8, nu = 1, c_8(0) = 0.01 (decay rate 72, 72 dt = 7.2): between the steps the
    saved and evaluated states are the heat semigroup 0.01 e^{-72 t} to rounding (a Lawson step of
    the fraction; a cubic Hermite in c with the slopes F - 72 c would give -4.0e-3 at t = 0.05)."""
    field = ZonalMeanField(0.0, 3, 8, noise=1.0)
    c0 = _heat_initial(field, [(8, 0.01)])
    times = np.array([0.0, 0.05, 0.1, 0.15, 0.2])
    control = {"dt": dt} if dt else {"rtol": 1e-8, "atol": 1e-12}
    solution = field.evolve(c0 @ field.basis.values.T, 0.2, scheme=scheme,
                            save_at=solvers.SaveAt(times=times, dense=True), **control)
    exact = 0.01 * np.exp(-72.0 * times)
    assert np.allclose(solution.states[:, 8], exact, rtol=1e-12, atol=0)
    assert solution.evaluate(0.07)[8] == pytest.approx(0.01 * math.exp(-72.0 * 0.07), rel=1e-12)


@pytest.mark.parametrize("scheme,dt", [("rk4", None), ("rk4", 0.05), ("tsit5", None)])
def test_noisy_event_time_matches_the_reference(scheme, dt):
    """beta = 4, L = 16, nu = 1, an event |int x dmu| = 0.05 at t = 0.426344 (brentq on solve_ivp's
    dense output): rk4 located it 3.7e-4 late with error control and 6.2e-4 late at dt = 0.05 (the
    interpolant's slopes left out the noise); now within 1e-7 (6e-9 and 7e-8)."""
    field = ZonalMeanField(4.0, 3, 16, noise=1.0)
    rho = lambda s: (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)  # noqa: E731
    c0 = field.coefficients_of(rho)
    scale = math.sqrt(4 * math.pi / 3)  # |int x dmu| = |c_1| sqrt(|S^2| / 3)
    level = 0.05
    dense = _reference(field, c0, [0.0, 2.0]).sol
    expected = optimize.brentq(lambda t: abs(dense(t)[1]) * scale - level, 0.0, 2.0, xtol=1e-14)
    event = solvers.Event(lambda t, u: field.order_parameter(u[:17]) - level, terminal=False)
    control = {"dt": dt} if dt else {"rtol": 1e-8, "atol": 1e-11}
    solution = field.evolve(rho, 2.0, scheme=scheme, events=(event,), **control)
    assert solution.t_events[0] == pytest.approx([expected], abs=1e-7)

"""States inside a step of the noisy spectral mean fields: saved times and events, every scheme.

References: SciPy's solve_ivp (DOP853, rtol 1e-12) on the Galerkin system
c' = F(c) - nu l(l+d-2) c, the heat semigroup c_l(t) = c_l(0) e^{-nu l(l+d-2) t} at beta = 0,
and scipy.integrate.quad for the variation-of-constants integral.
"""
import math

import numpy as np
import pytest
from scipy import integrate, optimize

from ctformer import solvers
from ctformer.particles import SphericalMeanField, ZonalMeanField
from ctformer.particles.lawson import exponential_hermite


def _dense_reference(field, c0, t1):
    l = np.arange(field.degree + 1)
    lap = field.noise * l * (l + field.dimension - 2)
    return integrate.solve_ivp(lambda t, c: field.transport(c) - lap * c, (0.0, t1), c0,
                               method="DOP853", rtol=1e-12, atol=1e-15, dense_output=True).sol


def _rho(s):
    return (1 + 0.3 * s + 0.2 * s ** 2) / (4 * np.pi)


@pytest.mark.parametrize("scheme,bound", [("lie", 2e-6), ("parallel", 2e-6), ("strang", 2e-7)])
def test_splitting_saved_times_inside_steps_follow_the_solution(scheme, bound):
    """beta = 4, L = 32, nu = 10, dt = 0.01 (nu L(L+1) dt = 106): states saved inside a step were
    a cubic through e^{nu l(l+1) tau} c mapped back, off by 3.0e12 (lie) and 5.0e12 (strang) at
    t = 0.013 while the step ends erred by 9e-7 and 2.5e-8; now 8.1e-7 and 5.4e-8."""
    field = ZonalMeanField(4.0, 3, 32, noise=10.0)
    times = np.array([0.0, 0.005, 0.013, 0.04, 0.045, 0.1])
    reference = _dense_reference(field, field.coefficients_of(_rho), 0.1)
    solution = field.evolve(_rho, 0.1, scheme=scheme, dt=0.01, save_at=solvers.SaveAt(times=times))
    errors = np.abs(solution.states[:, :-1] - reference(times).T).max(axis=1)
    assert np.all(errors < bound)



@pytest.mark.parametrize("scheme,bound", [("lie", 2e-6), ("strang", 5e-7)])
def test_spherical_splitting_saved_times_inside_steps_follow_the_solution(scheme, bound):
    """S^2, beta = 4, L = 16, nu = 10, dt = 0.02 (nu L(L+1) dt = 54): at t = 0.006 the saved
    states were off by 2.4e-3 (lie) and 2.5e-3 (strang), 1000 times their step ends' 1.8e-6 and
    1.1e-7; now 5.9e-7 and 2.5e-7 (solve_ivp on the real and imaginary parts)."""
    field = SphericalMeanField(4.0, 16, noise=10.0)
    rho = lambda x: (1 + 0.3 * x[..., 2] + 0.2 * x[..., 0] * x[..., 1]) / (4 * np.pi)  # noqa: E731
    a0 = field.coefficients_of(rho)
    lap, n = 10.0 * field.l * (field.l + 1.0), a0.shape[0]

    def rhs(t, y):
        a = y[:n] + 1j * y[n:]
        da = field.transport(a) - lap * a
        return np.concatenate([da.real, da.imag])

    times = np.array([0.0, 0.006, 0.01, 0.02, 0.034, 0.06])
    y = integrate.solve_ivp(rhs, (0.0, 0.06), np.concatenate([a0.real, a0.imag]), method="DOP853",
                            rtol=1e-12, atol=1e-15, t_eval=times).y.T
    solution = field.evolve(rho, 0.06, scheme=scheme, dt=0.02, save_at=solvers.SaveAt(times=times))
    assert np.abs(solution.states[:, :-1] - (y[:, :n] + 1j * y[:, n:])).max() < bound

@pytest.mark.parametrize("scheme", ["rk4", "lie", "strang", "parallel"])
def test_heat_event_inside_a_fixed_step_is_the_semigroups(scheme):
    """beta = 0, L = 8, nu = 1, c_8(0) = 0.01 (decay rate 72), dt = 0.1: c_8 = 0.01 e^{-3.6} at
    t = 0.05 exactly. The event was located at 0.01845 (rk4: a cubic in c with slopes -72 c) and
    0.09228 (splitting: a cubic in the (v, tau) state); now at 0.05 to 1e-10."""
    field = ZonalMeanField(0.0, 3, 8, noise=1.0)
    c0 = np.zeros(9)
    c0[0], c0[8] = 1 / math.sqrt(4 * math.pi), 0.01
    level = 0.01 * math.exp(-3.6)
    event = solvers.Event(lambda t, u: u[8] - level, terminal=False)
    solution = field.evolve(c0 @ field.basis.values.T, 0.2, scheme=scheme, dt=0.1, events=(event,))
    assert solution.t_events[0] == pytest.approx([0.05], abs=1e-10)
    assert solution.y_events[0][0, 8] == pytest.approx(level, rel=1e-9)



@pytest.mark.parametrize("scheme", ["rk4", "lie", "strang"])
def test_heat_event_under_error_control_is_the_semigroups(scheme):
    """As above with rtol 1e-3, atol 1e-6 (steps of up to 0.18: decay 72 h = 13): the event at
    t = 0.05 was located 0.0153 early (rk4, step doubling), 0.126 late (lie) and 0.084 late
    (strang); now to 1e-10 (tsit5's dense Lawson output already gave 7e-15)."""
    field = ZonalMeanField(0.0, 3, 8, noise=1.0)
    c0 = np.zeros(9)
    c0[0], c0[8] = 1 / math.sqrt(4 * math.pi), 0.01
    level = 0.01 * math.exp(-3.6)
    event = solvers.Event(lambda t, u: u[8] - level, terminal=False)
    solution = field.evolve(c0 @ field.basis.values.T, 0.2, scheme=scheme, rtol=1e-3, atol=1e-6,
                            events=(event,))
    assert solution.t_events[0] == pytest.approx([0.05], abs=1e-10)

@pytest.mark.parametrize("scheme,dt,bound", [("rk4", 0.05, 1e-6), ("strang", 0.01, 5e-6)])
def test_transport_event_of_fixed_steps_matches_the_reference(scheme, dt, bound):
    """beta = 4, L = 32, nu = 10, rho = e^{3s}: the order parameter halves its way at
    t = 0.0342448 (brentq on solve_ivp). rk4 at dt = 0.05 found it 1.2e-4 early and strang at
    dt = 0.01 2.4e-4 late; now within 3.9e-7 and 1.7e-6."""
    field = ZonalMeanField(4.0, 3, 32, noise=10.0)
    rho = lambda s: np.exp(3 * s)  # noqa: E731
    c0 = field.coefficients_of(rho)
    dense = _dense_reference(field, c0, 0.2)
    level = 0.5 * (field.order_parameter(c0) + field.order_parameter(dense(0.2)))
    expected = optimize.brentq(lambda t: field.order_parameter(dense(t)) - level, 0.0, 0.2, xtol=1e-14)
    event = solvers.Event(lambda t, u: field.order_parameter(u[:33]) - level)
    solution = field.evolve(rho, 0.2, scheme=scheme, dt=dt, events=(event,))
    assert solution.t_events[0] == pytest.approx([expected], abs=bound)


@pytest.mark.parametrize("rate", [0.0, 1e-3, 0.7, 3.0, 700.0])
def test_exponential_hermite_is_exact_for_a_linear_transport(rate):
    """c' = f + g s - rate c from c0 over h = 1: with c1 and the ends' transports exact the
    interpolant is the solution (quad of the variation of constants) at every theta, for a rate
    on each side of the series/recurrence switch at 1 and at the old 700 cap."""
    c0, f, g, h = 0.3, 2.0, -1.5, 1.0

    def exact(t):
        forced = integrate.quad(lambda s: math.exp(-rate * (t - s)) * (f + g * s), 0.0, t,
                                epsabs=1e-15, epsrel=1e-12)[0]
        return math.exp(-rate * t) * c0 + forced

    c1 = exact(h)
    lap = np.array([rate])
    for theta in (0.0, 0.25, 0.5, 0.9, 1.0):
        value = exponential_hermite(np.array([c0]), np.array([c1]), np.array([f]), np.array([f + g * h]),
                                    lap, h, theta)[0]
        assert value == pytest.approx(exact(theta * h), rel=1e-11, abs=1e-14)

"""Particles and the circle mean field as split problems of ctformer.solvers; scale-safe
retraction; stable steps; validation at entry; early refusal and Ctrl-C.

Independent references: scipy's ``solve_ivp`` (DOP853) for the exact particle flow and for the
Galerkin ODE of the mean field, the stability polynomials of the Runge-Kutta methods in closed
form, the imaginary stability interval of RK4 (:math:`|R(iy)|^2 = 1 - y^6/72 + y^8/576`, equal
to 1 at :math:`y = 2\\sqrt 2`), ``x / numpy.linalg.norm(x)`` on representable data.
"""
from __future__ import annotations

import math
import time
import warnings

import numpy as np
import pytest
from scipy.integrate import solve_ivp
from scipy.optimize import brentq

from ctformer import solvers
from ctformer.particles import (CircleMeanField, ResolutionWarning, SelfAttentionDynamics, SolveInterrupted,
                                linear_growth_rate, retract, sphere_tolerance, stability_function)
from ctformer.particles import timegrid as timegrid_module
from tests.conftest import fitted_order
from tests.test_particles import exact_solution, sphere_points

from .conftest import require

# The order each scheme must show on a one-flow problem (design notes, section 4).
ORDERS = {"euler": 1, "lie": 1, "parallel": 1, "heun": 2, "strang": 2, "rk4": 4,
          "bosh3": 3, "dopri5": 5, "tsit5": 5}
# methods of p <= 4 stages: their stability function is the Taylor polynomial of e^z of degree p
TAYLOR = ("euler", "lie", "parallel", "heun", "strang", "rk4")
# tsit5's leading error constant is so small that between its first steps and the reference's
# rounding the slope is still 5.4 (particles) to 5.9 (mean field): no asymptotic range to fit
# here; its order is checked by the order conditions in tests/test_embedded_pairs.py
FITTED = sorted(set(ORDERS) - {"tsit5"})


def test_every_scheme_is_covered():
    assert set(solvers.available()) == set(ORDERS)
    for name, order in ORDERS.items():
        assert solvers.get(name).order() == order


# -- observed orders ---------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", FITTED)
def test_particle_order_is_the_scheme_order(rng, scheme):
    """Slope of log(error) vs log(dt) against DOP853 at rtol 1e-13, dt = 1/4 ... 1/64 (fifth
    order: 1/2 ... 1/16, before the error reaches the reference's rounding)."""
    beta, t1 = 1.5, 1.0
    x0 = sphere_points(rng, 6, 3)
    Q = np.eye(3) + 0.3 * rng.standard_normal((3, 3))
    exact = exact_solution(x0, t1, beta, [(Q, np.eye(3), np.eye(3))])
    dyn = SelfAttentionDynamics(beta, Q=Q)
    dts = [1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64] if ORDERS[scheme] < 5 else [1 / 4, 1 / 8, 1 / 16]
    errors = [np.abs(dyn.solve(x0, t1, dt, scheme=scheme).final - exact).max() for dt in dts]
    assert min(errors) > 1e-12
    assert abs(fitted_order(dts, errors) - solvers.get(scheme).order()) < 0.3, errors


def galerkin_reference(mf, rho0, t1):
    """The mean-field Galerkin ODE integrated by DOP853: d rho/dt = -d/dtheta P_K(rho X[rho])."""
    n, kmax = mf.n_modes, mf.max_wavenumber
    ik = 1j * np.arange(kmax + 1)

    def project(values):
        return np.fft.irfft(np.fft.rfft(values)[: kmax + 1], n=n)

    def rhs(t, rho):
        flux = rho * mf.velocity(rho)
        return np.fft.irfft(-ik * np.fft.rfft(flux)[: kmax + 1], n=n)

    start = project(rho0(mf.grid))
    sol = solve_ivp(rhs, (0.0, t1), start, method="DOP853", rtol=1e-13, atol=1e-15)
    return sol.y[:, -1]


@pytest.mark.parametrize("scheme", FITTED)
def test_mean_field_order_is_the_scheme_order(scheme):
    beta, t1 = 2.0, 1.0
    mf = CircleMeanField(beta, 24)
    rho0 = lambda th: (1 + 0.5 * np.cos(th - 0.3) + 0.2 * np.sin(2 * th)) / (2 * np.pi)  # noqa: E731
    exact = galerkin_reference(mf, rho0, t1)
    # fifth order reaches the reference's rounding (1e-13) by dt = 1/40: coarser steps
    dts = [1 / 5, 1 / 10, 1 / 20, 1 / 40] if ORDERS[scheme] < 5 else [1 / 2, 1 / 4, 1 / 8]
    errors = [np.abs(mf.solve(rho0, t1, dt, scheme=scheme).density[-1] - exact).max() for dt in dts]
    assert min(errors) > 1e-12
    assert abs(fitted_order(dts, errors) - solvers.get(scheme).order()) < 0.25, errors


def test_mean_field_tracers_follow_the_same_scheme():
    """Tracers are part of the one state: with Heun they move as Heun moves them."""
    mf = CircleMeanField(1.0, 24)
    rho0 = lambda th: (1 + 0.3 * np.cos(th)) / (2 * np.pi)  # noqa: E731
    theta0 = np.array([0.5, 2.0, 4.0])
    a = mf.solve(rho0, 0.5, 0.05, tracers=theta0, scheme="heun")
    b = mf.solve(rho0, 0.5, 0.05, scheme="heun")
    np.testing.assert_array_equal(a.coefficients, b.coefficients)  # tracers do not feed back
    exact = mf.solve(rho0, 0.5, 0.005, tracers=theta0, scheme="rk4").tracers[-1]
    assert 1e-9 < np.abs(a.tracers[-1] - exact).max() < 1e-4


def test_step_runs_every_scheme(rng):
    x = sphere_points(rng, 5, 3)
    dyn = SelfAttentionDynamics(2.0)
    for name in solvers.available():
        one = dyn.step(x, 0.1, scheme=name)
        np.testing.assert_allclose(one, dyn.solve(x, 0.1, 0.1, scheme=name).final, rtol=0, atol=0)
        np.testing.assert_allclose(np.linalg.norm(one, axis=-1), 1.0, atol=4e-16)
    with pytest.raises(ValueError, match="unknown scheme"):
        dyn.step(x, 0.1, scheme="rk2")


# -- stability functions and the stable step -----------------------------------------------------
def test_stability_functions_in_closed_form():
    z = np.array([0.3, -1.2 + 0.4j, 2.5j, -2.0])
    taylor = lambda p: sum(z**j / math.factorial(j) for j in range(p + 1))  # noqa: E731
    for name in TAYLOR:
        np.testing.assert_allclose(stability_function(name, z), taylor(ORDERS[name]), rtol=1e-15, atol=1e-15)
    # the embedded pairs: R(z) = det(I - zA + z 1 b^T) / det(I - zA) (Hairer-Wanner IV.3, Prop. 3.2)
    for name in ("bosh3", "dopri5", "tsit5"):
        t = solvers.TABLEAUS[name]
        s_ = len(t.b)
        A = np.zeros((s_, s_))
        for i, row in enumerate(t.a):
            A[i, :len(row)] = row
        ones_b = np.outer(np.ones(s_), t.b)
        expected = [np.linalg.det(np.eye(s_) - zk * A + zk * ones_b) / np.linalg.det(np.eye(s_) - zk * A)
                    for zk in z]
        np.testing.assert_allclose(stability_function(name, z), expected, rtol=1e-13, atol=1e-13)


def test_stable_step_matches_the_imaginary_stability_interval_of_rk4():
    """RK4 on a long run: dt K V -> 2 sqrt 2 (|R(iy)| = 1 at y^2 = 8), K = 85 for 256 modes."""
    mf = CircleMeanField(5.0, 256)
    assert mf.max_wavenumber == 85
    y = 2 * math.sqrt(2)
    assert abs(1 - y**6 / 72 + y**8 / 576 - 1) < 1e-13
    bound = mf.stable_step(50.0, "rk4")
    assert y / 85 <= bound <= 1.003 * y / 85


def test_stable_step_of_euler_is_the_lax_richtmyer_budget():
    """Euler: (t1/dt) log|1 + i dt K V| = log(eps^-1/2), solved by brentq."""
    mf = CircleMeanField(1.0, 64)
    kv, t1 = mf.max_wavenumber * 1.0, 10.0
    budget = 0.5 * math.log(1 / np.finfo(float).eps)
    expected = brentq(lambda dt: t1 / dt * 0.5 * math.log1p((dt * kv) ** 2) - budget, 1e-8, 1e-1)
    assert mf.stable_step(t1, "euler") == pytest.approx(expected, rel=2e-3)
    assert mf.stable_step(t1, "lie") == mf.stable_step(t1, "euler")
    # USA: V = max e^{beta cos psi} |sin psi| (closed form vs a fine grid)
    usa = CircleMeanField(3.0, 64, normalized=False)
    psi = np.linspace(0, np.pi, 200001)
    assert usa.velocity_bound() == pytest.approx(np.max(np.exp(3 * np.cos(psi)) * np.sin(psi)), rel=1e-9)


@pytest.mark.parametrize("t1", [1.0, 10.0, 300.0, 1e4])
def test_stable_step_of_euler_on_long_runs_is_the_first_crossing(t1):
    """Reproducer: USA, beta 3, mass 0.5, t1 = 300 raised brentq's "The function value at
    x=0.0 is NaN" (the first grid point already over budget: the bracket started at y = 0,
    where the excess was 0/0). The bound is the first dt with (t1/dt) log|1 + i dt K V| =
    log(eps^-1/2), here found by scanning a geometric grid and bracketing the first sign
    change; log|1 + iy| is log1p(y^2)/2, exact, so both agree to brentq's tolerance."""
    usa = CircleMeanField(3.0, 64, normalized=False)
    kv = usa.max_wavenumber * usa.velocity_bound(0.5)
    budget = 0.5 * math.log(1 / np.finfo(float).eps)

    def excess(dt):
        return t1 / dt * 0.5 * math.log1p((dt * kv) ** 2) - budget

    grid = np.geomspace(1e-12, t1, 20001)
    first = int(np.nonzero([excess(dt) > 0 for dt in grid])[0][0])
    expected = brentq(excess, grid[first - 1], grid[first], xtol=1e-300, rtol=1e-15)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert usa.stable_step(t1, "euler", 0.5) == pytest.approx(expected, rel=1e-9)


def test_unstable_mean_field_step_is_refused_and_a_stable_one_accepted():
    """Issue reproducer: beta 5, 256 modes, t1 50, dt 1 returned densities of 1e280."""
    rho = lambda th: (1 + 0.1 * np.cos(3 * th)) / (2 * np.pi)  # noqa: E731
    mf = CircleMeanField(5.0, 256)
    with pytest.raises(ValueError, match=r"dt=1 is above the stable step 0\.0333"):
        mf.solve(rho, t1=50, dt=1)
    bound = mf.stable_step(3.0, "rk4")
    with pytest.raises(ValueError, match="stable step"):
        mf.solve(rho, 3.0, 1.02 * bound)
    accepted = mf.solve(rho, 3.0, 0.99 * bound, save_every=1000)
    fine = mf.solve(rho, 3.0, 0.99 * bound / 4, save_every=1000)
    assert np.abs(accepted.density[-1] - fine.density[-1]).max() < 1e-6 * fine.density[-1].max()
    # near the uniform density the mode k = 3 grows at k^2 I_k(beta) / (beta I_0(beta))
    small = mf.solve(lambda th: (1 + 1e-6 * np.cos(3 * th)) / (2 * np.pi), 3.0, 0.99 * bound, save_every=1000)
    growth = small.coefficients[-1, 3].real / small.coefficients[0, 3].real
    assert growth == pytest.approx(math.exp(3.0 * linear_growth_rate(3, 5.0)), rel=1e-5)


def test_negative_density_warns_that_modes_no_longer_resolve_it():
    rho = lambda th: (1 + 0.6 * np.cos(th - 0.4) + 0.2 * np.sin(3 * th)) / (2 * np.pi)  # noqa: E731
    with pytest.warns(ResolutionWarning, match=r"went negative between t=2\.4 and t=2\.8.*raise n_modes"):
        CircleMeanField(5.0, 96).solve(rho, 4.0, 0.02, save_every=20)


# -- scale-safe retraction ---------------------------------------------------------------------
@pytest.mark.parametrize("dtype,scales", [(np.float64, (1e155, 1e-160, 1e300, 1e-300)),
                                          (np.float32, (1e30, 1e-30))])
def test_retraction_is_scale_safe(rng, dtype, scales):
    x = rng.standard_normal((7, 5)).astype(dtype)
    eps = np.finfo(dtype).eps
    reference = (x.astype(np.float64) / np.linalg.norm(x.astype(np.float64), axis=1, keepdims=True))
    for c in scales:
        y = retract(dtype(c) * x)
        assert y.dtype == dtype
        np.testing.assert_allclose(y, reference, rtol=0, atol=4 * eps)
    np.testing.assert_allclose(retract(x), reference, rtol=0, atol=4 * eps)
    with pytest.raises(ValueError, match="zero vector"):
        retract(np.zeros((2, 3)))


@pytest.mark.parametrize("c", [1e160, 1e-170])
def test_solve_normalizes_any_scale(rng, c):
    """Issue 9 item 14: 1e160 * x said 'reduce dt', 1e-170 * x said 'zero row'."""
    x = sphere_points(rng, 5, 3)
    dyn = SelfAttentionDynamics(1.0)
    scaled = dyn.solve(c * x, 1.0, 0.1, normalize=True)
    plain = dyn.solve(x, 1.0, 0.1)
    np.testing.assert_allclose(scaled.positions, plain.positions, rtol=0, atol=1e-15)
    with pytest.raises(ValueError, match=r"not on the unit sphere .* = 1e\+160" if c > 1 else "not on the unit sphere"):
        dyn.solve(c * x, 1.0, 0.1)
    zero = x.copy()
    zero[3] = 0.0
    with pytest.raises(ValueError, match=r"zero row \(row 3"):
        dyn.solve(zero, 1.0, 0.1, normalize=True)


def test_float32_normalized_in_float32_is_accepted(rng):
    """Issue 9 item 13: unit-sphere tolerance sqrt(eps) of the dtype."""
    x64 = rng.standard_normal((6, 3))
    x32 = x64.astype(np.float32)
    x32 /= np.linalg.norm(x32, axis=1, keepdims=True)  # normalized in float32: ~1e-7 off
    assert np.max(np.abs(np.linalg.norm(x32.astype(np.float64), axis=1) - 1)) > 0
    assert sphere_tolerance(np.float32) == pytest.approx(math.sqrt(np.finfo(np.float32).eps))
    assert sphere_tolerance(np.float64) == pytest.approx(math.sqrt(np.finfo(np.float64).eps))
    path = SelfAttentionDynamics(1.0).solve(x32, 1.0, 0.1)
    assert path.positions.dtype == np.float32
    reference = SelfAttentionDynamics(1.0).solve(x32.astype(np.float64), 1.0, 0.1, normalize=True)
    np.testing.assert_allclose(path.final, reference.final, atol=2e-6)
    with pytest.raises(ValueError, match="not on the unit sphere"):
        SelfAttentionDynamics(1.0).solve(x32 * np.float32(1.001), 1.0, 0.1)


# -- refused arguments ---------------------------------------------------------------------------
@pytest.mark.parametrize("beta", ["1", True, np.True_, 1 + 0j, None])
def test_beta_must_be_a_real_number(beta):
    with pytest.raises(TypeError, match="beta must be a real number"):
        SelfAttentionDynamics(beta)
    with pytest.raises(TypeError, match="beta must be a real number"):
        CircleMeanField(beta, 16)
    with pytest.raises(TypeError, match="beta must be a real number"):
        linear_growth_rate(2, beta)


def test_complex_inputs_are_refused(rng):
    x = sphere_points(rng, 4, 3)
    dyn = SelfAttentionDynamics(1.0)
    with pytest.raises(TypeError, match="x0 must be real"):
        dyn.solve(x + 0j, 1.0, 0.1)
    with pytest.raises(TypeError, match="x0 must be real"):
        dyn.solve(x.tolist() + [[1j, 0, 0]], 1.0, 0.1)
    with pytest.raises(TypeError, match="must be real"):
        dyn.velocity(x.astype(complex))
    with pytest.raises(TypeError, match=r"Q\[0\] must be real"):
        SelfAttentionDynamics(1.0, Q=np.eye(3) + 0j)
    with pytest.raises(TypeError, match="weights must be real"):
        SelfAttentionDynamics(1.0, weights=np.ones(4) + 1j)
    with pytest.raises(TypeError, match="rho0 must be real"):
        CircleMeanField(1.0, 16).solve(np.ones(16) + 0j, 1.0, 0.1)
    with pytest.raises(TypeError, match="dt must be a real number"):
        dyn.solve(x, 1.0, "0.1")
    # integer and list inputs are accepted and become float64
    assert dyn.solve(np.eye(3, dtype=int).tolist(), 0.1, 0.1).positions.dtype == np.float64


def test_particles_are_validated_once_per_solve(rng, monkeypatch):
    x = sphere_points(rng, 4, 3)
    dyn = SelfAttentionDynamics(1.0)
    calls = []
    original = SelfAttentionDynamics._check_particles
    monkeypatch.setattr(SelfAttentionDynamics, "_check_particles",
                        lambda self, y, *name: calls.append(1) or original(self, y, *name))
    dyn.solve(x, 1.0, 0.05, scheme="rk4")  # 20 steps, 80 velocity evaluations
    assert len(calls) == 1


# -- memory, NaN reporting and Ctrl-C ------------------------------------------------------------
def test_too_many_saved_states_are_refused_at_once(rng, monkeypatch):
    """Issue 9 item 12: solve(x, 1e9, 1e-3) ran for ever."""
    monkeypatch.setenv("CTFORMER_MAX_STEPS", str(10**13))  # past the step limit: memory refuses
    x = sphere_points(rng, 4, 3)
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"save_every=1 over \d+ steps keeps 1000000000000 states of 96 bytes: "
                                         r"96000000000000 bytes needed .* available"):
        SelfAttentionDynamics(1.0).solve(x, 1e9, 1e-3)
    assert time.perf_counter() - start < 1.0


def test_memory_bound_is_exact(rng, monkeypatch):
    x = sphere_points(rng, 4, 3)
    per_state = 4 * 3 * 8
    monkeypatch.setattr(timegrid_module, "available_bytes", lambda like: 10 * per_state)
    dyn = SelfAttentionDynamics(1.0)
    assert len(dyn.solve(x, 0.9, 0.1)) == 10  # 9 steps + t = 0: exactly fits
    with pytest.raises(ValueError, match=rf"11 states of {per_state} bytes: {11 * per_state} bytes needed .*, "
                                         rf"{10 * per_state} bytes available .*raise save_every \(to at least 2\)"):
        dyn.solve(x, 1.0, 0.1)
    assert len(dyn.solve(x, 1.0, 0.1, save_every=2)) == 6


class _Interrupting(solvers.Scheme):
    """RK4 that raises KeyboardInterrupt (as Ctrl-C would) when step ``at`` starts, or NaN."""

    name = "rk4"
    nominal_order = 4.0

    def __init__(self, at, nan=False):
        self.at, self.nan, self.calls, self.inner = at, nan, 0, solvers.get("rk4")

    def step(self, problem, u, dt):
        if dt == 1.0:  # the stability probe of the mean field (stability_function), not a step
            return self.inner.step(problem, u, dt)
        self.calls += 1
        if self.calls == self.at:
            if self.nan:
                return u * float("nan")
            raise KeyboardInterrupt
        return self.inner.step(problem, u, dt)


def test_ctrl_c_keeps_the_particle_trajectory(rng):
    x = sphere_points(rng, 5, 3)
    dyn = SelfAttentionDynamics(2.0)
    full = dyn.solve(x, 1.0, 0.1)
    with pytest.raises(KeyboardInterrupt) as info:
        dyn.solve(x, 1.0, 0.1, scheme=_Interrupting(8), save_every=3)
    exc = info.value
    assert isinstance(exc, SolveInterrupted)
    assert "\n" not in str(exc) and "step 7 of 10" in str(exc) and "kept 4 states up to t=0.7" in str(exc)
    np.testing.assert_allclose(exc.result.times, [0.0, 0.3, 0.6, 0.7], atol=1e-15)
    np.testing.assert_array_equal(exc.result.positions, full.positions[[0, 3, 6, 7]])


def test_ctrl_c_keeps_the_mean_field_solution():
    mf = CircleMeanField(1.0, 16)
    rho = lambda th: (1 + 0.3 * np.cos(th)) / (2 * np.pi)  # noqa: E731
    full = mf.solve(rho, 1.0, 0.1, tracers=[1.0])
    with pytest.raises(SolveInterrupted, match=r"step 4 of 10.*kept 3 states up to t=0\.4") as info:
        mf.solve(rho, 1.0, 0.1, tracers=[1.0], scheme=_Interrupting(5), save_every=2)
    np.testing.assert_array_equal(info.value.result.density, full.density[[0, 2, 4]])
    np.testing.assert_array_equal(info.value.result.tracers, full.tracers[[0, 2, 4]])


def test_nan_born_during_a_solve_names_the_time(rng):
    x = sphere_points(rng, 5, 3)
    with pytest.raises(FloatingPointError, match=r"NaN or inf between t=0\.4 and t=0\.6"):
        SelfAttentionDynamics(1.0).solve(x, 1.0, 0.1, scheme=_Interrupting(5, nan=True), save_every=2)
    with pytest.raises(FloatingPointError, match=r"between t=0\.2 and t=0\.3 .*under-resolved"):
        CircleMeanField(1.0, 16).solve(lambda th: np.ones_like(th), 1.0, 0.1, scheme=_Interrupting(3, nan=True))


def test_generic_array_namespace_keeps_namespace_and_dtype(rng):
    """array_api_strict arrays (the one code path for every namespace): same answer as NumPy."""
    xs = require("array_api_strict")
    x = sphere_points(rng, 2, 6, 3)
    dyn = SelfAttentionDynamics(1.5, Q=0.5 * rng.standard_normal((3, 3)), weights=rng.random(6) + 0.2,
                                mask=np.tril(np.ones((6, 6), dtype=bool)))
    reference = dyn.solve(x, 1.0, 0.05, scheme="strang").final
    got = dyn.solve(xs.asarray(x), 1.0, 0.05, scheme="strang").final
    np.testing.assert_allclose(np.asarray(got), reference, rtol=0, atol=1e-15)
    single = dyn.solve(xs.asarray(x, dtype=xs.float32), 1.0, 0.05, scheme="strang").final
    assert single.dtype == xs.float32
    np.testing.assert_allclose(np.asarray(single), reference, atol=2e-6)

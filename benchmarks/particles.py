"""Benchmarks and measured accuracies of ctformer.particles.

Run ``python benchmarks/particles.py`` (add ``--quick`` to skip the 1,000-particle run). After the CPU
and the BLAS kernel it prints

1. the wall time of a 1,000-particle, d = 64, t = 20 SA simulation (Q = K = V = I, beta = 1,
   RK4 with dt = 0.1, uniform random start), with the number of clusters it reached;
2. the relative errors of the measured mean-field growth rates against
   k^2 I_k(beta) / (beta I_0(beta));
3. the particle-vs-mean-field error at the quantiles of rho0 = (1 + 0.3 cos theta) / (2 pi)
   and its fitted geometric rate;
4. (``--orders``) the observed order of every scheme of ``ctformer.solvers.available()`` for
   particles and for the mean field (slope of log error vs log dt against a fine reference),
   the time per step of a 16-particle, d = 16 solve, and the stable steps of the mean field.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np
from scipy import optimize, special

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import header, summary  # noqa: E402

from ctformer import solvers
from ctformer.particles import CircleMeanField, SelfAttentionDynamics, cluster_count, energy


def large_simulation(n=1000, d=64, t1=20.0, dt=0.1, beta=1.0, seed=0):
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((n, d))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    dyn = SelfAttentionDynamics(beta)
    dyn.solve(x0[:50], 0.2, dt)  # warm up (imports, FFTW-free but BLAS threads)
    start = time.perf_counter()
    path = dyn.solve(x0, t1, dt, scheme="rk4", save_every=int(round(t1 / dt)))
    elapsed = time.perf_counter() - start
    print(f"SA, n={n}, d={d}, beta={beta}, t=0..{t1}, rk4 dt={dt}: {elapsed:.2f} s "
          f"({int(round(t1 / dt))} steps, {elapsed / round(t1 / dt) * 1e3:.1f} ms/step)")
    print(f"  energy {energy(x0, beta):.6f} -> {energy(path.final, beta):.6f} "
          f"(max e^beta/(2 beta) = {math.exp(beta) / (2 * beta):.6f}); "
          f"clusters at tol 0.1: {cluster_count(path.final, 0.1)}")
    return elapsed


def growth_rates(betas=(1.0, 5.0, 9.0, 50.0), ks=(1, 2, 3, 5), eps=1e-7, t1=0.2, dt=0.01):
    worst = 0.0
    print("mean-field growth rate of eps cos(k theta), relative error vs k^2 I_k / (beta I_0):")
    for beta in betas:
        row = []
        for k in ks:
            sol = CircleMeanField(beta, 48).solve(lambda th: (1 + eps * np.cos(k * th)) / (2 * np.pi), t1, dt)
            measured = math.log(sol.coefficients[-1, k].real / sol.coefficients[0, k].real) / t1
            expected = k**2 * special.iv(k, beta) / (beta * special.iv(0, beta))
            row.append(abs(measured / expected - 1))
        worst = max(worst, max(row))
        print(f"  beta={beta:5.1f}: " + "  ".join(f"k={k}: {e:.1e}" for k, e in zip(ks, row)))
    print(f"  worst relative error {worst:.1e}")
    return worst


def particles_vs_mean_field(ns=(4, 6, 8, 10, 12, 14, 16, 20), beta=1.0, t1=1.0, dt=0.02, a=0.3):
    mf = CircleMeanField(beta, 97)
    rho0 = lambda th: (1 + a * np.cos(th)) / (2 * np.pi)  # noqa: E731
    errors = []
    for n in ns:
        u = (np.arange(n) + 0.5) / n
        theta0 = np.array([optimize.brentq(lambda th: (th + a * np.sin(th)) / (2 * np.pi) - ui, 0, 2 * np.pi,
                                           xtol=1e-15) for ui in u])
        field = mf.solve(rho0, t1, dt, tracers=theta0)
        xt = SelfAttentionDynamics(beta).solve(np.stack([np.cos(theta0), np.sin(theta0)], 1), t1, dt).final
        gap = np.angle(np.exp(1j * (np.arctan2(xt[:, 1], xt[:, 0]) - field.tracers[-1])))
        errors.append(np.abs(gap).max())
    rate = -np.polyfit(ns, np.log(errors), 1)[0]
    y = math.acosh(1 / a)
    print(f"particles at quantiles vs mean-field characteristics (beta={beta}, t={t1}):")
    print("  " + "  ".join(f"n={n}: {e:.2e}" for n, e in zip(ns, errors)))
    print(f"  error ~ exp(-{rate:.3f} n) (fit over all n); last steps: "
          + ", ".join(f"{r:.3f}" for r in -np.diff(np.log(errors)) / np.diff(ns))
          + f"; strip-of-analyticity prediction at t=0: {y - a * math.sinh(y):.3f}")
    return rate


def _slope(dts, errors):
    return float(np.polyfit(np.log(dts), np.log(errors), 1)[0])


def scheme_orders(seed=20251003):
    """Observed orders of every scheme: particles (vs RK4 at dt/64) and the mean field."""
    rng = np.random.default_rng(seed)
    x0 = rng.standard_normal((6, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    dyn = SelfAttentionDynamics(1.5, Q=np.eye(3) + 0.3 * rng.standard_normal((3, 3)))
    dts = [1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64]
    exact = dyn.solve(x0, 1.0, 1 / 4096, scheme="rk4").final
    mf = CircleMeanField(2.0, 24)
    rho0 = lambda th: (1 + 0.5 * np.cos(th - 0.3) + 0.2 * np.sin(2 * th)) / (2 * np.pi)  # noqa: E731
    mf_dts = [1 / 5, 1 / 10, 1 / 20, 1 / 40]
    mf_exact = mf.solve(rho0, 1.0, 1 / 2560, scheme="rk4").density[-1]
    print("observed orders (slope of log error vs log dt), declared order in brackets:")
    x16 = rng.standard_normal((16, 16))
    x16 /= np.linalg.norm(x16, axis=1, keepdims=True)
    small = SelfAttentionDynamics(1.0)
    for name in solvers.available():
        order = solvers.get(name).order()
        p_err = [np.abs(dyn.solve(x0, 1.0, dt, scheme=name).final - exact).max() for dt in dts]
        m_err = [np.abs(mf.solve(rho0, 1.0, dt, scheme=name).density[-1] - mf_exact).max() for dt in mf_dts]
        start = time.perf_counter()
        small.solve(x16, 1.0, 1 / 1024, scheme=name, save_every=1024)
        per_step = (time.perf_counter() - start) / 1024
        print(f"  {name:8s} [{order:.0f}]  particles {_slope(dts, p_err):5.2f}   mean field "
              f"{_slope(mf_dts, m_err):5.2f}   16 x 16 particles: {per_step * 1e6:6.1f} us/step")
    big = CircleMeanField(5.0, 256)
    print("mean-field stable step, beta = 5, 256 modes (K = 85), t1 = 50: "
          + ", ".join(f"{name} {big.stable_step(50.0, name):.3g}" for name in solvers.available())
          + f"; 2 sqrt(2) / K = {2 * math.sqrt(2) / 85:.4g}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 1,000-particle simulation")
    parser.add_argument("--orders", action="store_true", help="only the per-scheme orders and step times")
    args = parser.parse_args()
    header("particles and mean fields: timings and measured accuracies")
    if args.orders:
        scheme_orders()
        summary()
        raise SystemExit(0)
    if not args.quick:
        large_simulation()
    growth_rates()
    particles_vs_mean_field()
    summary()

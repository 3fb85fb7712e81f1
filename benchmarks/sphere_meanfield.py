"""Cost per step of the sphere mean fields against their degree, and against particles.

Run ``python benchmarks/sphere_meanfield.py`` (about a minute; ``--quick`` for the smaller
sizes). It prints, with the CPU model and the BLAS kernel,

1. the time of one right-hand side of ``ZonalMeanField(beta=5, dimension=3, degree=L)`` for
   L = 16 .. 1024 and of ``SphericalMeanField(beta=5, degree=L)`` (ducc0 transforms) for
   L = 8 .. 128, with the fitted exponent of time against L (a zonal step is a few dense
   (L+1) x (3L/2) products and is expected near L^1..L^2 at these sizes; a spherical-harmonic
   transform costs O(L^3));
2. the peer: the SA particle velocity (``SelfAttentionDynamics(beta=5).velocity``) with as many
   particles as the spherical solver has coefficients, n = (L+1)^2, which is O(n^2) = O(L^4),
   and the ratio (mean field / particles) at each size;

each time the median of 5 after a warm-up (``benchmarks/_environment.timed_block``).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import header, prepare, summary, timed_block  # noqa: E402

prepare(sys.argv, __file__)

import numpy as np  # noqa: E402

from ctformer.particles import SelfAttentionDynamics, SphericalMeanField, ZonalMeanField  # noqa: E402


def exponent(sizes, times) -> float:
    return float(np.polyfit(np.log(sizes), np.log(times), 1)[0])


def zonal(degrees):
    rows = []
    for L in degrees:
        field = ZonalMeanField(5.0, 3, L)
        c = field.coefficients_of(lambda s: np.exp(2.0 * s))
        rows.append((L, timed_block(lambda: field.transport(c), 5)[0]))
    return rows


def spherical(degrees):
    rows = []
    for L in degrees:
        field = SphericalMeanField(5.0, L)
        alm = field.coefficients_of(lambda x: np.exp(2.0 * x[..., 2]) * (1 + 0.1 * x[..., 0]))
        rows.append((L, timed_block(lambda: field.transport(alm), 5)[0]))
    return rows


def particles(counts):
    rng = np.random.default_rng(0)
    dynamics = SelfAttentionDynamics(beta=5.0)
    rows = []
    for n in counts:
        x = rng.standard_normal((n, 3))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        rows.append((n, timed_block(lambda: dynamics.velocity(x), 5)[0]))
    return rows


def main() -> int:
    quick = "--quick" in sys.argv
    header("sphere mean fields against their degree and against SA particles; median of 5")
    zonal_degrees = [16, 32, 64, 128, 256] if quick else [16, 32, 64, 128, 256, 512, 1024]
    sphere_degrees = [8, 16, 32, 64] if quick else [8, 16, 32, 64, 128]
    z = zonal(zonal_degrees)
    print("\nZonalMeanField(beta=5, d=3): one right-hand side")
    for L, t in z:
        print(f"  L = {L:5d}: {t * 1e6:10.1f} us")
    print(f"  fitted exponent of time in L (L >= 64): "
          f"{exponent(*zip(*[(L, t) for L, t in z if L >= 64])):.2f}")
    s = spherical(sphere_degrees)
    p = particles([(L + 1) ** 2 for L in sphere_degrees])
    print("\nSphericalMeanField(beta=5) against SA particles with n = (L+1)^2 (same unknowns)")
    print(f"  {'L':>5} {'mean field':>12} {'particles':>12} {'ratio':>8}")
    for (L, t), (n, tp) in zip(s, p):
        print(f"  {L:5d} {t * 1e3:10.3f} ms {tp * 1e3:10.3f} ms {t / tp:8.3f}   (n = {n})")
    print(f"  fitted exponents in L: mean field {exponent(*zip(*s)):.2f}, particles "
          f"{exponent([L for L, _ in s], [t for _, t in p]):.2f}")
    summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())

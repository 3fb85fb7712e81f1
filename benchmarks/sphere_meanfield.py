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
   and the ratio (mean field / particles) at each size, timed in alternating rounds
   (:func:`_environment.rounds`, medians of ``--repeats``);

the zonal times are medians of 5 after a warm-up (``benchmarks/_environment.timed_block``).

Goals: the spherical mean field at most as costly as the particles with as many unknowns from
L = 16 on (ratio <= 1; at L = 8 the transforms' fixed costs still dominate); the fitted
exponents of time in L at most 2 for the zonal field (L >= 64) and at most 3.2 for the
spherical one (its O(L^3) transforms).
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import (add_run_options, growth_exponent, header, prepare, rounds, summary,  # noqa: E402
                          timed_block, verdict)

if __name__ == "__main__":
    prepare(sys.argv[1:], __file__)

import argparse  # noqa: E402

import numpy as np  # noqa: E402

from ctformer.particles import SelfAttentionDynamics, SphericalMeanField, ZonalMeanField  # noqa: E402


RATIO_GOAL, RATIO_FROM = 1.0, 16  # spherical mean field / particles, from this degree on
ZONAL_EXPONENT, SPHERICAL_EXPONENT = 2.0, 3.2


def zonal(degrees):
    rows = []
    for L in degrees:
        field = ZonalMeanField(5.0, 3, L)
        c = field.coefficients_of(lambda s: np.exp(2.0 * s))
        rows.append((L, timed_block(lambda: field.transport(c), 5)[0]))
    return rows


def spherical_against_particles(degrees, repeats):
    """Rows (L, mean field s, particles s, ratio, quartiles): one right-hand side of
    ``SphericalMeanField(beta=5, degree=L)`` and the SA velocity of n = (L+1)^2 particles,
    timed in alternating rounds."""
    rng = np.random.default_rng(0)
    dynamics = SelfAttentionDynamics(beta=5.0)
    rows = []
    for L in degrees:
        field = SphericalMeanField(5.0, L)
        alm = field.coefficients_of(lambda x: np.exp(2.0 * x[..., 2]) * (1 + 0.1 * x[..., 0]))
        x = rng.standard_normal(((L + 1) ** 2, 3))
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        timed = rounds({"mean field": lambda: field.transport(alm), "particles": lambda: dynamics.velocity(x)},
                       repeats)
        rows.append((L, timed["mean field"], timed["particles"], timed.ratio("mean field", "particles"),
                     timed.spread("mean field", "particles")))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, quick="the smaller degrees (zonal L <= 256, spherical L <= 64), 3 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats = 3
    header(f"sphere mean fields against their degree and against SA particles; medians of {args.repeats}")
    zonal_degrees = [16, 32, 64, 128, 256] if args.quick else [16, 32, 64, 128, 256, 512, 1024]
    sphere_degrees = [8, 16, 32, 64] if args.quick else [8, 16, 32, 64, 128]
    z = zonal(zonal_degrees)
    print("\nZonalMeanField(beta=5, d=3): one right-hand side")
    for L, t in z:
        print(f"  L = {L:5d}: {t * 1e6:10.1f} us")
    zonal_fit = growth_exponent(*zip(*[(L, t) for L, t in z if L >= 64]))
    print(f"  fitted exponent of time in L (L >= 64): {zonal_fit:.2f}")
    verdict("zonal mean field: exponent of time in L (L >= 64)", zonal_fit, ZONAL_EXPONENT, unit="(power of L)")
    rows = spherical_against_particles(sphere_degrees, args.repeats)
    print("\nSphericalMeanField(beta=5) against SA particles with n = (L+1)^2 (same unknowns)")
    print(f"  {'L':>5} {'mean field':>12} {'particles':>12} {'ratio':>8} {'quartiles':>12}")
    for L, t, tp, ratio, spread in rows:
        print(f"  {L:5d} {t * 1e3:10.3f} ms {tp * 1e3:10.3f} ms {ratio:8.3f} {f'[{spread[0]:.2f}-{spread[1]:.2f}]':>12}"
              f"   (n = {(L + 1) ** 2})")
        if L >= RATIO_FROM:
            verdict(f"spherical mean field L={L} / SA particles n={(L + 1) ** 2}", ratio, RATIO_GOAL, show=False,
                    spread=spread, rounds=args.repeats)
    degrees = [row[0] for row in rows]
    fits = {"mean field": growth_exponent(degrees, [row[1] for row in rows]),
            "particles": growth_exponent(degrees, [row[2] for row in rows])}
    print(f"  fitted exponents in L: mean field {fits['mean field']:.2f}, particles {fits['particles']:.2f}")
    verdict("spherical mean field: exponent of time in L", fits["mean field"], SPHERICAL_EXPONENT,
            unit="(power of L)")
    summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())

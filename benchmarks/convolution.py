"""Benchmark: a translation-invariant feature kernel applied by FFT (O(M log M)).

Compares, in one run, for a batch of ``tokens`` rows of ``M`` features on ``Fourier(M)``:

* ``ctformer``  : ``Convolution(profile).apply`` (pyFFTW with cached plans on the CPU),
* ``numpy.fft`` : the same circulant product written directly with ``numpy.fft.rfft/irfft``,
* ``dense``     : the ``M x M`` matrix product (BLAS), the O(M^2) peer, for M <= 8192.

Prints times (best of ``--repeats``), ratios to numpy.fft and the agreement between methods.
Thread counts are left as the environment sets them; OPENBLAS_* variables are not touched.
Set ``CTFORMER_FFTW_PLANNER=FFTW_MEASURE`` to time measured FFTW plans (planning happens in the
warm-up call). Measured on the 2-core development machine (64 rows, float64), ratio to
numpy.fft: FFTW_ESTIMATE 2.3 (M = 256) .. 1.2 (M = 65536); FFTW_MEASURE 1.4 (M = 1024) .. 1.04
(M = 65536); the dense product is 25x numpy.fft at M = 4096.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ctformer.discretizations import Fourier
from ctformer.kernels import Convolution


def best(f, repeats):
    f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096, 16384, 65536])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    kernel = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z)))
    rng = np.random.default_rng(0)
    print(f"{'M':>7} {'method':>10} {'time ms':>10} {'/numpy.fft':>11} {'max abs diff':>13}")
    for m in args.sizes:
        grid = Fourier(m)
        u = rng.standard_normal((args.tokens, m))
        symbol = kernel.symbol(grid)

        def numpy_fft():
            return np.fft.irfft(np.fft.rfft(u, axis=-1) * symbol, n=m, axis=-1)

        reference = numpy_fft()
        t_np = best(numpy_fft, args.repeats)
        t_ct = best(lambda: kernel.apply(u, grid, grid), args.repeats)
        diff = np.abs(kernel.apply(u, grid, grid) - reference).max()
        print(f"{m:>7} {'numpy.fft':>10} {t_np * 1e3:>10.3f} {1.0:>11.2f} {0.0:>13.1e}")
        print(f"{m:>7} {'ctformer':>10} {t_ct * 1e3:>10.3f} {t_ct / t_np:>11.2f} {diff:>13.1e}")
        if m <= 8192:
            matrix = kernel.matrix(grid, grid)
            t_dense = best(lambda: u @ matrix.T, args.repeats)
            diff = np.abs(u @ matrix.T - reference).max()
            print(f"{m:>7} {'dense':>10} {t_dense * 1e3:>10.3f} {t_dense / t_np:>11.2f} {diff:>13.1e}")


if __name__ == "__main__":
    main()

"""Unnormalized self-attention particles (whose velocity takes log Z) have the same bits on one
and two OpenBLAS threads (log Z's product ran on OpenBLAS's own threads: the solves differed in
the last bits), and log Z equals SciPy's logsumexp of the written-out scores."""
import os
import subprocess
import sys

import numpy as np
from scipy.special import logsumexp

from ctformer.particles import log_partition

_SCRIPT = """
import numpy as np
from ctformer.particles import SelfAttentionDynamics
x = np.random.default_rng(3).standard_normal((4, 300, 16))
x /= np.linalg.norm(x, axis=-1, keepdims=True)
print(np.asarray(SelfAttentionDynamics(beta=2.0, normalized=False).solve(x, t1=1.0, dt=0.1).final).tobytes().hex())
"""


def _bits(threads: str) -> str:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": threads}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_unnormalized_particle_bits_do_not_depend_on_the_blas_threads():
    assert _bits("1") == _bits("2")


def test_log_partition_is_the_logsumexp_of_the_scores():
    x = np.random.default_rng(3).standard_normal((2, 50, 8))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    reference = logsumexp(2.0 * np.einsum("bid,bjd->bij", x, x), axis=-1) - np.log(50)  # weights 1/M
    np.testing.assert_allclose(log_partition(x, x, beta=2.0), reference, rtol=1e-14, atol=1e-14)

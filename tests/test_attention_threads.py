"""Attention does not depend on the thread count (issue 19, item 5): ``quadrature_attention``
and ``local_attention`` give bit-identical results for ``CTFORMER_NUM_THREADS`` = 1, 2, 3, with
the Numba and the NumPy loops, in float32 and float64. Each count runs in its own process (the
worker count and BLAS's threads are read per process)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.conftest import require

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    from ctformer.operators.local_attention import local_attention, window_pattern
    from ctformer.operators.quadrature_attention import quadrature_attention

    rng = np.random.default_rng(0)
    results = {}

    def masked_heads(dtype):
        r = np.random.default_rng(5)
        qm, km, vm = (r.standard_normal((40, 100, 16)).astype(dtype) for _ in range(3))
        keep = (r.random((40, 100, 100)) < 0.7) | np.eye(100, dtype=bool)
        return qm, km, vm, keep
    for dtype in ("float64", "float32"):
        # the user's case: (2, 1100, 16), the streamed path (worker tasks)
        q, k, v = (rng.standard_normal((2, 1100, 16)).astype(dtype) for _ in range(3))
        results[f"{dtype}-plain"] = quadrature_attention(q, k, v, beta=0.7)
        results[f"{dtype}-causal"] = quadrature_attention(q, k, v, beta=0.7, mask="causal")
        keep = rng.random((2, 1100, 1100)) < 0.5
        keep[0, :3] = False                          # queries without keys
        results[f"{dtype}-mask"] = quadrature_attention(q, k, v, beta=0.7, mask=keep,
                                                        weights=rng.uniform(0.5, 1.5, 1100))
        # many small problems: the blocked batched path on the workers
        qs, ks, vs = (rng.standard_normal((64, 48, 20, 8)).astype(dtype) for _ in range(3))
        results[f"{dtype}-blocks"] = quadrature_attention(qs, ks, vs, beta=np.linspace(0.5, 1.5, 48))
        # keys in blocks (online softmax) where the compiled kernels run: 2100 keys, weights
        qb, kb, vb = (rng.standard_normal((1, 2100, 16)).astype(dtype) for _ in range(3))
        results[f"{dtype}-keyblocks"] = quadrature_attention(qb, kb, vb, beta=0.7,
                                                             weights=rng.uniform(0.5, 1.5, 2100))
        p = np.arange(1100, dtype=float)
        results[f"{dtype}-window"] = local_attention(q, k, v, beta=0.7, pattern=window_pattern(p, 300))
        # many small masked problems (2^18 to 2^20 scores in all): blocks of heads on the workers
        qm, km, vm, keep = masked_heads(dtype)
        results[f"{dtype}-maskedheads"] = quadrature_attention(qm, km, vm, beta=0.7, mask=keep)
        # a sliding window over 256 tokens of 12 heads: its slabs take that path
        qw, kw, vw = (rng.standard_normal((12, 256, 16)).astype(dtype) for _ in range(3))
        results[f"{dtype}-windowheads"] = local_attention(qw, kw, vw, beta=0.7,
                                                          pattern=window_pattern(np.arange(256.0), 128))
        # grouped queries (3 per key/value head): blocks over the key/value heads and groups
        qg = rng.standard_normal((4, 4, 3, 128, 16)).astype(dtype)
        kg, vg = (rng.standard_normal((4, 4, 1, 128, 16)).astype(dtype) for _ in range(2))
        results[f"{dtype}-groupedheads"] = quadrature_attention(qg, kg, vg, beta=0.7, mask="causal")
        # longer grouped causal heads: chunks of all the heads of a key/value head (compiled kernels)
        qc = rng.standard_normal((2, 2, 3, 300, 16)).astype(dtype)
        kc, vc = (rng.standard_normal((2, 2, 1, 300, 16)).astype(dtype) for _ in range(2))
        results[f"{dtype}-groupedchunks"] = quadrature_attention(qc, kc, vc, beta=0.7, mask="causal")
    np.savez(sys.argv[1], **results)
""")


def _run(tmp_path, engine, threads):
    path = tmp_path / f"{engine}-{threads}.npz"
    env = dict(os.environ, CTFORMER_LOOP_ENGINE=engine, CTFORMER_NUM_THREADS=str(threads))
    subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, check=True, timeout=600,
                   cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with np.load(path) as data:
        return {name: data[name] for name in data.files}


@pytest.mark.parametrize("engine", ["numba", "numpy"])
def test_attention_is_bit_identical_for_1_2_3_threads(tmp_path, engine):
    if engine == "numba":
        require("numba")
    runs = {threads: _run(tmp_path, engine, threads) for threads in (1, 2, 3)}
    names = sorted(runs[1])
    assert len(names) == 20
    for threads in (2, 3):
        for name in names:
            a, b = runs[1][name], runs[threads][name]
            assert a.dtype == b.dtype == np.dtype(name.split("-")[0]) and np.all(np.isfinite(a))
            differing = float(np.mean(a != b))
            assert differing == 0.0, f"{name}: {differing:.1%} of the entries differ for 1 and {threads} threads"
    # and the computation is the one intended: the float64 streamed result is softmax attention
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 1100, 16)) for _ in range(3))
    s = 0.7 * q @ np.swapaxes(k, -1, -2)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.abs(runs[1]["float64-plain"] - p @ v / p.sum(-1, keepdims=True)).max() < 1e-13
    # and so are the many masked heads, with their masks
    r = np.random.default_rng(5)
    qm, km, vm = (r.standard_normal((40, 100, 16)) for _ in range(3))
    keep = (r.random((40, 100, 100)) < 0.7) | np.eye(100, dtype=bool)
    s = np.where(keep, 0.7 * qm @ np.swapaxes(km, -1, -2), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.abs(runs[1]["float64-maskedheads"] - p @ vm / p.sum(-1, keepdims=True)).max() < 1e-13

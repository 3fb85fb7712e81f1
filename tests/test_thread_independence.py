"""Results do not depend on the thread count: fresh processes with a two-thread BLAS and
``CTFORMER_NUM_THREADS`` = 1, 2, 3, both loop engines, float32 and float64.

The in-process tests run with a one-thread BLAS (see conftest), where a threaded BLAS product
never happens; the user's report (1 vs 2 threads differed by 8.9e-16 in float64 and 1.8e-7
relative in float32 on 2 x 700 tokens) came from the row blocks running on a threaded BLAS
when the worker count was 1. Each case therefore runs in a subprocess whose BLAS really has
two threads (checked there).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from .conftest import require

_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import threadpoolctl
    from ctformer import ContinuousTransformer
    from ctformer.operators.quadrature_attention import quadrature_attention

    np.ones((64, 64)) @ np.ones((64, 64))  # BLAS loaded
    blas = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    assert blas and max(blas) == 2, f"the BLAS of this process should have 2 threads, has {blas}"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 700, 32))          # 1400 rows: the row-block path
    model = ContinuousTransformer.random_smooth(seed=1, layers=2, heads=2)
    q, k, v = (rng.standard_normal((2, 1100, 16)) for _ in range(3))
    out = {"run64": model.run(x), "run32": model.run(x.astype(np.float32)),
           # 400 rows: packed float32 products by blocks of 128 rows, attention on the threads
           "run32_mid": model.run(x[:1, :400].astype(np.float32)),
           "attention": quadrature_attention(q, k, v, beta=0.7),
           # tasks of whole sequences: 5 blocks of 2 x 64 tokens, 8 of 128
           "seqs32": model.run(rng.standard_normal((9, 64, 32)).astype(np.float32)),
           "seqs64": model.run(rng.standard_normal((8, 128, 32)))}
    np.savez(sys.argv[1], **out)
""")


def _run(engine: str, threads: int, path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(OPENBLAS_NUM_THREADS="2", CTFORMER_LOOP_ENGINE=engine,
               CTFORMER_NUM_THREADS=str(threads))
    result = subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(path) as data:
        return dict(data)


@pytest.mark.parametrize("engine", ["numba", "numpy"])
def test_run_and_attention_are_bitwise_identical_for_1_2_3_threads(engine, tmp_path):
    """2 x 700 tokens through ``run`` (float64 and float32) and ``quadrature_attention`` on
    (2, 1100, 16): the same bits for 1, 2 and 3 worker threads; float32 and float64 agree to
    float32's precision (the float64 run as the reference)."""
    if engine == "numba":
        require("numba")
    results = [_run(engine, t, tmp_path / f"{t}.npz") for t in (1, 2, 3)]
    for name in ("run64", "run32", "run32_mid", "attention", "seqs32", "seqs64"):
        for threads, other in zip((2, 3), results[1:]):
            diff = np.max(np.abs(other[name].astype(np.float64) - results[0][name]))
            assert np.array_equal(other[name], results[0][name]), \
                f"{name}: {threads} threads differ from 1 thread by {diff:.3g}"
    one = results[0]
    assert one["run32"].dtype == np.float32 and one["run64"].dtype == np.float64
    scale = np.max(np.abs(one["run64"]))
    assert np.max(np.abs(one["run32"] - one["run64"])) / scale < 1e-5


def _blas_threads():
    threadpoolctl = require("threadpoolctl")
    counts = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    return max(counts) if counts else None


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_row_blocks_run_single_threaded_blas_for_every_worker_count(dtype, monkeypatch):
    """A token-wise map by row blocks on 1400 rows with a two-thread BLAS: every block sees a
    one-thread BLAS for 1, 2 and 3 workers (one worker used to get the threaded BLAS), and the
    result has the same bits for every count. The map's product has transposed operands, a
    layout for which OpenBLAS's threaded and single-threaded products round differently."""
    threadpoolctl = require("threadpoolctl")
    from ctformer._numerics.threads import by_row_blocks

    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 128)).astype(dtype) / 10
    u = rng.standard_normal((2, 700, 128)).astype(dtype)
    seen = []

    def flow(v):
        seen.append(_blas_threads())
        return (w @ v.T).T                          # (rows, 512), transposed operands

    blocked = by_row_blocks(flow, width=512)
    results = {}
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        assert _blas_threads() == 2
        threaded = flow(u.reshape(-1, 128))         # the map as one threaded product
        for threads in (1, 2, 3):
            monkeypatch.setenv("CTFORMER_NUM_THREADS", str(threads))
            seen.clear()
            results[threads] = blocked(u)
            assert set(seen) == {1}, f"{threads} workers: blocks ran with BLAS threads {set(seen)}"
        assert _blas_threads() == 2                 # restored afterwards
    for threads in (2, 3):
        assert np.array_equal(results[threads], results[1])
    assert results[1].dtype == dtype and results[1].shape == (2, 700, 512)
    # the reference: the float64 product of the same numbers, to the rounding of the dtype
    exact = (w.astype(np.float64) @ u.reshape(-1, 128).T.astype(np.float64)).T
    eps = np.finfo(dtype).eps
    assert np.max(np.abs(results[1].reshape(-1, 512) - exact)) < 64 * eps * np.max(np.abs(exact))
    assert np.max(np.abs(threaded - exact)) < 64 * eps * np.max(np.abs(exact))


_CALLER_THREADS_SCRIPT = textwrap.dedent("""
    import json
    import threading
    import numpy as np
    import threadpoolctl
    from ctformer import ContinuousTransformer
    from ctformer.operators.quadrature_attention import quadrature_attention

    np.ones((64, 64)) @ np.ones((64, 64))  # BLAS loaded
    blas = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    assert blas and max(blas) == 2, f"the BLAS of this process should have 2 threads, has {blas}"
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 700, 32))
    seqs = rng.standard_normal((9, 64, 32)).astype(np.float32)
    q, k, v = (rng.standard_normal((2, 1100, 16)).astype(np.float32) for _ in range(3))
    model = ContinuousTransformer.random_smooth(seed=1, layers=2, heads=2)

    def compute():
        return {"run64": model.run(x), "run32": model.run(x.astype(np.float32)),
                "attention": quadrature_attention(q, k, v, beta=0.7), "seqs32": model.run(seqs)}

    main = compute()  # on the main thread first: the thread that set OpenBLAS's count first
    differ = {}

    def elsewhere(label):
        for name, value in compute().items():
            if not np.array_equal(value, main[name]):
                differ[f"{label} {name}"] = float(np.max(np.abs(value.astype(np.float64) - main[name])))

    for group in (["one other thread"], ["three at once, 1", "three at once, 2", "three at once, 3"]):
        threads = [threading.Thread(target=elsewhere, args=(label,)) for label in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    blas = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    print(json.dumps({"differ": differ, "blas after": max(blas)}))
""")


def test_results_are_the_same_on_any_calling_thread():
    """The same calls (``run`` in float64 and float32, many short sequences, streamed
    attention) on the main thread, on one other thread, and on three threads at once, with a
    two-thread BLAS: the same bits everywhere, and the BLAS count is two again afterwards.
    Before, threadpoolctl obeyed only the thread that first set OpenBLAS's count (here the
    main thread), so the other threads' one-thread products ran on OpenBLAS's threads."""
    require("threadpoolctl")
    import json

    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(OPENBLAS_NUM_THREADS="2", CTFORMER_NUM_THREADS="2")
    result = subprocess.run([sys.executable, "-c", _CALLER_THREADS_SCRIPT], env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["differ"] == {}
    assert report["blas after"] == 2

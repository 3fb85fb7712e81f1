"""The BLAS limit of parallel passes: every BLAS library at one thread inside, its own count after."""
import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from ctformer._numerics import streamed, threads


def _blas_counts():
    """Each loaded BLAS library's thread count, as threadpoolctl reads it (the reference)."""
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize("before", [1, 2, 3])
def test_one_thread_inside_and_each_librarys_own_count_after(before):
    with threadpool_limits(limits=before, user_api="blas"):
        counts = _blas_counts()
        assert counts and set(counts.values()) == {before}
        limit = threads.single_thread_blas()
        with limit:
            assert set(_blas_counts().values()) == {1}
            with threads.single_thread_blas():  # nested: still one, and left at one
                assert set(_blas_counts().values()) == {1}
            assert set(_blas_counts().values()) == {1}
        assert _blas_counts() == counts
        with limit:  # the same object again (as a pass reuses none, but it must not leak state)
            assert set(_blas_counts().values()) == {1}
        assert _blas_counts() == counts


def test_an_exception_inside_restores_the_counts():
    with threadpool_limits(limits=2, user_api="blas"):
        counts = _blas_counts()
        with pytest.raises(ZeroDivisionError):
            with threads.single_thread_blas():
                1 / 0
        assert _blas_counts() == counts


@pytest.mark.parametrize("parallel", [False, True])
def test_small_blocks_limit_blas_once_a_pass(monkeypatch, parallel):
    """Many heads in one pass take one limit (not one per task: 8 us each), and the result is
    the float64 reference's to rounding."""
    made = []
    one = threads.single_thread_blas
    monkeypatch.setattr(threads, "single_thread_blas", lambda: made.append(1) or one())
    monkeypatch.setattr(streamed, "_PARALLEL_MIN_ENTRIES", 0 if parallel else 1 << 40)
    monkeypatch.setattr(streamed, "_ONE_BLAS_THREAD_MIN", 0)  # every problem would be limited
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((4, 12, 40, 8)) for _ in range(3))
    out = streamed.small_blocks(0.3 * q, k, v, None, True, None, (4, 12))
    assert len(made) == 1
    s = np.where(np.tri(40, dtype=bool), 0.3 * q @ k.swapaxes(-1, -2), -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    exact = (p / p.sum(-1, keepdims=True)) @ v
    assert np.abs(out - exact).max() / np.abs(exact).max() < 1e-14


def test_a_limit_held_on_another_thread_leaves_the_worker_count_alone(monkeypatch):
    """While a pass on one thread holds the one-thread limit, a pass started on another
    thread still gets the user's worker count (the BLAS count the limit will restore), and
    the limit stays until the last block leaves."""
    import threading

    monkeypatch.delenv("CTFORMER_NUM_THREADS", raising=False)
    entered, release, seen = threading.Event(), threading.Event(), {}

    def hold():
        with threads.single_thread_blas():
            entered.set()
            release.wait(10)

    with threadpool_limits(limits=3, user_api="blas"):
        holder = threading.Thread(target=hold)
        holder.start()
        assert entered.wait(10)
        seen["blas"] = set(_blas_counts().values())
        seen["workers"] = threads.num_threads()
        with threads.single_thread_blas():
            release.set()
            holder.join()
            seen["after the holder"] = set(_blas_counts().values())
        seen["after both"] = set(_blas_counts().values())
    assert seen == {"blas": {1}, "workers": 3, "after the holder": {1}, "after both": {3}}


_FORK_WHILE_LIMITED = """
import json
import os
import threading

import numpy as np
import threadpoolctl

from ctformer._numerics import threads
from ctformer.operators.quadrature_attention import quadrature_attention

np.ones((64, 64)) @ np.ones((64, 64))  # BLAS loaded


def counts():
    return sorted({i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"})


entered, release = threading.Event(), threading.Event()


def hold():  # another thread's pass, holding the limit while the main thread forks
    with threads.single_thread_blas():
        entered.set()
        release.wait(30)


holder = threading.Thread(target=hold)
holder.start()
entered.wait(10)
q = np.random.default_rng(0).standard_normal((1500, 32))
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    report = {"child": counts(), "workers": threads.num_threads()}
    out = quadrature_attention(q, q, q, beta=0.3)
    report["child after a pass"] = counts()
    report["child result"] = out.tolist()
    os.write(write, json.dumps(report).encode())
    os._exit(0)
os.close(write)
data = b""
while chunk := os.read(read, 1 << 16):
    data += chunk
os.waitpid(pid, 0)
release.set()
holder.join()
report = json.loads(data)
report["parent after"] = counts()
report["same result"] = np.array_equal(np.array(report.pop("child result")), quadrature_attention(q, q, q, beta=0.3))
print(json.dumps(report))
"""


def test_a_child_forked_while_another_thread_holds_the_limit():
    """A fork while another thread's pass holds the one-thread limit: the child (where that
    pass does not go on) has the BLAS libraries' own count back, keeps it after a pass of its
    own, and computes the parent's bits; the parent's count is restored when its pass ends.
    Before, the child kept one BLAS thread for good."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(OPENBLAS_NUM_THREADS="2", CTFORMER_NUM_THREADS="2")
    done = subprocess.run([sys.executable, "-c", _FORK_WHILE_LIMITED], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"child": [2], "workers": 2, "child after a pass": [2], "parent after": [2],
                      "same result": True}

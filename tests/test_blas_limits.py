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

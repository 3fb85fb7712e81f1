"""The worker threads of attention and activations: how many run, BLAS limits, nesting."""
import contextlib
import importlib
import threading
import time

import numpy as np
import pytest

from .conftest import require

threads_module = importlib.import_module("ctformer._numerics.threads")
threadpoolctl = require("threadpoolctl")


def _blas_threads():
    counts = [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]
    return max(counts) if counts else None


def _record(tasks, parallel):
    seen, blas = set(), []

    def worker(next_task):
        while next_task() is not None:
            seen.add(threading.get_ident())
            blas.append(_blas_threads())
            time.sleep(0.02)  # releases the GIL: the other worker takes the next task

    threads_module.run_blas_tasks(worker, tasks, parallel)
    return seen, blas


def test_blas_tasks_use_the_blas_thread_count_when_the_variable_is_unset(monkeypatch):
    """Without CTFORMER_NUM_THREADS the count is BLAS's own, read before BLAS is limited to
    one thread per worker (reading it afterwards gave 1: everything ran on one thread)."""
    np.ones(2) @ np.ones(2)  # BLAS loaded
    assert _blas_threads() is not None, "threadpoolctl sees no BLAS library behind NumPy"
    monkeypatch.delenv("CTFORMER_NUM_THREADS", raising=False)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        assert threads_module.num_threads() == 2
        seen, blas = _record(list(range(6)), parallel=True)
        assert len(seen) == 2 and set(blas) == {1}
        assert _blas_threads() == 2                      # restored afterwards
        seen, blas = _record(list(range(6)), parallel=False)
        assert len(seen) == 1 and set(blas) == {2}       # small work: BLAS as configured


def test_nested_workers_run_on_their_own_thread(monkeypatch):
    """A pool used from inside one of its workers would wait on itself: nested calls run on
    the calling worker's thread, and every task is done exactly once."""
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    done = []
    lock = threading.Lock()

    def inner(next_task):
        while (task := next_task()) is not None:
            with lock:
                done.append(task)

    def outer(next_task):
        while (task := next_task()) is not None:
            threads_module.run_workers(inner, [(task, j) for j in range(4)], 2)
            time.sleep(0.01)

    start = time.perf_counter()
    threads_module.run_workers(outer, list(range(5)), 2)
    assert sorted(done) == [(i, j) for i in range(5) for j in range(4)]
    assert time.perf_counter() - start < 10


def test_row_blocks_equal_the_whole_map_and_do_not_depend_on_threads(monkeypatch):
    """A feed-forward layer by row blocks: the same numbers as the unblocked map (to the
    rounding of its products), bit for bit the same for 1 and 3 threads, shape and dtype kept,
    and the map's own path for few rows or non-NumPy inputs."""
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((48, 96)) / 7, rng.standard_normal((96, 40)) / 10
    seen = []

    def ffn(v):
        seen.append(threading.get_ident())
        time.sleep(0.005)  # releases the GIL: the other workers take the next blocks
        return np.tanh(v @ w1) @ w2

    blocked = threads_module.by_row_blocks(ffn, width=40)
    u = rng.standard_normal((3, 700, 48))          # 2100 rows: 8 blocks of 263 rows
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "1")
    one = blocked(u)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    seen.clear()
    three = blocked(u)
    assert len(seen) == 8 and len(set(seen)) > 1   # the blocks ran on several threads
    np.testing.assert_array_equal(one, three)
    whole = ffn(u)
    assert one.shape == whole.shape == (3, 700, 40)
    assert np.max(np.abs(one - whole)) <= 1e-14 * np.max(np.abs(whole))
    single = blocked(u.astype(np.float32))
    assert single.dtype == np.float32
    assert np.max(np.abs(single - whole)) <= 1e-5 * np.max(np.abs(whole))
    seen.clear()
    small = blocked(u[:, :100])                   # 300 rows: one call of the map itself
    assert len(seen) == 1 and small.shape == (3, 100, 40)


def test_maps_with_packed_products_take_row_blocks_from_fewer_rows(monkeypatch):
    """Where a map's products run packed on one thread (``packed`` holds for the dtype), 256 to
    511 rows run by blocks of at least 128 rows, with the same bits for 1 and 3 threads; other
    dtypes, and fewer rows, call the map once."""
    rng = np.random.default_rng(1)
    w1, w2 = rng.standard_normal((48, 96)) / 7, rng.standard_normal((96, 40)) / 10
    seen = []

    def ffn(v):
        seen.append(v.size // v.shape[-1])
        time.sleep(0.005)
        return np.tanh(v @ w1.astype(v.dtype)) @ w2.astype(v.dtype)

    blocked = threads_module.by_row_blocks(ffn, width=40, packed=lambda dtype: dtype == np.float32)
    u = rng.standard_normal((2, 150, 48))          # 300 rows
    single = u.astype(np.float32)
    results = []
    for count in ("1", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        seen.clear()
        results.append(blocked(single))
        assert sorted(seen) == [44, 128, 128]       # blocks of 128 rows: the shape's, not the threads'
    np.testing.assert_array_equal(*results)
    whole = ffn(u)
    assert np.max(np.abs(results[0] - whole)) <= 1e-5 * np.max(np.abs(whole))
    for other, rows in ((u, 300), (single[:, :127], 254)):  # float64: no packed products; too few rows
        seen.clear()
        blocked(other)
        assert seen == [rows]


def test_short_inputs_of_large_products_take_row_blocks(monkeypatch):
    """256 to 511 rows whose map has at least 2^22 multiply-adds (rows x d x width) run by
    blocks of at least 128 rows on the workers, every dtype, with the same bits for 1 and 3
    threads; smaller products, and maps whose products run whole on torch's threads, are
    called once."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((256, 64)) / 16
    seen = []

    def product(v):
        seen.append(v.size // v.shape[-1])
        time.sleep(0.005)
        return v @ w.astype(v.dtype)

    u = rng.standard_normal((2, 150, 256))           # 300 rows x 256 x 64: 4.9 M multiply-adds
    assert 300 * 256 * 64 >= threads_module._SHORT_MIN_PRODUCT > 300 * 256 * 32
    blocked = threads_module.by_row_blocks(product, width=64)
    for dtype in (np.float64, np.float32):
        results = []
        for count in ("1", "3"):
            monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
            seen.clear()
            results.append(blocked(u.astype(dtype)))
            assert sorted(seen) == [44, 128, 128]
        np.testing.assert_array_equal(*results)
        exact, scale = u @ w, np.abs(u) @ np.abs(w)  # sums of 256 products in the dtype
        assert results[0].dtype == dtype
        assert np.all(np.abs(results[0] - exact) <= 256 * np.finfo(dtype).eps * scale)
    narrow = threads_module.by_row_blocks(lambda v: product(v)[..., :32], width=32)
    threaded = threads_module.by_row_blocks(product, width=64, whole=lambda dtype: True)
    for blocked_map in (narrow, threaded):
        seen.clear()
        blocked_map(u)
        assert seen == [300]


@pytest.mark.parametrize("limit", [1, 2, 3])
def test_thread_count_follows_blas_limits_as_threadpoolctl_reports_them(monkeypatch, limit):
    """num_threads reads the libraries' counts directly (not threadpoolctl's info(), 10-20 us):
    it must agree with info() under every limit, and again after the limit is lifted."""
    np.ones(2) @ np.ones(2)
    monkeypatch.delenv("CTFORMER_NUM_THREADS", raising=False)
    controller = threadpoolctl.ThreadpoolController()

    def reported():
        return max(i["num_threads"] for i in controller.info() if i["user_api"] == "blas")

    before = reported()
    with threadpoolctl.threadpool_limits(limits=limit, user_api="blas"):
        assert threads_module.num_threads() == reported() == limit
    assert threads_module.num_threads() == reported() == before


def test_fixed_threads_keeps_the_entry_count_on_its_thread_only(monkeypatch):
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    seen = []
    with threads_module.fixed_threads():
        monkeypatch.setenv("CTFORMER_NUM_THREADS", "1")
        assert threads_module.num_threads() == 3
        with threads_module.fixed_threads():  # nested: the outer count
            assert threads_module.num_threads() == 3
        assert threads_module.num_threads() == 3
        other = threading.Thread(target=lambda: seen.append(threads_module.num_threads()))
        other.start()
        other.join()
    assert seen == [1]  # another thread reads the variable as it is now
    assert threads_module.num_threads() == 1  # and so does this one after the block
    with threadpoolctl.threadpool_limits(1, user_api="blas"):
        monkeypatch.delenv("CTFORMER_NUM_THREADS")
        with threads_module.fixed_threads():
            assert threads_module.num_threads() == _blas_threads() == 1


def test_a_solve_reads_the_thread_count_once(monkeypatch):
    from ctformer.discretizations import Midpoint
    from ctformer.model import ContinuousTransformer
    from ctformer import evolution

    model = ContinuousTransformer.random_smooth(layers=2, heads=2)
    u0 = np.cos(np.arange(600 * 16).reshape(600, 16) / 7.0)  # row blocks and streamed attention
    grid = dict(tokens=Midpoint(600), features=Midpoint(16), steps_per_layer=2, scheme="strang")
    reads = []
    real = threads_module.positive_int
    monkeypatch.setattr(threads_module, "positive_int", lambda *a, **k: reads.append(a) or real(*a, **k))
    first = model.solve(u0, **grid)
    assert reads == [("CTFORMER_NUM_THREADS",)]
    reads.clear()
    with monkeypatch.context() as m:  # without the fixed count, every threaded call reads it
        m.setattr(evolution, "fixed_threads", lambda: contextlib.nullcontext())
        np.testing.assert_array_equal(model.solve(u0, **grid), first)
    assert len(reads) > 10
    # the count decides how work is shared, not the result: the same bits on one thread
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "1")
    np.testing.assert_array_equal(model.solve(u0, **grid), first)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="CTFORMER_NUM_THREADS"):
        model.solve(u0, **grid)


@pytest.mark.parametrize("tokens, one_thread", [(128, True), (16, False)])
def test_the_batched_attention_pass_multiplies_on_one_blas_thread_where_openblas_would_thread(
        monkeypatch, tokens, one_thread):
    """12 heads of 128 tokens (128 x 32 x 128 multiply-adds each, which OpenBLAS threads): the
    products see a one-thread BLAS (a threaded one left a spinning worker that slowed the next
    OpenMP passes 4x); 16 tokens skip the limit. Softmax attention either way (scipy's softmax)."""
    threadpoolctl = require("threadpoolctl")
    from scipy.special import softmax

    from ctformer._numerics import streamed

    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((12, tokens, 32)) for _ in range(3))
    seen = []
    inner = streamed._small

    def spy(*args):
        seen.append(max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"))
        return inner(*args)

    monkeypatch.setattr(streamed, "_small", spy)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        got = streamed.small(q * 0.2, k, v, None, None, False, None)
    assert seen == [1 if one_thread else 2]
    exact = softmax(0.2 * q @ k.swapaxes(-1, -2), axis=-1) @ v
    assert np.max(np.abs(got - exact)) <= 1e-14 * np.max(np.abs(exact))

"""MKL's strict reproducibility mode (ctformer._numerics.torch_threads.threaded_products): asked for
when ctformer loads torch, refused once MKL has computed, never asked where MKL_CBWR is set;
where it is on, torch's products have the same bits on 1, 2 and 3 threads, and the feature
products outside worker tasks run on torch's threads.

Each case runs in a fresh process: MKL takes the mode only before its first computation."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ctformer._numerics import gemm, threads, torch_threads

from .conftest import require

torch = require("torch")

_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    if sys.argv[1] == "torch first":
        import torch
        torch.mm(torch.ones(8, 8), torch.ones(8, 8))   # MKL has computed
    from ctformer._numerics import torch_threads
    import torch
    on = torch_threads.threaded_products()
    rng = np.random.default_rng(0)
    same, error = True, 0.0
    # shapes whose inner dimension MKL splits between threads outside the strict mode
    for m, k, n, dtype in ((16, 1536, 384, np.float64), (33, 4096, 64, np.float64),
                           (128, 1536, 384, np.float32), (1024, 4096, 64, np.float32)):
        a, b = (rng.standard_normal(s).astype(dtype) for s in ((m, k), (k, n)))
        products = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            products.append(torch.mm(torch.from_numpy(a), torch.from_numpy(b)).numpy())
        same &= all(np.array_equal(p, products[0]) for p in products)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)
        error = max(error, float(np.max(np.abs(products[0] - exact) / scale)) / np.finfo(dtype).eps)
    print(on, same, error)
""")


def _run(order: str, **env) -> tuple[bool, bool, float]:
    environment = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | env
    result = subprocess.run([sys.executable, "-c", _SCRIPT, order], env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    on, same, error = result.stdout.split()
    return on == "True", same == "True", float(error)


def test_strict_mode_gives_the_same_bits_for_every_thread_count():
    """ctformer imported before torch computes: the threaded paths are on exactly where torch
    carries MKL (these machines' CPU wheel does) and its strict mode gives 1, 2 and 3 threads
    the same bits on these shapes: on an Intel Xeon it does; on an AMD EPYC (family 25, MKL
    2024.2) float64 products of (33, 4096) @ (4096, 64) differ between 1 and 2 threads even in
    the mode, and the library's check turns them off. Every product is within 64 ulps
    (relative to sum |a||b|) of the float64 product."""
    on, same, error = _run("ctformer first")
    assert on == (torch.backends.mkl.is_available() and same)
    assert error < 64


@pytest.mark.parametrize("order, env", [("torch first", {}), ("ctformer first", {"MKL_CBWR": "AUTO"})])
def test_the_mode_is_off_when_mkl_refuses_or_the_user_chose(order, env):
    """After torch has computed, MKL refuses the mode; with MKL_CBWR set, the user's setting
    stands. Either way the library's products stay on one thread per block."""
    on, _, error = _run(order, **env)
    assert not on
    assert error < 64


def test_rows_product_uses_torch_threads_only_where_the_mode_is_on(monkeypatch):
    """Outside worker tasks, with torch chosen: torch's product on ``num_threads`` threads
    where the mode is on and the product has at least 2^18 multiply-adds; NumPy's BLAS
    where the mode is off or the product is small. Each one the product to rounding."""
    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    rng = np.random.default_rng(2)
    big = rng.standard_normal((3, 40, 96)), rng.standard_normal((96, 80))   # 921600 multiply-adds
    small = rng.standard_normal((16, 16)), rng.standard_normal((16, 48))    # a small solve's
    assert big[0].size * 80 >= gemm._THREADED_MIN_PRODUCTS > small[0].size * 48
    seen = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda x, y, out=None: seen.append(torch.get_num_threads())
                        or real_mm(x, y, out=out))
    for mode in (True, False):
        monkeypatch.setattr(torch_threads, "_STRICT_MKL", [mode])
        for (a, b), torch_calls in ((big, [2] if mode else []), (small, [])):
            exact = np.einsum("...i,ij->...j", a.astype(np.longdouble), b.astype(np.longdouble)).astype(np.float64)
            seen.clear()
            product = gemm.rows_product(a, b)
            assert product.shape == exact.shape
            assert np.max(np.abs(product - exact)) < 1e-13 * np.max(np.abs(exact))
            assert seen == torch_calls
        assert gemm.threaded_rows(np.float64) is mode


def test_row_blocks_give_way_to_threaded_products(monkeypatch):
    """A dense map on 1400 rows: one call on all rows where threaded products are on; blocks
    of at least 256 rows where they are off."""
    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    u = np.ones((2, 700, 4))
    for mode, calls in ((True, [1400]), (False, [256] * 5 + [120])):
        monkeypatch.setattr(torch_threads, "_STRICT_MKL", [mode])
        rows = []
        blocked = threads.by_row_blocks(lambda v: rows.append(v.size // v.shape[-1]) or 2 * v,
                                        whole=gemm.threaded_rows)
        assert np.array_equal(blocked(u), 2 * u)
        assert sorted(rows, reverse=True) == sorted(calls, reverse=True)


@pytest.mark.parametrize("mode", [True, False])
def test_the_bias_enters_the_threaded_product(monkeypatch, mode):
    """``rows_product(a, b, bias)`` is ``a @ b + bias`` to rounding on every path: torch's
    ``addmm`` (the bias inside the product) where the mode is on, NumPy's product and an
    in-place add where it is off."""
    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    monkeypatch.setattr(torch_threads, "_STRICT_MKL", [mode])
    rng = np.random.default_rng(4)
    calls = []
    real = torch.addmm
    monkeypatch.setattr(torch, "addmm", lambda *x, **y: calls.append(1) or real(*x, **y))
    for dtype, tol in ((np.float64, 1e-13), (np.float32, 1e-5)):
        a, b = rng.standard_normal((2, 60, 96)).astype(dtype), rng.standard_normal((96, 70)).astype(dtype)
        bias = rng.standard_normal(70).astype(dtype)
        calls.clear()
        product = gemm.rows_product(a, b, bias)
        exact = (np.einsum("...i,ij->...j", a.astype(np.longdouble), b.astype(np.longdouble)) + bias).astype(np.float64)
        assert product.dtype == dtype and product.shape == (2, 60, 70)
        assert np.max(np.abs(product - exact)) < tol * np.max(np.abs(exact))
        assert calls == ([1] if mode else [])


def test_read_only_views_share_memory_and_warn_nothing():
    """A network's weights are read-only: torch views them without a copy, and no warning
    reaches the user, on the first view (torch's warn-once is silenced) or any later one."""
    import warnings

    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 4))
    for m in (a, b):
        m.flags.writeable = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        views = [torch_threads._tensor(torch, m) for m in (a, b, a, b)]
    assert not caught, [str(w.message) for w in caught]
    assert all(t.data_ptr() == m.ctypes.data for t, m in zip(views, (a, b, a, b)))
    np.testing.assert_allclose(torch.mm(views[0], views[1]).numpy(), a @ b, rtol=1e-14, atol=1e-14)

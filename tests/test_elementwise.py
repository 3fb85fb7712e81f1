"""Residual sums and gated products of large NumPy arrays on torch's threads
(ctformer._numerics.elementwise, ctformer.solvers.runge_kutta.summing): the bits of NumPy's
``a + b`` and ``a * b`` (IEEE sums and products are correctly rounded wherever computed) for
every thread count, torch only where it does this machine's products, and a model's solve
with the same bits as with NumPy's sums."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import evolution
from ctformer._numerics import elementwise, threads
from ctformer._numerics.gemm import threaded_rows
from ctformer.solvers import runge_kutta

from .conftest import require

torch = require("torch")

LARGE = (300, 384)  # 115200 entries, above elementwise._TORCH_MIN


@pytest.fixture
def torch_calls(monkeypatch):
    """Count torch's add and in-place mul as the module calls them."""
    calls = []
    add, mul_ = torch.add, torch.Tensor.mul_
    monkeypatch.setattr(torch, "add", lambda *a, **k: calls.append("add") or add(*a, **k))
    monkeypatch.setattr(torch.Tensor, "mul_", lambda self, other: calls.append("mul") or mul_(self, other))
    return calls


def _pair(dtype, shape=LARGE, seed=0):
    rng = np.random.default_rng(seed)
    # magnitudes over 12 decades: the sums round in every way a sum can
    return tuple((rng.standard_normal(shape) * 10.0 ** rng.uniform(-6, 6, shape)).astype(dtype) for _ in range(2))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("count", ["1", "2", "3"])
def test_large_sums_and_products_have_numpys_bits_on_any_thread_count(monkeypatch, torch_calls, dtype, count):
    """Where torch does this machine's products, torch computes them; elsewhere (MKL's strict
    mode off, no MKL) NumPy does: NumPy's bits either way."""
    monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
    a, b = _pair(dtype)
    total = elementwise.add(a, b)
    assert total.dtype == dtype and total is not a and total is not b
    np.testing.assert_array_equal(total, a + b)
    target = a.copy()
    assert elementwise.multiply_into(target, b) is target
    np.testing.assert_array_equal(target, a * b)
    assert torch_calls == (["add", "mul"] if threaded_rows(dtype) else [])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_without_torchs_threaded_products_numpy_computes(monkeypatch, torch_calls, dtype):
    """The other branch on every machine: with torch's products off its threads (as where
    MKL's strict mode is off), large arrays are NumPy's own calls, with the same bits."""
    monkeypatch.setattr(elementwise, "threaded_rows", lambda dtype: False)
    a, b = _pair(dtype, seed=1)
    np.testing.assert_array_equal(elementwise.add(a, b), a + b)
    target = a.copy()
    np.testing.assert_array_equal(elementwise.multiply_into(target, b), a * b)
    assert torch_calls == []


@pytest.mark.parametrize("case", ["small", "strided", "broadcast", "mixed dtypes", "float16",
                                  "numpy products", "inside a worker"])
def test_everything_else_is_numpys_own_call(monkeypatch, torch_calls, case):
    a, b = _pair(np.float64)
    if case == "small":
        a, b = a[:8, :8].copy(), b[:8, :8].copy()
    elif case == "strided":
        a, b = np.asfortranarray(a), np.asfortranarray(b)
    elif case == "broadcast":
        b = b[:1].copy()
    elif case == "mixed dtypes":
        b = b.astype(np.float32)
    elif case == "float16":
        a, b = (np.clip(x, -200, 200).astype(np.float16) for x in (a, b))  # no overflow
    elif case == "numpy products":
        monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    else:
        monkeypatch.setattr(threads._INSIDE, "worker", True, raising=False)
    np.testing.assert_array_equal(elementwise.add(a, b), a + b)
    target = a.copy()
    np.testing.assert_array_equal(elementwise.multiply_into(target, b), a * b)
    assert torch_calls == []


def test_summing_routes_only_large_unit_weight_sums():
    seen = []

    def adder(u, k):
        seen.append(u.size)
        return u + k

    big, small = np.ones(1 << 16), np.ones(16)
    with runge_kutta.summing(adder):
        np.testing.assert_array_equal(runge_kutta._combine(big, 1.0, (1.0,), [2 * big]), 3 * big)
        runge_kutta._combine(small, 1.0, (1.0,), [small])          # small: NumPy's sum
        runge_kutta._combine(big, 0.5, (1.0,), [big])              # h w = 0.5: a scaled term
        with runge_kutta.summing(lambda u, k: pytest.fail("the outer adder stays")):
            runge_kutta._combine(big, 2.0, (0.5,), [big])
    runge_kutta._combine(big, 1.0, (1.0,), [big])                  # outside: NumPy's sum
    assert seen == [1 << 16, 1 << 16]


def test_a_models_solve_sums_on_torchs_threads_with_numpys_bits(monkeypatch):
    from ctformer.discretizations import Midpoint
    from ctformer.model import ContinuousTransformer

    model = ContinuousTransformer.random_smooth(seed=2, layers=2, heads=2)
    u0 = np.random.default_rng(1).standard_normal((256, 256))  # 65536 entries: large
    calls = []

    def counted(u, k):
        calls.append(u.shape)
        return elementwise.add(u, k)

    def solve():
        return model.solve(u0, tokens=Midpoint(256), features=Midpoint(256), scheme="lie", steps_per_layer=1)

    monkeypatch.setattr(evolution, "threaded_add", counted)
    fast = solve()
    assert calls and all(shape == (256, 256) for shape in calls)  # every residual sum went there
    monkeypatch.setattr(evolution, "threaded_add", lambda u, k: u + k)
    np.testing.assert_array_equal(fast, solve())

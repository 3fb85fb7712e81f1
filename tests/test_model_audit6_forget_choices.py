"""``ctformer._numerics.gemm.forget_choices`` drops every measured choice and what the process
decided while reading them, so that the next call reads the store it finds (a test switching
stores, a loop engine switched in the process) and measures what that store lacks."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import few_rows, gemm, store

pytest.importorskip("numba")


@pytest.fixture
def switching(monkeypatch, tmp_path):
    """Two empty stores to switch between, CTFORMER_GEMM unset; afterwards the process forgets
    what it read from them."""
    monkeypatch.delenv("CTFORMER_GEMM", raising=False)
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "auto")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "first"))
    gemm.forget_choices()
    yield tmp_path
    monkeypatch.undo()
    gemm.forget_choices()


def test_a_switched_store_measures_its_products_before_the_few_row_kernel(switching, monkeypatch):
    """Before, the second store's few-row measurement asked for the products' choice under the
    store's lock: ``RuntimeError: measuring 'few rows float64' asked for 'products float64',
    which is not stored yet``. Now both are measured into the new store, products first."""
    gemm.prepared_products(np.float64)
    monkeypatch.setenv("XDG_CACHE_HOME", str(switching / "second"))
    gemm.forget_choices()
    assert gemm.prepared_products(np.float64) in (True, False)
    stored = store.read(store.cache_file())
    assert stored["products float64"]["provider"] in ("numpy", "torch")
    assert stored["few rows float64"]["provider"] in ("numpy", "compiled")


def test_loops_turned_off_after_forget_choices_are_off_for_few_row_products(switching, monkeypatch):
    """With ``CTFORMER_LOOP_ENGINE=numpy`` set after a product of few rows and
    ``forget_choices()``, the compiled kernel used to stay on: its verdict was timed with the
    kernels read under the old setting (``"compiled"``, stored in the NumPy engine's store) and
    ``prepare`` kept handing out compiled products. Now the verdict is the NumPy engine's:
    "the compiled loops are off", and no compiled product is prepared."""
    gemm.prepared_products(np.float64)
    assert few_rows.prepare(np.ones((64, 64)), None) is not None  # the loops are on
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    gemm.forget_choices()
    assert gemm.prepared_products(np.float64) is False
    verdict = store.read(store.cache_file())["few rows float64"]
    assert verdict["provider"] == "numpy" and "loops are off" in verdict["reason"]
    assert few_rows.prepare(np.ones((64, 64)), None) is None


def test_the_attention_blocks_choice_is_read_again_from_a_switched_store(switching, monkeypatch):
    """The attention blocks' measured chunk size was kept across ``forget_choices()``: the
    first store's size was used with a second store that held another. Now the second
    store's is used."""
    from ctformer._numerics import measured_blocks

    first, second = measured_blocks.CHUNK_BYTES[:2]
    monkeypatch.setattr(measured_blocks, "_measure_chunks", lambda dtype: {"chunk_bytes": first})
    assert measured_blocks.geometry(np.float64).chunk_bytes == first
    monkeypatch.setenv("XDG_CACHE_HOME", str(switching / "second"))
    monkeypatch.setattr(measured_blocks, "_measure_chunks", lambda dtype: {"chunk_bytes": second})
    gemm.forget_choices()
    assert measured_blocks.geometry(np.float64).chunk_bytes == second
    assert store.read(store.cache_file())["attention chunks float64"]["chunk_bytes"] == second


def _silu_operands():
    from ctformer._numerics import loops

    rng = np.random.default_rng(0)
    weight, rows = rng.standard_normal((384, 1152)) / 20, rng.standard_normal((16, 384))
    product = rows @ weight
    return weight, rows, loops.ACTIVATION_KINDS["silu"], product / (1 + np.exp(-product))


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_prepared_product_with_its_activation_survives_the_numpy_engine(switching, monkeypatch, threads):
    """A few-row product prepared (and kept in a cache) under the compiled loops, called after
    ``CTFORMER_LOOP_ENGINE=numpy`` was set: on one thread its fused SiLU raised
    ``AttributeError: 'NoneType' object has no attribute 'activation_over'``. Now it keeps
    its bits, the float64 SiLU of the product to 1e-13."""
    monkeypatch.setenv("CTFORMER_NUM_THREADS", threads)
    weight, rows, silu, expected = _silu_operands()
    prepared = few_rows.prepare(weight, None)
    before = prepared.then(silu)(rows)
    assert np.abs(before - expected).max() < 1e-13
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    assert np.array_equal(prepared.then(silu)(rows), before)
    gemm.forget_choices()  # and after the choices are forgotten
    assert np.array_equal(prepared.then(silu)(rows), before)
    assert np.abs(prepared(rows) - rows @ weight).max() < 1e-12

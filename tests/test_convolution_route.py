"""Where a periodic convolution multiplies by its dense matrix rather than by FFTs
(ctformer._numerics.convolution_route): measured once per machine and dtype, stored and reused,
refused when damaged, pinned by CTFORMER_GEMM or ``Convolution.dense_below``; both routes give
the closed form of the Bessel-function convolution."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import special

from ctformer._numerics import blocks, convolution_route as route, store
from ctformer.discretizations import Fourier
from ctformer.kernels import Convolution

from .conftest import stored_choices


def _synthetic(ratios):
    """A ``_times`` whose dense product takes ``ratios[m]`` of the FFT route's time at ``m``."""
    def times(dtype, m):
        return [ratios[m] * 1e-5] * route.ROUNDS, [1e-5] * route.ROUNDS
    return times


@pytest.mark.parametrize("ratios, expected", [
    ({16: 0.2, 32: 0.3, 64: 0.6, 128: 0.9, 256: 1.5, 512: 3.0, 1024: 6.0}, 128),
    # up to the default a product that is not clearly slower stays; above it one not clearly faster is not taken
    ({16: 0.2, 32: 0.3, 64: 0.6, 128: 1.05, 256: 0.95, 512: 3.0, 1024: 6.0}, 128),
    ({16: 0.2, 32: 0.3, 64: 0.6, 128: 0.7, 256: 0.85, 512: 0.9, 1024: 1.2}, 512),
    # clearly slower at 128: FFT from there on, and a product that loses at 64 is not taken at 128 either
    ({16: 0.2, 32: 0.3, 64: 0.6, 128: 1.1, 256: 1.5, 512: 3.0, 1024: 6.0}, 64),
    ({16: 0.2, 32: 0.3, 64: 1.2, 128: 0.9, 256: 1.5, 512: 3.0, 1024: 6.0}, 32),
    ({m: 1.2 for m in route.SIZES}, 0),
    ({m: 0.5 for m in route.SIZES}, 1024),
])
def test_the_crossover_is_the_largest_size_below_which_the_product_always_won(monkeypatch, ratios, expected):
    monkeypatch.setattr(route, "_times", _synthetic(ratios))
    measured = route._measure(np.dtype(np.float64))
    assert measured["dense_below"] == expected
    assert measured["ratios"] == {str(m): pytest.approx(r) for m, r in ratios.items()}


def test_a_winner_must_win_most_rounds():
    rounds, wins = route.ROUNDS, blocks.WINS
    # the FFT route far faster in a few rounds, slower in most: 128 stays dense
    few = [0.5] * (wins - 1) + [1.05] * (rounds - wins + 1)
    assert route.dense_wins(128, [1.0] * rounds, few)
    assert not route.dense_wins(128, [1.0] * rounds, [0.85] * rounds)
    # above the default, the product must win clearly in most rounds
    assert not route.dense_wins(256, few, [1.0] * rounds)
    assert route.dense_wins(256, [0.85] * rounds, [1.0] * rounds)


def test_the_crossover_is_measured_once_stored_and_reused(fresh_store, monkeypatch):
    chosen = route.dense_below(np.float32)
    _, stored = stored_choices(fresh_store)
    entry = stored["convolution dense float32"]
    assert entry["checked"] == route.CHECKED and entry["dense_below"] == chosen
    assert set(entry["ratios"]) == {str(m) for m in route.SIZES}
    # 16 points: one small product against two transforms and a pass (0.10-0.17 measured);
    # 1024 points: 64 M multiply-adds against 64 transforms of O(M log M) (4-9x slower)
    assert entry["ratios"]["16"] < 0.5 and entry["ratios"]["1024"] > 2.0
    assert 16 <= chosen < 1024
    # a later process reads it
    route._measured.cache_clear()
    monkeypatch.setattr(route, "_measure", lambda dtype: pytest.fail("stored: nothing to measure"))
    assert route.dense_below(np.float32) == chosen


def test_a_damaged_entry_is_measured_again(fresh_store, monkeypatch):
    monkeypatch.setattr(route, "_times", _synthetic({m: 0.5 if m <= 64 else 2.0 for m in route.SIZES}))
    assert route.dense_below(np.float64) == 64
    path, stored = stored_choices(fresh_store)
    stored["convolution dense float64"]["dense_below"] = 100  # not a candidate: never used
    path.write_text(json.dumps(stored))
    route._measured.cache_clear()
    monkeypatch.setattr(route, "_times", _synthetic({m: 0.5 if m <= 256 else 2.0 for m in route.SIZES}))
    assert route.dense_below(np.float64) == 256
    assert stored_choices(fresh_store)[1]["convolution dense float64"]["dense_below"] == 256


def test_a_pinned_product_choice_keeps_the_default_and_measures_nothing(monkeypatch):
    monkeypatch.setattr(store, "entry", lambda *a, **k: pytest.fail("a pinned choice measures nothing"))
    for pinned in ("numpy", "torch"):
        monkeypatch.setenv("CTFORMER_GEMM", pinned)
        assert route.dense_below(np.float32) == route.dense_below(np.float64) == route.DEFAULT == 128
    monkeypatch.delenv("CTFORMER_GEMM")
    assert route.dense_below(np.float16) == route.DEFAULT
    monkeypatch.setenv("CTFORMER_GEMM", "mkl")
    with pytest.raises(ValueError, match="CTFORMER_GEMM"):
        route.dense_below(np.float64)


def _bessel_case(m):
    """int_0^1 e^{cos 2 pi (y - e)} cos(2 pi e) de = I_1(1) cos(2 pi y) on Fourier(m)."""
    grid = Fourier(m)
    u = np.cos(2 * np.pi * grid.nodes) * np.arange(1, 4)[:, None]
    return grid, u, special.i1(1.0) * u


@pytest.mark.parametrize("stored_limit, m, dense", [(0, 16, False), (1024, 256, True), (64, 64, True), (64, 128, False)])
def test_convolutions_take_the_stored_route(fresh_store, monkeypatch, stored_limit, m, dense):
    monkeypatch.setattr(route, "_times", _synthetic({s: 0.5 if s <= stored_limit else 2.0 for s in route.SIZES}))
    kernel = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z)))
    grid, u, exact = _bessel_case(m)
    got = kernel.apply(u, grid, grid)
    assert route.dense_below(u.dtype) == stored_limit
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-14)
    product = u @ np.asarray(kernel.matrix(grid, grid)).T
    assert np.array_equal(got, product) is dense  # the product's bits exactly where it multiplies
    # along another axis the same route: the product's bits where it multiplies (BLAS may
    # order a strided operand's sums otherwise: 2e-15 apart on OpenBLAS's SkylakeX kernel)
    columns = u.T.copy()
    along = kernel.apply(columns, grid, grid, axis=0)
    np.testing.assert_allclose(along, exact.T, rtol=0, atol=1e-14)
    assert np.array_equal(along, (columns.T @ np.asarray(kernel.matrix(grid, grid)).T).T) is dense


@pytest.mark.parametrize("pinned, m, dense", [(0, 16, False), (512, 256, True)])
def test_an_instance_pins_the_route(fresh_store, monkeypatch, pinned, m, dense):
    monkeypatch.setattr(route, "_times", lambda *a: pytest.fail("a pinned kernel measures nothing"))
    kernel = Convolution(lambda z: np.exp(np.cos(2 * np.pi * z)))
    kernel.dense_below = pinned
    grid, u, exact = _bessel_case(m)
    got = kernel.apply(u, grid, grid)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-14)
    assert np.array_equal(got, u @ np.asarray(kernel.matrix(grid, grid)).T) is dense

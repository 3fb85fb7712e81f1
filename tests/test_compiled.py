"""The compiled loops: the vectorizable exp against 50-digit arithmetic, the row kernel of
quadrature attention against a dense NumPy formula, and the engine switch."""
from __future__ import annotations

import importlib
import math
import os
import sys

import numpy as np
import pytest

from ctformer._numerics import compiled, normal_tail

from .conftest import require


@pytest.fixture
def made(monkeypatch):
    require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    return compiled.kernels()


def _exact_exp(x):
    mpmath = require("mpmath")
    mpmath.mp.dps = 50
    return np.array([float(mpmath.exp(mpmath.mpf(float(v)))) for v in x])


@pytest.mark.parametrize("dtype, low, high, ulps", [(np.float64, -707.7, 709.78, 1.0),
                                                    (np.float32, -86.6, 88.72, 1.0)])
def test_exp_is_correctly_rounded_to_an_ulp_over_the_whole_range(made, dtype, low, high, ulps):
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(low, high, 3000), rng.uniform(-1, 1, 1000),
                        [low, high, 0.0, -0.0, 1e-300, 0.5 * np.log(2), -0.5 * np.log(2)]]).astype(dtype)
    out = np.empty_like(x)
    made.exp_array(x, out)
    exact = _exact_exp(x)
    # error in units of the spacing of the exact value's binade (ulp)
    ulp = np.spacing(np.abs(exact).astype(dtype)).astype(np.float64)
    assert np.max(np.abs(out - exact) / ulp) <= ulps
    assert out[x == 0].tolist() == [1.0] * int(np.sum(x == 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_exp_limits_flush_overflow_and_nan(made, dtype):
    exp = made.exp_array
    big = 90.0 if dtype == np.float32 else 710.0
    x = np.array([-np.inf, -2 * big, -big, big, 2 * big, np.inf, np.nan], dtype=dtype)
    out = np.empty_like(x)
    exp(x, out)
    assert out[:3].tolist() == [0.0, 0.0, 0.0]
    assert out[3:6].tolist() == [np.inf] * 3
    assert np.isnan(out[6])


def test_generic_exp_keeps_the_precision_in_python_and_in_compiled_code(made):
    """exp_ is exp32 / exp64 inside kernels and NumPy's exp when called from Python: the same
    values to rounding (each within 1.5 ulp of the exact value, so at most 2.5 apart), in the
    argument's precision."""
    loops = importlib.import_module("ctformer._numerics.loops")
    for dtype in (np.float32, np.float64):
        x = np.linspace(-20, 20, 101).astype(dtype)
        compiled_out = np.empty_like(x)
        made.exp_array(x, compiled_out)
        python_out = np.array([loops.exp_(v) for v in x])
        assert python_out.dtype == dtype
        assert np.max(np.abs(python_out - compiled_out) / np.spacing(python_out)) <= 2.5


def test_float32_exp_polynomial_is_the_minimax_fit_of_the_relative_error():
    """EXP32_POLYNOMIAL against the best degree-4 P for 1 + r + r^2 P(r) ~ e^r on |r| <= ln2/2
    in relative error, solved here as a linear program (SciPy's HiGHS): the shipped P is within
    2% of the optimum, and the optimum is below a tenth of a float32 ulp."""
    from scipy.optimize import linprog

    loops = importlib.import_module("ctformer._numerics.loops")
    half = np.log(2) / 2
    r = np.linspace(-half, half, 4001)
    e = np.exp(r)
    powers = np.stack([r ** (i + 2) / e for i in range(5)], axis=1) * 1e8  # scaled above HiGHS's tolerances
    target = (e - 1 - r) / e * 1e8
    ones = np.ones((r.size, 1))
    bound = np.vstack([np.hstack([powers, -ones]), np.hstack([-powers, -ones])])
    best = linprog(np.r_[np.zeros(5), 1.0], A_ub=bound, b_ub=np.r_[target, -target],
                   bounds=[(None, None)] * 6, method="highs").x[-1] / 1e8
    fine = np.linspace(-half, half, 200001)
    shipped = 1 + fine + fine**2 * np.polyval(np.array(loops.EXP32_POLYNOMIAL, dtype=np.float64), fine)
    error = np.max(np.abs(shipped / np.exp(fine) - 1))
    assert best < 0.1 * np.finfo(np.float32).eps / 2
    assert error <= 1.02 * best


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_softmax_exponential_is_the_exponential_bit_for_bit_below_zero(made, dtype):
    """exp_nonpositive_ (the softmax rows' exponential: no overflow test) gives exp_'s bits for
    every x <= 0, the flush to 0 below the smallest normal number, -inf and NaN included, and
    stays exact up to x = 88 (float32) / 709 (float64)."""
    numba = require("numba")
    loops = importlib.import_module("ctformer._numerics.loops")

    @numba.njit
    def both(x, general, softmax):
        for i in range(x.size):
            general[i] = loops.exp_(x[i])
            softmax[i] = loops.exp_nonpositive_(x[i])

    low = -707.7 if dtype == np.float64 else -86.6
    rng = np.random.default_rng(3)
    x = np.concatenate([-np.geomspace(1e-30, 800, 20000), rng.uniform(low - 1, 0, 20000),
                        np.nextafter(dtype(low), [-np.inf, np.inf]), [0.0, -0.0, -np.inf, np.nan]]).astype(dtype)
    general, softmax = np.empty_like(x), np.empty_like(x)
    both(x, general, softmax)
    np.testing.assert_array_equal(softmax.view(f"u{x.itemsize}")[:-1], general.view(f"u{x.itemsize}")[:-1])
    assert np.isnan(softmax[-1]) and softmax[-2] == 0 and softmax[-4] == 1
    top = 709.0 if dtype == np.float64 else 88.0
    x = np.linspace(0, top, 1001).astype(dtype)
    both(x, general, softmax)
    np.testing.assert_array_equal(softmax, general)


def _dense_rows(s, log_w, causal_start, period, shift):
    """exp(s + log w - row max) with masked keys 0: the formula, with NumPy's exp."""
    s = s.astype(np.float64) + (0 if log_w.size == 0 else log_w)
    if causal_start >= 0:
        q = causal_start + np.arange(s.shape[0]) % period
        j = np.arange(s.shape[1])
        s = np.where(j[None, :] <= q[:, None], s, -np.inf)
        s[np.arange(s.shape[0]), q] += shift
    return np.exp(s - s.max(axis=1, keepdims=True))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", ["plain", "weights", "causal", "causal-half-periodic", "masked-entries"])
def test_row_kernel_equals_the_formula(made, dtype, case):
    rng = np.random.default_rng(3)
    rows, cols = 37, 53   # not multiples of the 8-way maximum
    s = (6 * rng.standard_normal((rows, cols))).astype(dtype)
    log_w = np.log(rng.uniform(0.2, 2.0, cols)).astype(dtype) if case != "plain" else np.empty(0, dtype)
    causal_start, period, shift = -1, 1 << 62, 0.0
    if case == "causal":
        causal_start = 16   # rows are queries 16..52 of a chunk that starts at 16
    elif case == "causal-half-periodic":
        causal_start, period, shift = 0, 9, np.log(0.5)  # 9 queries per problem, stacked
        s, log_w = s[:, :9].copy(), log_w[:9].copy()
    elif case == "masked-entries":
        s[rng.random(s.shape) < 0.3] = -np.inf
        s[:, 0] = 1.0
    expected = _dense_rows(s, log_w, causal_start, period, shift)
    sums = np.full(s.shape[0], np.nan, dtype=dtype)
    made.exp_rows(s, log_w, causal_start, period, dtype(shift), sums)
    eps = np.finfo(dtype).eps
    # rounding of s + log w (relative to the scores' size) and of the exp
    assert np.max(np.abs(s - expected)) <= 16 * eps * (1 + np.max(np.abs(expected)))
    assert np.array_equal(s == 0, expected == 0)
    # the row sums: math.fsum of the kernel's own entries, to the rounding of 53 terms
    exact_sums = np.array([math.fsum(row) for row in s.astype(np.float64)])
    assert np.max(np.abs(sums - exact_sums) / exact_sums) <= 8 * eps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_maximum_in_lanes_equals_numpys_at_every_length_and_position(made, dtype):
    """Rows of 256 entries or more take their maximum in SIMD lanes, then the entries after
    the last block of 64 in eight scalar maxima: the largest entry is found in the first
    entry, the last entry of a block, either kind of tail, for lengths around each edge."""
    loops = importlib.import_module("ctformer._numerics.loops")
    rng = np.random.default_rng(5)
    for end in (1, 7, 8, 9, 63, 255, 256, 257, 319, 320, 327, 1023, 1024, 1025, 2111):
        for where in {0, min(63, end - 1), end // 2, max(0, end - 9), max(0, end - 2), end - 1}:
            row = rng.standard_normal(end + 5).astype(dtype)   # entries past ``end`` never count
            row[end:] = 100
            row[where] = 7
            assert loops.row_max(row, end) == 7, (end, where)
        row = np.full(end, -np.inf, dtype)
        assert loops.row_max(row, end) == -np.inf
        row[end - 1] = np.inf
        assert loops.row_max(row, end) == np.inf


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_long_rows_with_a_nan_give_a_nan_sum(made, dtype):
    """A NaN score is passed over by the maximum but not by the exponential: its row sum is
    NaN (so is the attention output of that query), the other rows are the formula."""
    rng = np.random.default_rng(6)
    s = (4 * rng.standard_normal((3, 1031))).astype(dtype)
    s[1, 500] = np.nan
    expected = _dense_rows(np.delete(s, 1, axis=0), np.empty(0), -1, 1, 0.0)
    sums = np.empty(3, dtype=dtype)
    made.exp_rows(s, np.empty(0, dtype), -1, 1 << 62, dtype(0), sums)
    assert np.isnan(sums[1]) and np.isfinite(sums[[0, 2]]).all()
    assert np.max(np.abs(np.delete(s, 1, axis=0) - expected)) <= 16 * np.finfo(dtype).eps


def test_engine_switch_is_validated(monkeypatch):
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "fortran")
    with pytest.raises(ValueError, match="CTFORMER_LOOP_ENGINE must be one of auto, numba, numpy"):
        compiled.loop_engine()
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")
    assert compiled.loop_engine() == "numpy" and compiled.kernels() is None
    monkeypatch.setitem(sys.modules, "numba", None)  # as if Numba were not installed
    # the import is tried once per process: this test looks again, past the cache
    monkeypatch.setattr(compiled, "_numba_installed", compiled._numba_installed.__wrapped__)
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    with pytest.raises(ImportError, match=r'needs Numba: pip install "ctformer\[fast\]"'):
        compiled.loop_engine()
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "auto")
    assert compiled.loop_engine() == "numpy"


def _exact_gelu(z):
    mpmath = require("mpmath")
    mpmath.mp.dps = 50
    return np.array([float(mpmath.mpf(float(v)) * mpmath.ncdf(mpmath.mpf(float(v)))) for v in z])


def test_normal_tail_coefficients_are_the_40_digit_chebyshev_interpolant():
    require("mpmath")
    assert normal_tail.power_coefficients() == normal_tail.POWER


def test_normal_tail_numpy_formula_is_relatively_accurate_to_3_ulp():
    mpmath = require("mpmath")
    mpmath.mp.dps = 50
    a = np.concatenate([np.linspace(0, 37.5, 3001), [1e-300, 38.5, 40.0, 1e18, np.inf]])
    exact = np.array([float(mpmath.ncdf(-mpmath.mpf(float(v)))) for v in a])
    ours = normal_tail.lower_tail(a)
    normal = exact > np.finfo(np.float64).tiny
    assert np.max(np.abs(ours - exact)[normal] / exact[normal]) <= 3 * np.finfo(np.float64).eps
    assert ours[-3:].tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="lower_tail needs a >= 0"):
        normal_tail.lower_tail([-1.0])


def test_gelu64_is_relatively_accurate_to_a_few_ulp_down_to_the_smallest_normal_result(made):
    """3.5 ulp at most (3.52 over 30 000 random points of [-37.615, 0] and [-8, 0]; 2.7 for
    99.9% of them): the Gaussian factor multiplies last, so results near the smallest normal
    number are not rounded as subnormal products first (12 ulp before)."""
    rng = np.random.default_rng(5)
    # down to -37.615, where z Phi(z) is still a normal number (2.3e-308)
    z = np.concatenate([-np.linspace(0, 37.5, 3001), -np.linspace(37.5, 37.615, 231), rng.uniform(-10, 10, 2000),
                        rng.uniform(-37.615, -30, 2000), np.linspace(0, 40, 101)])
    out = np.empty_like(z)
    made.gelu64(z, out)
    exact = _exact_gelu(z)
    normal = np.abs(exact) > np.finfo(np.float64).tiny
    # relative, without the condition number's allowance: the a^2 split removes the z^2/2 ulps
    assert np.max(np.abs(out - exact)[normal] / np.abs(exact)[normal]) <= 3.5 * np.finfo(np.float64).eps
    assert np.array_equal(out[~normal & (z != 0)], exact[~normal & (z != 0)])  # flushed: 0 both
    special = np.array([np.inf, -np.inf, np.nan, 1e300, -1e300, 0.0, -0.0])
    out = np.empty_like(special)
    made.gelu64(special, out)
    assert out[0] == np.inf and out[1] == 0 and np.isnan(out[2])
    assert out[3] == 1e300 and out[4] == 0 and out[5] == 0 and np.signbit(out[6])


_CALL_EVERY_KERNEL = """
import json, numpy as np
from ctformer._numerics import compiled
made = compiled.kernels()
for dtype in (np.float32, np.float64):
    z = np.linspace(-3, 3, 11).astype(dtype)
    bits = "32" if dtype == np.float32 else "64"
    for name in ("gelu", "gelu_tanh", "silu"):
        getattr(made, name + bits)(z, np.empty_like(z))
        getattr(made, name + "_over" + bits)(z.copy())
    made.activation_over(2, z.copy())
    made.exp_array(z, np.empty_like(z))
    s = np.ones((3, 4), dtype)
    made.exp_rows(s, np.empty(0, dtype), -1, 1 << 62, dtype(0), np.empty(3, dtype))
# one count per compiled function (SiLU's and the tanh GELU's loops serve both precisions)
dispatchers = {id(getattr(made, name)): getattr(made, name) for name in compiled._KERNELS}
hits = sum(len(d.stats.cache_hits) for d in dispatchers.values())
print(json.dumps({"hits": hits}))
"""


def test_compiled_kernels_are_loaded_from_numbas_cache_in_a_new_process(tmp_path):
    """A second process loads every kernel from the disk cache and writes nothing new (kernels
    that close over compiled functions were recompiled in every process, each leaving another
    cache file behind)."""
    require("numba")
    import json
    import subprocess

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), CTFORMER_LOOP_ENGINE="numba")

    def run():
        done = subprocess.run([sys.executable, "-c", _CALL_EVERY_KERNEL], env=env, check=True,
                              capture_output=True, text=True, timeout=300)
        return json.loads(done.stdout.strip().splitlines()[-1])["hits"]

    run()
    files = sorted(p.name for p in tmp_path.rglob("*") if p.is_file())
    assert any(name.endswith(".nbc") for name in files)
    # 3 activations x 2 precisions x (new array, over the input), activation_over, exp_array and
    # exp_rows x 2 signatures
    assert run() == 18
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == files


def test_sigint_is_held_back_until_the_block_ends_then_raised():
    """Ctrl-C inside ``sigint_deferred`` (the compile step of every kernel): the block runs to
    its end, then the previous handler raises KeyboardInterrupt; the handler is restored."""
    import signal
    import threading
    import time

    before = signal.getsignal(signal.SIGINT)
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with compiled.sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)                  # Python would have run the handler by now
            finished.append(True)
    assert finished == [True] and signal.getsignal(signal.SIGINT) is before
    with compiled.sigint_deferred():          # no signal: nothing happens
        finished.append(True)
    errors = []

    def elsewhere():                          # off the main thread: a plain block
        try:
            with compiled.sigint_deferred():
                finished.append(True)
        except Exception as exc:              # pragma: no cover - the failure being tested
            errors.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert errors == [] and finished == [True] * 3


def test_kernels_compile_under_the_deferred_sigint(made):
    """Every kernel's compile step goes through ``sigint_deferred`` (Numba calls it only when
    no compiled version fits the arguments)."""
    for name in compiled._KERNELS:
        step = getattr(made, name)._compile_for_args
        assert getattr(step, "__wrapped__", None) is not None      # the wrapper, not Numba's own
        assert step.__wrapped__.__name__ == "_compile_for_args"

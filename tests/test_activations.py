"""Activations on NumPy arrays (blocked, threaded, logistic / erfc forms) against float64 torch."""
import numpy as np
import pytest

from ctformer.operators import activations

from .conftest import require

torch = require("torch")
F = torch.nn.functional

# every test runs with the compiled loops and with NumPy's
pytestmark = pytest.mark.usefixtures("loop_engine")

REFERENCE = {
    "gelu": lambda t: F.gelu(t),
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": lambda t: F.silu(t),
}
# max |phi(z) - reference| / max(|z|, 1) in units of the dtype's eps; float32 gelu uses an
# erfc approximation with relative error below 1.2e-7 (Numerical Recipes), about 1 eps.
TOLERANCE = {("gelu", np.float32): 2.5, ("gelu", np.float64): 4, ("gelu_tanh", np.float32): 2,
             ("gelu_tanh", np.float64): 4, ("silu", np.float32): 2, ("silu", np.float64): 4}


def _points():
    rng = np.random.default_rng(0)
    return np.concatenate([np.linspace(-40, 40, 200001), 4 * rng.standard_normal(100000),
                           [0.0, -0.0, 1e-300, -1e-300, 1e-30, -1e-30, 700.0, -700.0]])


@pytest.mark.parametrize("name", sorted(REFERENCE))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_activation_equals_float64_torch_to_rounding(name, dtype):
    z = _points().astype(dtype)
    out = activations.ACTIVATIONS[name](z)
    assert out.dtype == dtype and out.shape == z.shape
    z64 = z.astype(np.float64)
    ref = REFERENCE[name](torch.from_numpy(z64)).numpy()
    err = np.abs(out - ref) / np.maximum(np.abs(z64), 1.0)
    assert np.all(np.isfinite(out))
    assert err.max() <= TOLERANCE[name, dtype] * np.finfo(dtype).eps, err.max()
    assert out[z == 0].tolist() == [0.0] * int(np.sum(z == 0))


def _exact(name, z):
    """(phi(z), its condition number |z phi'(z) / phi(z)|) in 120-digit arithmetic (mpmath):
    enough digits for 1 + tanh(u) ~ 1e-62 at z = -12."""
    mpmath = require("mpmath")
    mpmath.mp.dps = 120

    def phi(x):
        if name == "gelu":
            return x * mpmath.ncdf(x)
        if name == "silu":
            return x / (1 + mpmath.exp(-x))
        u = mpmath.sqrt(2 / mpmath.pi) * (x + mpmath.mpf("0.044715") * x**3)
        return x / 2 * (1 + mpmath.tanh(u))

    x = mpmath.mpf(float(z))
    value = phi(x)
    return float(value), float(abs(x * mpmath.diff(phi, x) / value))


@pytest.mark.parametrize("name", sorted(REFERENCE))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_path_keeps_the_relative_accuracy_of_the_negative_tail(name, dtype):
    """gelu(-8) = -8 Phi(-8) ~ -5e-15: computed without the cancellation of the forms
    1 + erf and 1 + tanh (torch's), to a few eps times the condition number of phi at z
    (about z^2 in the tail: the rounding of z itself), against 120-digit arithmetic."""
    z = -np.linspace(0.5, 8 if dtype == np.float32 else 12, 40).astype(dtype)
    out = activations.ACTIVATIONS[name](z)
    exact, condition = np.array([_exact(name, x) for x in z]).T
    relative = np.abs(out - exact) / np.abs(exact)
    bound = 4 * np.finfo(dtype).eps * (1 + condition)
    assert np.all(relative <= bound), (relative / bound).max()
    assert condition.max() > 6   # the tail is really reached


@pytest.mark.parametrize("name", sorted(REFERENCE))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_blocked_threaded_result_does_not_depend_on_threads_or_layout(name, dtype, monkeypatch):
    rng = np.random.default_rng(1)
    z = (3 * rng.standard_normal((5, 601, 181))).astype(dtype)  # > 2^19 elements: threaded
    phi = activations.ACTIVATIONS[name]
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "1")
    one = phi(z)
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    three = phi(z)
    np.testing.assert_array_equal(one, three)
    transposed = phi(np.asfortranarray(z))                      # any memory layout
    np.testing.assert_array_equal(transposed, one)
    np.testing.assert_array_equal(phi(z[1, 7:9]), one[1, 7:9])  # small: one thread, same values


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_torch_tensors_use_torch(name):
    z = torch.linspace(-6, 6, 101, dtype=torch.float64, requires_grad=True)
    out = activations.ACTIVATIONS[name](z)
    assert isinstance(out, torch.Tensor) and out.requires_grad
    np.testing.assert_allclose(out.detach().numpy(), REFERENCE[name](z).detach().numpy(),
                               rtol=1e-15, atol=1e-15)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted({**REFERENCE, "relu": F.relu}))
def test_nan_stays_nan_as_in_torch(name, dtype):
    # relu used to map NaN to 0, which hid a NaN born inside a solve from its report
    z = np.array([np.nan, -2.0, -0.5, 0.0, 0.5, 2.0], dtype=dtype)
    out = activations.ACTIVATIONS[name](z)
    expected = {**REFERENCE, "relu": F.relu}[name](torch.from_numpy(z.astype(np.float64))).numpy()
    assert np.isnan(out[0]) and np.isnan(expected[0])
    np.testing.assert_allclose(out[1:], expected[1:], rtol=2e-7, atol=1e-7)


@pytest.mark.parametrize("name, threaded_from", [("gelu", 1 << 17), ("gelu_tanh", 1 << 19), ("silu", 1 << 19)])
def test_pool_threads_only_arrays_worth_a_wake_up(name, threaded_from, monkeypatch):
    """The pool's pass is asked for from 2^17 elements for the exact GELU and from 2^19 for the
    cheap activations (module notes), and the result is the same either way."""
    from ctformer._numerics import threads

    asked = []
    run_workers = threads.run_workers
    monkeypatch.setattr(threads, "run_workers", lambda w, tasks, count: asked.append(count) or run_workers(w, tasks, count))
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    phi = activations.ACTIVATIONS[name]
    below = np.linspace(-8, 8, threaded_from - 1, dtype=np.float32)
    at = np.linspace(-8, 8, threaded_from, dtype=np.float32)
    expected = [REFERENCE[name](torch.from_numpy(a.astype(np.float64))).numpy() for a in (below, at)]
    for a, ref in zip((below, at), expected):
        assert np.abs(phi(a) - ref).max() < 4 * np.finfo(np.float32).eps * 8
    assert asked == [1, 2]


@pytest.mark.parametrize("name", sorted(REFERENCE))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_overwrite_gives_the_new_arrays_bits_in_place(name, dtype, loop_engine, monkeypatch):
    """``overwrite`` writes phi(z) over z (blocks on two threads for a large z): the bits of
    ``phi(z)``, and z itself returned; with NumPy's passes, which read z after writing, it
    declines (None) and leaves z as it was. Float64 torch agrees to rounding."""
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "2")
    phi = activations.ACTIVATIONS[name]
    z = _points().astype(dtype)
    expected = phi(z)
    owned = z.copy()
    done = activations.overwrite(phi, owned)
    if loop_engine == "numpy":
        assert done is None and np.array_equal(owned, z)
        return
    assert done is owned
    np.testing.assert_array_equal(owned, expected)
    z64 = z.astype(np.float64)
    ref = REFERENCE[name](torch.from_numpy(z64)).numpy()
    assert np.max(np.abs(owned - ref) / np.maximum(np.abs(z64), 1.0)) <= TOLERANCE[name, dtype] * np.finfo(dtype).eps


def test_overwrite_declines_what_it_may_not_change(loop_engine):
    """None (and z untouched) for another activation, a float16, a strided or read-only array."""
    z = np.linspace(-3, 3, 64)
    assert activations.overwrite(activations.relu, z.copy()) is None
    assert activations.overwrite(activations.gelu, z.astype(np.float16)) is None
    strided = np.linspace(-3, 3, 128)
    assert activations.overwrite(activations.gelu, strided[::2]) is None
    frozen = z.copy()
    frozen.flags.writeable = False
    assert activations.overwrite(activations.gelu, frozen) is None
    np.testing.assert_array_equal(strided, np.linspace(-3, 3, 128))

"""Audit of what enters as a state or a setting: NumPy scalars and vectors given as states,
initial functions that return no numbers, dtypes without floating limits, and the atomic
writes' permissions and interruptions. References: the shapes and messages the docstrings
state, ``numpy.finfo`` / ``torch.finfo``, and what :func:`open` gives a new file."""
from __future__ import annotations

import os
import stat

import numpy as np
import pytest

from tests.conftest import require

from ctformer import atomic
from ctformer.backend import floating_info
from ctformer.discretizations import Midpoint
from ctformer.model import ContinuousTransformer
from ctformer.model_inputs import as_state_array
from ctformer.state import Grids

GRIDS = dict(tokens=Midpoint(4), features=Midpoint(8))
SHAPE = r"must have shape \(\.\.\., tokens, features\), got shape"


@pytest.mark.parametrize("value", [np.float64(3.0), np.float32(2.0), np.int64(3), np.array(3.0), 3.0])
def test_a_number_is_refused_as_a_state_by_name_with_the_expected_shape(value):
    """np.float64(3.0) came back unchanged (a NumPy scalar, no array); now every number,
    0-d array included, is refused where it enters, under the caller's name."""
    with pytest.raises(ValueError, match=rf"u0 {SHAPE} \(\): .* np\.full\(\(N, d\), value\)"):
        as_state_array(value, "u0")


def test_a_vector_is_refused_with_the_remedy_and_a_matrix_is_kept():
    with pytest.raises(ValueError, match=rf"x {SHAPE} \(5,\): .* x\[None, :\] is one token"):
        as_state_array(np.ones(5), "x")
    state = np.arange(6.0).reshape(2, 3)
    assert as_state_array(state, "x") is state
    widened = as_state_array([[1, 2, 3]], "x")
    assert widened.dtype == np.float64 and widened.shape == (1, 3)


@pytest.mark.parametrize("entry", ["solve", "evolve", "run"])
def test_every_entry_that_takes_a_state_refuses_a_numpy_scalar_by_name(entry):
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    calls = {"solve": lambda u: model.solve(u, steps_per_layer=1, **GRIDS),
             "evolve": lambda u: model.evolve(u, **GRIDS),
             "run": model.run}
    name = "x" if entry == "run" else "u0"
    with pytest.raises(ValueError, match=rf"{name} {SHAPE} \(\)"):
        calls[entry](np.float64(3.0))


def test_gradient_refuses_a_torch_scalar_by_name():
    torch = require("torch")
    from ctformer.adjoint import gradient

    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    with pytest.raises(ValueError, match=rf"u0 {SHAPE} \(\)"):
        gradient(model, torch.tensor(3.0, dtype=torch.float64), lambda u: (u ** 2).sum(), **GRIDS)


def test_an_initial_function_without_a_return_is_named_not_called_nan():
    """u0 returning None was reported as "u0(x, y) returned NaN or inf" (None became NaN), a
    string or a ragged list as NumPy's own conversion errors."""
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)

    def forgot_return(x, y):
        np.cos(x + y)

    with pytest.raises(TypeError, match=r"u0\(x, y\) must return real numbers.* got NoneType "
                                        r"\(a function without a return statement returns None\)"):
        model.solve(forgot_return, steps_per_layer=1, **GRIDS)
    for returned, kind in (("a", "str"), ([[1.0, 2.0], [3.0]], "list")):
        with pytest.raises(TypeError, match=rf"u0\(x, y\) must return real numbers.* got {kind}"):
            model.solve(lambda x, y, r=returned: r, steps_per_layer=1, **GRIDS)
    # real values (and booleans: an indicator) still sample, at the nodes of the grids
    grids = Grids(GRIDS["tokens"], GRIDS["features"])
    x, y = np.asarray(GRIDS["tokens"].quadrature_nodes), np.asarray(GRIDS["features"].quadrature_nodes)
    np.testing.assert_array_equal(grids.sample(lambda x, y: np.cos(x + 2 * y)),
                                  np.cos(x[:, None] + 2 * y[None, :]))
    np.testing.assert_array_equal(grids.sample(lambda x, y: x + 0 * y < 0.5),
                                  np.broadcast_to((x < 0.5)[:, None], (4, 8)).astype(float))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "longdouble", "complex64"])
def test_floating_info_equals_numpys_finfo(dtype):
    info = floating_info(np.dtype(dtype))
    reference = np.finfo(np.dtype(dtype))
    assert (info.bits, info.eps, info.max) == (reference.bits, reference.eps, reference.max)


def test_floating_info_of_torch_dtypes_and_a_clear_refusal_of_integers():
    """An integer dtype raised NumPy's "data type <class 'numpy.int64'> not inexact"; the
    string "bfloat16" a torch argument error."""
    torch = require("torch")
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64, "bfloat16"):
        wanted = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        assert floating_info(dtype).eps == torch.finfo(wanted).eps
        assert floating_info(dtype).bits == torch.finfo(wanted).bits
    for dtype in (np.int64, torch.int64, torch.bool, "text"):
        with pytest.raises(TypeError, match="floating_info needs a floating dtype .* got"):
            floating_info(dtype)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_an_atomic_write_keeps_a_private_file_private(tmp_path):
    """write_atomic made every file 0o644: a 0o600 file became readable by every user, and a
    new file ignored the umask. Now the old file's mode is kept, and a new file gets what
    open() gives it."""
    private, script = tmp_path / "private.txt", tmp_path / "run.sh"
    private.write_text("old")
    os.chmod(private, 0o600)
    script.write_text("old")
    os.chmod(script, 0o755)
    atomic.write_atomic(private, "new")
    atomic.write_atomic(script, "new")
    assert (_mode(private), _mode(script)) == (0o600, 0o755)
    assert private.read_text() == "new"
    before = os.umask(0o077)
    try:
        atomic.write_atomic(tmp_path / "fresh.txt", "x")
        with open(tmp_path / "opened.txt", "w") as handle:  # the reference: what open() gives
            handle.write("x")
    finally:
        os.umask(before)
    assert _mode(tmp_path / "fresh.txt") == _mode(tmp_path / "opened.txt") == 0o600


@pytest.mark.parametrize("where", ["write", "fsync", "chmod", "replace"])
def test_an_interrupted_atomic_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch, where):
    target = tmp_path / "result.json"
    target.write_text("old")
    os.chmod(target, 0o640)

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if where == "write":  # Ctrl-C after the first byte is written
        opened = os.fdopen

        class Interrupted:
            def __init__(self, fd, mode):
                self.handle = opened(fd, mode)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.handle.close()

            def write(self, data):
                self.handle.write(data[:1])
                raise KeyboardInterrupt

        monkeypatch.setattr(atomic.os, "fdopen", Interrupted)
    else:
        monkeypatch.setattr(atomic.os, where, interrupt)
    with pytest.raises(KeyboardInterrupt):
        atomic.write_atomic(target, "new")
    monkeypatch.undo()
    assert target.read_text() == "old" and _mode(target) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["result.json"]


def test_an_integer_beyond_float64_is_refused_by_name():
    """validation.real(10**400) raised float()'s OverflowError, which names no argument."""
    from ctformer import validation

    with pytest.raises(ValueError, match="dt must be a finite positive number, got 1000"):
        validation.real(10**400, "dt", positive=True)
    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    with pytest.raises(ValueError, match="rtol must be a finite non-negative number"):
        model.evolve(np.ones((4, 8)) + np.arange(8), rtol=10**400, **GRIDS)
    assert validation.real(2**60, "dt") == 2.0**60


@pytest.mark.parametrize("setting", ["64", 2.5, True])
def test_a_convolution_route_limit_that_is_no_integer_is_refused_by_name(setting):
    """dense_below="64" failed inside a comparison ('<=' not supported between int and str);
    2.5 and True were used as numbers."""
    from ctformer.kernels import Convolution

    kernel = Convolution(lambda z: np.cos(2 * np.pi * z))
    kernel.dense_below = setting
    with pytest.raises(TypeError, match=r"Convolution.dense_below must be None .* or an integer"):
        kernel.apply(np.ones((2, 32)), Midpoint(32), Midpoint(32))


def test_bfloat16_tensors_come_to_the_host_exactly():
    """to_host of a bfloat16 tensor raised torch's "Got unsupported ScalarType BFloat16", and
    with it Grids.min_feature_std of a bfloat16 state; every bfloat16 number is a float32."""
    torch = require("torch")
    from ctformer.backend import to_host

    u = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    host = to_host(u)
    assert host.dtype == np.float32
    np.testing.assert_array_equal(host, u.double().numpy())
    np.testing.assert_array_equal(to_host(u, np.float64), u.double().numpy())
    grids = Grids(GRIDS["tokens"], GRIDS["features"])
    assert grids.min_feature_std(u) == grids.min_feature_std(u.double())


def test_an_atomic_write_onto_a_directory_names_the_directory(tmp_path):
    """The rename failed with "Is a directory: '.../.out.x1y2.tmp' -> '.../out'", naming a
    temporary file the user never gave."""
    (tmp_path / "out").mkdir()
    with pytest.raises(IsADirectoryError, match=r"write_atomic: '.*out' is a directory; give the path of a file"):
        atomic.write_atomic(tmp_path / "out", "text")
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("rule", ["p1", "p2", "midpoint"])
@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_a_big_endian_state_gives_the_bits_of_the_native_one(rule, dtype):
    """A big-endian state (data read from a file) on P1 or P2 tokens raised SciPy's
    "scipy.sparse does not support dtype >f8" from inside the mass matrix's conversion."""
    import ctformer.discretizations as discretizations

    model = ContinuousTransformer.random_smooth(seed=0, layers=1)
    tokens = discretizations.get(rule, 9)
    base = np.random.default_rng(0).standard_normal((9, 8)) + np.linspace(0.0, 1.0, 8)
    native, swapped = base.astype("<" + dtype), base.astype(">" + dtype)
    expected = model.solve(native, tokens=tokens, features=Midpoint(8), steps_per_layer=1)
    got = model.solve(swapped, tokens=tokens, features=Midpoint(8), steps_per_layer=1)
    assert got.dtype == np.dtype(dtype) and got.dtype.isnative
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(tokens.to_quadrature(swapped, axis=-2), tokens.to_quadrature(native, axis=-2))

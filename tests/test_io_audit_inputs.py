"""What comes out is what went in: dtypes, namespaces, ranks and integer inputs at the entry
points of the discretizations, the grids and the gradients."""
import hashlib

import numpy as np
import pytest
import torch

import ctformer.discretizations as d
from ctformer import ContinuousTransformer, Grids
from ctformer.adjoint import gradient


def _digest(a):
    if isinstance(a, torch.Tensor):
        a = a.detach().cpu().numpy()
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


NODAL = [d.Midpoint(4), d.GaussLegendre(4), d.Fourier(4), d.Chebyshev(4),
         d.Product(d.Midpoint(2), d.Midpoint(2)), d.WithAtoms(d.Midpoint(3))]


# -- nodal to_quadrature / from_quadrature -----------------------------------------------------
@pytest.mark.parametrize("disc", NODAL, ids=repr)
@pytest.mark.parametrize("method", ["to_quadrature", "from_quadrature"])
def test_nodal_maps_convert_integers_to_float64(disc, method):
    # the identity used to hand an int64 array back as int64
    values = np.arange(2 * disc.n, dtype=np.int64).reshape(2, disc.n)
    out = getattr(disc, method)(values)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, np.arange(2.0 * disc.n).reshape(2, disc.n))
    out = getattr(disc, method)(values.tolist())   # lists too, products included
    assert isinstance(out, np.ndarray) and out.dtype == np.float64


@pytest.mark.parametrize("disc", NODAL, ids=repr)
@pytest.mark.parametrize("method", ["to_quadrature", "from_quadrature"])
def test_nodal_maps_refuse_scalars_and_wrong_lengths(disc, method):
    # a scalar and a row of the wrong length used to come back unchanged
    with pytest.raises(ValueError, match="at least one dimension, got a scalar"):
        getattr(disc, method)(np.float64(1.0))
    with pytest.raises(ValueError, match=rf"length {disc.n + 1} along axis 1, expected n = {disc.n}"):
        getattr(disc, method)(np.ones((2, disc.n + 1)))


@pytest.mark.parametrize("disc", NODAL, ids=repr)
def test_nodal_maps_keep_floating_arrays_as_they_are(disc):
    for values in (np.ones((3, disc.n), dtype=np.float32), torch.ones(3, disc.n, dtype=torch.float32)):
        assert disc.to_quadrature(values) is values
        assert disc.from_quadrature(values) is values


# -- Grids.evaluate ----------------------------------------------------------------------------
def test_grids_evaluate_of_integers_is_the_linear_interpolant():
    # u_ij = i + 2 j on Midpoint(5) x Midpoint(4): the function 5x - 1/2 + 2 (4y - 1/2),
    # which piecewise-linear interpolation reproduces exactly
    grids = Grids(d.Midpoint(5), d.Midpoint(4))
    u = np.add.outer(np.arange(5), 2 * np.arange(4))
    x, y = np.array([0.0, 0.33, 1.0]), np.array([0.2, 0.9])
    out = grids.evaluate(u, tokens=x, features=y)
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, (5 * x - 0.5)[:, None] + 2 * (4 * y - 0.5)[None, :], rtol=0, atol=1e-13)
    # without points (the identity on nodal grids) it used to return the int64 array itself
    same = grids.evaluate(u)
    assert same.dtype == np.float64
    np.testing.assert_array_equal(same, u.astype(np.float64))


@pytest.mark.parametrize("bad, shape", [(np.float64(1.0), r"\(\)"), (np.ones(4), r"\(4,\)"),
                                        (np.ones((5, 3)), r"\(5, 3\)")])
@pytest.mark.parametrize("points", [{}, {"features": [0.5]}])
def test_grids_evaluate_refuses_wrong_ranks_by_name(bad, shape, points):
    # on nodal grids a scalar, one row of features, or a state of another width came back as
    # it was (or was interpolated as if it were a state); the messages named "values"/"axis -2"
    grids = Grids(d.Midpoint(5), d.Midpoint(4))
    with pytest.raises(ValueError, match=rf"u has shape {shape}; its last two axes must be "
                                         r"\(tokens.n, features.n\) = \(5, 4\)"):
        grids.evaluate(bad, **points)


def test_grids_evaluate_refuses_nan_and_booleans_by_name():
    grids = Grids(d.Midpoint(2), d.Midpoint(3))
    u = np.ones((2, 3))
    u[1, 2] = np.nan
    with pytest.raises(ValueError, match="u contains NaN or inf"):
        grids.evaluate(u)
    with pytest.raises(TypeError, match="u must be a real floating array, got dtype torch.bool"):
        grids.evaluate(torch.ones(2, 3, dtype=torch.bool))


_CASES = {
    "float32": lambda u: u.astype(np.float32),
    "read-only": lambda u: _read_only(u.copy()),
    "strided": lambda u: np.repeat(u, 2, axis=-1)[..., ::2],
    "torch32": lambda u: torch.tensor(u, dtype=torch.float32),
    "torch64": lambda u: torch.tensor(u).transpose(-1, -2).contiguous().transpose(-1, -2),
}


def _read_only(a):
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("kind", list(_CASES))
@pytest.mark.parametrize("tokens, features", [(d.Midpoint(5), d.GaussLegendre(4)), (d.P1(5), d.P2(5)),
                                              (d.Fourier(4), d.Chebyshev(5))], ids=repr)
def test_grids_evaluate_keeps_namespace_dtype_and_input(kind, tokens, features):
    grids = Grids(tokens, features)
    u64 = np.random.default_rng(0).standard_normal((2,) + grids.stored_shape)
    points = {"tokens": [0.1, 0.6], "features": [0.3, 0.95]}
    reference = grids.evaluate(u64, **points)
    u = _CASES[kind](u64)
    before = _digest(u)
    out = grids.evaluate(u, **points)
    assert isinstance(out, torch.Tensor) == kind.startswith("torch")
    assert str(out.dtype).endswith("float32" if "32" in kind else "float64")
    values = out.numpy() if isinstance(out, torch.Tensor) else out
    np.testing.assert_allclose(values, reference, rtol=0, atol=(2e-6 if "32" in kind else 1e-13))
    assert _digest(u) == before


# -- adjoint.gradient --------------------------------------------------------------------------
def _model_and_grids():
    return ContinuousTransformer.random_smooth(seed=0, layers=1), dict(tokens=d.Midpoint(3),
                                                                       features=d.Midpoint(8))


def _loss(u):
    return (u ** 2).sum()


@pytest.mark.parametrize("route", ["adjoint", "autograd"])
def test_gradient_of_integer_tensor_is_that_of_its_float64_values(route):
    # a torch int64 u0 used to cast every parameter to int64 and then blame one of them
    model, grids = _model_and_grids()
    u0 = torch.tensor([[1, -2, 0, 3, 1, 0, -1, 2]] * 3, dtype=torch.int64)
    before = _digest(u0)
    got = gradient(model, u0, _loss, route=route, **grids)
    reference = gradient(model, u0.to(torch.float64), _loss, route=route, **grids)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    torch.testing.assert_close(got, reference, rtol=0, atol=0)
    assert _digest(u0) == before


@pytest.mark.parametrize("route", ["adjoint", "autograd"])
def test_gradient_refuses_booleans_complex_and_scalars_as_u0(route):
    model, grids = _model_and_grids()
    with pytest.raises(TypeError, match="u0 must be a real floating array, got dtype torch.bool"):
        gradient(model, torch.ones(3, 8, dtype=torch.bool), _loss, route=route, **grids)
    with pytest.raises(TypeError, match="u0 must be a real array, got complex dtype torch.complex128"):
        gradient(model, torch.ones(3, 8, dtype=torch.complex128), _loss, route=route, **grids)
    # a NumPy scalar used to be called "neither a torch tensor nor a NumPy array"
    with pytest.raises(ValueError, match=r"u0 (has shape \(\)|must have shape \(\.\.\., tokens, "
                                         r"features\), got shape \(\))"):
        gradient(model, np.float64(1.0), _loss, route=route, **grids)


@pytest.mark.parametrize("kind", ["float32", "read-only", "strided", "torch32"])
def test_gradient_keeps_dtype_namespace_and_input(kind):
    model, grids = _model_and_grids()
    u64 = np.random.default_rng(1).standard_normal((3, 8))
    reference = gradient(model, u64, _loss, **grids)
    u0 = _CASES[kind](u64)
    before = _digest(u0)
    got = gradient(model, u0, _loss, **grids)
    assert isinstance(got, torch.Tensor) == kind.startswith("torch")
    assert str(got.dtype).endswith("float32" if "32" in kind else "float64")
    values = got.numpy() if isinstance(got, torch.Tensor) else got
    np.testing.assert_allclose(values, reference, rtol=0, atol=(2e-6 if "32" in kind else 1e-13) * np.abs(reference).max())
    assert _digest(u0) == before

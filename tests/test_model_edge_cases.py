"""Inputs at the edges of ``ContinuousTransformer.run`` and ``solve``: subclasses of the NumPy
array (``np.matrix``, masked arrays) are read as their plain values and give the float64 torch
network's output, masked entries and empty axes are refused naming the argument."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.model import ContinuousTransformer
from tests.conftest import require

D = 8


def _network(torch, norm_first):
    """A float64 torch encoder of two layers and its conversion."""
    from ctformer.bridges import from_torch

    torch.manual_seed(3)
    layer = torch.nn.TransformerEncoderLayer(D, 2, 16, dropout=0.0, batch_first=True,
                                             norm_first=norm_first)
    net = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).double().eval()
    return net, from_torch(net)


def _expected(torch, net, x):
    with torch.no_grad():
        return net(torch.tensor(np.asarray(x))[None] if np.ndim(x) == 2 else
                   torch.tensor(np.asarray(x))).numpy().reshape(np.shape(x))


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("norm_first", [True, False])
def test_matrix_input_is_its_plain_array(norm_first):
    """np.matrix (whose ``*`` is a matrix product) failed inside the normalization; now it is
    read as its values: the torch network's output to 1e-12, as a plain ndarray."""
    torch = require("torch")
    net, model = _network(torch, norm_first)
    x = np.random.default_rng(0).standard_normal((5, D))
    expected = _expected(torch, net, x)
    got = model.run(np.asmatrix(x))
    assert type(got) is np.ndarray and got.shape == (5, D)
    assert np.abs(got - expected).max() < 1e-12 * np.abs(expected).max()


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
def test_masked_array_input(dtype, tol):
    """A masked array without masked entries is its values (it failed with a broadcast error);
    one with masked entries is refused: its hidden values would be used silently."""
    torch = require("torch")
    net, model = _network(torch, True)
    x = np.random.default_rng(1).standard_normal((3, 5, D))
    expected = _expected(torch, net, x)
    got = model.run(np.ma.array(x.astype(dtype)))
    assert type(got) is np.ndarray and got.dtype == dtype
    assert np.abs(got - expected).max() < tol * np.abs(expected).max()
    hidden = np.ma.array(x, mask=x > 2.0)
    with pytest.raises(ValueError, match=r"x is a masked array with masked entries.*x\.filled"):
        model.run(hidden)
    smooth = ContinuousTransformer.random_smooth(seed=0, layers=1)
    with pytest.raises(ValueError, match="u0 is a masked array with masked entries"):
        smooth.solve(hidden, tokens=Midpoint(5), features=GaussLegendre(D))


def test_solve_of_a_masked_array_is_the_solve_of_its_values():
    model = ContinuousTransformer.random_smooth(seed=2, layers=1)
    x = np.random.default_rng(2).standard_normal((2, 4, 6))
    kw = dict(tokens=Midpoint(4), features=GaussLegendre(6), scheme="strang", steps_per_layer=2)
    plain = model.solve(x, **kw)
    assert np.abs(plain).max() > 0.1
    np.testing.assert_array_equal(model.solve(np.ma.array(x), **kw), plain)


def test_empty_axes_name_the_argument():
    """No tokens or no features: the message names x (run) or u0 (solve), not a Midpoint(0)."""
    torch = require("torch")
    _, model = _network(torch, True)
    for shape in ((2, 0, D), (0, D)):
        with pytest.raises(ValueError, match=r"x must have shape \(N, d\) or \(B, N, d\) with N >= 1"):
            model.run(np.zeros(shape))
    smooth = ContinuousTransformer.random_smooth(seed=0, layers=1)
    with pytest.raises(ValueError, match=r"x must have shape .* got shape \(2, 4, 0\)"):
        smooth.run(np.zeros((2, 4, 0)))
    for shape in ((2, 0, 6), (3, 0)):
        with pytest.raises(ValueError, match=rf"u0 has shape \({shape[0]}, 0(, 6)?\): a state needs"):
            smooth.solve(np.zeros(shape), tokens="midpoint", features="gauss-legendre")
    # a batch of no sequences is still an empty result, not an error
    assert model.run(np.zeros((0, 3, D))).shape == (0, 3, D)


def test_padding_masks_of_complex_numbers_or_strings_are_refused():
    """1 + 0j was read as 1 and a string reported as "got shape ()"; a 0/1 integer mask still
    gives the bits of the boolean one."""
    import ctformer

    model = ctformer.ContinuousTransformer.random_smooth(seed=0, layers=1)
    x = np.random.default_rng(0).standard_normal((2, 5, 16))
    keep = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(model.run(x, padding_mask=keep), model.run(x, padding_mask=keep == 1))
    for bad in (keep + 0j, np.full((2, 5), "1"), "11100"):
        with pytest.raises(TypeError, match="padding_mask must be an array of booleans or 0/1"):
            model.run(x, padding_mask=bad)

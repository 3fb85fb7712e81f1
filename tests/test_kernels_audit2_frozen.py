"""Kernels are frozen values: equal by type and numbers, hashed alike, never changed in place.

Before: kernels compared by identity (a pickled kernel was unequal to its original although
its matrix was bit-identical) and were mutable (``SmoothRandom(3).seed = 5`` was accepted,
kept the coefficients of seed 3, and the repr then said seed 5).
"""
import copy
import pickle

import numpy as np
import pytest

from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.kernels import Convolution, PiecewiseConstant, Smooth, SmoothRandom
from .conftest import require


def bump(s, t):
    """A module-level kernel function: pickles by reference, so a copy holds the same one."""
    return np.exp(-((s - t) ** 2))


def wave(z):
    return np.cos(2 * np.pi * z)


def _kernels():
    rng = np.random.default_rng(0)
    return {"smooth random": SmoothRandom(3), "piecewise": PiecewiseConstant(rng.standard_normal((3, 4))),
            "smooth": Smooth(bump), "convolution": Convolution(wave)}


@pytest.mark.parametrize("name,attribute", [("smooth random", "seed"), ("piecewise", "weight"),
                                            ("smooth", "function"), ("convolution", "profile")])
def test_setting_or_deleting_an_attribute_is_refused_by_name(name, attribute):
    kernel = _kernels()[name]
    before = repr(kernel)
    with pytest.raises(AttributeError, match=rf"is immutable .*cannot set or delete '{attribute}'; "
                                             r"build a new kernel instead.*with_parameters"):
        setattr(kernel, attribute, 5)
    with pytest.raises(AttributeError, match=rf"cannot set or delete '{attribute}'"):
        delattr(kernel, attribute)
    assert repr(kernel) == before


def test_seed_of_a_smooth_random_kernel_cannot_go_out_of_step_with_its_coefficients():
    kernel = SmoothRandom(3)
    with pytest.raises(AttributeError, match="cannot set or delete 'seed'"):
        kernel.seed = 5
    # the coefficients are still those of seed 3: the kernel equals a fresh SmoothRandom(3)
    assert kernel.seed == 3 and kernel == SmoothRandom(3) and kernel != SmoothRandom(5)


@pytest.mark.parametrize("name", ["smooth random", "piecewise", "smooth", "convolution"])
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_copied_kernel_is_equal_hashes_alike_and_has_the_same_matrix_bits(name, how):
    kernel = _kernels()[name]
    out, inp = GaussLegendre(6), Midpoint(8)
    expected = np.array(kernel.matrix(out, inp))  # built before the copy exists
    copied = pickle.loads(pickle.dumps(kernel)) if how == "pickle" else copy.deepcopy(kernel)
    assert copied is not kernel and copied == kernel and hash(copied) == hash(kernel)
    assert expected.tobytes() == np.asarray(copied.matrix(out, inp)).tobytes()
    # a copy is frozen again
    with pytest.raises(AttributeError, match="is immutable"):
        copied.extra = 1


def test_kernels_that_compute_differently_are_unequal():
    assert SmoothRandom(3) != SmoothRandom(4)
    assert SmoothRandom(3) != SmoothRandom(3, scale=-1.0)
    assert SmoothRandom(3) != SmoothRandom(3, modes=5)
    assert Smooth(bump) != Smooth(lambda s, t: np.exp(-((s - t) ** 2)))
    assert Convolution(wave) != Smooth(wave)
    assert Convolution(np.cos) != Convolution(np.sin)

    class Counting(Smooth):   # another type with the same function is another kernel
        pass

    assert Counting(bump) != Smooth(bump)


def test_arrays_equal_in_the_sampled_entries_but_not_in_one_other_byte_are_unequal():
    """The hash reads 64 entries of a 1024 x 1024 weight; the comparison reads every byte."""
    a = np.random.default_rng(1).standard_normal((1024, 1024))
    b = a.copy()
    b[0, 1] = np.nextafter(b[0, 1], np.inf)   # entry 1: not one of the sampled (every 16384th)
    first, second = PiecewiseConstant(a), PiecewiseConstant(b)
    assert hash(first) == hash(second) and first != second
    grid_out, grid_in = Midpoint(1024), Midpoint(1024)
    # the cache keyed on kernels gives each its own matrix (the discrete limit: the weight itself)
    assert first.matrix(grid_out, grid_in)[0, 1] == a[0, 1]
    assert second.matrix(grid_out, grid_in)[0, 1] == b[0, 1] != a[0, 1]
    # a transposed (Fortran-ordered) view of the same numbers is the same kernel
    assert PiecewiseConstant(np.asfortranarray(a), copy=False) == first


def test_signed_zeros_are_different_numbers():
    positive, negative = PiecewiseConstant(np.zeros((2, 2))), PiecewiseConstant(-np.zeros((2, 2)))
    assert positive != negative
    grid = Midpoint(2)
    # their matrices differ in the sign bits: 1 / A is +inf for one and -inf for the other
    with np.errstate(divide="ignore"):
        assert np.all(1.0 / positive.matrix(grid, grid) == np.inf)
        assert np.all(1.0 / negative.matrix(grid, grid) == -np.inf)


def test_a_dense_route_setting_stays_settable_and_is_not_part_of_the_value():
    kernel = Convolution(wave)
    kernel.dense_below = 0
    assert kernel.dense_below == 0 and kernel == Convolution(wave)
    grid = Midpoint(32)
    u = np.random.default_rng(2).standard_normal((3, 32))
    dense = Convolution(wave)
    dense.dense_below = 64
    np.testing.assert_allclose(kernel.apply(u, grid, grid), dense.apply(u, grid, grid), rtol=0, atol=1e-14)
    np.testing.assert_allclose(dense.apply(u, grid, grid), u @ dense.matrix(grid, grid).T, rtol=0, atol=0)


def test_a_kernel_holding_tensors_is_equal_only_to_itself():
    torch = require("torch")
    a = np.random.default_rng(3).standard_normal((3, 4))
    host = PiecewiseConstant(a)
    held = copy.deepcopy(host)
    held._replace("weight", torch.tensor(a))
    assert held == held and held != host and held != copy.deepcopy(held)
    with pytest.raises(AttributeError, match="has no attribute 'wieght' to replace"):
        copy.deepcopy(host)._replace("wieght", a)


def test_with_parameters_of_a_random_model_gives_equal_kernels_and_the_same_bits():
    model = ContinuousTransformer.random_smooth(seed=5, layers=1)
    same = model.with_parameters(model.parameters())
    assert same.blocks[0].attention.W_Q[1] == model.blocks[0].attention.W_Q[1]
    x = np.random.default_rng(4).standard_normal((5, 8))
    grids = dict(tokens=GaussLegendre(5), features=GaussLegendre(8))
    reference = model.solve(x, **grids)
    assert same.solve(x, **grids).tobytes() == reference.tobytes()
    # a replaced number makes an unequal kernel; the original model is untouched
    name = "blocks.0.attention.W_Q.1.coefficients"
    changed = np.array(model.parameters()[name])
    changed[0, 0] = np.nextafter(changed[0, 0], np.inf)
    moved = model.with_parameters({**model.parameters(), name: changed})
    assert moved.blocks[0].attention.W_Q[1] != model.blocks[0].attention.W_Q[1]
    assert model.solve(x, **grids).tobytes() == reference.tobytes()
    assert pickle.loads(pickle.dumps(model)).blocks[0].attention.W_Q[1] == model.blocks[0].attention.W_Q[1]


@pytest.mark.torch
def test_with_parameters_of_a_converted_network_is_the_network_built_from_them():
    """The parameters of network b handed to the conversion of network a: the same bits as
    converting b, and b's float64 torch output to rounding."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    def encoder(seed):
        torch.manual_seed(seed)
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True, norm_first=True)
        return torch.nn.TransformerEncoder(layer, 1, norm=torch.nn.LayerNorm(8),
                                           enable_nested_tensor=False).double().eval()

    enc_a, enc_b = encoder(0), encoder(1)
    a, b = from_torch(enc_a), from_torch(enc_b)
    x = np.random.default_rng(5).standard_normal((5, 8))
    before = a.run(x)
    moved = a.with_parameters(b.parameters())
    assert moved.run(x).tobytes() == b.run(x).tobytes()
    with torch.no_grad():
        expected = enc_b(torch.tensor(x)[None]).numpy()[0]
    np.testing.assert_allclose(moved.run(x), expected, rtol=1e-12, atol=1e-12)
    assert a.run(x).tobytes() == before.tobytes()

"""Identity of a computation and models as data: exact keys, pickling, parameters()."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.studies import convergence, model_identity, smooth_initial_state

from .conftest import require

STUDY = dict(refine="tokens", levels=[4, 8, 16], tokens="midpoint", features="midpoint:8",
             progress=False)


def _torch_encoder(seed=0):
    torch = require("torch")
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True,
                                             norm_first=True)
    return torch.nn.TransformerEncoder(layer, 1, norm=torch.nn.LayerNorm(8),
                                       enable_nested_tensor=False).double().eval()


@pytest.mark.torch
@pytest.mark.parametrize("change", ["final LayerNorm weight", "linear1 column"])
def test_a_changed_parameter_is_a_new_computation(tmp_path, change):
    """Issue reproducer: one weight of the final LayerNorm (or one column of linear1) changed
    between two studies into the same store must not reuse the old cases."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    enc = _torch_encoder()
    first = convergence(from_torch(enc), store=tmp_path, **STUDY)
    with torch.no_grad():
        if change == "final LayerNorm weight":
            enc.norm.weight[5] += 0.5
        else:
            enc.layers[0].linear1.weight[:, 1] += 0.5
    changed = from_torch(enc)
    stored = convergence(changed, store=tmp_path, **STUDY)
    fresh = convergence(changed, **STUDY)
    assert [r.error for r in stored.table] == [r.error for r in fresh.table]
    assert stored.table[0].error != first.table[0].error
    assert len(list(tmp_path.glob("*.json"))) == 6   # three cases per model, none shared


def test_initial_data_identified_exactly(tmp_path):
    """A perturbation that vanishes on every coarse probe grid still makes a new case."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)

    def perturbed(x, y):
        return smooth_initial_state(x, y) + 0.05 * np.sin(6 * np.pi * x) * np.sin(4 * np.pi * y)

    convergence(model, store=tmp_path, u0=smooth_initial_state, **STUDY)
    stored = convergence(model, store=tmp_path, u0=perturbed, **STUDY)
    fresh = convergence(model, u0=perturbed, **STUDY)
    assert [r.error for r in stored.table] == [r.error for r in fresh.table]
    again = convergence(model, store=tmp_path, u0=smooth_initial_state, **STUDY)
    assert again.table[0].error != fresh.table[0].error


def test_nan_reference_is_refused():
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    with pytest.raises(ValueError, match="reference"):
        convergence(model, reference=lambda x, y: np.nan * x * y, **STUDY)


def test_unpicklable_model_with_a_store_is_refused(tmp_path):
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    model.blocks[0].feedforward.phi = lambda z: z   # a lambda: no identity
    with pytest.raises(TypeError, match="lambda"):
        convergence(model, store=tmp_path, **STUDY)


def test_model_pickles_before_and_after_a_solve_bit_identically():
    model = ContinuousTransformer.random_smooth(seed=4, layers=2)
    grids = dict(tokens=GaussLegendre(6), features=GaussLegendre(5))
    before = pickle.loads(pickle.dumps(model))
    u = model.solve(smooth_initial_state, **grids, scheme="strang", steps_per_layer=3)
    after = pickle.loads(pickle.dumps(model))
    for copy in (before, after):
        np.testing.assert_array_equal(
            copy.solve(smooth_initial_state, **grids, scheme="strang", steps_per_layer=3), u)
    assert model_identity(before) == model_identity(after) == model_identity(model)
    names = model.parameters()
    assert set(names) == set(after.parameters())
    assert all(np.array_equal(names[k], after.parameters()[k]) for k in names)


@pytest.mark.torch
def test_parameters_of_a_converted_network_count_every_torch_number():
    from ctformer.bridges import from_torch

    enc = _torch_encoder(seed=3)
    model = from_torch(enc)
    ours = sum(np.asarray(v).size for v in model.parameters().values())
    assert ours == sum(p.numel() for p in enc.parameters())
    x = np.random.default_rng(0).standard_normal((5, 8))
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(model)).run(x), model.run(x))


def test_identity_changes_with_any_parameter_byte():
    model = ContinuousTransformer.random_smooth(seed=5, layers=1)
    key = model_identity(model)
    name = "blocks.0.attention.W_Q.1.coefficients"  # kernels are frozen: other numbers, another model
    changed = np.array(model.parameters()[name])
    changed[0, 0] = np.nextafter(changed[0, 0], np.inf)
    assert model_identity(model.with_parameters({**model.parameters(), name: changed})) != key
    assert model_identity(model) == key
    assert Midpoint(4) == Midpoint(4)   # discretizations stay value objects

"""``parameters()`` hands out read-only views and ``with_parameters`` is the one way to change
values (issue 19, items 4, 10 and 13): an in-place edit raises instead of splitting the model
between its cached discretizations, its pickled copies and its study identity; invalid
replacements are refused naming the parameter; a valid replacement round-trips exactly."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ctformer import ContinuousTransformer
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.studies import convergence, model_identity

from .conftest import require
from .test_study_identity import _torch_encoder

# Derandomized (see tests/test_robustness_properties.py): every run tries the same examples.
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

GRIDS = dict(tokens=GaussLegendre(5), features=GaussLegendre(6))
STUDY = dict(refine="tokens", levels=[4, 8, 16], tokens="midpoint", features="midpoint:8",
             progress=False)
MODEL = ContinuousTransformer.random_smooth(seed=2, layers=1)
NAMES = sorted(MODEL.parameters())


def _start(x, y):
    return np.cos(3 * y + np.sin(np.pi * x)) + 0.2 * x * y


def _solve(model):
    return model.solve(_start, **GRIDS)


def test_editing_parameters_in_place_raises_and_changes_nothing():
    """Issue reproducer: ``for v in m.parameters().values(): v *= 2``."""
    model = ContinuousTransformer.random_smooth(seed=2, layers=1)
    before = _solve(model)   # discretizations cached with the old values
    for name, v in model.parameters().items():
        with pytest.raises(ValueError, match="read-only"):
            v *= 2
        assert not v.flags.writeable, name
    np.testing.assert_array_equal(_solve(model), before)
    np.testing.assert_array_equal(_solve(pickle.loads(pickle.dumps(model))), before)


@pytest.mark.torch
def test_parameters_of_a_converted_network_are_read_only_views_not_copies():
    from ctformer.bridges import from_torch

    model = from_torch(_torch_encoder())
    weight = model.blocks[0].feedforward.W_1.weight
    exposed = model.parameters()["blocks.0.feedforward.W_1.weight"]
    assert np.shares_memory(exposed, weight)           # no copy of large weights
    with pytest.raises(ValueError, match="read-only"):
        exposed[0, 0] = 1.0


@pytest.mark.torch
def test_with_parameters_is_the_way_to_change_values():
    """Reference: torch's float64 encoder with the same scaled weights."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    encoder = _torch_encoder(seed=1)
    model = from_torch(encoder)
    scaled = model.with_parameters({k: 1.25 * v for k, v in model.parameters().items()})
    with torch.no_grad():
        for p in encoder.parameters():
            p.mul_(1.25)
    x = np.random.default_rng(0).standard_normal((5, 8))
    with torch.no_grad():
        expected = encoder(torch.tensor(x)[None]).numpy()[0]
    assert np.max(np.abs(scaled.run(x) - expected)) < 1e-12
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(scaled)).run(x), scaled.run(x))
    assert np.max(np.abs(model.run(x) - expected)) > 1e-3   # the original is unchanged


def test_with_parameters_copies_the_callers_arrays():
    name = "blocks.0.feedforward.W_1.coefficients"
    values = {k: np.array(v) for k, v in MODEL.parameters().items()}
    changed = MODEL.with_parameters(values)
    before = _solve(changed)
    values[name] *= 3.0   # the caller's array stays the caller's
    np.testing.assert_array_equal(_solve(changed), before)
    np.testing.assert_array_equal(_solve(pickle.loads(pickle.dumps(changed))), before)
    assert not changed.parameters()[name].flags.writeable


def test_store_files_changed_values_under_a_new_identity(tmp_path):
    """With an in-place edit refused, the only route to new values is a new model: its study
    does not reuse the old model's cases, and equals the same study without a store."""
    model = ContinuousTransformer.random_smooth(seed=2, layers=1)
    first = convergence(model, store=tmp_path, **STUDY)
    doubled = model.with_parameters({k: 2 * v for k, v in model.parameters().items()})
    assert model_identity(doubled) != model_identity(model)
    stored = convergence(doubled, store=tmp_path, **STUDY)
    assert [r.error for r in stored.table] == [r.error for r in convergence(doubled, **STUDY).table]
    assert stored.table[0].error != first.table[0].error
    assert len(list(tmp_path.glob("*.json"))) == 2 * len(STUDY["levels"])


@pytest.mark.parametrize("value, error, message", [
    ("abc", TypeError, r"params\['{name}'\] must be a real array of shape \(4, 4\).*got a str"),
    (np.ones((4, 4)) * 1j, TypeError, r"params\['{name}'\].*complex numbers"),
    (np.ones((4, 4), dtype=bool), TypeError, r"params\['{name}'\].*got a ndarray"),
    (object(), TypeError, r"params\['{name}'\] must be a real array.*got a object"),
    (np.full((4, 4), np.nan), ValueError, r"params\['{name}'\] holds NaN or inf"),
    (np.ones((3, 4)), ValueError, r"params\['{name}'\] has shape \(3, 4\), the parameter has shape \(4, 4\)"),
])
def test_invalid_replacements_name_the_parameter(value, error, message):
    """Issue reproducer: a string gave an AttributeError while building the message, a complex
    array only NumPy's ComplexWarning."""
    name = "blocks.0.attention.W_Q.0.coefficients"
    params = dict(MODEL.parameters(), **{name: value})
    with pytest.raises(error, match=message.format(name=name)):
        MODEL.with_parameters(params)


@pytest.mark.torch
def test_tensor_dtypes_are_checked_naming_the_parameter():
    torch = require("torch")
    params = {k: torch.tensor(v) for k, v in MODEL.parameters().items()}
    odd = NAMES[3]
    mixed = dict(params, **{odd: params[odd].to(torch.float32)})
    with pytest.raises(TypeError, match=rf"params\['{odd}'\] is a Tensor of dtype torch.float32.*"
                                        "torch.float64"):
        MODEL.with_parameters(mixed)
    with pytest.raises(TypeError, match=rf"params\['{odd}'\] is a tensor of dtype torch.complex128"):
        MODEL.with_parameters(dict(params, **{odd: params[odd].to(torch.complex128)}))
    model = MODEL.with_parameters(params)
    u0 = torch.tensor(MODEL.grids(**GRIDS).sample(_start))
    with pytest.raises(TypeError, match=r"u0 has dtype torch.float32, the tensor parameters "
                                        r"\(e.g. '.*'\) have dtype torch.float64"):
        model.solve(u0.to(torch.float32), **GRIDS)
    # the float64 solve is the NumPy one (the same numbers through torch)
    np.testing.assert_allclose(model.solve(u0, **GRIDS).numpy(), _solve(MODEL), rtol=0, atol=1e-13)


def test_round_trip_is_the_same_model_and_identity():
    """Issue reproducer: with_parameters(parameters()) turned scalars into 0-d arrays and got
    a new identity (every case of an identical study was recomputed)."""
    same = MODEL.with_parameters(MODEL.parameters())
    assert model_identity(same) == model_identity(MODEL)
    assert model_identity(same.with_parameters(same.parameters())) == model_identity(MODEL)
    np.testing.assert_array_equal(_solve(same), _solve(MODEL))


@st.composite
def replacement(draw):
    name = draw(st.sampled_from(NAMES))
    own = MODEL.parameters()[name]
    values = draw(st.lists(st.floats(-10.0, 10.0), min_size=own.size, max_size=own.size))
    return name, np.array(values).reshape(own.shape)


@SETTINGS
@given(replacement(), st.integers(0, 10**6))
def test_any_valid_replacement_round_trips(case, where):
    name, values = case
    model = MODEL.with_parameters(dict(MODEL.parameters(), **{name: values}))
    got = model.parameters()
    np.testing.assert_array_equal(got[name], values)
    assert all(np.array_equal(got[k], v) for k, v in MODEL.parameters().items() if k != name)
    again = model.with_parameters({k: np.array(v).tolist() if v.ndim else float(v)
                                   for k, v in got.items()})
    assert model_identity(again) == model_identity(model)   # equal values: equal identity
    bumped = values.copy().reshape(-1)
    index = where % bumped.size
    bumped[index] = np.nextafter(bumped[index], np.inf)
    other = model.with_parameters(dict(got, **{name: bumped.reshape(values.shape)}))
    assert model_identity(other) != model_identity(model)   # one ulp: another computation
    assert np.count_nonzero(other.parameters()[name] != got[name]) == 1


@SETTINGS
@given(st.sampled_from(NAMES),
       st.sampled_from(["nan", "inf", "shape", "complex", "str", "none", "bool"]))
def test_any_invalid_replacement_names_the_parameter(name, kind):
    own = MODEL.parameters()[name]
    value = {"nan": np.full(own.shape, np.nan), "inf": np.full(own.shape, -np.inf),
             "shape": np.zeros(own.shape + (2,)), "complex": own + 1j, "str": "abc",
             "none": None, "bool": np.zeros(own.shape, dtype=bool)}[kind]
    error = ValueError if kind in ("nan", "inf", "shape") else TypeError
    with pytest.raises(error, match=rf"params\['{name}'\]"):
        MODEL.with_parameters(dict(MODEL.parameters(), **{name: value}))

"""Audit of the study store's identity: a stored case is never reused for another computation.

Each test changes one thing between two studies into the same store and checks that the
second study recomputes: its errors equal those of a fresh study without a store (the
reference), and the store holds the cases of both.
"""
from __future__ import annotations

import importlib.util
import sys

import numpy as np
import pytest

import ctformer
from ctformer import ContinuousTransformer
from ctformer.discretizations import Midpoint
from ctformer.studies import convergence, model_identity, smooth_initial_state
from ctformer.studies.identity import array_identity, describe

from .conftest import require

TOKENS = dict(refine="tokens", levels=[4, 8, 16], tokens="midpoint", features="midpoint:8",
              progress=False)
TIME = dict(refine="time", levels=[1, 2, 4], tokens="midpoint:6", features="midpoint:6",
            progress=False)

_ACTIVATION = '''
from ctformer.operators.activations import gelu
SCALE = 1.0


def act(z):
    return gelu({factor} * SCALE * z)
'''


def _user_module(directory, factor):
    """A user's module ``user_activation`` (same name, same function name ``act``) whose
    source says ``gelu({factor} * z)``: the script a user edits between two runs."""
    directory.mkdir()
    path = directory / "user_activation.py"
    path.write_text(_ACTIVATION.format(factor=factor))
    spec = importlib.util.spec_from_file_location("user_activation", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["user_activation"] = module   # where pickle looks it up, as for a script's
    return module


def _errors(result):
    return [row.error for row in result.table]


def test_an_edited_user_function_is_a_new_computation(tmp_path, monkeypatch):
    """The user edits ``act`` in their script (gelu(z) -> gelu(2 z)) and reruns into the same
    store: the cases of gelu(z) were reused (same qualified name), now they are recomputed."""
    monkeypatch.delitem(sys.modules, "user_activation", raising=False)
    store = tmp_path / "store"
    first = _user_module(tmp_path / "first", 1.0)
    convergence(ContinuousTransformer.random_smooth(seed=1, layers=1, activation=first.act),
                store=store, **TOKENS)
    edited = _user_module(tmp_path / "edited", 2.0)
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, activation=edited.act)
    stored = convergence(model, store=store, **TOKENS)
    fresh = convergence(model, **TOKENS)
    assert _errors(stored) == _errors(fresh)
    assert len(list(store.glob("*.json"))) == 6


def test_a_module_level_value_read_by_a_user_function_is_part_of_its_identity(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "user_activation", raising=False)
    module = _user_module(tmp_path / "module", 1.0)
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, activation=module.act)
    before = model_identity(model)
    monkeypatch.setattr(module, "SCALE", 2.0)
    assert model_identity(model) != before
    monkeypatch.setattr(module, "SCALE", 1.0)
    assert model_identity(model) == before   # the same values: the same computation


class _Doubling:
    """A user class whose method's code is its computation."""

    def __call__(self, z):
        return 2.0 * z


def test_an_edited_user_method_is_part_of_the_identity(monkeypatch):
    before = describe(_Doubling())

    def tripling(self, z):
        return 3.0 * z

    tripling.__qualname__ = "_Doubling.__call__"   # the edited source, under the same name
    monkeypatch.setattr(_Doubling, "__call__", tripling)
    assert describe(_Doubling()) != before


def test_another_library_version_recomputes(tmp_path, monkeypatch):
    """Records of another release (one with a fix) are not reused: 3 cases became 6."""
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    convergence(model, store=tmp_path, **TOKENS)
    monkeypatch.setattr(ctformer, "__version__", ctformer.__version__ + ".post1")
    convergence(model, store=tmp_path, **TOKENS)
    assert len(list(tmp_path.glob("*.json"))) == 6


def test_another_librarys_function_is_its_home_and_release(tmp_path, monkeypatch):
    """A SciPy ufunc as the activation: identified as ``scipy.special.erf`` of SciPy's installed
    version (a ufunc names no module: it read as ``numpy.erf``, and a SciPy upgrade that changed
    it reused the old cases). Another SciPy release recomputes: 3 cases became 6."""
    scipy = require("scipy")
    from scipy.special import erf

    assert describe(erf) == {"function": "scipy.special.erf", "release": scipy.__version__}
    assert describe(np.tanh) == {"function": "numpy.tanh", "release": np.__version__}
    assert "release" not in describe(sorted) and "release" not in describe(smooth_initial_state)
    model = ContinuousTransformer.random_smooth(seed=1, layers=1, activation=erf)
    convergence(model, store=tmp_path, **TOKENS)
    monkeypatch.setattr(scipy, "__version__", scipy.__version__ + ".post1")
    stored = convergence(model, store=tmp_path, **TOKENS)
    assert _errors(stored) == _errors(convergence(model, **TOKENS))
    assert len(list(tmp_path.glob("*.json"))) == 6


@pytest.mark.torch
def test_a_torch_state_does_not_reuse_the_numpy_cases(tmp_path):
    """The same float64 values as a torch tensor compute in torch (other roundings: the errors
    differ in the last digits); the torch study returns the torch numbers, not the NumPy ones."""
    torch = require("torch")
    model = ContinuousTransformer.random_smooth(seed=1, layers=1)
    u0 = model.grids(Midpoint(6), Midpoint(6), None, None).sample(smooth_initial_state)
    convergence(model, u0=u0, store=tmp_path, **TIME)
    stored = convergence(model, u0=torch.as_tensor(u0), store=tmp_path, **TIME)
    fresh = convergence(model, u0=torch.as_tensor(u0), **TIME)
    assert _errors(stored) == _errors(fresh)
    assert len(list(tmp_path.glob("*.json"))) == 6


@pytest.mark.torch
def test_a_bfloat16_tensor_is_not_its_float32_copy():
    """to_host gives a bfloat16 tensor as float32 (exactly): the identity keeps its dtype."""
    torch = require("torch")
    values = torch.linspace(0.0, 1.0, 8, dtype=torch.bfloat16)
    assert array_identity(values) != array_identity(values.float())
    assert array_identity(values.double()) != array_identity(values.double().numpy())


def test_a_namedtuple_is_described_by_its_type():
    from collections import namedtuple

    Options = namedtuple("Options", "beta")
    assert describe(Options(1.0)) != describe((1.0,))
    assert describe(np.asarray(1.5)) == describe(1.5)   # unchanged: numbers are numbers

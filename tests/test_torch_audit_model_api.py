"""Audit of torch tensors through the model API (run, solve, evolve, with_parameters) against
the NumPy path: equal numbers to rounding, the input's dtype and device kept, gradients equal to
float64 central differences, torch masks like NumPy ones, the caller's tensors and torch thread
count untouched; tensors on torch's value-less ``meta`` device refused by name, a
``torch.nn.Parameter`` taken as the tensor it is, and a CPU state solved on the CPU whatever
torch's default device. A CuPy that imports without a GPU is never picked."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from tests.conftest import require

from ctformer import backend as backend_module
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.model import ContinuousTransformer

pytestmark = pytest.mark.torch

MASK = np.array([[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1]])


@pytest.fixture(scope="module")
def torch():
    return require("torch")


@pytest.fixture(scope="module")
def model():
    return ContinuousTransformer.random_smooth(seed=3, layers=2, heads=2, mask="causal",
                                               positions="rope", context_length=6)


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((2, 6, 8))


def _host(a):
    return a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)


def _rel(a, b):
    a, b = _host(a), _host(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def _variants(torch, x, dtype):
    """The same values as contiguous, transposed-view, strided-view, leaf, non-leaf and
    inference-mode tensors."""
    base = torch.tensor(x, dtype=dtype)
    leaf = base.clone().requires_grad_(True)
    with torch.inference_mode():
        frozen = torch.tensor(x, dtype=dtype)
    return {"contiguous": base, "transposed": base.transpose(1, 2).contiguous().transpose(1, 2),
            "strided": torch.stack([base, base], dim=-1)[..., 0], "leaf": leaf,
            "non-leaf": leaf * 1.0, "inference": frozen,
            "parameter": torch.nn.Parameter(base.clone())}


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-13), ("float32", 1e-6)])
def test_tensors_of_every_kind_give_the_numpy_numbers(torch, model, x, dtype, tol):
    reference = model.run(x.astype(dtype), padding_mask=MASK)
    threads = torch.get_num_threads()
    for name, tensor in _variants(torch, x, getattr(torch, dtype)).items():
        before = tensor.detach().clone()
        out = model.run(tensor, padding_mask=torch.tensor(MASK))
        assert isinstance(out, torch.Tensor) and out.dtype == tensor.dtype, name
        assert out.device == tensor.device and out.shape == tensor.shape, name
        assert _rel(out, reference) < tol, name
        assert torch.equal(tensor.detach(), before), name      # the caller's tensor is unchanged
        assert torch.get_num_threads() == threads, name


@pytest.mark.parametrize("kind", ["int64", "bool", "float32", "numpy-bool", "list"])
def test_torch_masks_are_taken_like_numpy_ones(torch, model, x, kind):
    mask = {"int64": torch.tensor(MASK), "bool": torch.tensor(MASK).bool(),
            "float32": torch.tensor(MASK, dtype=torch.float32), "numpy-bool": MASK.astype(bool),
            "list": MASK.tolist()}[kind]
    reference = model.solve(x, tokens="chebyshev", features="midpoint", padding_mask=MASK)
    got = model.solve(torch.tensor(x), tokens="chebyshev", features="midpoint", padding_mask=mask)
    assert _rel(got, reference) < 1e-13
    assert _rel(model.run(x, padding_mask=mask), model.run(x, padding_mask=MASK)) == 0.0


def test_numpy_inputs_are_not_modified(model, x):
    copy = x.copy()
    for dtype in ("float64", "float32"):
        model.run(x.astype(dtype) if dtype == "float32" else x, padding_mask=MASK)
        model.solve(x, tokens="gauss-legendre", features="midpoint", trajectory=True)
        model.evolve(x, tokens="p1", features="midpoint", rtol=1e-2)
    assert np.array_equal(x, copy)


def test_gradient_through_run_equals_central_differences(torch, model, x):
    weights = np.random.default_rng(1).standard_normal(x.shape)
    u = torch.tensor(x, requires_grad=True)
    (model.run(u, padding_mask=torch.tensor(MASK)) * torch.tensor(weights)).sum().backward()

    def loss(values):
        return float((model.run(values, padding_mask=MASK) * weights).sum())

    for index in [(0, 0, 0), (0, 3, 5), (1, 2, 7), (1, 5, 1)]:
        step = np.zeros_like(x)
        step[index] = 1e-6
        central = (loss(x + step) - loss(x - step)) / 2e-6
        assert abs(u.grad[index].item() - central) <= 1e-7 * max(1.0, abs(central))


def test_evolve_in_torch_takes_the_numpy_steps(torch, model, x):
    expected = model.evolve(x, tokens="chebyshev", features="midpoint", rtol=1e-4, atol=1e-7)
    got = model.evolve(torch.tensor(x), tokens="chebyshev", features="midpoint", rtol=1e-4, atol=1e-7)
    assert got.stats["accepted"] == expected.stats["accepted"]
    assert isinstance(got.final, torch.Tensor) and _rel(got.final, expected.final) < 1e-13


# -- meta tensors ----------------------------------------------------------------------------

def test_meta_tensors_are_refused_by_name(torch, model):
    """Before: torch's "Tensor.item() cannot be called on meta tensors" from deep inside."""
    meta = torch.empty(2, 6, 8, dtype=torch.float64, device="meta")
    with pytest.raises(TypeError, match=r"^x is a torch tensor on the 'meta' device.*values"):
        model.run(meta)
    for solve in (model.solve, model.evolve):
        with pytest.raises(TypeError, match=r"^u0 is a torch tensor on the 'meta' device"):
            solve(meta, tokens="midpoint", features="midpoint")
    with pytest.raises(TypeError, match=r"^padding_mask is a torch tensor on the 'meta' device"):
        model.run(torch.zeros(2, 6, 8, dtype=torch.float64),
                  padding_mask=torch.ones(2, 6, device="meta", dtype=torch.bool))
    for solve in (model.solve, model.evolve):  # the mask of a solve: its own check
        with pytest.raises(TypeError, match=r"^padding_mask is a torch tensor on the 'meta' device"):
            solve(torch.zeros(2, 6, 8, dtype=torch.float64), tokens="midpoint", features="midpoint",
                  padding_mask=torch.ones(2, 6, device="meta", dtype=torch.bool))


def test_meta_parameters_are_refused_by_name(torch, model):
    params = {k: torch.empty(np.shape(v), dtype=torch.float64, device="meta")
              for k, v in model.parameters().items()}
    with pytest.raises(TypeError, match=r"^params\['blocks\.0\..*'\] is a torch tensor on the 'meta'"):
        model.with_parameters(params)


# -- torch.nn.Parameter is a tensor ------------------------------------------------------------

def test_parameters_and_plain_tensors_mix(torch, model, x):
    """Before: a Parameter state with plain tensor parameters (and the reverse, and a mix of
    both among the parameters) was refused as "not in the parameters' namespace"."""
    reference = model.run(x)
    values = {k: torch.tensor(np.array(v)) for k, v in model.parameters().items()}
    plain = model.with_parameters(values)
    assert _rel(plain.run(torch.nn.Parameter(torch.tensor(x))), reference) < 1e-13
    wrapped = model.with_parameters({k: torch.nn.Parameter(v.clone()) for k, v in values.items()})
    assert _rel(wrapped.run(torch.tensor(x)), reference) < 1e-13
    name = "blocks.0.feedforward.W_2.coefficients"
    assert name in values
    mixed = dict(values, **{name: torch.nn.Parameter(values[name].clone())})
    out = model.with_parameters(mixed).run(torch.tensor(x))
    assert _rel(out, reference) < 1e-13
    weights = torch.tensor(np.random.default_rng(2).standard_normal(x.shape))
    (out * weights).sum().backward()
    grad = mixed[name].grad[0, 0].item()

    def loss(shift):
        moved = np.array(model.parameters()[name])
        moved[0, 0] += shift
        changed = model.with_parameters(dict(model.parameters(), **{name: moved}))
        return float((changed.run(x) * weights.numpy()).sum())

    central = (loss(1e-6) - loss(-1e-6)) / 2e-6
    assert abs(grad - central) <= 1e-7 * max(1.0, abs(central))


# -- torch's default device ----------------------------------------------------------------------

@pytest.mark.parametrize("default", ["cuda", "meta"])
def test_a_cpu_state_is_solved_on_the_cpu_under_another_default_device(torch, model, x, default):
    """Before: ``torch.set_default_device("cuda")`` made the solve's own constants CUDA tensors:
    "Torch not compiled with CUDA enabled" (AssertionError) on a machine without a GPU, a device
    mismatch on one with a GPU ("meta" stands in for the second case here)."""
    expected = {"run": model.run(x, padding_mask=MASK),
                "evolve": model.evolve(x, tokens="p1", features="midpoint", rtol=1e-3).final,
                "controlled": model.solve(x, tokens="midpoint", features="midpoint", rtol=1e-2)}
    u = torch.tensor(x, requires_grad=True)
    torch.set_default_device(default)
    try:
        got = {"run": model.run(u, padding_mask=torch.tensor(MASK, device="cpu")),
               "evolve": model.evolve(u, tokens="p1", features="midpoint", rtol=1e-3).final,
               "controlled": model.solve(u, tokens="midpoint", features="midpoint", rtol=1e-2)}
    finally:
        torch.set_default_device(None)
    for name, value in got.items():
        assert value.device.type == "cpu" and _rel(value, expected[name]) < 1e-13, name
    got["run"].sum().backward()
    assert u.grad is not None and bool(torch.isfinite(u.grad).all())


# -- CuPy without a GPU ------------------------------------------------------------------------------

def test_cupy_that_imports_without_a_gpu_is_never_picked(monkeypatch, model, x):
    """``import cupy`` succeeds on machines without a GPU: its device is probed, not assumed."""
    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(is_available=lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setattr(backend_module, "_BACKENDS", {})
    assert backend_module.cupy_available() is False
    assert backend_module.get_backend("auto").name == "numpy"
    with pytest.raises(RuntimeError, match=r"backend 'cupy' was requested but no CUDA GPU is usable"):
        backend_module.get_backend("cupy")
    out = model.run(x)
    assert type(out) is np.ndarray and backend_module.backend_of(out).name == "numpy"


# -- NumPy arguments beside tensors go to the tensors' device ----------------------------------

def test_numpy_masks_weights_and_beta_follow_the_tensors_device(torch, model):
    """A NumPy mask, weight or beta array beside CPU tensors was made a tensor on torch's
    *default* device (on a GPU: a CPU mask beside CUDA scores, a device mismatch); "meta" as the
    default device shows where they went. Reference: the same call on NumPy arrays."""
    from ctformer.operators.local_attention import local_attention
    from ctformer.operators.quadrature_attention import quadrature_attention

    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 2, 5, 4)) for _ in range(3))
    weights, beta = rng.uniform(0.5, 1.5, 5), np.array([[1.0], [2.0]])
    mask = rng.uniform(size=(5, 5)) > 0.3
    mask[:, 0] = True
    keys = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=bool)[:, None, :]
    grids = model.grids(GaussLegendre(6), Midpoint(8), context_length=6)
    state = rng.standard_normal((2, 6, 8))
    state_tensor = torch.tensor(state)   # made before the default device changes
    calls = {
        "quadrature": lambda a, b, c: quadrature_attention(a, b, c, beta=beta, weights=weights, mask=mask),
        "local": lambda a, b, c: local_attention(a, b, c, beta=2.0, key_mask=keys),
        "operator": lambda a, b, c: model.blocks[0].attention(
            state if isinstance(a, np.ndarray) else state_tensor, grids, padding_mask=MASK),
    }
    for name, call in calls.items():
        expected = call(q, k, v)
        tensors = [torch.tensor(a) for a in (q, k, v)]
        torch.set_default_device("meta")
        try:
            got = call(*tensors)
        finally:
            torch.set_default_device(None)
        assert got.device.type == "cpu" and _rel(got, expected) < 1e-13, name


def test_converted_gpt2_takes_tensors_and_hf_masks_like_arrays(torch):
    """A small random GPT-2 converted by ``from_hf``: float64 and float32 tensors with the int64
    attention_mask HuggingFace gives equal the NumPy run of the same values; the gradient
    equals central differences."""
    transformers = require("transformers")
    from ctformer.bridges import from_hf

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, n_positions=16, vocab_size=32,
                                     bos_token_id=0, eos_token_id=0)
    model = from_hf(transformers.GPT2Model(config).double().eval())
    x = np.random.default_rng(5).standard_normal((2, 6, 16)) * 0.5
    hf_mask = torch.tensor(MASK)          # int64, as a tokenizer returns it
    for dtype, tol in (("float64", 1e-13), ("float32", 1e-6)):
        expected = model.run(x.astype(dtype), padding_mask=MASK)
        got = model.run(torch.tensor(x, dtype=getattr(torch, dtype)), padding_mask=hf_mask)
        assert got.dtype == getattr(torch, dtype) and _rel(got, expected) < tol, dtype
    u = torch.tensor(x, requires_grad=True)
    model.run(u, padding_mask=hf_mask)[1, 3].sum().backward()
    step = np.zeros_like(x)
    step[1, 2, 4] = 1e-6
    central = float((model.run(x + step, padding_mask=MASK)[1, 3].sum()
                      - model.run(x - step, padding_mask=MASK)[1, 3].sum()) / 2e-6)
    assert abs(u.grad[1, 2, 4].item() - central) <= 1e-7 * max(1.0, abs(central))

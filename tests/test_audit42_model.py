"""Audit 42 of the continuous model and its gradients: each test checks a number against an
independent reference (central finite differences in float64, or the NumPy solve)."""
import numpy as np
import pytest

import ctformer
from ctformer.adjoint import gradient

torch = pytest.importorskip("torch")

GRIDS = dict(tokens="midpoint", features="midpoint")


def _model_and_state():
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2)
    u0 = np.random.default_rng(0).standard_normal((2, 5, 4))
    return model, u0


def _finite_difference(model, u0, index, h=1e-6):
    """Central difference of sum(solve(u0)) in the entry ``index`` of ``u0`` (NumPy, float64)."""
    e = np.zeros_like(u0)
    e[index] = h
    return (model.solve(u0 + e, **GRIDS).sum() - model.solve(u0 - e, **GRIDS).sum()) / (2 * h)


def test_solve_in_inference_mode_leaves_later_autograd_solves_working():
    # the torch copies of host constants are cached: made in inference mode, they were
    # inference tensors, and every later autograd solve raised "Inference tensors cannot be
    # saved for backward"
    # a seed and grids of its own: constants cached by another test would hide the defect
    model = ctformer.ContinuousTransformer.random_smooth(seed=4242, layers=2)
    u0 = np.random.default_rng(1).standard_normal((2, 7, 3))
    with torch.inference_mode():
        first = model.solve(torch.tensor(u0), **GRIDS)
    np.testing.assert_allclose(first.numpy(), model.solve(u0, **GRIDS), rtol=0, atol=1e-13)
    x = torch.tensor(u0, requires_grad=True)
    model.solve(x, **GRIDS).sum().backward()
    index = (1, 2, 2)
    assert float(x.grad[index]) == pytest.approx(_finite_difference(model, u0, index), abs=1e-7)


def test_with_parameters_refuses_a_masked_array():
    model, _ = _model_and_state()
    params = dict(model.parameters())
    name = "blocks.0.attention.W_Q.0.coefficients"
    value = np.array(params[name])
    # the hidden entry would have been used silently: the model computes value's data
    params[name] = np.ma.masked_array(value + 1.0, mask=np.eye(*value.shape, dtype=bool))
    with pytest.raises(ValueError, match=r"params\['blocks\.0\.attention\.W_Q\.0\.coefficients'\] "
                                         r"is a masked array with masked entries.*filled"):
        model.with_parameters(params)
    # without masked entries it is its values, as a plain array
    params[name] = np.ma.masked_array(value)
    _, u0 = _model_and_state()
    np.testing.assert_array_equal(model.with_parameters(params).solve(u0, **GRIDS),
                                  model.solve(u0, **GRIDS))


def test_a_model_of_computed_tensors_takes_with_parameters_and_gradient():
    # tensors computed from leaves (a reparametrization) could not be deep-copied by torch:
    # with_parameters and gradient on such a model raised inside copy.deepcopy
    model, u0 = _model_and_state()
    leaves = {k: torch.tensor(np.array(v), requires_grad=True) for k, v in model.parameters().items()}
    computed = model.with_parameters({k: 1.0 * v for k, v in leaves.items()})
    again = computed.with_parameters(computed.parameters())
    assert all(again.parameters()[k] is v for k, v in computed.parameters().items())
    x = torch.tensor(u0)
    np.testing.assert_allclose(again.solve(x, **GRIDS).detach().numpy(), model.solve(u0, **GRIDS),
                               rtol=0, atol=1e-13)
    grad = gradient(computed, x, lambda u: u.sum(), route="autograd", **GRIDS)
    index = (0, 4, 1)
    assert float(grad[index]) == pytest.approx(_finite_difference(model, u0, index), abs=1e-7)
    # the original model still holds its own tensors, which still reach the leaves
    computed.solve(x, **GRIDS).sum().backward()
    name = "blocks.1.feedforward.W_1.coefficients"
    h, p = 1e-6, {k: np.array(v) for k, v in model.parameters().items()}
    step = np.zeros_like(p[name])
    step.reshape(-1)[0] = h
    plus = model.with_parameters({**p, name: p[name] + step}).solve(u0, **GRIDS).sum()
    minus = model.with_parameters({**p, name: p[name] - step}).solve(u0, **GRIDS).sum()
    assert float(leaves[name].grad.reshape(-1)[0]) == pytest.approx((plus - minus) / (2 * h), abs=1e-6)

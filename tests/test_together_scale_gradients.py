"""A learnable temperature keeps its gradient where attention rescales huge inputs.

With max |q| max |k| d beta above finfo.max / 8 the scores are computed from q and k scaled
by powers of two and beta folded into one factor; that factor was computed on the host, so a
torch ``beta`` in autograd raised "Can't call numpy() on Tensor that requires grad" (a beta
per head) or lost its gradient. The scaled problem is the same attention (beta q.k is
unchanged), so its value and gradient must equal those of the unscaled inputs.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ctformer.operators import quadrature_attention  # noqa: E402


@pytest.mark.parametrize("beta", [0.7, [0.7, -1.3]])
def test_a_learnable_beta_keeps_its_gradient_through_the_rescaling(beta):
    g = torch.Generator().manual_seed(0)
    shape = (2, 5, 4) if isinstance(beta, list) else (5, 4)
    q, k, v = (torch.randn(shape, dtype=torch.float64, generator=g) for _ in range(3))

    def value_and_gradient(scale):
        b = torch.tensor(beta, dtype=torch.float64, requires_grad=True)
        out = quadrature_attention(q * 2.0 ** scale, k * 2.0 ** -scale, v, beta=b)
        (out * v).sum().backward()
        return out.detach(), b.grad

    plain, plain_grad = value_and_gradient(0)
    scaled, scaled_grad = value_and_gradient(1020)  # |q| ~ 1e307: the rescaled path
    torch.testing.assert_close(scaled, plain, rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(scaled_grad, plain_grad, rtol=1e-12, atol=1e-15)


def test_an_unchecked_call_keeps_a_scalar_betas_gradient():
    """``check=False`` (the solver's path) turned a 0-d beta into a Python float: its gradient
    was lost. d/dbeta of sum(out * v) must equal the checked call's and torch's autograd of
    softmax(beta q k^T) v written out (uniform weights)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(5, 4, dtype=torch.float64, generator=g) for _ in range(3))
    grads = []
    for check in (True, False):
        b = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
        (quadrature_attention(q, k, v, beta=b, check=check) * v).sum().backward()
        grads.append(b.grad)
    b = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)  # written out: softmax(beta q k^T) v
    (torch.softmax(b * (q @ k.T), dim=-1) @ v * v).sum().backward()
    reference = b.grad
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-14, atol=0)
    torch.testing.assert_close(grads[0], reference, rtol=1e-12, atol=0)


def test_a_learnable_beta_beside_numpy_inputs_is_refused_by_name():
    """No gradient can flow through a NumPy computation: a torch beta in autograd beside NumPy
    q, k, v raised torch's "Can't call numpy() on Tensor that requires grad" from inside."""
    import numpy as np
    q = np.random.default_rng(0).standard_normal((5, 4))
    beta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    with pytest.raises(TypeError, match="beta must be .* requires grad beside NumPy inputs"):
        quadrature_attention(q, q, q, beta=beta)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # nor does a learnable beta beside tensors warn
        quadrature_attention(torch.from_numpy(q), torch.from_numpy(q), torch.from_numpy(q), beta=beta)

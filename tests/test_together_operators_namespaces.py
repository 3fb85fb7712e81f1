"""Features together: temperatures, padding keys, grids and array namespaces combined.

References are written out in NumPy float64 from the formula (softmax of the scores with the
quadrature weights, the mask applied before normalizing; the circulant sum of a convolution).
Before the fixes:

* ``quadrature_attention(q, k, v, beta=b[:, None, None])`` with ``b`` of shape (3,) and ``q``
  of shape (3, 6, 4) returned an array of shape (3, 1, 3, 6, 4) (nine problems where three were
  given); a beta of shape (3,) beside a ``q`` of shape (6, 4) returned (3, 6, 4);
* ``attention.discretize(grids, padding_mask=keys)(u)`` with NumPy keys and a torch state (or
  torch keys and a NumPy state) raised ``TypeError: any() received an invalid combination of
  arguments`` inside torch (the windowed engine: ``unsupported operand type(s) for &``); a
  nested list of flags raised "list is not a supported array type";
* a ``Convolution`` on an empty torch batch raised "MKL FFT error: Inconsistent configuration
  parameters";
* list weights (or list ``beta``) beside float64 tensors were rounded to float32 (3.6e-8
  relative error); ``check=False`` with NumPy ``beta``/weights/mask beside tensors raised
  AttributeError inside the kernels;
* ``Grids`` took a ``Product`` as features, where a LayerNorm then failed inside NumPy.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from scipy.special import softmax

import ctformer.discretizations as D
from ctformer.kernels import Smooth
from ctformer.operators import Attention, Grids, quadrature_attention


RNG = np.random.default_rng(7)


def _attend(q, k, v, beta, keep=None):
    s = beta * np.einsum("...id,...jd->...ij", q, k)
    if keep is None:
        return np.einsum("...ij,...jd->...id", softmax(s, axis=-1), v)
    # a query without keys attends to the empty set: output zero (the integral over it)
    top = np.where(keep, s, -np.inf).max(axis=-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(np.isfinite(top), top, 0.0)), 0.0)
    total = p.sum(axis=-1, keepdims=True)
    return np.einsum("...ij,...jd->...id", p / np.where(total > 0, total, 1.0), v)


def test_beta_per_batch_entry_matches_the_written_out_softmax():
    q, k, v = (RNG.standard_normal((3, 6, 4)) for _ in range(3))
    b = np.array([0.5, 1.0, 2.0])
    out = quadrature_attention(q, k, v, beta=b)
    assert out.shape == (3, 6, 4)
    for i in range(3):
        assert np.max(np.abs(out[i] - _attend(q[i], k[i], v[i], b[i]))) < 1e-14


@pytest.mark.parametrize("q_shape, beta_shape", [((3, 6, 4), (3, 1, 1)), ((6, 4), (3,)), ((2, 6, 4), (4, 1))])
def test_a_beta_that_would_enlarge_the_output_is_refused(q_shape, beta_shape):
    q = RNG.standard_normal(q_shape)
    beta = np.linspace(0.5, 2.0, int(np.prod(beta_shape))).reshape(beta_shape)
    with pytest.raises(ValueError, match=r"beta of shape .* would enlarge the output's leading"):
        quadrature_attention(q, q, q, beta=beta)


def test_a_beta_against_keys_with_more_leading_axes_is_kept():
    # shared queries, one set of keys per batch entry: beta (2,) fits the broadcast (2,) axes
    q = RNG.standard_normal((6, 4))
    k, v = RNG.standard_normal((2, 5, 4)), RNG.standard_normal((2, 5, 3))
    b = np.array([0.5, 2.0])
    out = quadrature_attention(q, k, v, beta=b)
    for i in range(2):
        assert np.max(np.abs(out[i] - _attend(q, k[i], v[i], b[i]))) < 1e-14


def _profile(a):
    return lambda s, t: np.cos(a * s + t) + a * s * t


def _reference_attention(u, grids, keys, causal, window):
    """One head, beta 1, smooth kernels: the operator written out in float64."""
    y, sigma = grids.features, grids.head_features

    def matrix(f, out, inp):
        s = np.asarray(out.quadrature_nodes)
        t = np.asarray(inp.quadrature_nodes)
        return f(s[:, None], t[None, :]) * np.asarray(inp.quadrature_weights)[None, :] / inp.length

    w_sigma = np.asarray(sigma.quadrature_weights) / sigma.length
    q, k, v = (u @ matrix(_profile(a), sigma, y).T for a in (0.5, 1.0, 1.5))
    n = u.shape[-2]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    keep = keys[..., None, :] & ((j <= i) if causal else True) & ((i - j < window) if window else True)
    attended = _attend(q * w_sigma, k, v, 1.0, keep)
    return attended @ matrix(_profile(2.0), y, sigma).T


@pytest.mark.parametrize("options", [dict(), dict(mask="causal"), dict(mask="causal", window=2.0)])
@pytest.mark.parametrize("state_kind, keys_kind", [("torch", "numpy"), ("numpy", "torch")])
def test_padding_keys_of_another_namespace_than_the_state(options, state_kind, keys_kind):
    grids = Grids(D.Midpoint(5), D.GaussLegendre(4), head_features=D.Chebyshev(3), context_length=5)
    att = Attention([Smooth(_profile(0.5))], [Smooth(_profile(1.0))], [Smooth(_profile(1.5))],
                    [Smooth(_profile(2.0))], **options)
    u = RNG.standard_normal((2, 5, 4))
    keys = np.ones((2, 5), bool)
    keys[1, :2] = False  # right-aligned second sequence: its first two tokens are padding
    ref = _reference_attention(u, grids, keys, "mask" in options, options.get("window"))
    state = torch.tensor(u) if state_kind == "torch" else u
    given = torch.tensor(keys) if keys_kind == "torch" else keys
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch on a read-only NumPy array
        flow = att.discretize(grids, padding_mask=given)
        for check in (False, True):
            out = flow(state, check=check)
            assert type(out) is type(state)
            host = out.numpy() if state_kind == "torch" else out
            assert np.max(np.abs(host - ref)) < 1e-13


@pytest.mark.parametrize("features", [D.Midpoint(8), D.Fourier(8, (0.0, 2.0))])
def test_convolution_on_an_empty_torch_batch(features):
    # a uniform periodic grid takes the FFT: torch's raised "MKL FFT error: Inconsistent
    # configuration parameters" for a batch of no sequences; NumPy's gave the empty result
    from ctformer.kernels import Convolution
    from ctformer.operators import FeatureMap

    grids = Grids(D.Midpoint(5), features)
    op = FeatureMap(Convolution(lambda z: np.cos(2 * np.pi * z)), lambda s: s)
    for dtype in (torch.float32, torch.float64):
        empty = torch.zeros((0, 5, 8), dtype=dtype)
        for out in (op(empty, grids), op.discretize(grids)(empty)):
            assert type(out) is torch.Tensor and out.dtype == dtype and tuple(out.shape) == (0, 5, 8)
    # and a non-empty batch still agrees with the written-out circulant sum p((s_i - t_j) mod 1) / n
    u = RNG.standard_normal((2, 5, 8))
    a, b = features.domain
    s = (np.asarray(features.quadrature_nodes) - a) / (b - a)  # reference coordinates of the nodes
    circulant = np.cos(2 * np.pi * (s[:, None] - s[None, :])) / 8
    ref = u @ circulant.T + s
    assert np.max(np.abs(op(torch.tensor(u), grids).numpy() - ref)) < 1e-14


def _weighted_reference(q, k, v, beta, w, keep=None):
    s = beta[:, None, None] * np.einsum("...id,...jd->...ij", q, k) + np.log(w)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    return np.einsum("...ij,...jd->...id", softmax(s, axis=-1), v)


def test_python_lists_beside_float64_tensors_keep_float64():
    # torch.asarray reads Python floats as float32: list weights beside float64 tensors were
    # rounded to float32 (a relative error of 3.6e-8 in the result)
    q, k, v = (RNG.standard_normal((3, 6, 4)) for _ in range(3))
    w, b = RNG.uniform(0.5, 1.5, 6), np.array([0.3, 0.7, 1.1])
    out = quadrature_attention(*(torch.tensor(a) for a in (q, k, v)), beta=b.tolist(), weights=w.tolist())
    assert out.dtype == torch.float64
    assert np.max(np.abs(out.numpy() - _weighted_reference(q, k, v, b, w))) < 1e-14


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_unchecked_call_takes_host_beta_weights_and_mask_beside_tensors(dtype):
    # check=False: "beta and weights are brought to the inputs' dtype"; NumPy ones beside float32
    # tensors had raised AttributeError ('numpy.ndarray' object has no attribute 'to'), a NumPy
    # mask TypeError inside torch.any, tensors beside NumPy arrays 'Tensor' has no 'astype'
    q, k, v = (RNG.standard_normal((3, 6, 4)) for _ in range(3))
    w, b = RNG.uniform(0.5, 1.5, 6), np.array([0.3, 0.7, 1.1])
    keep = RNG.random((3, 6, 6)) < 0.7
    keep[..., 0] = True
    ref = _weighted_reference(q, k, v, b, w, keep)
    tensors = [torch.tensor(a, dtype=getattr(torch, dtype)) for a in (q, k, v)]
    tol = 1e-14 if dtype == "float64" else 3e-6
    for given in ((b, w, keep), (b.tolist(), w.tolist(), keep)):
        out = quadrature_attention(*tensors, beta=given[0], weights=given[1], mask=given[2], check=False)
        assert out.dtype == getattr(torch, dtype)
        assert np.max(np.abs(out.double().numpy() - ref)) < tol
    out = quadrature_attention(q.astype(dtype), k.astype(dtype), v.astype(dtype), beta=torch.tensor(b),
                               weights=torch.tensor(w), mask=torch.tensor(keep), check=False)
    assert type(out) is np.ndarray and out.dtype == np.dtype(dtype)
    assert np.max(np.abs(out - ref)) < tol


@pytest.mark.parametrize("field", ["features", "head_features", "hidden"])
def test_a_product_is_a_token_domain_only(field):
    # a LayerNorm on Product features read (N, 2) nodes and failed inside NumPy ("operands
    # could not be broadcast together with shapes (3,4) (4,2) (3,4)")
    square = D.Product(D.Midpoint(2), D.Midpoint(2))
    options = {"features": D.Midpoint(4), field: square}
    with pytest.raises(TypeError, match=f"Grids.{field} must discretize an interval, got Product"):
        Grids(D.Midpoint(3), **options)
    with pytest.raises(TypeError, match="Grids.features must discretize an interval"):
        Grids(D.Midpoint(3), D.WithAtoms(square))
    # the tokens may be a square: attention over it is the weighted softmax of the 12 points
    tokens = D.Product(D.GaussLegendre(3), D.Chebyshev(4))
    grids = Grids(tokens, D.Midpoint(4))
    assert grids.shape == (12, 4)


@pytest.mark.parametrize("options", [dict(), dict(mask="causal")])
def test_a_nested_list_of_padding_flags_in_discretize(options):
    # Attention.__call__ took a nested list of 0/1 flags; discretize raised "TypeError: list is
    # not a supported array type" from inside array_api_compat
    grids = Grids(D.Midpoint(5), D.GaussLegendre(4), head_features=D.Chebyshev(3))
    att = Attention([Smooth(_profile(0.5))], [Smooth(_profile(1.0))], [Smooth(_profile(1.5))],
                    [Smooth(_profile(2.0))], **options)
    u = RNG.standard_normal((2, 5, 4))
    flags = [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    ref = _reference_attention(u, grids, np.array(flags, bool), "mask" in options, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for state in (u, torch.tensor(u)):
            out = att.discretize(grids, padding_mask=flags)(state)
            host = out.numpy() if isinstance(out, torch.Tensor) else out
            assert np.max(np.abs(host - ref)) < 1e-13


@pytest.mark.parametrize("mask", [None, "causal"])
def test_a_learnable_scalar_temperature_keeps_its_gradient(mask):
    # a 0-d beta tensor was read with float(): the result had no graph to beta (beta.grad None
    # after backward) while a beta of shape (H,) kept it
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 7, 3, dtype=torch.float64, generator=gen) for _ in range(3))
    w = torch.rand(7, dtype=torch.float64, generator=gen) + 0.5
    beta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    out = quadrature_attention(q, k, v, beta=beta, weights=w, mask=mask)
    (out * out).sum().backward()
    ref_beta = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)
    s = ref_beta * (q @ k.transpose(-1, -2)) + torch.log(w)
    if mask == "causal":
        s = s.masked_fill(~torch.tril(torch.ones(7, 7, dtype=torch.bool)), -torch.inf)
    ref = torch.softmax(s, dim=-1) @ v
    (ref * ref).sum().backward()
    assert tuple(out.shape) == (2, 7, 3)
    assert (out - ref).abs().max().item() < 1e-14
    assert beta.grad is not None
    assert abs(beta.grad.item() - ref_beta.grad.item()) < 1e-13 * abs(ref_beta.grad.item())


@pytest.mark.parametrize("check", [True, False])
@pytest.mark.parametrize("name", ["beta", "weights"])
def test_a_learnable_tensor_beside_numpy_inputs_is_refused_checked_or_not(check, name):
    # unchecked, its NumPy copy had cut it from autograd silently: a result, and grad None
    q = np.random.default_rng(4).standard_normal((2, 5, 3))
    learnable = torch.tensor(0.7 if name == "beta" else [1.0] * 5, dtype=torch.float64, requires_grad=True)
    args = dict(beta=learnable, weights=None) if name == "beta" else dict(beta=0.7, weights=learnable)
    with pytest.raises(TypeError, match="requires grad beside NumPy inputs.*pass q, k and v as torch tensors"):
        quadrature_attention(q, q, q, check=check, **args)
    # detached, it is an ordinary array: softmax(0.7 q q^T) q
    detached = {key: (value.detach() if key == name else value) for key, value in args.items()}
    s = 0.7 * q @ q.swapaxes(-1, -2)
    ref = np.exp(s - s.max(-1, keepdims=True))
    ref = ref / ref.sum(-1, keepdims=True) @ q
    assert np.max(np.abs(quadrature_attention(q, q, q, check=check, **detached) - ref)) < 1e-14

"""Padding masks where they enter: their shape against the state's batch axes, their device,
their dtype, and the messages that name what is wrong (audit of positions, masks, padding).

References: a NumPy softmax over the kept keys (causal and padding) for the attention operator,
and the contract of ``check_padding_mask`` (a mask on the state's device)."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import Midpoint
from ctformer.kernels import PiecewiseConstant
from ctformer.model_inputs import check_padding_mask
from ctformer.operators import Attention, Grids
from ctformer.operators.local_attention import local_attention
from tests.conftest import require

HEADS, D, D_H, N = 2, 8, 4, 6


def _attention(rng):
    def kernels(rows, cols):
        return [PiecewiseConstant(rng.standard_normal((rows, cols)) / 3) for _ in range(HEADS)]

    weights = kernels(D_H, D), kernels(D_H, D), kernels(D_H, D), kernels(D, D_H)
    return Attention(*weights, mask="causal", beta=1.5), weights


def _numpy_reference(u, weights, keep):
    """Causal softmax attention over the real keys, head by head, from the kernel matrices."""
    out = 0.0
    i, j = np.arange(N)[:, None], np.arange(N)[None, :]
    allowed = (j <= i) & keep[..., None, :]
    for h in range(HEADS):
        q, k, v = (u @ w[h].matrix(Midpoint(D_H), Midpoint(D)).T for w in weights[:3])
        s = np.where(allowed, 1.5 * q @ k.swapaxes(-1, -2) / D_H, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        o = (p / p.sum(-1, keepdims=True)) @ v
        out = out + o @ weights[3][h].matrix(Midpoint(D), Midpoint(D_H)).T
    return out


def test_extended_attention_mask_is_refused_instead_of_broadcasting_the_batch():
    """HuggingFace's extended mask (B, 1, 1, N) broadcast the state: Attention returned an
    array of shape (2, 1, 2, 6, 8) for u of shape (2, 6, 8), each sequence under every mask."""
    rng = np.random.default_rng(0)
    att, weights = _attention(rng)
    grids = Grids(Midpoint(N), Midpoint(D), Midpoint(D_H), context_length=N)
    u = rng.standard_normal((2, N, D))
    keep = np.ones((2, N), dtype=bool)
    keep[1, -2:] = False
    expected = _numpy_reference(u, weights, keep)
    got = att(u, grids, padding_mask=keep)
    assert got.shape == u.shape
    assert np.max(np.abs(got - expected)) / np.max(np.abs(expected)) < 1e-12
    with pytest.raises(ValueError, match=r"leading axes \(2, 1, 1\) do not broadcast to the batch axes "
                                         r"\(2,\) of u: .*shape \(2, 6\)"):
        att(u, grids, padding_mask=keep[:, None, None, :])
    with pytest.raises(ValueError, match=r"leading axes \(2,\) do not broadcast to the batch axes \(\) of u"):
        att(u[0], grids, padding_mask=keep)
    # masks that broadcast to the batch axes are the same computation as the full mask
    shared = np.ones(N, dtype=bool)
    shared[-1] = False
    full = att(u, grids, padding_mask=np.broadcast_to(shared, (2, N)).copy())
    np.testing.assert_array_equal(att(u, grids, padding_mask=shared), full)
    np.testing.assert_array_equal(att(u, grids, padding_mask=shared[None]), full)


def test_integer_masks_of_the_operator_are_refused_with_the_conversion():
    """0/1 integers are read as keep-masks (tests/test_operators_audit_masks.py); other
    integers and non-integer dtypes are refused with the value or dtype and the remedy."""
    rng = np.random.default_rng(1)
    att, _ = _attention(rng)
    grids = Grids(Midpoint(N), Midpoint(D), Midpoint(D_H), context_length=N)
    with pytest.raises(ValueError, match=r"padding_mask must hold only 0 and 1 .*got the value 2; pass a boolean"):
        att(rng.standard_normal((2, N, D)), grids, padding_mask=2 * np.ones((2, N), dtype=np.int64))
    # 0.0 / 1.0 floats are read as run reads them; an additive mask is named with its conversion
    u = rng.standard_normal((2, N, D))
    keep = np.ones((2, N), dtype=bool)
    keep[1, -2:] = False
    np.testing.assert_array_equal(att(u, grids, padding_mask=keep.astype(np.float64)),
                                  att(u, grids, padding_mask=keep))
    with pytest.raises(ValueError, match=r"got the value -inf.*padding_mask == 0"):
        att(u, grids, padding_mask=np.where(keep, 0.0, -np.inf))
    with pytest.raises(TypeError, match=r"padding_mask must be boolean or hold only 0 and 1 .*"
                                        r"got dtype complex128; pass padding_mask == 1"):
        att(u, grids, padding_mask=np.ones((2, N), dtype=complex))


def test_torch_mask_on_another_device_is_moved_to_the_states_device():
    """check_padding_mask promises the mask on u's device; a torch mask was returned on its own
    device (a CPU attention_mask for a state on the GPU), so the attention met two devices."""
    torch = require("torch")
    u = torch.zeros((2, 5, 3), dtype=torch.float64, device="meta")
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    for given in (mask.bool(), mask, mask.numpy()):
        got = check_padding_mask(given, u)
        assert got.device == u.device and got.dtype == torch.bool
    cpu = check_padding_mask(mask, torch.zeros((2, 5, 3), dtype=torch.float64))
    assert cpu.tolist() == [[True, True, True, False, False], [True] * 5]


def test_padding_mask_messages_name_the_sequence_and_the_remedy():
    u = np.zeros((3, 4, 2))
    keep = np.ones((3, 4))
    keep[2] = 0
    with pytest.raises(ValueError, match=r"without any real token \(a row of zeros\) at batch index 2: .*"
                                         r"drop that sequence from the batch"):
        check_padding_mask(keep, u)
    with pytest.raises(ValueError, match=r"without any real token \(a row of zeros\): every sequence"):
        check_padding_mask(np.zeros(4), u[0])
    with pytest.raises(ValueError, match=r"padding_mask must be a rectangular array of shape \(3, 4\)"):
        check_padding_mask([[1, 1, 1, 1], [1, 1], [1, 1, 1, 1]], u)
    with pytest.raises(TypeError, match=r"booleans or 0/1, got NoneType, int"):
        check_padding_mask([[1, None, 1, 1]] * 3, u)


def test_local_attention_key_mask_of_integers_names_its_dtype():
    """A 0/1 key_mask was refused as 'must be a boolean array of shape (..., 6), got (2, 6)':
    the shape it had was the one asked for."""
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 6, 4))
    np.testing.assert_array_equal(local_attention(q, q, q, beta=1.0, key_mask=np.ones((2, 6))),
                                  local_attention(q, q, q, beta=1.0, key_mask=np.ones((2, 6), dtype=bool)))
    with pytest.raises(ValueError, match=r"key_mask must hold only 0 and 1 .*got the value 0.5"):
        local_attention(q, q, q, beta=1.0, key_mask=np.full((2, 6), 0.5))
    with pytest.raises(ValueError, match=r"key_mask must hold only 0 and 1 .*got the value -1"):
        local_attention(q, q, q, beta=1.0, key_mask=-np.ones((2, 6), dtype=np.int64))
    with pytest.raises(ValueError, match=r"key_mask must be a boolean array of shape \(\.\.\., 6\), got \(2, 5\)"):
        local_attention(q, q, q, beta=1.0, key_mask=np.ones((2, 5), dtype=bool))

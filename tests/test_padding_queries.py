"""Queries without keys (issue 19, item 2): left-padded batches, as HuggingFace batches decoders
for generation. A padding token before the first real token sees no key under the causal mask;
its attention output is zero (the integral over an empty set of keys), it never reaches a real
token, and the real tokens equal the float64 HuggingFace / torch modules to 1e-12. The same
rule holds in every path of ``quadrature_attention`` and ``local_attention``."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.operators.local_attention import local_attention, window_pattern
from ctformer.operators.quadrature_attention import quadrature_attention
from tests.conftest import rel_err, require
from tests.test_modern_bridges import _llama, _randomize, _run_hf

TOL = 1e-12


def _left_padding(batch, tokens):
    """The user's mask [0, 0, 1, 1, 1] first, then a full sequence, then one real token."""
    mask = np.ones((batch, tokens), dtype=bool)
    mask[0, :2] = False
    if batch > 2:
        mask[2, :-1] = False
    return mask


def _check_left_padded(torch, model, tokens=5, batch=3, seed=0):
    """run(hidden_states[0], padding_mask) on left padding: finite, real tokens = HF's."""
    from ctformer.bridges import from_hf

    d = model.config.hidden_size
    x = np.random.default_rng(seed).standard_normal((batch, tokens, d))
    mask = _left_padding(batch, tokens)
    last, hidden = _run_hf(torch, model, x, mask)
    got = from_hf(model).run(hidden[0], padding_mask=mask)
    assert np.all(np.isfinite(got))
    assert rel_err(got, last, mask) < TOL
    # HuggingFace's attention also gives a query without keys output zero: the padding
    # tokens agree as well (measured 3e-16 for GPT-2, Llama, Qwen2, Mistral)
    assert rel_err(got, last, ~mask) < TOL
    return got, last, mask


def test_gpt2_left_padding_users_reproducer():
    """run(x, padding_mask=[[0, 0, 1, 1, 1]]) raised FloatingPointError ("the step may be
    unstable"); it now equals HuggingFace's float64 GPT-2."""
    torch = require("torch")
    t = require("transformers")
    config = t.GPT2Config(vocab_size=32, n_positions=32, n_embd=8, n_layer=2, n_head=2, n_inner=12,
                          bos_token_id=0, eos_token_id=0)
    model = _randomize(torch, t.GPT2Model(config).double().eval(), 1, conv1d=True)
    _check_left_padded(torch, model, batch=1)   # the user's mask [[0, 0, 1, 1, 1]]
    _check_left_padded(torch, model, tokens=7, batch=3, seed=1)


@pytest.mark.parametrize("cls, extra", [("Llama", {}), ("Qwen2", {}), ("Mistral", {"sliding_window": None}),
                                        ("Mistral", {"sliding_window": 3})],
                         ids=["llama", "qwen2", "mistral", "mistral-window3"])
def test_llama_family_left_padding(cls, extra):
    """Float64 references (float64 RoPE frequencies, SDPA attention), grouped-query heads."""
    torch = require("torch")
    t = require("transformers", f"{cls}Model")
    model = _llama(t, torch, cls=cls, layers=2, heads=4, kv_heads=2, d=16, theta=1000.0, **extra)
    _check_left_padded(torch, model, tokens=8, batch=3, seed=2)


def test_torch_causal_encoder_left_padding_equals_the_unpadded_sequences():
    """from_torch(causal=True): with left padding, each sequence's real tokens equal torch's
    causal encoder run on the real tokens alone (the encoder has no positions), to 1e-12."""
    torch = require("torch")
    from ctformer.bridges import from_torch

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=12, nhead=3, dim_feedforward=20, dropout=0.0,
                                             batch_first=True, norm_first=True)
    net = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).double().eval()
    x = np.random.default_rng(3).standard_normal((3, 6, 12))
    mask = _left_padding(3, 6)
    got = from_torch(net, causal=True).run(x, padding_mask=mask)
    assert np.all(np.isfinite(got))
    for b in range(3):
        real = x[b, mask[b]][None]
        square = torch.nn.Transformer.generate_square_subsequent_mask(real.shape[1], dtype=torch.float64)
        with torch.no_grad():
            expected = net(torch.from_numpy(real), mask=square, is_causal=True).numpy()[0]
        assert rel_err(got[b, mask[b]], expected) < TOL


# -- quadrature_attention and local_attention themselves -------------------------------------
def _reference(q, k, v, beta, keep):
    """Plain float64 softmax over the kept keys; zero for a query that keeps none."""
    s = beta * q.astype(np.float64) @ np.swapaxes(k.astype(np.float64), -1, -2)
    s = np.where(keep, s, -np.inf)
    top = np.max(s, axis=-1, keepdims=True)
    empty = ~keep.any(-1, keepdims=True)
    p = np.where(keep, np.exp(s - np.where(empty, 0.0, top)), 0.0)
    den = p.sum(-1, keepdims=True)
    return np.where(empty, 0.0, p @ v.astype(np.float64) / np.where(empty, 1.0, den))


def _left_padded_causal_mask(lead, n, pad):
    """(lead, n, n): keys j <= i, the first ``pad`` tokens of the first problem are padding."""
    keep = np.broadcast_to(np.tril(np.ones((n, n), bool)), (*lead, n, n)).copy()
    keep.reshape(-1, n, n)[0, :, :pad] = False
    return keep


# (lead, n, chunk): the small batched path, the streamed path (n * n >= 2^16, worker tasks), the
# generic chunked path (explicit chunk)
PATHS = [((2, 3), 9, None), ((2,), 300, None), ((2,), 40, 7)]


@pytest.mark.parametrize("lead, n, chunk", PATHS, ids=["small", "stream", "chunked"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("check", [True, False])
def test_quadrature_attention_empty_rows_are_zero(loop_engine, lead, n, chunk, dtype, check):
    rng = np.random.default_rng(n)
    q, k, v = (rng.standard_normal((*lead, n, 4)).astype(dtype) for _ in range(3))
    keep = _left_padded_causal_mask(lead, n, pad=3)
    got = quadrature_attention(q, k, v, beta=0.8, mask=keep, chunk=chunk, check=check)
    assert got.dtype == np.dtype(dtype) and np.all(np.isfinite(got))
    empty = ~keep.any(-1)
    assert empty.sum() == 3 and np.all(got[empty] == 0)
    tol = 1e-13 if dtype == "float64" else 1e-5
    assert np.abs(got - _reference(q, k, v, 0.8, keep)).max() < tol


def test_quadrature_attention_key_mask_without_keys_and_weights():
    """A (…, 1, M) key mask with no key at all: every query of that problem gives zero."""
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((3, 2, 6, 3))
    keep = np.ones((2, 1, 6), bool)
    keep[1] = False
    w = rng.uniform(0.5, 1.5, 6)
    got = quadrature_attention(q, k, v, beta=1.1, mask=keep, weights=w)
    assert np.all(got[1] == 0)
    s = 1.1 * q[0] @ k[0].T + np.log(w)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.abs(got[0] - p @ v[0] / p.sum(-1, keepdims=True)).max() < 1e-14


@pytest.mark.parametrize("namespace", ["torch", "array_api_strict"])
def test_quadrature_attention_empty_rows_other_namespaces(namespace):
    xp = require(namespace)
    rng = np.random.default_rng(5)
    q, k, v = rng.standard_normal((3, 2, 8, 4))
    keep = _left_padded_causal_mask((2,), 8, pad=2)
    got = quadrature_attention(*(xp.asarray(a) for a in (q, k, v)), beta=0.9, mask=xp.asarray(keep))
    got = got.numpy() if namespace == "torch" else np.from_dlpack(got)
    assert np.all(np.isfinite(got)) and np.all(got[~keep.any(-1)] == 0)
    assert np.abs(got - _reference(q, k, v, 0.9, keep)).max() < 1e-13


@pytest.mark.parametrize("alibi", [False, True])
def test_local_attention_empty_rows_are_zero(alibi):
    """Window pattern and ALiBi with a key mask that leaves queries without keys."""
    rng = np.random.default_rng(6)
    n = 10
    q, k, v = rng.standard_normal((3, 2, n, 4))
    pad = np.ones((2, n), bool)
    pad[0, :4] = False                       # left padding longer than the window
    p = np.arange(n, dtype=float)
    slopes = np.array([0.5, 0.25]) if alibi else None
    got = local_attention(q, k, v, beta=0.7, pattern=window_pattern(p, 3), key_mask=pad,
                          slopes=slopes, positions=p if alibi else None,
                          block=4)
    i, j = p[:, None], p[None, :]
    keep = ((i - j >= 0) & (i - j < 3))[None] & pad[:, None, :]
    empty = ~keep.any(-1)
    assert empty.sum() == 4 and np.all(got[empty] == 0)
    s = 0.7 * q @ np.swapaxes(k, -1, -2)
    if alibi:
        s = s - slopes[:, None, None] * np.abs(i - j)
    s = np.where(keep, s, -np.inf)
    e = np.where(keep, np.exp(s - np.where(empty[..., None], 0.0, s.max(-1, keepdims=True))), 0.0)
    ref = np.where(empty[..., None], 0.0, e @ v / np.maximum(e.sum(-1, keepdims=True), 1e-300))
    assert np.abs(got - ref).max() < 1e-14

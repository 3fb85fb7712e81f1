r"""torch's fused attention kernel (``scaled_dot_product_attention``) as a path of quadrature
attention on NumPy arrays: softmax attention with uniform weights, plain or square causal, on
ctformer's threads, where torch does this machine's products and its MKL gives the same bits
for every thread count (:func:`ctformer._numerics.torch_threads.threaded_products`).
"""
from __future__ import annotations

import threading

import numpy as np

from .gemm import uses_torch
from .threads import _INSIDE, num_threads
from .torch_threads import _tensor, _torch, _torch_threads, threaded_products

__all__ = ["fused_attention", "fused_attention_ok"]

_LOCK = threading.Lock()
_FUSED_OK: list = []  # [bool] once fused_attention_ok has checked the fused kernel


def fused_attention(q, k, v, scale, causal, lead, out):
    r"""``softmax(scale q k^T) v`` over the leading axes ``lead`` by torch's fused kernel
    (``scaled_dot_product_attention``) on :func:`~ctformer._numerics.threads.num_threads`
    threads, for NumPy arrays of one float dtype: uniform weights, no mask but the causal one
    (square), where :func:`fused_attention_ok` holds. Key/value heads shared by groups of
    query heads (``k``, ``v`` of shape ``(..., H_kv, 1, M, d)`` against ``lead`` ending in
    ``(H_kv, G)``) are passed as they are, not repeated. Writes and returns ``out``, of shape
    ``(*lead, N, e)``; ``q``, ``k``, ``v`` have ``len(lead) + 2`` axes."""
    torch = _torch()
    n, m, e = q.shape[-2], k.shape[-2], v.shape[-1]
    tq, tk, tv = (_tensor(torch, a) for a in (q, k, v))
    grouped = len(lead) >= 2 and lead[-1] > 1 and k.shape[-3] == v.shape[-3] == 1 and q.shape[-3] == lead[-1]
    tq = tq.expand(*lead, n, q.shape[-1])
    if grouped:  # (..., H_kv, G, N, d) queries against (..., H_kv, 1, M, d) keys and values
        tq = tq.flatten(-4, -3)
        tk, tv = (t.expand(*lead[:-1], 1, *t.shape[-2:]).squeeze(-3) for t in (tk, tv))
    else:
        tk, tv = (t.expand(*lead, *t.shape[-2:]) for t in (tk, tv))
    tq, tk, tv = (_four_axes(t) for t in (tq, tk, tv))
    with _torch_threads(torch, num_threads()):
        o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=float(scale),
                                                             enable_gqa=grouped)
    np.copyto(out, o.reshape(*lead, n, e).numpy())
    return out


def _four_axes(t):
    """``t`` with its leading axes made exactly two (the kernel's (batch, heads))."""
    if t.dim() == 4:
        return t
    if t.dim() < 4:
        return t.reshape(*(1,) * (4 - t.dim()), *t.shape)
    return t.flatten(0, t.dim() - 4)


def fused_attention_ok(dtype) -> bool:
    """True when :func:`fused_attention` serves ``dtype``: torch multiplies it
    (:func:`gemm_provider`), outside worker tasks, with MKL's strict mode on
    (:func:`threaded_products`) and a check that the fused kernel gives the same bits on one
    and two threads (plain and causal)."""
    if getattr(_INSIDE, "worker", False) or not uses_torch(dtype) or not threaded_products():
        return False
    if not _FUSED_OK:
        with _LOCK:
            if not _FUSED_OK:
                _FUSED_OK.append(_fused_thread_count_invariant(_torch()))
    return _FUSED_OK[0]


def _fused_thread_count_invariant(torch) -> bool:
    rng = np.random.default_rng(2)
    for dtype, causal in ((np.float64, False), (np.float32, True)):
        q, k, v = (torch.from_numpy(rng.standard_normal((2, 3, 300, 16)).astype(dtype)) for _ in range(3))
        runs = []
        for count in (1, 2):
            with _torch_threads(torch, count):
                runs.append(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
        if not torch.equal(*runs):
            return False
    return True

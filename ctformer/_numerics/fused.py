r"""torch's fused attention kernel (``scaled_dot_product_attention``) as a path of quadrature
attention on NumPy arrays: softmax attention with uniform weights, plain or square causal, on
ctformer's threads, where torch does this machine's products and its MKL gives the same bits
for every thread count (:func:`ctformer._numerics.torch_threads.threaded_products`).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from ..environment import choice
from . import measured_blocks as _measured_blocks
from . import packed_attention as _packed_attention
from . import gemm as _gemm
from .gemm import uses_torch
from .threads import _INSIDE, num_threads
from .torch_threads import _tensor, _torch, _torch_threads, threaded_products

__all__ = ["engine_setting", "fused_attention", "fused_attention_ok", "fused_chosen"]

_LOCK = threading.Lock()
_FUSED_OK: list = []  # [bool] once fused_attention_ok has checked the fused kernel
_ENGINES = ("auto", "fused", "streamed")
# Problems with at least this many scores each run on the engine measured faster on this
# machine (the kernel or the streamed query chunks), plain and causal apart; smaller ones on
# the kernel (2-2.6x the library's paths on networks' attention).
_CALIBRATED_MIN_SCORES = 1 << 20
# The measurement: pairs of calls, and how clearly the streamed engine must win to be kept.
_PAIRS, _WINS, _MARGIN = 9, 7, 0.92


def engine_setting() -> str:
    """``CTFORMER_ATTENTION_ENGINE``: ``"auto"`` (unset or empty), ``"fused"`` or ``"streamed"``.

    Read by every attention evaluation, whatever its size and array namespace, so that a bad
    value is refused at once rather than only by the problems the setting decides.

    Raises
    ------
    ValueError
        If the variable is none of auto, fused, streamed (the message lists them).
    """
    return choice("CTFORMER_ATTENTION_ENGINE", _ENGINES)


def fused_chosen(dtype, causal: bool, scores: int, engine: str | None = None) -> bool:
    """Whether a problem that torch's fused kernel can take (:func:`fused_attention_ok`) goes
    to it, by ``CTFORMER_ATTENTION_ENGINE``: ``fused``, always; ``streamed``, never (the
    library's own paths); ``auto`` (the default), the kernel for problems of fewer than
    ``_CALIBRATED_MIN_SCORES`` ``scores`` each, and for larger ones the engine measured faster
    on this machine, plain and causal apart (:func:`_measure_plain`, :func:`_measure_causal`,
    stored with the product choices).

    Raises
    ------
    ValueError
        If ``CTFORMER_ATTENTION_ENGINE`` is not one of auto, fused, streamed.
    """
    engine = engine_setting() if engine is None else engine
    if engine != "auto":
        return engine == "fused"
    if scores < _CALIBRATED_MIN_SCORES:
        return True
    name = np.dtype(dtype).name
    # stored first: the measurements below run under the store's lock
    _gemm.softmax_provider(name)
    _measured_blocks.geometry(name)
    if causal:
        return _gemm._measured("causal attention", name, _measure_causal) == "torch"
    _packed_attention.chosen(name)
    return _gemm._measured("plain attention", name, _measure_plain) == "torch"


def _measure_causal(dtype) -> dict:
    """:func:`_measure_engines` on a causal problem."""
    return _measure_engines(dtype, True)


def _measure_plain(dtype) -> dict:
    """:func:`_measure_engines` on a problem without a mask (the streamed engine with packed
    key and value blocks where this machine chose them)."""
    return _measure_engines(dtype, False)


def _measure_engines(dtype, causal: bool) -> dict:
    """Alternating times of torch's fused kernel and the streamed engine on one problem (2048
    tokens, 64 features; ``causal`` or without a mask), ``_PAIRS`` pairs after a warm-up, the
    order swapped every other pair. The streamed engine is kept (``"numpy"``) only when its
    median ratio to the kernel is at most ``_MARGIN`` and it was faster in at least ``_WINS``
    of the pairs, so that a noisy machine keeps the kernel."""
    from . import streamed

    q, k, v = (np.random.default_rng(seed).standard_normal((1, 1, 2048, 64)).astype(dtype) for seed in range(3))
    out = np.empty_like(q)
    geometry = _measured_blocks.geometry(dtype)
    packed = not causal and 2048 >= 2 * geometry.key_block and _packed_attention.chosen(dtype)

    def kernel():
        fused_attention(q, k, v, 0.125, causal, (1, 1), out)

    def ours():
        packs = _packed_attention.packed_blocks(geometry.key_block) if packed else None
        streamed.stream(q, 0.125, k, v, None, None, causal, None, (1, 1), None, geometry, packs)

    for call in (kernel, ours, kernel, ours):
        call()
    times = {kernel: [], ours: []}
    for i in range(_PAIRS):
        for call in ((kernel, ours) if i % 2 == 0 else (ours, kernel)):
            start = time.perf_counter()
            call()
            times[call].append(time.perf_counter() - start)
    return engine_verdict(times[kernel], times[ours])


def engine_verdict(kernel_s, streamed_s) -> dict:
    """The stored choice from paired times: ``"numpy"`` (the streamed engine) when the median
    of the per-pair ratios streamed / kernel is at most ``_MARGIN`` and the streamed engine won
    at least ``_WINS`` pairs, else ``"torch"`` (the kernel); with the medians, the ratio and
    the wins."""
    ratios = [s / k for k, s in zip(kernel_s, streamed_s)]
    ratio, wins = float(np.median(ratios)), sum(r < 1.0 for r in ratios)
    provider = "numpy" if ratio <= _MARGIN and wins >= _WINS else "torch"
    return {"provider": provider, "numpy_s": float(np.median(streamed_s)),
            "torch_s": float(np.median(kernel_s)), "ratio": ratio, "wins": int(wins)}


def fused_attention(q, k, v, scale, causal, lead, out):
    r"""``softmax(scale q k^T) v`` over the leading axes ``lead`` by torch's fused kernel
    (``scaled_dot_product_attention``) on :func:`~ctformer._numerics.threads.num_threads`
    threads, for NumPy arrays of one float dtype: uniform weights, no mask but the causal one
    (square), where :func:`fused_attention_ok` holds. Key/value heads shared by groups of
    query heads (``k``, ``v`` of shape ``(..., H_kv, 1, M, d)`` against ``lead`` ending in
    ``(H_kv, G)``) are passed as they are, not repeated. Writes and returns ``out``, of shape
    ``(*lead, N, e)``; ``q``, ``k``, ``v`` have ``len(lead) + 2`` axes."""
    torch = _torch()
    with _torch_threads(torch, num_threads()):
        o = sdpa(torch, *(_tensor(torch, a) for a in (q, k, v)), scale, causal, lead)
    np.copyto(out, o.numpy())
    return out


def sdpa(torch, q, k, v, scale, causal, lead):
    """``softmax(scale q k^T) v`` of torch tensors shaped as :func:`fused_attention`'s arrays,
    by ``scaled_dot_product_attention`` on torch's current threads: a tensor ``(*lead, N, e)``
    (differentiable, as the kernel is)."""
    n, e = q.shape[-2], v.shape[-1]
    grouped = len(lead) >= 2 and lead[-1] > 1 and k.shape[-3] == v.shape[-3] == 1 and q.shape[-3] == lead[-1]
    q = q.expand(*lead, n, q.shape[-1])
    if grouped:  # (..., H_kv, G, N, d) queries against (..., H_kv, 1, M, d) keys and values
        q = q.flatten(-4, -3)
        k, v = (t.expand(*lead[:-1], 1, *t.shape[-2:]).squeeze(-3) for t in (k, v))
    else:
        k, v = (t.expand(*lead, *t.shape[-2:]) for t in (k, v))
    q, k, v = (_four_axes(t) for t in (q, k, v))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=float(scale),
                                                         enable_gqa=grouped)
    return o.reshape(*lead, n, e)


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

r"""The dense attention engine: every path of a validated quadrature-attention call.

Given checked arrays (one namespace, one real floating dtype, finite), the log-weights
:math:`\log w_j`, a boolean keep mask or a causal flag, this computes, row by row,

.. math::

    \mathrm{out}_i = \frac{\sum_j m_{ij} e^{s_{ij} - \mu_i} v_j}{\sum_j m_{ij} e^{s_{ij} - \mu_i}},
    \qquad s_{ij} = \beta q_i \cdot k_j + \log w_j, \quad \mu_i = \max_{j: m_{ij} = 1} s_{ij},

choosing the path by size and namespace: a batched NumPy pass for small problems, the
threaded streamed engine (:mod:`ctformer._numerics.streamed`) for large NumPy ones and for
masked ones too many for one batched pass (the slabs of a sliding window over many heads),
query chunks of array-API operations elsewhere. A soft cap of the scores,
:math:`s \mapsto c \tanh(s / c)` (Gemma 2), enters every path right after the score product.
It also owns the rule that a query without keys gets output zero; the power-of-two rescaling
that keeps scores and weighted sums below overflow (scale safety) is
:mod:`ctformer._numerics.scale_safety`. The mathematics and the validation live in
:func:`ctformer.operators.quadrature_attention`.
"""
from __future__ import annotations

import math
import sys

import array_api_compat
import numpy as np

from . import fused as _fused_kernel
from . import grouped as _grouped
from . import measured_blocks as _measured_blocks
from . import packed_attention as _packed_attention
from . import streamed as _numpy_paths
from .scale_safety import scale_safe_inputs, times_pow2
from ..discretizations.memory import check_allocation, surely_within

_NUMPY = array_api_compat.array_namespace(np.zeros(0))

# Scores per chunk (elements of one (chunk, M) block) for the generic path: ~8 MiB in
# float64 on the host; on a GPU larger blocks amortize the kernel launches.
_CHUNK_ELEMENTS = 1 << 20
_CHUNK_ELEMENTS_DEVICE = 1 << 27
# Problems with fewer score entries per (batch, head) than this are done batched in one go.
_STREAM_MIN_ENTRIES = 1 << 16
# torch's fused kernel from this many score entries in all (its call costs ~50 us)
_FUSED_MIN_ENTRIES = 1 << 16


def attend(xp, q, k, v, beta, log_w, keep, causal, diag_shift, lead, chunk, terms=None):
    """The path for the problem's size and namespace; every row of ``keep`` keeps a key.
    ``terms``: None, or the :class:`~ctformer._numerics.score_terms.ScoreTerms` of the scores (a
    soft cap, an additive term), before the log-weights and masks (torch's fused kernels have
    none: the library's paths take such problems)."""
    n, m = q.shape[-2], k.shape[-2]
    numpy = isinstance(q, np.ndarray)
    engine = _fused_kernel.engine_setting()  # read (and a bad value refused) at every size
    if terms is None and numpy and _fused(q, k, v, log_w, keep, causal, diag_shift, lead, chunk, engine):
        out = _numpy_paths.output_array(lead, n, v.shape[-1], q.dtype, _numpy_paths.head_axes(q, k, lead))
        scale = _one_value(beta)  # one beta for all heads: the kernel scales (no pass over q)
        if scale is not None:
            return _fused_kernel.fused_attention(q, k, v, scale, causal, lead, out)
        return _fused_kernel.fused_attention(q * beta, k, v, 1.0, causal, lead, out)
    if (terms is None and not numpy and engine != "streamed"
            and _torch_fusable(q, k, v, log_w, keep, causal, diag_shift, lead, chunk)):
        import torch

        return _fused_kernel.sdpa(torch, q * beta, k, v, 1.0, causal, lead)
    if numpy and q.dtype in (np.float32, np.float64) and (n * m >= _STREAM_MIN_ENTRIES or (
            keep is not None and chunk is None and n * m * math.prod(lead) > _CHUNK_ELEMENTS)):
        # masked problems too many for one batched pass: each (batch, head) a task
        # beta scales each query chunk inside the workers
        if _grouped.applies(q, k, v, lead, keep, causal, chunk, terms):
            return _grouped.stream_groups(q, beta, k, v, log_w, diag_shift, lead)
        geometry = _measured_blocks.geometry(q.dtype)
        packs = None
        if (q.dtype == np.float32 and keep is None and not causal and terms is None and m >= 2 * geometry.key_block
                and _packed_attention.fits(k, v) and _packed_attention.chosen(q.dtype)):
            packs = _packed_attention.packed_blocks(geometry.key_block)
        return _numpy_paths.stream(q, beta, k, v, log_w, keep, causal, diag_shift, lead, chunk, geometry, packs,
                                   terms)
    qs = q * beta  # beta folded into the queries: O(N d), cheaper than scaling every score
    if numpy and chunk is None and n * m < _STREAM_MIN_ENTRIES and lead and \
            n * m * math.prod(lead) >= _numpy_paths._PARALLEL_MIN_ENTRIES:
        # many heads (a sliding window's slabs too): blocks of heads on the worker threads
        out = _numpy_paths.small_blocks(qs, k, v, log_w, causal, diag_shift, lead, terms, keep)
    elif numpy and chunk is None and n * m * math.prod(lead) <= _CHUNK_ELEMENTS and n * m < _STREAM_MIN_ENTRIES:
        out = _numpy_paths.small(qs, k, v, log_w, keep, causal, diag_shift,
                                 out=_numpy_paths.output_array(lead, n, v.shape[-1], _common_dtype(qs, k, v),
                                                                _numpy_paths.head_axes(q, k, lead)), terms=terms)
    else:
        if chunk is None:
            target = _CHUNK_ELEMENTS_DEVICE if array_api_compat.is_cupy_array(q) else _CHUNK_ELEMENTS
            chunk = max(1, min(n, target // max(1, m * (math.prod(lead) or 1))))
        out = _stream_generic(xp, qs, k, v, log_w, keep, causal, diag_shift, int(chunk), terms)
    return out


def check_sizes(lead, n, m, e, dtype, chunk=None, name="chunk") -> None:
    r"""Refuse, before anything is allocated, an attention call whose output or whose blocks
    of scores would exceed the memory budget (``CTFORMER_MEMORY_BUDGET``).

    The output takes :math:`b \prod_\ell L_\ell \, N e` bytes (``b`` the dtype's size, ``L`` the
    leading axes after broadcasting); a ``chunk`` of query rows asked for meets all :math:`M`
    keys at once, :math:`b \cdot \min(\mathrm{chunk}, N) \, M` bytes of scores per (batch,
    head) problem on NumPy, all problems at once elsewhere.

    Raises
    ------
    ctformer.discretizations.SizeTooLargeError
        Naming the output or ``name`` (the argument that set the block), the bytes needed and
        the budget.
    """
    itemsize = getattr(dtype, "itemsize", None) or 8
    problems = math.prod(lead)
    rows = 0 if chunk is None else min(int(chunk), n)
    if surely_within(float(itemsize) * problems * max(n * e, rows * m)):
        return
    check_allocation(float(itemsize) * problems * n * e, f"the attention output of shape {(*lead, n, e)}",
                     "use fewer queries, batch entries or heads (the leading axes of q, k, v, beta "
                     "and the mask broadcast against each other: check that they do not multiply)")
    if chunk is not None:
        per_block = 1 if isinstance(dtype, np.dtype) else problems  # NumPy: one problem a worker
        check_allocation(float(itemsize) * per_block * rows * m,
                         f"{name}={chunk}: a block of {rows} x {m} scores",
                         f"pass a smaller {name}, or {name}=None (blocks of a few MiB)")


def batched(n: int, m: int, problems: int) -> bool:
    """Whether :func:`attend` does ``problems`` NumPy (batch, head) problems of ``n`` queries
    and ``m`` keys in the one batched pass of :func:`~ctformer._numerics.streamed.small`, for
    every weight and mask (fewer scores in all than torch's fused kernel and the streamed
    engine start from)."""
    return n * m * problems < min(_FUSED_MIN_ENTRIES, _STREAM_MIN_ENTRIES, _CHUNK_ELEMENTS)


def _common_dtype(qs, k, v):
    """``np.result_type(qs, k, v)``, answered at once when the three share a dtype."""
    dtype = qs.dtype
    return dtype if k.dtype == dtype and v.dtype == dtype else np.result_type(qs, k, v)


def _one_value(beta):
    """``beta`` as a float when it is one number (a float, or an array of equal entries), else None."""
    if isinstance(beta, (int, float)):
        return float(beta)
    flat = np.asarray(beta).reshape(-1)
    return float(flat[0]) if flat.size and bool(np.all(flat == flat[0])) else None


def _fused(q, k, v, log_w, keep, causal, diag_shift, lead, chunk, engine) -> bool:
    """Whether torch's fused kernel takes the problem: softmax attention as the kernel knows it
    (uniform weights, no mask but the square causal one, no chunking asked for), one float
    dtype, at least ``_FUSED_MIN_ENTRIES`` scores in all (below, its call costs more than
    the batched pass), :func:`ctformer._numerics.fused.fused_attention_ok` and
    :func:`~ctformer._numerics.fused.fused_chosen` (the engine setting, and for long plain or
    causal problems the engine measured faster on this machine)."""
    if log_w is not None or keep is not None or diag_shift is not None or chunk is not None:
        return False
    n, m = q.shape[-2], k.shape[-2]
    if (causal and n != m) or n * m * math.prod(lead) < _FUSED_MIN_ENTRIES:
        return False
    dims = len(lead) + 2
    return (q.ndim == k.ndim == v.ndim == dims and q.dtype == k.dtype == v.dtype
            and q.dtype in (np.float32, np.float64) and _fused_kernel.fused_attention_ok(q.dtype)
            and _fused_kernel.fused_chosen(q.dtype, causal, n * m, engine))


def _torch_fusable(q, k, v, log_w, keep, causal, diag_shift, lead, chunk) -> bool:
    """Whether torch tensors go to torch's fused kernel (``scaled_dot_product_attention``, with
    its backward): float32 or float64 on one device, uniform weights, no mask but the square
    causal one, no chunking asked for; as HuggingFace's modules compute attention. Elsewhere
    the query chunks of tensor operations (with ``torch.softmax``)."""
    torch = sys.modules.get("torch")
    if (torch is None or not isinstance(q, torch.Tensor) or log_w is not None or keep is not None
            or diag_shift is not None or chunk is not None or (causal and q.shape[-2] != k.shape[-2])):
        return False
    dims = len(lead) + 2
    return (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and q.ndim == k.ndim == v.ndim == dims
            and q.dtype == k.dtype == v.dtype and q.dtype in (torch.float32, torch.float64)
            and q.device == k.device == v.device)


# -- queries without keys -------------------------------------------------------------------------
def admissible_rows(xp, keep):
    r"""``(keep, empty)``: a mask in which every query keeps a key, and the queries that kept none.

    A query :math:`i` with :math:`m_{ij} = 0` for every key attends to an empty set: its
    output is the integral over that empty set, zero. Such rows are given every key here (any
    finite softmax will do) and :func:`zero_rows` sets their output to zero afterwards; ``empty``
    is None (and ``keep`` unchanged) when there is no such row, the usual case.
    """
    if keep is None:
        return None, None
    empty = ~xp.any(keep, axis=-1)
    if not bool(xp.any(empty)):
        return keep, None
    # a new mask as large as the caller's: refused by name where it cannot be held
    check_allocation(float(math.prod(keep.shape)), f"a copy of the mask of shape {tuple(keep.shape)}",
                     "its rows without keys (output zero) are given every key in a copy: use fewer "
                     "tokens a call, or a mask whose every query keeps a key")
    return keep | empty[..., None], empty


def zero_rows(xp, out, empty):
    """``out`` (..., N, e) with the rows ``empty`` (..., N or 1) set to zero (in place for NumPy)."""
    if empty is None:
        return out
    if isinstance(out, np.ndarray) and out.flags.writeable:
        np.copyto(out, 0, where=np.broadcast_to(empty[..., None], out.shape))
        return out
    zero = xp.zeros((), dtype=out.dtype, device=array_api_compat.device(out))
    return xp.where(empty[..., None], zero, out)


# -- generic path (any array namespace) ----------------------------------------------------------
def _stream_generic(xp, qs, k, v, log_w, keep, causal, diag_shift, chunk, terms=None):
    """Query chunks with functional array-API operations; returns (..., N, e)."""
    n, e = qs.shape[-2], v.shape[-1]
    softmax = _torch_softmax(qs)
    if softmax is None:  # the column of ones gives the denominator from the numerator's product
        v1 = xp.concat([v, xp.ones((*v.shape[:-1], 1), dtype=v.dtype)], axis=-1)
    blocks = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        cols = stop if causal else k.shape[-2]  # causal: keys after the chunk never count
        s = qs[..., start:stop, :] @ xp.matrix_transpose(k[..., :cols, :])
        if terms is not None:
            s = terms.applied(s, slice(start, stop), slice(0, cols))
        if log_w is not None:
            s = s + log_w[:cols]
        if causal:
            s = _mask_diagonal_block(xp, s, start, stop, diag_shift)
        elif keep is not None:
            rows = keep[..., start:stop, :] if keep.shape[-2] > 1 else keep
            s = xp.where(rows, s, -xp.inf)
        if softmax is not None:
            blocks.append(softmax(s) @ v[..., :cols, :])
            continue
        p = xp.exp(s - xp.max(s, axis=-1, keepdims=True))
        num = p @ v1[..., :cols, :]
        blocks.append(num[..., :e] / num[..., e:])
    return xp.concat(blocks, axis=-2) if len(blocks) > 1 else blocks[0]


def _torch_softmax(a):
    """For torch tensors, torch's softmax over the last axis (one fused pass, where maximum,
    exponential, sum and division as tensor operations took four; differentiable to any
    order); None for other arrays."""
    if not array_api_compat.is_torch_array(a):
        return None
    import torch

    return lambda s: torch.softmax(s, dim=-1)


def _mask_diagonal_block(xp, s, start, stop, diag_shift):
    """Mask keys j > i inside the diagonal block s[..., :, start:stop] (and halve j == i)."""
    r = stop - start
    i = xp.arange(r)[:, None]
    j = xp.arange(r)[None, :]
    block = xp.where(j <= i, s[..., start:], -xp.inf)
    if diag_shift is not None:
        block = block + xp.astype(j == i, s.dtype) * diag_shift
    return xp.concat([s[..., :start], block], axis=-1) if start else block


def attend_trusted(q, k, v, beta, weights, mask, diagonal, chunk=None, terms=None):
    """Quadrature attention on inputs already known to be valid (no check, no rescaling).

    ``mask`` is None, ``"causal"`` or a boolean keep array; ``weights`` positive or None;
    ``terms`` None or the scores' :class:`~ctformer._numerics.score_terms.ScoreTerms` (:func:`attend`).
    """
    xp, beta, log_w, keep, diag_shift, lead = trusted(q, k, v, beta, weights, mask, diagonal)
    return attend_rows(xp, q, k, v, beta, log_w, keep, isinstance(mask, str), diag_shift, lead, chunk, terms)


def attention_with_terms(q, k, v, beta, weights, mask, diagonal, check, terms):
    """:func:`attend_trusted` with the scores' ``terms`` (a
    :class:`~ctformer._numerics.score_terms.ScoreTerms`: soft cap, ALiBi), for the validated
    state of an attention operator; with ``check`` scale-safely (:func:`scale_safe_inputs`:
    inputs rescaled by powers of two where scores could overflow, NaN and inf refused by name)."""
    if not check:
        return attend_trusted(q, k, v, beta, weights, mask, diagonal, terms=terms)
    xp = array_api_compat.array_namespace(q, k, v)
    leading = beta if isinstance(beta, (int, float)) or beta.ndim == 0 else beta[..., None, None]
    q, scaled, k, v, v_scale = scale_safe_inputs(xp, q, k, v, leading)
    return times_pow2(xp, attend_trusted(q, k, v, beta if scaled is leading else scaled, weights, mask,
                                         diagonal, terms=terms), v_scale)


def attend_rows(xp, q, k, v, beta, log_w, keep, causal, diag_shift, lead, chunk, terms=None):
    """:func:`attend` after giving queries without keys every key, then zeroing their rows."""
    n = q.shape[-2]
    if type(q) is np.ndarray and not q.dtype == k.dtype == v.dtype:
        # one dtype for every path: the streamed ones computed in q's, the batched pass in the
        # promoted one, so float32 queries on float64 keys gave float32 or float64 by size
        dtype = np.result_type(q, k, v)
        q, k, v = (a.astype(dtype, copy=False) for a in (q, k, v))
    if n == 0:
        return xp.zeros((*lead, 0, v.shape[-1]), dtype=q.dtype)
    keep, empty = admissible_rows(xp, keep)
    return zero_rows(xp, attend(xp, q, k, v, beta, log_w, keep, causal, diag_shift, lead, chunk, terms), empty)


def trusted(q, k, v, beta, weights, mask, diagonal):
    """The few derived values a validated call needs (``check=False``): nothing is verified,
    but ``beta`` and the weights are brought to the inputs' dtype, as a checked call does (a
    NumPy float64 such as ``1 / np.sqrt(d)`` is a Python float subclass that NumPy's
    promotion treats as float64: it made float32 queries float64, and the result with them)."""
    xp = _NUMPY if type(q) is np.ndarray else array_api_compat.array_namespace(q, k, v)
    dtype = q.dtype if k.dtype == q.dtype and v.dtype == q.dtype else xp.result_type(q, k, v)
    lead = q.shape[:-2]
    if k.shape[:-2] != lead or v.shape[:-2] != lead:
        lead = np.broadcast_shapes(lead, k.shape[:-2], v.shape[:-2])
    if isinstance(beta, (int, float)):
        beta = float(beta)
    elif beta.ndim == 0 and not getattr(beta, "requires_grad", False):  # a learnable one stays
        beta = float(beta)
    else:
        if len(beta.shape) > len(lead) or lead[len(lead) - len(beta.shape):] != beta.shape:
            lead = np.broadcast_shapes(lead, beta.shape)
        beta = _in_dtype(xp, beta, dtype)[..., None, None]
    log_w = None if weights is None else log_in(xp, weights, dtype)
    keep = diag_shift = None
    if isinstance(mask, str):
        if diagonal == "half":
            diag_shift = math.log(0.5)
    elif mask is not None:
        keep = mask
        lead = np.broadcast_shapes(lead, mask.shape[:-2])
    return xp, beta, log_w, keep, diag_shift, tuple(lead)


def log_in(xp, weights, dtype):
    r""":math:`\log w` in ``dtype``, the logarithm taken in the weights' own precision where it
    is the wider one: float64 weights of 1e-50 (or 1e50) are 0 (inf) in float32, whose
    logarithm made every score of the key -inf (inf) and rows of NaN, where
    :math:`\log w = -115.1` is an ordinary float32 number."""
    if (type(weights) is np.ndarray and isinstance(dtype, np.dtype) and weights.dtype.kind == "f"
            and weights.dtype.itemsize > dtype.itemsize):
        return np.log(weights).astype(dtype)
    return xp.log(_in_dtype(xp, weights, dtype))


def _in_dtype(xp, a, dtype):
    """``a`` in ``dtype`` (itself where it has it already)."""
    return a if a.dtype == dtype else xp.astype(a, dtype)

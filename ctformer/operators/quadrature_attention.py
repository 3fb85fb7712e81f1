r"""Quadrature attention: the functional core of self-attention as an integral operator.

For queries :math:`q_i`, keys :math:`k_j`, values :math:`v_j` at token nodes :math:`x_j` with
quadrature weights :math:`w_j` and a mask :math:`m_{ij} \in \{0, 1\}`,

.. math::

    \mathrm{out}_i = \frac{\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j} v_j}
                          {\sum_j w_j m_{ij} e^{\beta q_i \cdot k_j}},

the quadrature of :math:`\int_X \gamma(x_i, x') v(x') dx'` with the state-dependent kernel
:math:`\gamma` of the design notes, section 1 (Tai, Liu, Li, Chan 2025, arXiv 2510.03989). Uniform
weights cancel (ordinary softmax attention); other weights enter as a log-weight bias,
:math:`\mathrm{softmax}_j(\beta q_i\cdot k_j + \log w_j)`.

The sum is computed with the row maximum subtracted (log-sum-exp), so the result is finite in
float32 and for very large :math:`\beta`; the inputs are rescaled by powers of two when the
scores or the weighted sums could overflow, so any finite input gives a finite answer. The code
is written once against the array namespace (NumPy, CuPy, ``array_api_strict``); small NumPy
problems take a lean batched path (a solve calls it thousands of times), large ones a streaming
path that reuses one score buffer per worker thread (:mod:`ctformer._numerics.threads`) and
never forms an N x M matrix.
"""
from __future__ import annotations

import math
import array_api_compat
import numpy as np

from .. import validation
from ..backend import to_host
from .activation_blocks import is_half, widened
from .._numerics import dense as _dense
from .._numerics import scale_safety as _scale_safety
from .._numerics.scale_safety import times_pow2

_NUMPY = array_api_compat.array_namespace(np.zeros(0))

__all__ = ["quadrature_attention"]

def quadrature_attention(q, k, v, *, beta, weights=None, mask=None, diagonal="full", chunk=None,
                         check=True):
    r"""Softmax attention as a quadrature of a nonlocal integral operator.

    .. math::

        \mathrm{out}_i = \frac{\sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)\, v_j}
                              {\sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)}

    Parameters
    ----------
    q : array_like, shape (..., N, d)
        Queries at the N query nodes.
    k : array_like, shape (..., M, d)
        Keys at the M key nodes.
    v : array_like, shape (..., M, e)
        Values at the M key nodes.
    beta : float or array
        Inverse temperature; a scalar or an array broadcasting to the leading (batch, head)
        axes of ``q``, ``k``, ``v`` and the mask, e.g. shape ``(H,)`` for one value per head
        when ``q`` is ``(B, H, N, d)``. Must be finite and real. A ``beta`` whose shape would
        enlarge those axes (``(3, 1, 1)`` beside a ``q`` of shape ``(3, N, d)``) is refused.
        A tensor ``beta`` that requires grad (0-d included) keeps its gradient.
    weights : array_like, shape (M,), optional
        Positive quadrature weights of the key nodes. Default: uniform (plain softmax).
    mask : None, "causal" or bool array broadcasting to (..., N, M), optional
        ``"causal"`` keeps :math:`x_j \le x_i` (requires N == M). A boolean array keeps the
        entries that are True; its last axis has length M, the one before it N or 1 (a key
        mask). A query whose row keeps no entry (a padding token that sees only padding)
        attends to an empty set of keys: its output is zero, the integral over the empty set.
    diagonal : {"full", "half"}
        With ``mask="causal"``: weight of the diagonal cell. ``"full"`` is the standard causal
        mask (first-order quadrature of :math:`\int_0^{x_i}`); ``"half"`` gives it weight
        :math:`w_i / 2` (second order on midpoint nodes, design notes, section 2).
    chunk : int, optional
        Number of query rows processed at once. Default: chosen so that one block of scores
        stays small (a few MiB on the CPU), never an N x M matrix for large N.
    check : bool, default True
        Validate the inputs (shapes, dtypes, finiteness) and guard against overflow. Callers
        that already validated their data (a solve validates its state once, at entry) pass
        ``check=False``: ``q``, ``k``, ``v`` must then be arrays of one namespace and one real
        floating dtype, finite and of moderate size (no rescaling is done), ``beta`` finite,
        ``weights`` positive and a mask valid; nothing of this is verified. ``beta`` and
        ``weights`` are brought to the inputs' dtype, as with ``check=True``: a NumPy float64
        ``beta`` leaves float32 inputs float32; ``beta``, ``weights`` and a mask given as
        NumPy arrays or lists beside tensors (or as tensors beside NumPy inputs) are
        converted to the inputs' kind and device first; a tensor that requires grad beside
        NumPy inputs is refused (no gradient would flow), checked or not.

    Returns
    -------
    array, shape (..., N, e)
        Same array library and dtype as the inputs (float32 stays float32; lists give NumPy
        float64). Half-precision inputs (float16; torch bfloat16) are computed in float32 and
        rounded once to their dtype.

    Raises
    ------
    ValueError
        For mismatched shapes, non-finite entries of ``q``, ``k``, ``v`` or ``weights`` (the
        message names the argument), non-positive weights, non-finite ``beta`` or one whose
        shape enlarges the leading axes, a mask of the wrong shape, or a bad ``chunk``.
    ctformer.discretizations.SizeTooLargeError
        (a ``ValueError`` and a ``MemoryError``) Before anything is allocated, where the output
        :math:`(\ldots, N, e)` (its leading axes broadcast) or, with ``chunk``, a block of
        ``chunk`` x M scores would exceed the memory budget (``CTFORMER_MEMORY_BUDGET``, by
        default half the available memory).
    TypeError
        For non-floating or complex inputs, a non-boolean mask, or a ``beta`` that is not a
        real number (strings and booleans are refused).

    Notes
    -----
    With :math:`s_{ij} = \beta q_i \cdot k_j + \log w_j` and the row maximum
    :math:`\mu_i = \max_{j: m_{ij}=1} s_{ij}`, the code evaluates

    .. math::

        \mathrm{out}_i = \frac{\sum_j m_{ij} e^{s_{ij} - \mu_i} v_j}{\sum_j m_{ij} e^{s_{ij} - \mu_i}},

    where every exponent is :math:`\le 0` and the largest is exactly 0, so nothing overflows and
    the denominator is at least 1, for any finite :math:`\beta`.

    *Queries without keys.* A row with :math:`m_{ij} = 0` for every :math:`j` has an empty
    sum above and below; its output is defined as zero (the integral over an empty set of
    keys), never NaN, in every path and array namespace, with or without ``check``. Padding
    masks produce such rows: with left padding (HuggingFace's batches for generation) and a
    causal mask, a padding token before the first real token sees no key. The zero rows
    never reach the other queries (a padding key is masked for everyone).

    *Half precision.* Float16 inputs (NumPy, CuPy, torch) and torch bfloat16 ones are widened to
    float32, attended there (as torch's SDPA accumulates them) and the result is
    rounded once to their dtype (as the activations and normalizations do): scores formed in
    float16 keep 11 bits, and :math:`e^{s}` turns a score's rounding :math:`\delta` into a
    relative error :math:`\delta` of its weight (at :math:`|s| \approx 200` that is 6%). The
    output is a convex combination of ``v``, so it stays within float16's range.

    *Scale safety* (``check=True``). With :math:`a_q, a_k, a_v` the largest magnitudes of
    ``q``, ``k``, ``v`` in each (batch, head) problem, the scores are bounded by
    :math:`|\beta| a_q a_k d` and the weighted sums by :math:`M a_v`. When a bound comes within
    a factor 8 of the largest number of the dtype, the inputs are first scaled by powers of two
    (exact): :math:`\hat q = 2^{-e_q} q`, :math:`\hat k = 2^{-e_k} k` with entries at most 1 and
    :math:`c = \beta\, 2^{e_q + e_k}` folded into the queries; if :math:`|c|` itself exceeds
    ``finfo.max / (8 d)`` it is clamped there, which changes nothing but rounding: the
    exponents :math:`c(\hat s_{ij} - \hat\mu_i)` of any gap above the rounding of
    :math:`\hat s` are then below :math:`-10^{290}` (float64), i.e. the softmax is its hard-max
    limit either way. ``v`` is scaled by :math:`2^{-e_v}` and the result by :math:`2^{e_v}`.
    So inputs of size 1e160 (float64) or 1e30 (float32) give the exact limit, never NaN or
    inf; tiny inputs (1e-160) keep full relative accuracy. Inputs of ordinary size take the
    unscaled path.

    *Paths.* NumPy softmax attention as torch's fused kernel knows it (no weights, no mask
    but the square causal one, ``diagonal="full"``, no ``chunk``, at least 65536 scores) goes
    to that kernel (``scaled_dot_product_attention``) on ``CTFORMER_NUM_THREADS`` threads,
    where torch does this machine's products and MKL's strict reproducibility mode is on
    (:mod:`ctformer._numerics.torch_threads`; a check at first use confirms that one and two threads
    give the same bits); it was 2-2.6x faster than the paths below on the attention of
    networks (8 x 128 and 4 x 512 tokens, 12 heads, Intel Xeon). ``CTFORMER_ATTENTION_ENGINE``
    pins the kernel (``fused``) or the paths below (``streamed``); with ``auto`` a causal
    problem of at least 2^20 scores runs on the one of the two measured faster on this
    machine (once, stored). Otherwise: small NumPy
    problems are done batched in one go (a handful of NumPy calls).
    Large NumPy problems, and masked ones with too many (batch, head) problems for one
    batched pass, are split into (batch, head, query chunk) tasks shared by
    ``CTFORMER_NUM_THREADS`` worker threads (default: the thread count of the BLAS library),
    each with its own score buffer of about 8 MiB, while the BLAS library is limited to one
    thread through ``threadpoolctl``. The chunks depend on the problem's shape and dtype only,
    never on the number of threads, so results are bit-identical for any
    ``CTFORMER_NUM_THREADS``. With a causal mask only the keys :math:`j \le i` are computed
    (half the work) and only the diagonal block of each chunk is masked. Extra memory is
    about ``threads x 8 MiB`` plus the output (no copies of ``q``, ``k`` or ``v``; inputs
    rescaled for scale safety are the exception). Set
    ``CTFORMER_NUM_THREADS=1`` when calling from several threads at once (e.g. a threaded Dask
    worker).
    """
    if _all_float16(q, k, v):  # computed in float32, rounded once (see Notes)
        return in_float32(quadrature_attention, q, k, v, beta=beta, weights=weights, mask=mask,
                          diagonal=diagonal, chunk=chunk, check=check)
    if not check:
        beta, weights, mask = _beside(q, beta, "beta"), _beside(q, weights, "weights"), _beside(q, mask, "mask")
        return _dense.attend_trusted(q, k, v, beta, weights, mask, diagonal, chunk)
    xp, q, k, v, beta, log_w, keep, diag_shift, lead, amax = _validate(q, k, v, beta, weights, mask, diagonal)
    if chunk is not None:
        chunk = validation.integer(chunk, "chunk")
    _dense.check_sizes(lead, q.shape[-2], k.shape[-2], v.shape[-1], q.dtype, chunk)
    if q.shape[-2] == 0:
        return xp.zeros((*lead, 0, v.shape[-1]), dtype=q.dtype, device=array_api_compat.device(q))
    q, beta, k, v, v_scale = _scale_safety.scaled_inputs(xp, q, k, v, beta, amax)
    out = _dense.attend_rows(xp, q, k, v, beta, log_w, keep, isinstance(mask, str), diag_shift, lead, chunk)
    return times_pow2(xp, out, v_scale)


def _all_float16(q, k, v) -> bool:
    """Whether ``q``, ``k``, ``v`` are half-precision arrays of one dtype (:func:`is_half`)."""
    return is_half(q) and k.dtype == q.dtype and v.dtype == q.dtype and is_half(k) and is_half(v)


def in_float32(attend, q, k, v, *args, **options):
    """``attend(q, k, v, ...)``; half-precision heads (:func:`is_half`) in float32, the result
    rounded once to their dtype (scores rounded to float16 put errors of several percent on
    their weights)."""
    if not _all_float16(q, k, v):
        return attend(q, k, v, *args, **options)
    out = attend(widened(q), widened(k), widened(v), *args, **options)
    if type(out) is np.ndarray:
        return out.astype(q.dtype)
    xp = array_api_compat.array_namespace(out)
    return xp.astype(out, q.dtype)


def _beside(q, a, name):
    """``a`` (a beta, weights or a mask of an unchecked call, named ``name``) as an array of
    ``q``'s kind and device: NumPy arrays or lists beside tensors (and tensors beside NumPy) had
    failed inside the kernels (``'numpy.ndarray' object has no attribute 'to'``). Numbers,
    strings, None and arrays of ``q``'s type pass as they are (the hot path of a solve). A
    tensor that requires grad beside NumPy inputs is refused, as with ``check=True``: its
    NumPy copy had silently cut it from autograd."""
    if a is None or type(a) is type(q) or isinstance(a, (str, int, float)):
        return a
    if type(q) is np.ndarray:
        if getattr(a, "requires_grad", False):
            raise TypeError(f"{name} is a torch tensor that requires grad beside NumPy inputs, through "
                            "which no gradient flows: pass q, k and v as torch tensors, or detach it")
        return to_host(a)
    if isinstance(a, (list, tuple)):
        a = np.asarray(a)  # Python floats are float64 (torch's asarray would read them as float32)
    return array_api_compat.array_namespace(q).asarray(a, device=array_api_compat.device(q))


# -- validation -----------------------------------------------------------------------------------
def _as_array(a, name):
    """An array of a known namespace; lists and tuples of numbers become NumPy float64."""
    if isinstance(a, np.ndarray) or hasattr(a, "__array_namespace__") or array_api_compat.is_array_api_obj(a):
        return a
    try:
        arr = np.asarray(a)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an array of real numbers, got {type(a).__name__}: {exc}") from None
    if arr.dtype.kind in "iu":
        arr = arr.astype(np.float64)
    return arr


def _validate(q, k, v, beta, weights, mask, diagonal):
    """Checked and converted arguments; ``amax`` is (max|q|, max|k|, max|v|) as Python floats."""
    q, k, v = (_as_array(a, name) for a, name in ((q, "q"), (k, "k"), (v, "v")))
    if (type(q) is np.ndarray and type(k) is np.ndarray and type(v) is np.ndarray
            and q.dtype == k.dtype == v.dtype and q.dtype.kind == "f"):
        xp = _NUMPY  # the common case, without the generic dtype machinery (a solve calls this often)
    else:
        xp = _namespace_and_dtype_checks(q, k, v)
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., tokens, features), got shape {tuple(a.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature size, got {q.shape[-1]} and {k.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of tokens, got {k.shape[-2]} and {v.shape[-2]}")
    n, m = q.shape[-2], k.shape[-2]
    if m == 0:
        raise ValueError("k and v must hold at least one key token, got 0")
    shapes = [("q", q.shape[:-2]), ("k", k.shape[:-2]), ("v", v.shape[:-2])]
    if not q.dtype == k.dtype == v.dtype:  # NumPy too: its beta and weights were cast to q's dtype
        dtype = xp.result_type(q, k, v)
        q, k, v = (xp.astype(a, dtype, copy=False) for a in (q, k, v))
    dtype = q.dtype
    amax = _scale_safety.finite_abs_max(xp, q, k, v)

    # NumPy beta, weights and masks beside tensors go to the tensors' device, not torch's default
    device = None if xp is _NUMPY else array_api_compat.device(q)
    beta = _check_beta(xp, beta, dtype, shapes, device)
    log_w = None if weights is None else _log_weights(xp, weights, dtype, m, device)
    keep, diag_shift = _check_mask(xp, mask, diagonal, n, m, shapes, device)
    try:
        lead = tuple(np.broadcast_shapes(*(tuple(s) for _, s in shapes)))
    except ValueError:
        listed = ", ".join(f"{name} {tuple(s)}" for name, s in shapes)
        raise ValueError(f"leading (batch, head) axes do not broadcast: {listed}") from None
    _check_beta_fits(shapes, lead)
    return xp, q, k, v, beta, log_w, keep, diag_shift, lead, amax


def _check_beta_fits(shapes, lead):
    """ValueError where beta's shape enlarges the leading axes set by q, k, v and the mask: one
    temperature per (batch, head) problem, never a new batch of outputs (almost surely a misuse,
    such as ``beta[:, None, None]`` where the heads are the first axis of q)."""
    others = [tuple(s) for name, s in shapes if name != "beta"]
    own = tuple(np.broadcast_shapes(*others))
    if own != lead:
        beta_shape = next(tuple(s) for name, s in shapes if name == "beta")
        raise ValueError(
            f"beta of shape {beta_shape} would enlarge the output's leading (batch, head) axes "
            f"from {own} (those of q, k, v and the mask) to {lead}; beta must broadcast to {own}, "
            + (f"e.g. shape ({own[-1]},) for one value per head on the last leading axis" if own
               else "i.e. a scalar, as q, k and v have no leading axes")
        )


def _namespace_and_dtype_checks(q, k, v):
    """The array namespace of q, k, v after refusing complex and non-floating inputs."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        kind = getattr(getattr(a, "dtype", None), "kind", None)
        if kind == "c" or (kind is None and "complex" in str(getattr(a, "dtype", ""))):
            raise TypeError(f"{name} must be real; complex inputs are not supported (got dtype {a.dtype})")
        if kind is not None and kind != "f":
            raise TypeError(f"q, k, v must be real floating arrays, got dtype {a.dtype} for {name}")
    try:
        xp = array_api_compat.array_namespace(q, k, v)
    except TypeError as exc:
        raise TypeError(f"q, k, v must be arrays of one array library: {exc}") from None
    if not xp.isdtype(xp.result_type(q, k, v), "real floating"):
        raise TypeError(f"q, k, v must be real floating arrays, got dtype {xp.result_type(q, k, v)}")
    return xp


def _check_beta(xp, beta, dtype, shapes, device=None):
    """A finite Python float, or an array (..., 1, 1) of dtype; appends its shape to ``shapes``."""
    if isinstance(beta, (bool, np.bool_, str, bytes, complex, np.complexfloating)):
        raise TypeError(f"beta must be a real number or an array of them, got {beta!r}")
    if isinstance(beta, (int, float, np.floating, np.integer)):
        if not math.isfinite(float(beta)):
            raise ValueError(f"beta must be finite, got {beta!r}")
        return float(beta)
    arr = _real_array(xp, beta, dtype, "beta must be a real number or an array of them", device)
    if not math.isfinite(_scale_safety.global_abs_max(xp, arr)):
        raise ValueError("beta must be finite")
    if arr.ndim == 0:  # a learnable temperature keeps its graph (float() cut it from autograd)
        return arr[..., None, None] if getattr(arr, "requires_grad", False) else float(arr)
    shapes.append(("beta", arr.shape))
    return arr[..., None, None]


def _real_array(xp, value, dtype, expected: str, device=None):
    """``value`` as a real array of ``dtype`` in ``xp`` (on ``device`` when given); TypeError
    ``expected, got ...`` else."""
    if xp is _NUMPY and type(value) is np.ndarray and value.dtype.kind == "f":
        return value.astype(dtype, copy=False)
    learnable = getattr(value, "requires_grad", False)  # a tensor in autograd: keep its graph
    if learnable and xp is _NUMPY:
        raise TypeError(f"{expected}, got a torch tensor that requires grad beside NumPy inputs, "
                        "through which no gradient flows: pass q, k and v as torch tensors, or "
                        "detach it")
    try:
        if isinstance(value, (list, tuple)):
            value = np.asarray(value)  # Python floats as float64: torch's asarray rounded them to float32
        if learnable:
            arr = value if device is None else value.to(device)
        else:
            arr = xp.asarray(value) if device is None else xp.asarray(value, device=device)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{expected}, got {value!r}") from exc
    if not (xp.isdtype(arr.dtype, "real floating") or xp.isdtype(arr.dtype, "integral")):
        raise TypeError(f"{expected}, got dtype {arr.dtype}")
    return xp.astype(arr, dtype)


def _log_weights(xp, weights, dtype, m, device=None):
    """log of positive, finite quadrature weights of shape (m,), in dtype (on ``device``)."""
    if isinstance(weights, (str, bytes)):
        raise TypeError(f"weights must be an array of positive numbers, got {weights!r}")
    # host weights beside narrower inputs are checked and logged in float64: 1e-50 is a positive
    # weight whose float32 is 0 (log -inf: rows of NaN), log(1e-50) = -115.1 an ordinary float32
    host = type(weights) is np.ndarray or not hasattr(weights, "__dlpack__")  # lists, numbers too
    wide = host and getattr(dtype, "itemsize", 8) < 8
    w = _real_array(_NUMPY if wide else xp, weights, np.float64 if wide else dtype,
                    "weights must be an array of positive numbers", None if wide else device)
    if w.ndim != 1 or w.shape[0] != m:
        raise ValueError(f"weights must have shape ({m},) (one per key token), got {tuple(w.shape)}")
    lo, hi = float(_NUMPY.min(w) if wide else xp.min(w)), float(_NUMPY.max(w) if wide else xp.max(w))
    if not (math.isfinite(hi) and math.isfinite(lo)):
        raise ValueError("weights must be finite; they contain NaN or inf")
    if not lo > 0:
        raise ValueError("weights must be positive and finite")
    if not wide:
        return xp.log(w)
    log_w = np.log(w)
    return log_w.astype(dtype) if xp is _NUMPY else \
        (xp.asarray(log_w, dtype=dtype) if device is None else xp.asarray(log_w, dtype=dtype, device=device))


def _check_mask(xp, mask, diagonal, n, m, shapes, device=None):
    validation.one_of(diagonal, "diagonal", ("full", "half"))
    if mask is None:
        if diagonal == "half":
            raise ValueError("diagonal='half' only applies with mask='causal'")
        return None, None
    if isinstance(mask, str):
        if mask != "causal":
            raise ValueError(f"mask must be None, 'causal' or a boolean array, got {mask!r}")
        if n != m:
            raise ValueError(f"mask='causal' needs as many queries as keys, got {n} and {m}")
        return None, (math.log(0.5) if diagonal == "half" else None)
    keep = xp.asarray(mask) if device is None else xp.asarray(mask, device=device)
    if keep.dtype != xp.bool:
        raise TypeError(f"mask array must be boolean (True = keep), got dtype {keep.dtype}")
    if keep.ndim < 2 or keep.shape[-1] != m or keep.shape[-2] not in (1, n):
        raise ValueError(
            f"mask array must have shape (..., {n}, {m}) or (..., 1, {m}), got {tuple(keep.shape)}"
        )
    if diagonal == "half":
        raise ValueError("diagonal='half' only applies with mask='causal'")
    shapes.append(("mask", keep.shape[:-2]))
    return keep, None



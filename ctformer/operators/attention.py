r"""Multi-head self-attention as a nonlocal integral operator in the token variable.

For heads :math:`h = 1, \dots, H` (design notes, section 1; Tai, Liu, Li, Chan 2025),

.. math::

    q^h = W_Q^h u + b_Q^h, \quad k^h = W_K^h u + b_K^h, \quad v^h = W_V^h u + b_V^h
    \qquad \text{(functions on } X \times Y_h),

    s^h(x, x') = \beta_h \int_{Y_h} q^h(x, \sigma)\, k^h(x', \sigma)\, d\sigma, \qquad
    \gamma^h(x, x') = \frac{m(x, x') e^{s^h(x, x')}}{\int_X m(x, x'') e^{s^h(x, x'')} dx''},

    \mathrm{Attn}(u)(x, y) = \sum_h \int_{Y_h} W_O^h(y, \sigma)
        \int_X \gamma^h(x, x')\, v^h(x', \sigma)\, dx'\, d\sigma + b_O(y).

Discretized, the :math:`\sigma` integral is the head-feature quadrature and the :math:`x'`
integral is :func:`~ctformer.operators.quadrature_attention.quadrature_attention` with the token
weights. With midpoint grids, :math:`\beta_h = \sqrt{d_h}` and :class:`~ctformer.kernels.PiecewiseConstant`
kernels from the blocks of torch's in- and out-projections, this is exactly
``torch.nn.MultiheadAttention`` (design notes, section 2).

Components of current Transformers (design notes, section 10):

* grouped-query attention: :math:`H` query heads share :math:`H_{kv}` key/value heads, head
  :math:`h` reading key/value head :math:`\lfloor h H_{kv} / H \rfloor` (``kv_heads``);
* positions :math:`p(x) = L s(x) - 1/2` (:meth:`ctformer.Grids.positions`) enter through
  :class:`~ctformer.operators.positions.RoPE` (queries and keys rotated in :math:`\sigma`) or
  :class:`~ctformer.operators.positions.ALiBi` (:math:`-m_h |p(x) - p(x')|` added to the
  exponent);
* a sliding window :math:`m(x, x') = 1\{0 \le p(x) - p(x') < W\}` (``window``), computed by
  :func:`~ctformer.operators.local_attention.local_attention` in :math:`O(N W)`.
"""
from __future__ import annotations

import math
from numbers import Real

import array_api_compat
import numpy as np

from ..backend import matmul_rows, namespace, plus_bias
from ..kernels import Kernel, is_host
from ..model_inputs import renamed_keyword
from .base import Constants, Grids, Operator
from .functions import as_feature_function, named_parameters
from .local_attention import local_attention, window_pattern
from .positions import ALiBi, RoPE, rotate
from .quadrature_attention import quadrature_attention
from .threads import by_row_blocks

__all__ = ["Attention"]

_NUMPY = array_api_compat.array_namespace(np.zeros(1))


def _kernel_list(kernels, name: str) -> list:
    if isinstance(kernels, Kernel):
        kernels = [kernels]
    try:
        kernels = list(kernels)
    except TypeError:
        raise TypeError(f"{name} must be a list of Kernel objects (one per head), got {type(kernels).__name__}") from None
    if not kernels:
        raise ValueError(f"{name} must contain at least one kernel (one per head)")
    for h, k in enumerate(kernels):
        if not isinstance(k, Kernel):
            raise TypeError(f"{name}[{h}] must be a ctformer.kernels.Kernel, got {type(k).__name__}")
    return kernels


class Attention(Operator):
    r"""Multi-head self-attention with feature kernels, biases and one temperature per head.

    Parameters
    ----------
    W_Q, W_K, W_V : list of Kernel
        One kernel per head, mapping features :math:`Y` to head features :math:`Y_h`.
        ``heads = len(W_Q)``; all four lists must have that length.
    W_O : list of Kernel
        One kernel per head, mapping head features :math:`Y_h` to features :math:`Y`.
    b_Q, b_K, b_V : list of feature functions, optional
        One bias per head on :math:`Y_h` (``None`` entries are zero); see
        :mod:`ctformer.operators.functions`.
    b_O : feature function, optional
        Output bias on :math:`Y`.
    beta : float or sequence of float
        Inverse temperature :math:`\beta_h`, one number for all heads or one per head; finite.
    mask : {None, "causal"}
        ``"causal"`` keeps :math:`x' \le x`.
    diagonal : {"full", "half"}
        With a causal mask, the weight of the diagonal cell: ``"full"`` (the standard causal
        mask, first order) or ``"half"`` (second order on midpoint grids).
    kv_heads : int, optional
        Number :math:`H_{kv}` of key/value heads (grouped-query attention); it must divide
        ``heads``, and ``W_K``, ``W_V``, ``b_K``, ``b_V`` then have :math:`H_{kv}` entries.
        Default: ``heads`` (one key/value head per query head).
    positions : RoPE, ALiBi or None
        How token positions enter the scores (:mod:`ctformer.operators.positions`). The grids
        must then have a ``context_length``.
    window : float, optional
        Sliding window :math:`W` (in positions): keys with :math:`0 \le p(x) - p(x') < W`.
        Needs ``mask="causal"`` and ``diagonal="full"``.

    Raises
    ------
    TypeError
        If a kernel list holds something that is not a kernel.
    ValueError
        If the lists have different lengths, ``beta`` is not finite or has the wrong length,
        ``mask`` or ``diagonal`` is not one of the allowed values, a bias list has the wrong
        length, ``kv_heads`` does not divide ``heads``, ``positions`` is of an unknown kind, or
        ``window`` is not a positive number or lacks the causal mask.

    Notes
    -----
    ``discretize(grids)`` returns ``f(u, padding_mask=None, *, check=False)``: ``u`` has shape
    ``(..., Nq_tokens, Nq_features)``; ``padding_mask`` is an optional boolean array
    ``(..., N)`` (True = a real token, kept as a key), combined with the causal mask (and the
    window). A query that keeps no key (left padding with the causal mask) gets attention
    output zero, the integral over an empty set of keys, in every path (dense, streamed,
    windowed, ALiBi, grouped-query; NumPy and torch); no real token reads it. ``f`` trusts
    ``u`` (a solve validates its state once, where it enters); ``check=True``, what
    :meth:`__call__` passes, evaluates it scale-safely and reports overflow by name.

    The scores use the head-feature quadrature,
    :math:`s_{ij} = \beta_h \sum_\sigma w_\sigma q_{i\sigma} k_{j\sigma}`: the query kernel is
    pre-scaled by :math:`w_\sigma`, the three projections of all heads are one matrix product
    (as torch's packed in-projection), and ``quadrature_attention`` runs with one
    :math:`\beta_h` per head, all heads in one call on arrays ``(..., H, N, d_h)``. Token weights are
    ``grids.tokens.quadrature_weights``; uniform weights are dropped (they cancel), others
    act as a log-weight bias.
    """

    def __init__(self, W_Q, W_K, W_V, W_O, *, b_Q=None, b_K=None, b_V=None, b_O=None,
                 beta=1.0, mask=None, diagonal="full", kv_heads=None, positions=None, window=None):
        self.W_Q = _kernel_list(W_Q, "W_Q")
        self.heads = len(self.W_Q)
        if kv_heads is None:
            self.kv_heads = self.heads
        else:
            if isinstance(kv_heads, bool) or not isinstance(kv_heads, (int, np.integer)) or kv_heads < 1:
                raise ValueError(f"kv_heads must be a positive integer, got {kv_heads!r}")
            if self.heads % kv_heads:
                raise ValueError(f"kv_heads={kv_heads} must divide the number of heads {self.heads}")
            self.kv_heads = int(kv_heads)
        for name, ks in (("W_K", W_K), ("W_V", W_V), ("W_O", W_O)):
            ks = _kernel_list(ks, name)
            expected = self.heads if name == "W_O" else self.kv_heads
            if len(ks) != expected:
                if name == "W_O" or kv_heads is None:
                    raise ValueError(
                        f"W_Q, W_K, W_V and W_O must have one kernel per head; W_Q has {self.heads}, "
                        f"{name} has {len(ks)} (for grouped-query attention pass kv_heads=...)"
                    )
                raise ValueError(f"{name} must have one kernel per key/value head (kv_heads={self.kv_heads}), "
                                 f"got {len(ks)}")
            setattr(self, name, ks)
        for name, bs in (("b_Q", b_Q), ("b_K", b_K), ("b_V", b_V)):
            count = self.heads if name == "b_Q" else self.kv_heads
            if bs is not None:
                if isinstance(bs, (str, bytes)) or not hasattr(bs, "__len__"):
                    raise TypeError(f"{name} must be None or a list of {count} feature functions (one per head)")
                if len(bs) != count:
                    raise ValueError(f"{name} must have one entry per head ({count}), got {len(bs)}")
                bs = [as_feature_function(b, f"{name}[{h}]") for h, b in enumerate(bs)]
                if all(b.is_none for b in bs):
                    bs = None
            setattr(self, name, bs)
        self.b_O = as_feature_function(b_O, "b_O")
        self.beta = self._check_beta(beta)
        if mask not in (None, "causal"):
            raise ValueError(f"mask must be None or 'causal', got {mask!r}")
        if diagonal not in ("full", "half"):
            raise ValueError(f"diagonal must be 'full' or 'half', got {diagonal!r}")
        if diagonal == "half" and mask is None:
            raise ValueError("diagonal='half' only applies with mask='causal'")
        self.mask, self.diagonal = mask, diagonal
        if positions is not None and not isinstance(positions, (RoPE, ALiBi)):
            raise ValueError(f"positions must be None, a RoPE or an ALiBi object, got {positions!r}")
        if isinstance(positions, ALiBi):
            positions.slopes_for(self.heads)  # one slope per head
        self.positions = positions
        if window is not None:
            if isinstance(window, bool) or not isinstance(window, Real) or not np.isfinite(window) or window <= 0:
                raise ValueError(f"window must be a finite number > 0 (in positions), got {window!r}")
            if mask != "causal" or diagonal != "full":
                raise ValueError("window (sliding-window attention, 0 <= p(x) - p(x') < W) needs "
                                 "mask='causal' and diagonal='full'")
            window = float(window)
        self.window = window

    def _check_beta(self, beta) -> np.ndarray:
        if isinstance(beta, Real) and not isinstance(beta, (bool, np.bool_)):
            beta = [float(beta)] * self.heads
        values = np.asarray(beta) if not isinstance(beta, (str, bytes)) else np.asarray([beta])
        if values.dtype.kind not in "iuf":   # strings, booleans, complex numbers, objects
            raise TypeError(f"beta must be a real number or a list of {self.heads} real numbers, "
                            f"got {beta!r}")
        try:
            arr = np.array(beta, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"beta must be a number or a list of {self.heads} numbers, got {beta!r}") from None
        if arr.ndim == 0:
            arr = np.full(self.heads, float(arr))
        if arr.shape != (self.heads,):
            raise ValueError(f"beta must be a number or have one value per head ({self.heads}), got shape {arr.shape}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"beta must be finite, got {arr.tolist()}")
        arr.setflags(write=False)
        return arr

    def __repr__(self) -> str:
        extra = ""
        if self.kv_heads != self.heads:
            extra += f", kv_heads={self.kv_heads}"
        if self.positions is not None:
            extra += f", positions={self.positions!r}"
        if self.window is not None:
            extra += f", window={self.window!r}"
        return (f"Attention(heads={self.heads}, beta={self.beta.tolist()}, mask={self.mask!r}, "
                f"diagonal={self.diagonal!r}{extra})")

    def __call__(self, u, grids: Grids, padding_mask=None, *, key_mask=None):
        r"""Apply the operator to point values ``u`` on ``grids``: validated, scale-safe.

        Parameters
        ----------
        u : array, shape ``(..., Nq_tokens, Nq_features)``
            Real, floating and finite (checked here, once).
        grids : Grids
        padding_mask : bool array ``(..., N)``, optional
            True = a real token: only those are keys (``key_mask`` is its deprecated name).
            A query left without any key (with left padding and the causal mask, a padding
            token before the first real one) gets attention output zero, the integral over
            an empty set of keys; the padding tokens never reach the real ones.

        Returns
        -------
        array, same shape, namespace and dtype as ``u``

        Raises
        ------
        TypeError, ValueError
            For a ``u`` of the wrong kind, shape or with NaN or inf, or a bad ``padding_mask``.
        FloatingPointError
            When a projection or the output exceeds the dtype's range (not representable).

        Notes
        -----
        Unlike the discretized callable used in a solve (``discretize(grids)``, which trusts
        its validated state and checks nothing per step), this call evaluates the softmax
        scale-safely, as ``quadrature_attention(..., check=True)``: scores
        :math:`eta_h\, q \cdot k` that would overflow are computed from inputs rescaled by
        powers of two, so ``1e300 * u`` or ``beta=1e308`` give the finite hard-max limit
        (plain, causal, windowed, ALiBi, grouped-query), never NaN.
        """
        padding_mask = renamed_keyword("key_mask", key_mask, "padding_mask", padding_mask)
        return super().__call__(u, grids, padding_mask=padding_mask, check=True)

    def parameters(self) -> dict:
        """Named arrays of the kernels and biases (``W_Q.<head>.<kernel parameter>``, ...)."""
        return named_parameters(W_Q=self.W_Q, W_K=self.W_K, W_V=self.W_V, W_O=self.W_O,
                                b_Q=self.b_Q, b_K=self.b_K, b_V=self.b_V, b_O=self.b_O)

    def host_arrays(self, grids: Grids) -> dict:
        """The stacked host arrays of the discretized operator on ``grids``.

        Returns
        -------
        dict
            ``"Q"``: ``(H, nq_h, nq_y)``, ``"K"``, ``"V"``: ``(H_kv, nq_h, nq_y)`` kernel matrices; ``"O"``: the
            output kernels concatenated over heads, ``(H * nq_h, nq_y)`` (transposed, ready to
            right-multiply); ``"b_Q"``, ``"b_K"``, ``"b_V"``: ``(H or H_kv, 1, nq_h)`` or None;
            ``"b_O"``: ``(nq_y,)`` or None; ``"w_sigma"``: ``(nq_h,)``; ``"beta"``: ``(H,)``;
            ``"w_tokens"``: ``(nq_x,)`` or None when uniform.
        """
        y, sigma = grids.features, grids.head_features
        xp, on = _assembly(self.parameters())
        arrays = {name: xp.stack([on(k.matrix(sigma, y)) for k in getattr(self, f"W_{name}")])
                  for name in ("Q", "K", "V")}
        w_o = xp.stack([on(k.matrix(y, sigma)) for k in self.W_O])  # (H, nq_y, nq_h)
        arrays["O"] = xp.reshape(xp.permute_dims(w_o, (0, 2, 1)), (-1, w_o.shape[1]))
        for name in ("b_Q", "b_K", "b_V"):
            bs = getattr(self, name)
            if bs is None or all(b.is_none for b in bs):
                arrays[name] = None
                continue
            rows = [b.evaluate(sigma) for b in bs]
            zeros = np.zeros(len(sigma.quadrature_nodes))
            arrays[name] = xp.stack([on(zeros if r is None else r) for r in rows])[:, None, :]
        arrays["b_O"] = None if self.b_O.is_none else on(self.b_O.evaluate(y))
        arrays["w_sigma"] = np.asarray(sigma.quadrature_weights, dtype=np.float64) / sigma.length
        arrays["beta"] = np.asarray(self.beta)
        w = np.asarray(grids.tokens.quadrature_weights, dtype=np.float64)
        arrays["w_tokens"] = None if np.all(w == w[0]) else w / grids.tokens.length
        return arrays

    def _constants(self, host: dict, grids: Grids) -> Constants:
        """The host constants of the discretized operator: one packed projection matrix
        (queries pre-scaled by the head-feature weights; rows (H + 2 H_kv, nq_h), as torch's
        packed in-projection), its bias, the output matrix, the temperatures (grouped by
        key/value head), the token weights, the RoPE tables and the ALiBi slopes."""
        heads, kv_heads = self.heads, self.kv_heads
        xp, on = _assembly(self.parameters())
        n_sigma, groups = host["Q"].shape[1], heads // kv_heads
        w_sigma = on(host["w_sigma"])
        stacked = xp.concat([host["Q"] * w_sigma[None, :, None], host["K"], host["V"]])
        biases = [host[name] for name in ("b_Q", "b_K", "b_V")]
        bias = None
        if any(b is not None for b in biases):
            biases = [on(np.zeros((count, 1, n_sigma))) if b is None else b
                      for b, count in zip(biases, (heads, kv_heads, kv_heads))]
            biases[0] = biases[0] * w_sigma
            bias = xp.reshape(xp.concat(biases), (-1,))
        rope = self.positions.tables(grids) if isinstance(self.positions, RoPE) else (None, None)
        alibi = None
        if isinstance(self.positions, ALiBi):
            alibi = self.positions.slopes_for(heads)
            alibi = alibi if groups == 1 else alibi.reshape(kv_heads, groups)
        qkv_t = xp.matrix_transpose(xp.reshape(stacked, (-1, stacked.shape[-1])))
        return Constants(
            QKV_t=np.ascontiguousarray(qkv_t) if isinstance(qkv_t, np.ndarray) else qkv_t,
            b_QKV=bias, O=host["O"], b_O=host["b_O"], w_tokens=host["w_tokens"],
            beta=host["beta"] if groups == 1 else host["beta"].reshape(kv_heads, groups),
            cos=rope[0], sin=rope[1], slopes=alibi,
        )

    def _discretize(self, grids: Grids):
        if self.mask == "causal" and getattr(grids.tokens, "dimension", 1) != 1:
            raise ValueError(f"mask='causal' orders tokens on an interval; the token domain "
                             f"{grids.tokens!r} is two-dimensional and has no causal order (and no "
                             "convergence order for it): use mask=None")
        host = self.host_arrays(grids)
        heads, kv_heads, n_tokens = self.heads, self.kv_heads, grids.shape[0]
        n_sigma = host["Q"].shape[1]
        groups = heads // kv_heads
        positions = grids.positions() if self.positions is not None or self.window is not None else None
        constants = self._constants(host, grids)
        rope = constants.host["cos"] is not None
        alibi = constants.host["slopes"]
        mask, diagonal, window = self.mask, self.diagonal, self.window
        pattern = None if window is None else window_pattern(positions, window)
        local = window is not None or alibi is not None
        w_tokens_host = host["w_tokens"]

        # the two projections are token-wise: large NumPy states run them by row blocks
        project_qkv = by_row_blocks(
            lambda v: plus_bias(matmul_rows(v, constants("QKV_t", v)), constants("b_QKV", v)),
            width=constants.host["QKV_t"].shape[-1])
        project_out = by_row_blocks(
            lambda v: plus_bias(matmul_rows(v, constants("O", v)), constants("b_O", v)),
            width=constants.host["O"].shape[-1])

        def attention(u, padding_mask=None, *, check=False):
            if not check:
                return attend(u, padding_mask, False)
            with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by name
                return attend(u, padding_mask, True)

        def attend(u, padding_mask, check):
            xp = namespace(u)
            qkv = project_qkv(u)
            lead = tuple(u.shape[:-2])
            # one reshape and one axis move for all projections: (..., H + 2 H_kv, N, d_h)
            qkv = _swap_heads_tokens(xp, xp.reshape(qkv, (*lead, n_tokens, heads + 2 * kv_heads, n_sigma)))
            q, k, v = qkv[..., :heads, :, :], qkv[..., heads:heads + kv_heads, :, :], \
                qkv[..., heads + kv_heads:, :, :]
            if rope:
                cos, sin = constants("cos", u), constants("sin", u)
                q, k = rotate(xp, q, cos, sin), rotate(xp, k, cos, sin)
            if check:
                for name, a in (("query", q), ("key", k), ("value", v)):
                    _refuse_overflow(xp, a, u, f"the {name} projection")
            if groups > 1:  # head h = g * groups + r reads key/value head g (no copies)
                q = xp.reshape(q, (*lead, kv_heads, groups, n_tokens, n_sigma))
                k, v = k[..., None, :, :], v[..., None, :, :]
            extra_axes = 1 if groups > 1 else 0
            if local:
                km = _padding(xp, padding_mask, u, n_tokens, diagonal)
                if km is not None:
                    km = xp.reshape(km, (*km.shape[:-1], *([1] * (1 + extra_axes)), n_tokens))
                attended = local_attention(
                    q, k, v, beta=constants("beta", u), pattern=pattern, weights=w_tokens_host,
                    key_mask=km, slopes=constants("slopes", u), positions=positions,
                    causal=mask == "causal" and pattern is None, diagonal=diagonal, check=check)
            else:
                keep = _key_mask(xp, padding_mask, u, n_tokens, mask, diagonal)
                if keep is not None and extra_axes:
                    keep = keep[..., None, :, :, :]
                attended = quadrature_attention(   # a solve's state was validated where it entered
                    q, k, v, beta=constants("beta", u), weights=constants("w_tokens", u),
                    mask=mask if keep is None else keep,
                    diagonal=diagonal if keep is None else "full", check=check,
                )
            if groups > 1:
                attended = xp.reshape(attended, (*attended.shape[:-4], heads, n_tokens, n_sigma))
            # concatenate heads along the features and contract with the stacked W_O
            concat = xp.reshape(_swap_heads_tokens(xp, attended), (*attended.shape[:-3], n_tokens, -1))
            out = project_out(concat)
            if check:
                _refuse_overflow(xp, out, u, "the output projection")
            return out

        return attention


def _refuse_overflow(xp, a, u, what: str) -> None:
    """FloatingPointError when ``a`` (computed from the finite ``u``) is not finite: the
    exact values exceed the dtype's range, a property of the inputs and the weights."""
    if bool(xp.all(xp.isfinite(a))):
        return
    scale = float(xp.max(xp.abs(u))) if math.prod(u.shape) else 0.0
    wider = "" if "float64" in str(u.dtype) else " or compute in float64"
    raise FloatingPointError(
        f"{what} of u overflow {u.dtype}: max |u| = {scale:.3g} times the kernels exceeds the "
        f"largest {u.dtype} number, so the result is not representable; scale u down{wider}")


def _swap_heads_tokens(xp, a):
    """Swap the axes -3 and -2 ((..., N, H, d) <-> (..., H, N, d)); a view for NumPy."""
    if type(a) is np.ndarray:
        return a.swapaxes(-3, -2)  # 10x cheaper than moveaxis's axis normalization
    return xp.moveaxis(a, -2, -3)


def _padding(xp, key_mask, u, n_tokens, diagonal):
    """Validate a padding mask (..., N) of booleans; None stays None."""
    if key_mask is None:
        return None
    km = xp.asarray(key_mask)
    if km.dtype != xp.bool:
        raise TypeError(f"padding_mask must be a boolean array (True = a real token), got dtype {km.dtype}")
    if km.ndim < 1 or km.shape[-1] != n_tokens:
        raise ValueError(f"padding_mask must have shape (..., {n_tokens}) (one flag per token), got {tuple(km.shape)}")
    try:
        xp.broadcast_shapes(tuple(km.shape[:-1]), tuple(u.shape[:-2]))
    except ValueError:
        raise ValueError(
            f"padding_mask leading axes {tuple(km.shape[:-1])} do not broadcast with the batch axes "
            f"{tuple(u.shape[:-2])} of u"
        ) from None
    if diagonal == "half":
        raise ValueError("padding_mask cannot be combined with diagonal='half'; use diagonal='full'")
    return km


def _assembly(parameters: dict):
    """``(xp, on)`` for assembling the discretized constants: NumPy and the identity for host
    parameters; for tensors handed in by ``with_parameters``, their namespace and the
    conversion of a host array into it (same dtype and device), so autograd sees the
    assembly."""
    tensors = [v for v in parameters.values() if not is_host(v)]
    if not tensors:
        return _NUMPY, lambda a: a
    like = tensors[0]
    xp = array_api_compat.array_namespace(*tensors)
    device = array_api_compat.device(like)

    def on(a):
        return xp.asarray(np.asarray(a), dtype=like.dtype, device=device) if is_host(a) else a

    return xp, on


def _key_mask(xp, key_mask, u, n_tokens, mask, diagonal):
    """Combine a padding mask (..., N) with the causal mask into a bool (..., 1, N, N) array."""
    km = _padding(xp, key_mask, u, n_tokens, diagonal)
    if km is None:
        return None
    lead = xp.broadcast_shapes(tuple(km.shape[:-1]), tuple(u.shape[:-2]))
    keep = xp.broadcast_to(km[..., None, None, :], (*lead, 1, n_tokens, n_tokens))
    if mask == "causal":
        rows = xp.arange(n_tokens)
        keep = keep & (rows[None, :] <= rows[:, None])
    return keep

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

Components of current Transformers:

* grouped-query attention: :math:`H` query heads share :math:`H_{kv}` key/value heads, head
  :math:`h` reading key/value head :math:`\lfloor h H_{kv} / H \rfloor` (``kv_heads``);
* positions :math:`p(x) = L s(x) - 1/2` (:meth:`ctformer.Grids.positions`) enter through a
  :class:`~ctformer.operators.positions.PositionEncoding` (``positions``):
  :class:`~ctformer.operators.positions.RoPE` and
  :class:`~ctformer.operators.positions.AxialRoPE` rotate queries and keys in :math:`\sigma`,
  :class:`~ctformer.operators.positions.ALiBi` adds :math:`-m_h |p(x) - p(x')|` to the
  exponent;
* the mask :math:`m(x, x')` is a :class:`~ctformer.operators.masks.Mask` (``mask``):
  :class:`~ctformer.operators.masks.Causal`, :class:`~ctformer.operators.masks.SlidingWindow`
  and their products, ``Causal() & SlidingWindow(W)`` keeping :math:`0 \le p(x) - p(x') < W`;
  a mask with a finite band is computed by the banded engine in :math:`O(N W)`
  (:mod:`ctformer.operators.attention_flow`).
"""
from __future__ import annotations

import numpy as np

from .. import validation
from ..validation import renamed
from ..kernels import is_host
from .attention_arguments import _compose_mask, _kernel_list, _position
# the assembly helpers, re-exported here where they were defined before
from .attention_assembly import _NUMPY, _assembly, _output_matrix, _root  # noqa: F401
from .attention_flow import DiscretizedAttention, Layout, plan_engine
from .base import Constants, Grids, Operator
from .functions import as_feature_function, named_parameters
from .masks import Intersection, Padding, SlidingWindow, check_padding, padding_for
from .positions import NoPositions

__all__ = ["Attention"]


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
    mask : None, "causal" or Mask
        The mask :math:`m(x, x')`: ``"causal"`` is ``Causal(diagonal)``; a
        :class:`~ctformer.operators.masks.Mask` (``Causal()``, ``SlidingWindow(W)``, products
        with ``&``, or a subclass) is used as given.
    diagonal : {"full", "half"}
        With ``mask="causal"``, the weight of the diagonal cell: ``"full"`` (the standard
        causal mask, first order) or ``"half"`` (second order on midpoint grids).
    kv_heads : int, optional
        Number :math:`H_{kv}` of key/value heads (grouped-query attention); it must divide
        ``heads``, and ``W_K``, ``W_V``, ``b_K``, ``b_V`` then have :math:`H_{kv}` entries.
        Default: ``heads`` (one key/value head per query head).
    positions : PositionEncoding or None
        How token positions enter the scores: ``RoPE(...)``, ``AxialRoPE(...)``,
        ``ALiBi(...)``, a subclass of :class:`~ctformer.operators.positions.PositionEncoding`,
        or ``None`` (:class:`~ctformer.operators.positions.NoPositions`). The grids must then
        have a ``context_length``.
    window : float, optional
        With ``mask="causal"`` and ``diagonal="full"``: the sliding window :math:`W` (in
        positions), i.e. ``mask=Causal() & SlidingWindow(W)``.
    softcap : float, optional
        Soft-capping of the score (Gemma 2's ``attn_logit_softcapping``): the kernel is
        :math:`e^{c \tanh(s / c)}` with :math:`s = \beta_h \int q\, k\, d\sigma` instead of
        :math:`e^{s}`, a bounded (:math:`|c \tanh(s/c)| < c`) smooth map of the score; the
        quadrature weights, position terms and masks act after it. Default None (no cap).

    Attributes
    ----------
    mask : Mask or None
        The composed mask (``Causal()``, ``Causal() & SlidingWindow(4.0)``, ...).
    positions : PositionEncoding
    diagonal : str
        ``mask.diagonal`` (read-only).
    window : float or None
        The width of the mask's sliding window (read-only).

    Raises
    ------
    TypeError
        If a kernel list holds something that is not a kernel.
    ValueError
        If the lists have different lengths, ``beta`` is not finite or has the wrong length,
        ``mask`` or ``diagonal`` is not one of the allowed values, a bias list has the wrong
        length, ``kv_heads`` does not divide ``heads``, ``positions`` is not a position
        encoding, or ``window`` is not a positive number or lacks the causal mask.

    Notes
    -----
    ``discretize(grids, padding_mask=None)`` returns ``f(u, *, check=False)``: ``u`` has shape
    ``(..., Nq_tokens, Nq_features)``; the optional ``padding_mask`` ``(..., N)``, boolean or 0/1
    integers (True or 1 = a real token, kept as a key), is combined with the mask there, once (a solve does it
    when it builds its split problem), so that evaluating ``f`` builds and checks no mask. A
    query that keeps no key (left padding with the causal mask) gets attention output zero,
    the integral over an empty set of keys, in every path (dense, streamed, banded, ALiBi,
    grouped-query; NumPy and torch); no real token reads it. ``f`` trusts ``u`` (a solve
    validates its state once, where it enters); ``check=True``, what :meth:`__call__`
    passes, evaluates it scale-safely and reports overflow by name.

    The scores use the head-feature quadrature,
    :math:`s_{ij} = \beta_h \sum_\sigma w_\sigma q_{i\sigma} k_{j\sigma}`: the query kernel is
    pre-scaled by :math:`w_\sigma`, the three projections of all heads are one matrix product
    (as torch's packed in-projection), and ``quadrature_attention`` runs with one
    :math:`\beta_h` per head, all heads in one call on arrays ``(..., H, N, d_h)``. Token weights are
    ``grids.tokens.quadrature_weights``; uniform weights are dropped (they cancel), others
    act as a log-weight bias.
    """

    def __init__(self, W_Q, W_K, W_V, W_O, *, b_Q=None, b_K=None, b_V=None, b_O=None,
                 beta=1.0, mask=None, diagonal="full", kv_heads=None, positions=None, window=None,
                 softcap=None):
        self.W_Q = _kernel_list(W_Q, "W_Q")
        self.heads = len(self.W_Q)
        if kv_heads is None:
            self.kv_heads = self.heads
        else:
            kv_heads = validation.integer(kv_heads, "kv_heads")
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
        self.mask = _compose_mask(mask, diagonal, window)
        self.positions = _position(positions, self.heads)
        self.softcap = None if softcap is None else validation.real(softcap, "softcap", positive=True)

    @property
    def diagonal(self) -> str:
        """The weight rule of the diagonal cell: ``"half"`` with ``Causal(diagonal="half")``."""
        return "full" if self.mask is None else self.mask.diagonal

    @property
    def window(self):
        """The width :math:`W` of the mask's :class:`SlidingWindow`, or None."""
        parts = () if self.mask is None else self.mask.parts()
        widths = [m.width for m in parts if isinstance(m, SlidingWindow)]
        return min(widths) if widths else None

    def _check_beta(self, beta) -> np.ndarray:
        if validation.is_real(beta):
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
        if self.positions != NoPositions():
            extra += f", positions={self.positions!r}"
        return f"Attention(heads={self.heads}, beta={self.beta.tolist()}, mask={self.mask!r}{extra})"

    @renamed(key_mask="padding_mask")
    def __call__(self, u, grids: Grids, padding_mask=None):
        r"""Apply the operator to point values ``u`` on ``grids``: validated, scale-safe.

        Parameters
        ----------
        u : array, shape ``(..., Nq_tokens, Nq_features)``
            Real, floating and finite (checked here, once).
        grids : Grids
        padding_mask : bool or 0/1 integer array ``(..., N)``, optional
            True (1) = a real token: only those are keys; integers other than 0 and 1 are
            refused by value (as ``run`` and ``solve`` do). Its leading axes broadcast to the batch
            axes of ``u`` (``(B, N)``, or ``(N,)`` for every sequence); more or larger ones
            (HuggingFace's extended ``(B, 1, 1, N)`` mask) are refused.
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
        if not isinstance(grids, Grids):
            raise TypeError(f"grids must be a ctformer.Grids, got {type(grids).__name__}")
        grids.validate(u, "u", points=True)
        if padding_mask is not None:
            padding_mask = padding_for(u, padding_mask, grids.shape[0])
        return self.discretize(grids, padding_mask=padding_mask)(u, check=True)

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
        arrays.update(self._small_arrays(grids, xp, on))
        return arrays

    def _small_arrays(self, grids: Grids, xp, on) -> dict:
        """The biases, head-feature weights, temperatures and token weights of :meth:`host_arrays`."""
        y, sigma = grids.features, grids.head_features
        arrays = {}
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

    def _packed_host(self, grids: Grids) -> dict:
        r"""The host constants of :meth:`_constants` built without stacking: the packed matrix
        ``QKV_t`` ``(nq_y, (H + 2 H_kv) nq_h)`` is filled head by head (queries times
        :math:`w_\sigma`, the same products as from :meth:`host_arrays`), and ``O`` is the
        transposed view of the output weight when the heads' matrices are consecutive column
        blocks of one array (a converted network in the discrete limit), so that a converted
        model holds one copy of its output projections and one packed copy of the others."""
        y, sigma = grids.features, grids.head_features
        arrays = self._small_arrays(grids, _NUMPY, lambda a: a)
        w_sigma, n_sigma = arrays["w_sigma"], len(sigma.quadrature_nodes)
        kernels = self.W_Q + self.W_K + self.W_V
        qkv = np.empty((len(kernels) * n_sigma, len(y.quadrature_nodes)))
        for c, kernel in enumerate(kernels):
            block, m = qkv[c * n_sigma:(c + 1) * n_sigma], kernel.matrix(sigma, y)
            if c < self.heads:
                np.multiply(m, w_sigma[:, None], out=block)
            else:
                block[...] = m
        # held transposed, as the feature maps hold their weights: a product of few rows then
        # reads each output column's weights as one contiguous row (ctformer._numerics.few_rows)
        arrays["QKV_t"], arrays["O"] = qkv.T, _output_matrix([k.matrix(y, sigma) for k in self.W_O])
        return arrays

    def _constants(self, host: dict, grids: Grids) -> Constants:
        """The host constants of the discretized operator: one packed projection matrix
        (queries pre-scaled by the head-feature weights; rows (H + 2 H_kv, nq_h), as torch's
        packed in-projection), its bias, the output matrix, the temperatures (grouped by
        key/value head), the token weights and the rotation tables of the position encoding."""
        heads, kv_heads = self.heads, self.kv_heads
        xp, on = _assembly(self.parameters())
        n_sigma, groups = len(grids.head_features.quadrature_nodes), heads // kv_heads
        w_sigma = on(host["w_sigma"])
        qkv_t = host.get("QKV_t")
        if qkv_t is None:
            stacked = xp.concat([host["Q"] * w_sigma[None, :, None], host["K"], host["V"]])
            qkv_t = xp.matrix_transpose(xp.reshape(stacked, (-1, stacked.shape[-1])))
        biases = [host[name] for name in ("b_Q", "b_K", "b_V")]
        bias = None
        if any(b is not None for b in biases):
            biases = [on(np.zeros((count, 1, n_sigma))) if b is None else b
                      for b, count in zip(biases, (heads, kv_heads, kv_heads))]
            biases[0] = biases[0] * w_sigma
            bias = xp.reshape(xp.concat(biases), (-1,))
        rotation = self.positions.rotation(grids)
        cos, sin = (None, None) if rotation is None else rotation
        return Constants(
            QKV_t=qkv_t,
            b_QKV=bias, O=host["O"], b_O=host["b_O"], w_tokens=host["w_tokens"],
            beta=host["beta"] if groups == 1 else host["beta"].reshape(kv_heads, groups),
            cos=cos, sin=sin,
        )

    def _discretize(self, grids: Grids) -> DiscretizedAttention:
        parameters = self.parameters()
        host = (self._packed_host(grids) if all(is_host(v) for v in parameters.values())
                else self.host_arrays(grids))
        layout = Layout(self.heads, self.kv_heads, grids.shape[0], len(grids.head_features.quadrature_nodes))
        engine = plan_engine(self.mask, self.positions, grids, layout, host["w_tokens"],
                             cap=self.softcap)
        constants = self._constants(host, grids)
        flow = DiscretizedAttention(constants, layout, constants.host["cos"] is not None, engine)
        keys = None if self.mask is None else self.mask.keys()
        return flow if keys is None else flow.with_padding(check_padding(keys, layout.n_tokens))

    def discretize(self, grids: Grids, padding_mask=None) -> DiscretizedAttention:
        r"""The discretized operator on ``grids``, with a padding mask composed once.

        Parameters
        ----------
        grids : Grids
        padding_mask : bool or 0/1 integer array ``(..., N)`` (NumPy, torch, a nested list), or Padding, optional
            The real tokens of a padded batch (True or 1 = a real token, kept as a key), combined
            here with the operator's mask: the returned callable builds no mask per call, and
            takes states of any array library beside it.

        Returns
        -------
        DiscretizedAttention
            ``f(u, *, check=False)``; the operator without padding is built once per grids
            and cached (see :meth:`Operator.discretize`), the padded one per call of this
            method (a solve calls it once per block).

        Raises
        ------
        TypeError, ValueError
            For a padding mask that is neither boolean nor 0/1 integers, not of shape
            ``(..., N)``, or with
            ``Causal(diagonal="half")``.
        """
        flow = super().discretize(grids)
        if padding_mask is None:
            return flow
        if isinstance(padding_mask, (list, tuple)):  # as __call__ takes them (array_api_compat refused lists)
            padding_mask = np.asarray(padding_mask)
        padding = padding_mask if isinstance(padding_mask, Padding) else Padding(padding_mask)
        combined = padding if self.mask is None else Intersection(self.mask, padding)
        return flow.with_padding(check_padding(combined.keys(), grids.shape[0]))

r"""The discretized attention operator: projections, positions and one attention engine.

:meth:`ctformer.operators.Attention.discretize` builds, once per grids, what a flow
evaluation needs: the packed projection matrices (:class:`~ctformer.operators.base.Constants`),
the rotation tables of the position encoding, and the engine that the composed mask and the
position encoding call for:

* the **dense** engine, :func:`~ctformer.operators.quadrature_attention.quadrature_attention`
  (batched or streamed), for no mask, the causal mask (only the lower triangle is computed) or
  an explicit boolean pattern; with padding keys on a large NumPy state the causal mask goes by
  index to the banded engine's blocks of query rows, never one ``(..., N, N)`` mask;
* the **banded** engine, :class:`~ctformer.operators.local_attention.BandedAttention`, when
  the mask has a finite band (:meth:`Mask.band`: only the columns inside it are visited) or
  the position encoding adds a score term (:meth:`PositionEncoding.score_bias`, evaluated
  block by block).

A padding mask is composed with the operator's mask once, when a solve builds its split
problem (:meth:`DiscretizedAttention.with_padding`); evaluating the flow then validates
nothing and builds no mask.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ..backend import namespace, to_host
from ..environment import setting
from .local_attention import BandedAttention, mask_pattern
from .masks import Intersection
from .positions import rotate
from .quadrature_attention import in_float32, quadrature_attention
from .._numerics import dense as _dense
from .._numerics import streamed as _streamed
from .._numerics.fused import engine_setting
from .._numerics.score_terms import DistanceTerm, ScoreTerms
from .._numerics.gemm import numpy_rows, packed_rows, plain_rows, rows_product, threaded_rows
from .._numerics.sequences import sequence_blocks
from .._numerics.threads import _INSIDE, by_row_blocks, run_blas_tasks

_SMALL_SHAPES = 64  # shapes whose small-path decision a discretized attention remembers
_FLOATS = (np.float32, np.float64)
# Causal attention with padding keys: from this many bytes of the combined (..., N, N) mask on,
# the causal part is applied by index in blocks of query rows (N = 1024 with a batch of 2, 88 ->
# 64 ms and 22 -> 12 MiB; below, the one dense mask is faster: N = 1024 alone, 24 against 31 ms)
_DENSE_KEEP_BYTES = 1 << 21

__all__ = ["DiscretizedAttention", "Layout", "plan_engine"]


class Layout:
    """The head layout of one discretized attention: heads, key/value heads, tokens, pair size."""

    __slots__ = ("heads", "kv_heads", "groups", "n_tokens", "n_sigma")

    def __init__(self, heads, kv_heads, n_tokens, n_sigma):
        self.heads, self.kv_heads, self.groups = heads, kv_heads, heads // kv_heads
        self.n_tokens, self.n_sigma = n_tokens, n_sigma

    @property
    def extra_axes(self) -> int:
        """1 when grouped-query heads are laid out as (kv_heads, groups), else 0."""
        return 1 if self.groups > 1 else 0


def _structure(mask):
    """``(causal, diagonal, explicit)`` of a mask without its padding: whether it orders the
    tokens, its diagonal rule, and the product of its other parts (None when there are none)."""
    parts = [] if mask is None else [m for m in mask.parts() if m.keys() is None]
    causal = any(m.causal for m in parts)
    diagonal = "half" if any(m.diagonal == "half" for m in parts) else "full"
    explicit = [m for m in parts if not m.causal]
    return causal, diagonal, (Intersection(*parts) if explicit else None)


def _coordinates(grids, needs_positions: bool):
    """The positions p(x) of the tokens, or their indices when only the order matters."""
    if needs_positions:
        return np.asarray(grids.positions(), dtype=np.float64)
    return np.arange(grids.shape[0], dtype=np.float64)


def plan_engine(mask, position, grids, layout: Layout, weights, cap=None):
    """The engine for a mask (without padding) and a position encoding on ``grids``, with the
    scores' soft cap ``cap`` when given. ALiBi's term without a band goes to the dense engine,
    evaluated block by block (:class:`~ctformer._numerics.score_terms.DistanceTerm`); another
    score term, or a band, to the banded engine.

    Returns
    -------
    _DenseEngine or _BandedEngine
    """
    causal, diagonal, explicit = _structure(mask)
    if causal and grids.tokens.dimension != 1:
        raise ValueError(f"mask='causal' orders tokens on an interval; the token domain "
                         f"{grids.tokens!r} is two-dimensional and has no causal order (and no "
                         "convergence order for it): use mask=None")
    bias = position.score_bias(layout.heads)
    p = _coordinates(grids, bias is not None or (explicit is not None and explicit.needs_positions))
    if explicit is not None:  # a window no shorter than the grid keeps every key: left out
        kept = [m for m in explicit.parts() if not m.keeps_all(p, p)]
        explicit = Intersection(*kept) if any(not m.causal for m in kept) else None
    band = None if explicit is None else explicit.band(p, p)
    slopes = getattr(bias, "distance_slopes", None)
    if band is None and (bias is None or slopes is not None):
        pattern = None if explicit is None else \
            np.asarray(explicit.keep(p[:, None], p[None, :]), dtype=bool)
        term = None if slopes is None else DistanceTerm(_slopes_by_head(slopes, layout), p, p)
        terms = None if cap is None and term is None else ScoreTerms(cap, term)
        streamed = None if not causal or pattern is not None else _BandedEngine(BandedAttention(
            layout.n_tokens, layout.n_tokens, weights=weights, bias=_grouped(bias, layout), positions=(p, p),
            causal=True, diagonal=diagonal, cap=cap), layout)
        return _DenseEngine(causal, diagonal, pattern, layout, terms=terms, streamed=streamed)
    pattern = None if explicit is None else mask_pattern(explicit, p)
    bias = _grouped(bias, layout)
    engine = BandedAttention(layout.n_tokens, layout.n_tokens, pattern=pattern, weights=weights,
                             bias=bias, positions=(p, p), causal=causal and pattern is None,
                             diagonal=diagonal, cap=cap)
    return _BandedEngine(engine, layout)


def _slopes_by_head(slopes, layout):
    """The heads' slopes as ``(heads, 1, 1)``, grouped-query heads as ``(kv_heads, groups, 1, 1)``."""
    shape = (layout.kv_heads, layout.groups) if layout.groups > 1 else (layout.heads,)
    return np.asarray(slopes, dtype=np.float64).reshape(*shape, 1, 1)


def _grouped(bias, layout):
    """A score term (heads, r, c) laid out as (kv_heads, groups, r, c) (itself without groups)."""
    if bias is None or layout.groups == 1:
        return bias

    def grouped(difference):
        b = bias(difference)
        if b.ndim < 3:   # one term for every head
            return b
        return namespace(b).reshape(b, (layout.kv_heads, layout.groups, *b.shape[-2:]))
    return grouped


def _like(converted, name, value, a):
    """``value`` (a pattern, padding keys) in the namespace and on the device of ``a``, converted once
    into ``converted`` (NumPy keys beside a torch state, or the reverse, had failed inside torch)."""
    if type(a) is np.ndarray and type(value) is np.ndarray:
        return value
    device = array_api_compat.device(a)
    key = (name, type(a), str(device))
    found = converted.get(key)
    if found is None:
        found = converted[key] = (to_host(value) if type(a) is np.ndarray
                                  else namespace(a).asarray(value, device=device))
    return found


class _DenseEngine:
    """quadrature_attention with the causal flag, an explicit pattern and/or padding keys, and
    the scores' terms ``terms`` (a :class:`~ctformer._numerics.score_terms.ScoreTerms`: soft
    cap, ALiBi; None: none)."""

    def __init__(self, causal, diagonal, pattern, layout, keep=None, terms=None, streamed=None):
        self.causal, self.diagonal, self.pattern, self.layout = causal, diagonal, pattern, layout
        self.keep = keep   # the combined boolean mask (with padding), or None
        self.terms = terms
        self.streamed = streamed  # the causal mask by index, block by block (_BandedEngine), or None
        self.per_sequence = keep is None  # treats every sequence alike: no padding keys
        self._converted = {}   # (array type, device) -> the pattern there

    def with_keys(self, real):
        """The engine with the padding keys ``real`` (..., N) combined into one boolean mask (a
        causal mask of a large NumPy batch: the banded engine with the keys alone)."""
        xp = namespace(real)
        n = self.layout.n_tokens
        if self.streamed is not None and type(real) is np.ndarray and real.size // n * n * n >= _DENSE_KEEP_BYTES:
            return self.streamed.with_keys(real)  # no (..., N, N) mask: blocks of query rows
        keep = real[..., None, None, :]
        if self.pattern is not None:
            keep = keep & _like(self._converted, "pattern", self.pattern, real)
        elif self.causal:
            rows = xp.arange(n, device=array_api_compat.device(real))
            keep = keep & (rows[None, :] <= rows[:, None])
        else:
            keep = xp.broadcast_to(keep, (*keep.shape[:-2], n, n))
        if self.layout.extra_axes:
            keep = keep[..., None, :, :, :]
        return _DenseEngine(self.causal, self.diagonal, self.pattern, self.layout, keep, self.terms)

    def __call__(self, q, k, v, beta, weights, check):
        if self.keep is not None:
            mask, diagonal = _like(self._converted, "keep", self.keep, q), "full"
        elif self.pattern is not None:
            mask, diagonal = _like(self._converted, "pattern", self.pattern, q), "full"
        else:
            mask, diagonal = ("causal" if self.causal else None), self.diagonal
        if self.terms is not None:
            return in_float32(_dense.attention_with_terms, q, k, v, beta, weights, mask, diagonal, check,
                               self.terms)
        return quadrature_attention(q, k, v, beta=beta, weights=weights, mask=mask,
                                    diagonal=diagonal, check=check)


class _BandedEngine:
    """BandedAttention with padding keys laid out against the head axes."""

    def __init__(self, engine, layout, keys=None):
        self.engine, self.layout, self.keys, self._converted = engine, layout, keys, {}
        self.per_sequence = keys is None  # treats every sequence alike: no padding keys

    def with_keys(self, real):
        """The engine with the padding keys ``real`` (..., N), reshaped once."""
        xp = namespace(real)
        keys = xp.reshape(real, (*real.shape[:-1], *([1] * (1 + self.layout.extra_axes)),
                                 self.layout.n_tokens))
        return _BandedEngine(self.engine, self.layout, keys)

    def __call__(self, q, k, v, beta, weights, check):
        keys = None if self.keys is None else _like(self._converted, "keys", self.keys, q)
        return in_float32(self.engine, q, k, v, beta, key_mask=keys, check=check)


class DiscretizedAttention:
    """``f(u, *, check=False)``: the attention operator on one grids, its mask composed.

    ``u`` has shape ``(..., Nq_tokens, Nq_features)`` and is trusted (a solve validates its
    state where it enters); ``check=True``, what :meth:`Attention.__call__` passes, evaluates
    scale-safely and reports overflow by name. Holds the operator's constants, never the
    operator.
    """

    __slots__ = ("constants", "layout", "rotation", "engine", "_project_qkv", "_project_out", "_small", "_gemm")

    def __init__(self, constants, layout: Layout, rotation: bool, engine):
        self.constants, self.layout, self.rotation, self.engine = constants, layout, rotation, engine
        self._small = {}  # (shape, dtype) -> _SmallPlan or None (the general path), made under
        self._gemm = None  # this CTFORMER_GEMM: a plan holds the products that setting chose
        # the two projections are token-wise: large NumPy states run them by row blocks
        self._project_qkv = by_row_blocks(
            lambda v: rows_product(v, constants("QKV_t", v), constants("b_QKV", v),
                                   constants.prepared("QKV_t", "b_QKV", v)),
            width=constants.host["QKV_t"].shape[-1], whole=threaded_rows, packed=packed_rows)
        self._project_out = by_row_blocks(
            lambda v: rows_product(v, constants("O", v), constants("b_O", v), constants.prepared("O", "b_O", v)),
            width=constants.host["O"].shape[-1], whole=threaded_rows, packed=packed_rows)

    def with_padding(self, real) -> "DiscretizedAttention":
        """The same operator keeping only the keys ``real`` (bool ``(..., N)``, True = a real
        token), combined with its mask here, once."""
        return DiscretizedAttention(self.constants, self.layout, self.rotation,
                                    self.engine.with_keys(real))

    def __call__(self, u, *, check=False):
        if not check:
            return self._attend(u, False)
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is reported by name
            return self._attend(u, True)

    def _attend(self, u, check):
        if not check and type(u) is np.ndarray and u.flags.c_contiguous and not getattr(_INSIDE, "worker", False):
            if (gemm := setting("CTFORMER_GEMM")) != self._gemm:  # another setting: plans made again
                self._small.clear()
                self._gemm = gemm
            plan = self._small.get((u.shape, u.dtype), self)
            if plan is self:
                plan = self._small_plan(u)
            if plan is not None:
                return self._attend_small(u, plan)
            blocks = sequence_blocks(u.shape) if self.engine.per_sequence and u.dtype in _FLOATS else None
            if blocks is not None:
                return self._attend_by_sequences(u, blocks)
        xp, constants, L = namespace(u), self.constants, self.layout
        q, k, v = self._heads(xp, self._project_qkv(u), u)
        if check:
            for name, a in (("query", q), ("key", k), ("value", v)):
                _refuse_overflow(xp, a, u, f"the {name} projection")
        attended = self.engine(q, k, v, constants("beta", u), constants("w_tokens", u), check)
        out = self._project_out(self._concatenated(xp, attended))
        if check:
            _refuse_overflow(xp, out, u, "the output projection")
        return out

    def _attend_by_sequences(self, u, blocks):
        """The general path on ``blocks`` of the sequences of the NumPy state ``u`` (C order),
        each block one task on the worker threads (:mod:`ctformer._numerics.sequences`);
        inside a task every product and every head runs on that thread."""
        flat = u.reshape(-1, *u.shape[-2:])
        out = np.empty((*flat.shape[:-1], self.constants.host["O"].shape[-1]), dtype=u.dtype)

        def worker(next_task):
            while (block := next_task()) is not None:
                out[block] = self._attend(flat[block], False)

        run_blas_tasks(worker, blocks, True)
        return out.reshape(*u.shape[:-1], out.shape[-1])

    def _heads(self, xp, qkv, u):
        """``(q, k, v)`` of the projected ``qkv`` (..., N, (H + 2 H_kv) d_h), rotated by the
        position encoding; grouped-query heads as (..., H_kv, groups, N, d_h) against the
        key/value heads' (..., H_kv, 1, N, d_h)."""
        L = self.layout
        heads, kv_heads, n_tokens, n_sigma = L.heads, L.kv_heads, L.n_tokens, L.n_sigma
        lead = tuple(u.shape[:-2])
        # one reshape and one axis move for all projections: (..., H + 2 H_kv, N, d_h)
        qkv = _swap_heads_tokens(xp, _reshape(xp, qkv, (*lead, n_tokens, heads + 2 * kv_heads, n_sigma)))
        q, k, v = qkv[..., :heads, :, :], qkv[..., heads:heads + kv_heads, :, :], \
            qkv[..., heads + kv_heads:, :, :]
        if self.rotation:
            cos, sin = self.constants("cos", u), self.constants("sin", u)
            q, k = rotate(xp, q, cos, sin), rotate(xp, k, cos, sin)
        if L.groups > 1:  # head h = g * groups + r reads key/value head g (no copies)
            q = xp.reshape(q, (*lead, kv_heads, L.groups, n_tokens, n_sigma))
            k, v = k[..., None, :, :], v[..., None, :, :]
        return q, k, v

    def _concatenated(self, xp, attended):
        """The heads of ``attended`` concatenated along the features: (..., N, H d_h)."""
        L = self.layout
        if L.groups > 1:
            attended = xp.reshape(attended, (*attended.shape[:-4], L.heads, L.n_tokens, L.n_sigma))
        # the width named, not -1: an empty batch has no size to infer it from
        return _reshape(xp, _swap_heads_tokens(xp, attended), (*attended.shape[:-3], L.n_tokens, L.heads * L.n_sigma))

    def _small_plan(self, u):
        """The :class:`_SmallPlan` of the NumPy state ``u`` (trusted, C order), or None when
        ``u`` takes the general path; remembered per shape and dtype (:meth:`_attend`: under one CTFORMER_GEMM)."""
        if len(self._small) >= _SMALL_SHAPES:
            self._small.clear()
        plan = self._small[(u.shape, u.dtype)] = _SmallPlan.of(self, u)
        return plan

    def _attend_small(self, u, plan):
        """The evaluation of a small NumPy state in a few NumPy calls: the operations of the
        general path for its size (NumPy's products with the biases added in place, the
        batched pass of the dense engine) without its dispatch (the same bits)."""
        engine_setting()  # a bad CTFORMER_ATTENTION_ENGINE is refused here too, as by the general path
        q, k, v = self._heads(_dense._NUMPY, _plain_product(u, plan.qkv_t, plan.b_qkv, plan.prepared_qkv), u)
        lead, n = q.shape[:-2], q.shape[-2]
        out = _streamed.output_array(lead, n, v.shape[-1], u.dtype, _streamed.head_axes(q, k, lead))
        attended = _streamed.small(q * plan.beta, k, v, plan.log_w, None, plan.causal, plan.diag_shift, out=out,
                                   terms=plan.terms)
        return _plain_product(self._concatenated(_dense._NUMPY, attended), plan.o, plan.b_o, plan.prepared_o)


class _SmallPlan:
    """What the small path of one discretized attention needs for one shape and dtype: the
    constants in that dtype, the temperatures against the heads, the log-weights and the mask's
    flags, read once (:meth:`DiscretizedAttention._attend_small`)."""

    __slots__ = ("qkv_t", "b_qkv", "o", "b_o", "prepared_qkv", "prepared_o", "beta", "log_w", "causal", "diag_shift",
                 "terms")

    @classmethod
    def of(cls, attention, u):
        """The plan of ``attention`` for ``u``, or None where the general path does something
        else: a mask other than none or the causal one, constants given as tensors, products
        or score counts large enough for torch's call, row blocks, the streamed or the fused
        engine."""
        L, engine, constants = attention.layout, attention.engine, attention.constants
        if (u.dtype not in (np.float32, np.float64) or u.ndim < 2 or u.shape[-2] != L.n_tokens
                or not L.n_tokens or type(engine) is not _DenseEngine or engine.keep is not None
                or engine.pattern is not None or constants._tensors):
            return None
        rows, d = math.prod(u.shape[:-1]), u.shape[-1]
        qkv_t, o = constants("QKV_t", u), constants("O", u)
        if (qkv_t.shape[0] != d or not plain_rows(rows, d, qkv_t.shape[1]) or not plain_rows(rows, o.shape[0], o.shape[1])
                or not _dense.batched(L.n_tokens, L.n_tokens, math.prod(u.shape[:-2]) * L.heads)):
            return None
        plan = cls()
        plan.qkv_t, plan.b_qkv, plan.o, plan.b_o = qkv_t, constants("b_QKV", u), o, constants("b_O", u)
        # the general path's prepared products where they apply (on some machines)
        qkv, out = constants.prepared("QKV_t", "b_QKV", u), constants.prepared("O", "b_O", u)
        plan.prepared_qkv = qkv if qkv is not None and qkv.applies(rows) else None
        plan.prepared_o = out if out is not None and out.applies(rows) else None
        beta, weights = constants("beta", u), constants("w_tokens", u)
        plan.beta = float(beta) if beta.ndim == 0 else beta[..., None, None]  # as the dense engine's
        plan.log_w = None if weights is None else np.log(weights)
        plan.causal, plan.terms = engine.causal, engine.terms
        plan.diag_shift = math.log(0.5) if engine.causal and engine.diagonal == "half" else None
        return plan


def _plain_product(a, b, bias, prepared):
    """:func:`rows_product` of a small plan's C-contiguous NumPy rows: the prepared product
    where the plan found one, else NumPy's."""
    return numpy_rows(a, b, bias) if prepared is None else prepared(a)


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


def _reshape(xp, a, shape):
    """``xp.reshape(a, shape)``; NumPy's method directly (the array-API wrapper costs ~1.5 us,
    twice per evaluation of a small problem)."""
    return a.reshape(shape) if type(a) is np.ndarray else xp.reshape(a, shape)


def _swap_heads_tokens(xp, a):
    """Swap the axes -3 and -2 ((..., N, H, d) <-> (..., H, N, d)); a view for NumPy."""
    if type(a) is np.ndarray:
        return a.swapaxes(-3, -2)  # 10x cheaper than moveaxis's axis normalization
    return xp.moveaxis(a, -2, -3)

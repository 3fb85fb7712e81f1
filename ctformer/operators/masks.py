r"""Attention masks: which keys :math:`x'` a query :math:`x` keeps.

Attention integrates over the keys a mask :math:`m(x, x') \in \{0, 1\}` keeps,

.. math::  \gamma(x, x') = \frac{m(x, x')\, e^{s(x, x')}}{\int_X m(x, x'')\, e^{s(x, x'')}\, dx''}.

A mask is a small value object (:class:`Mask`); masks combine with ``&`` (the product of
their indicator functions, :class:`Intersection`):

* :class:`Causal`: :math:`m = 1\{x' \le x\}` (tokens on an interval), with its rule for the
  diagonal cell (``"full"``, or ``"half"``: weight :math:`w_i / 2`, second order on midpoint
  nodes);
* :class:`SlidingWindow`: :math:`m = 1\{|p(x) - p(x')| < W\}` with the positions :math:`p`
  (:meth:`ctformer.Grids.positions`); ``Causal() & SlidingWindow(W)`` is the window of Mistral
  and Qwen2, :math:`0 \le p(x) - p(x') < W`;
* :class:`Padding`: the keys that are real tokens of a padded batch (data of one solve, not
  structure of the model).

A mask says what it keeps, :meth:`Mask.keep`, a function of the positions of a query and a key
evaluated pairwise (broadcasting), and, where it has compact support, :meth:`Mask.band`: the
range of key columns outside which a query keeps nothing. The attention operator combines its
masks once per discretization (and the padding once per solve) and lets the combined mask pick
the engine: a finite band is computed by the banded engine
(:func:`~ctformer.operators.local_attention.local_attention`, :math:`O(N W)`), anything else by
the dense or streamed quadrature kernel.

Writing a new mask is one class: subclass :class:`Mask`, implement :meth:`~Mask.keep` (and
:meth:`~Mask.band` if the mask has compact support), and pass it as
``Attention(..., mask=MyMask() & Causal())``.
"""
from __future__ import annotations

import abc
from typing import ClassVar

import array_api_compat
import numpy as np

from .. import validation
from ..backend import namespace, to_host

__all__ = ["Mask", "Causal", "SlidingWindow", "Padding", "Intersection", "keep_flags"]

DIAGONALS = ("full", "half")


class Mask(abc.ABC):
    r"""A mask :math:`m(x, x') \in \{0, 1\}` of attention (subclass and implement :meth:`keep`).

    Attributes
    ----------
    causal : bool
        Whether the mask keeps only :math:`x' \le x` (class attribute; :class:`Causal`). The
        engines then compute only the lower triangle, and the token domain must be an interval.
    needs_positions : bool
        Whether :meth:`keep` and :meth:`band` read the positions :math:`p(x)` (the grids then
        need a ``context_length``). When False they receive the token indices, which order the
        tokens as their positions do. Default True.
    diagonal : {"full", "half"}
        Weight of the diagonal cell with :class:`Causal`; ``"full"`` for every other mask.
    """

    causal: ClassVar[bool] = False
    needs_positions: ClassVar[bool] = True
    diagonal: str = "full"

    @abc.abstractmethod
    def keep(self, p, p_key):
        r"""Whether the query at ``p`` keeps the key at ``p_key`` (broadcasting, boolean).

        Parameters
        ----------
        p, p_key : ndarray of float64
            Query and key positions (or token indices when ``needs_positions`` is False),
            shapes broadcasting against each other, e.g. ``(N, 1)`` and ``(1, M)``.

        Returns
        -------
        bool ndarray of the broadcast shape
        """

    def band(self, p, p_key):
        """``(lo, hi)``: for each query, the key columns ``[lo, hi)`` outside which it keeps
        nothing; ``None`` (the default): no such band, every key may be kept.

        ``p`` (N,) and ``p_key`` (M,) are increasing. A mask with a band is computed by the
        banded engine, visiting only those columns.
        """
        return None

    def keeps_all(self, p, p_key) -> bool:
        """Whether the mask keeps every key for every query at these positions (``p`` (N,),
        ``p_key`` (M,), increasing), so that on these grids it can be left out; False (the
        default) where that is not known without evaluating :meth:`keep` on every pair."""
        return False

    def keys(self):
        """Boolean array ``(..., M)`` of the keys every query may keep (a padding mask), or
        ``None`` (the default: the mask acts only through :meth:`keep`)."""
        return None

    def parts(self) -> tuple:
        """The masks whose product this mask is (itself, for a single mask)."""
        return (self,)

    def __and__(self, other):
        if not isinstance(other, Mask):
            return NotImplemented
        return Intersection(*self.parts(), *other.parts())

    def __eq__(self, other):
        """Equal masks are the same computation: same type and attributes of the same types and
        values (arrays: same shape, dtype and entries), so that no cache reuses a different one."""
        return type(self) is type(other) and _same(self.__dict__, other.__dict__)

    def __hash__(self):
        return hash(type(self))

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable; build a new mask")


class Causal(Mask):
    r"""The causal mask :math:`m(x, x') = 1\{x' \le x\}`.

    Parameters
    ----------
    diagonal : {"full", "half"}
        Weight of the diagonal cell: ``"full"`` (the standard causal mask, a first-order
        quadrature of :math:`\int_0^x`) or ``"half"`` (weight :math:`w_i / 2`, second order
        on midpoint nodes). ``"half"`` combines with no other mask.
    """

    causal: ClassVar[bool] = True
    needs_positions: ClassVar[bool] = False

    def __init__(self, diagonal: str = "full"):
        object.__setattr__(self, "diagonal", validation.one_of(diagonal, "diagonal", DIAGONALS))

    def __repr__(self) -> str:
        return "Causal()" if self.diagonal == "full" else f"Causal(diagonal={self.diagonal!r})"

    def keep(self, p, p_key):
        return np.asarray(p_key) <= np.asarray(p)


class SlidingWindow(Mask):
    r"""The window :math:`m(x, x') = 1\{|p(x) - p(x')| < W\}` of width :math:`W` in positions.

    ``Causal() & SlidingWindow(W)`` keeps :math:`0 \le p(x) - p(x') < W` (HuggingFace
    ``sliding_window``). Both ends are decided with a tolerance of 1000 units in the last
    place of the largest position, so positions that are integers up to rounding select
    exactly the discrete window.

    Parameters
    ----------
    width : float
        :math:`W > 0`, finite.
    """

    def __init__(self, width):
        object.__setattr__(self, "width", validation.real(width, "width (of the sliding window)",
                                                          positive=True))

    def __repr__(self) -> str:
        return f"SlidingWindow({self.width!r})"

    def _tolerance(self, p, p_key) -> float:
        largest = max(1.0, self.width, float(np.abs(p).max(initial=0.0)),
                      float(np.abs(p_key).max(initial=0.0)))
        return 1000 * np.finfo(np.float64).eps * largest

    def keep(self, p, p_key):
        p, p_key = np.asarray(p, dtype=np.float64), np.asarray(p_key, dtype=np.float64)
        tol = self._tolerance(p, p_key)
        return (p_key > p - self.width + tol) & (p_key < p + self.width - tol)

    def band(self, p, p_key):
        tol = self._tolerance(p, p_key)
        return (np.searchsorted(p_key, p - self.width + tol, side="right"),
                np.searchsorted(p_key, p + self.width - tol, side="left"))

    def keeps_all(self, p, p_key) -> bool:
        """The window keeps exactly its band (an interval of keys): every key when each band is
        all of them, as for a sequence no longer than the window."""
        lo, hi = self.band(np.asarray(p, dtype=np.float64), np.asarray(p_key, dtype=np.float64))
        return bool(np.all(lo == 0) and np.all(hi == len(p_key)))


class Padding(Mask):
    r"""The keys that are real tokens: :math:`m(x, x') = \mathrm{real}(x')` for each sequence.

    Parameters
    ----------
    real : bool or 0/1 integer array of shape (..., N)
        True (1) for a real token (the HuggingFace ``attention_mask`` convention), in the namespace
        and on the device of the state. Validated where it enters (a solve, or
        :meth:`ctformer.operators.Attention.__call__`).
    """

    needs_positions: ClassVar[bool] = False

    def __init__(self, real):
        object.__setattr__(self, "real", real)

    def __repr__(self) -> str:
        return f"Padding(shape {tuple(self.real.shape)})"

    def __eq__(self, other):
        return self is other

    __hash__ = object.__hash__

    def keep(self, p, p_key):
        return np.ones(np.broadcast_shapes(np.shape(p), np.shape(p_key)), dtype=bool)

    def keys(self):
        return self.real


class Intersection(Mask):
    r"""The product :math:`m = m_1 m_2 \cdots` of masks: ``Causal() & SlidingWindow(64)``.

    Raises
    ------
    ValueError
        With ``Causal(diagonal="half")`` and another mask (the half-weight diagonal belongs to
        the plain causal integral).
    """

    def __init__(self, *masks):
        flat = []
        for m in masks:
            if not isinstance(m, Mask):
                raise TypeError(f"masks must be Mask objects, got {type(m).__name__}")
            flat.extend(part for part in m.parts() if not any(part is f for f in flat))
        half = [m for m in flat if m.diagonal == "half"]
        if half and len(flat) > 1:
            raise ValueError(f"{half[0]!r} combines with no other mask (got {flat!r}); use "
                             "Causal() (diagonal='full')")
        object.__setattr__(self, "masks", tuple(flat))

    @property
    def causal(self) -> bool:  # noqa: D401 - the contract attribute
        return any(m.causal for m in self.masks)

    @property
    def needs_positions(self) -> bool:
        return any(m.needs_positions for m in self.masks)

    @property
    def diagonal(self) -> str:
        return "half" if any(m.diagonal == "half" for m in self.masks) else "full"

    def __repr__(self) -> str:
        return " & ".join(repr(m) for m in self.masks)

    def parts(self) -> tuple:
        return self.masks

    def __eq__(self, other):
        """A product is the same in any order: equal when the parts match one to one."""
        if type(self) is not type(other) or len(self.masks) != len(other.masks):
            return False
        rest = list(other.masks)
        for m in self.masks:
            match = next((i for i, r in enumerate(rest) if m == r), None)
            if match is None:
                return False
            del rest[match]
        return True

    def __hash__(self):
        return hash((type(self), tuple(sorted(hash(m) for m in self.masks))))

    def keep(self, p, p_key):
        kept = np.ones(np.broadcast_shapes(np.shape(p), np.shape(p_key)), dtype=bool)
        for m in self.masks:
            kept &= m.keep(p, p_key)
        return kept

    def band(self, p, p_key):
        bands = [b for b in (m.band(p, p_key) for m in self.masks) if b is not None]
        if not bands:
            return None
        return (np.max([lo for lo, _ in bands], axis=0), np.min([hi for _, hi in bands], axis=0))

    def keys(self):
        real = [k for k in (m.keys() for m in self.masks) if k is not None]
        if not real:
            return None
        keys = real[0]
        for k in real[1:]:
            keys = keys & k
        return keys


def _same(a, b) -> bool:
    """Whether two attribute values of masks are the same: of one type, arrays (anything with
    ``shape`` and ``dtype``) with equal shape, dtype and entries, containers element by element,
    anything else by an ``==`` that answers one boolean."""
    if a is b:
        return True
    if type(a) is not type(b):   # 1 and 1.0 and True are different attributes here
        return False
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return (tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype
                and bool(np.array_equal(to_host(a), to_host(b))))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        answer = a == b
    except Exception:  # noqa: BLE001 - a value that cannot compare is not known to be the same
        return False
    return bool(answer) if isinstance(answer, (bool, np.bool_)) else False


def keep_flags(keys, name: str = "padding_mask"):
    """A keep-mask as booleans: a boolean array as given, integers 0/1 as ``keys == 1``.

    HuggingFace's ``attention_mask`` is int64; one rule holds for every entry point of a mask
    (:meth:`Attention.__call__ <ctformer.operators.Attention.__call__>`,
    ``Attention.discretize(padding_mask=...)``, ``local_attention(key_mask=...)``, and ``run``
    / ``solve``): booleans, or integers or floats that are all 0 or 1 (1 = keep). Other values
    are refused with the first offending one (an additive mask with the conversion), other
    dtypes with theirs.
    """
    xp = namespace(keys)
    if keys.dtype == xp.bool:
        return keys
    if not xp.isdtype(keys.dtype, ("integral", "real floating")):
        raise TypeError(f"{name} must be boolean or hold only 0 and 1 (1 = keep), got dtype "
                        f"{keys.dtype}; pass {name} == 1 for a 0/1 mask of another dtype")
    binary = (keys == 0) | (keys == 1)
    if not bool(xp.all(binary)):
        first = to_host(xp.reshape(keys, (-1,)))[~to_host(xp.reshape(binary, (-1,)))][0]
        shown = int(first) if xp.isdtype(keys.dtype, "integral") else float(first)
        additive = f"; an additive mask (0 keep, -inf pad) is {name} == 0" if shown == -np.inf else ""
        raise ValueError(f"{name} must hold only 0 and 1 (1 = keep, 0 = padding), got the value {shown}; "
                         f"pass a boolean mask ({name} != 0 if every nonzero value means keep){additive}")
    return keys == 1


def check_padding(keys, n_tokens: int, name: str = "padding_mask"):
    """A padding mask ``(..., N)`` checked once: boolean or 0/1 integers (:func:`keep_flags`),
    one flag per token; returned as booleans."""
    keys = keep_flags(keys, name)
    if keys.ndim < 1 or keys.shape[-1] != n_tokens:
        raise ValueError(f"{name} must have shape (..., {n_tokens}) (one flag per token), "
                         f"got {tuple(keys.shape)}")
    return keys


def padding_for(u, padding_mask, n_tokens: int):
    """A padding mask handed to :meth:`Attention.__call__`: in ``u``'s namespace, checked,
    its leading axes broadcasting to ``u``'s batch axes (the output keeps ``u``'s shape)."""
    xp = namespace(u)
    # on u's device: a NumPy mask for a CUDA state went to torch's default device (the CPU)
    keys = check_padding(xp.asarray(padding_mask, device=array_api_compat.device(u)), n_tokens)
    lead, batch = tuple(keys.shape[:-1]), tuple(u.shape[:-2])
    try:
        fits = np.broadcast_shapes(lead, batch) == batch
    except ValueError:
        fits = False
    if not fits:
        # a mask with more or larger leading axes would broadcast u itself: an output of another
        # shape, e.g. a batch by batch product for HuggingFace's extended (B, 1, 1, N) mask
        raise ValueError(
            f"padding_mask leading axes {lead} do not broadcast to the batch axes {batch} of u: pass one "
            f"flag per token of each sequence, shape {batch + (n_tokens,)} (HuggingFace's (B, N) "
            "attention_mask, not its extended (B, 1, 1, N) form)"
        )
    return keys

r"""The arguments of :class:`~ctformer.operators.attention.Attention`, checked and composed
when the operator is built: the kernel lists, the mask and the position encoding.

Each of ``W_Q``, ``W_K``, ``W_V``, ``W_O`` is a list of :class:`~ctformer.kernels.Kernel`, one
per head (``_kernel_list``). The mask :math:`m(x, x')` is a
:class:`~ctformer.operators.masks.Mask` given as such, or composed from the keywords
(``_compose_mask``): ``mask="causal"`` is ``Causal(diagonal)``, :math:`m = 1\{x' \le x\}`, and
with a window :math:`W` it is ``Causal() & SlidingWindow(W)``,

.. math::  m(x, x') = 1\{0 \le p(x) - p(x') < W\},

with the positions :math:`p` of :meth:`ctformer.Grids.positions`; ``mask=None`` is no mask,
:math:`m = 1`. The position encoding (``_position``) is a
:class:`~ctformer.operators.positions.PositionEncoding`, ``None`` meaning
:class:`~ctformer.operators.positions.NoPositions`, and is checked against the number of heads.
"""
from __future__ import annotations

from .. import validation
from ..kernels import Kernel
from .masks import DIAGONALS, Causal, Mask, SlidingWindow
from .positions import NoPositions, PositionEncoding


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


def _compose_mask(mask, diagonal, window):
    """The operator's mask from the keywords (``"causal"``, ``diagonal``, ``window``) or a Mask."""
    diagonal = validation.one_of(diagonal, "diagonal", DIAGONALS)
    if isinstance(mask, Mask):
        if diagonal != "full" or window is not None:
            raise ValueError(f"diagonal= and window= build the mask from mask='causal'; with "
                             f"mask={mask!r} write them into it (Causal(diagonal='half'), "
                             "& SlidingWindow(W))")
        return mask
    if mask is not None and not (isinstance(mask, str) and mask == "causal"):
        raise ValueError(f"mask must be None, 'causal' or a Mask (Causal(), SlidingWindow(W), their "
                         f"product with &, or a subclass), got {mask!r}")
    if diagonal == "half" and mask is None:
        raise ValueError("diagonal='half' only applies with mask='causal'")
    if window is not None:
        validation.real(window, "window (sliding-window attention, in positions)", positive=True)
        if mask != "causal" or diagonal != "full":
            raise ValueError("window (sliding-window attention, 0 <= p(x) - p(x') < W) needs "
                             "mask='causal' and diagonal='full' (or pass mask=Causal() & "
                             "SlidingWindow(W))")
        return Causal() & SlidingWindow(window)
    return None if mask is None else Causal(diagonal)


def _position(positions, heads: int) -> PositionEncoding:
    """The position encoding (``None``: :class:`NoPositions`), checked against the heads."""
    if positions is None:
        return NoPositions()
    if not isinstance(positions, PositionEncoding):
        raise ValueError(f"positions must be None or a PositionEncoding (RoPE, AxialRoPE, ALiBi, "
                         f"NoPositions or a subclass), got {positions!r}")
    positions.check_heads(heads)
    return positions

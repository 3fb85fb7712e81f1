r"""One layer of the continuous Transformer: :class:`Block`, its sub-flows and their normalizations.

A block is the layer's attention and feed-forward operators with the normalizations
:math:`N_1, N_2` at a placement of :data:`PLACEMENTS`; :meth:`Block.split_problem` turns it into
the :class:`ctformer.solvers.SplitProblem` of one layer on a :class:`ctformer.Grids`. The class
is named ``ctformer.model.Block`` (its ``__module__``, set by :mod:`ctformer.model`), the path
pickles and stored study identities record.
"""
from __future__ import annotations

from typing import Callable

from .. import solvers, validation
from ..operators.attention import Attention
from ..operators.base import check_normalization
from ..operators.feature import FeedForward, GatedFeedForward
from ..operators.functions import named_parameters
from ..state import Grids

#: Where the normalizations of a block act.
PLACEMENTS = ("pre", "post", "none")


class Block:
    r"""One layer of the continuous Transformer: attention and feed-forward sub-flows.

    Parameters
    ----------
    attention : ctformer.operators.Attention or None
        The attention operator :math:`\mathrm{Attn}`; ``None`` drops the sub-flow.
    feedforward : ctformer.operators.FeedForward or None
        The feed-forward operator :math:`F`; ``None`` drops the sub-flow.
    normalization1, normalization2 : ctformer.operators.Normalization or None
        :class:`ctformer.operators.LayerNormProjection`, :class:`ctformer.operators.RMSNorm`,
        :class:`ctformer.operators.SphereProjection`, a user's subclass of
        :class:`ctformer.operators.Normalization`, or ``None`` (identity).
        ``normalization1`` belongs to attention, ``normalization2`` to the feed-forward.
    placement : {"pre", "post", "none"}
        Where the normalizations act:

        - ``"pre"``: flows :math:`u \mapsto \mathrm{Attn}(N_1 u)` and
          :math:`u \mapsto F(N_2 u)`, no projections;
        - ``"post"``: flows :math:`\mathrm{Attn}`, :math:`F` followed by the projections
          :math:`N_1`, :math:`N_2`;
        - ``"none"``: no normalization (both must be ``None``).

    Raises
    ------
    ValueError
        For an unknown placement, a block without sub-flows, or normalizations with
        ``"none"``.
    TypeError
        For a normalization that is not a :class:`ctformer.operators.Normalization`, or an
        attention operator given as ``feedforward`` (a feed-forward one as ``attention``),
        naming the argument.
    """

    @validation.renamed(norm1="normalization1", norm2="normalization2")
    def __init__(self, attention=None, feedforward=None, normalization1=None, normalization2=None,
                 placement="pre"):
        validation.one_of(placement, "placement", PLACEMENTS)
        if attention is None and feedforward is None:
            raise ValueError("a Block needs an attention or a feedforward operator (both are None)")
        if placement == "none" and (normalization1 is not None or normalization2 is not None):
            raise ValueError("placement='none' takes no normalizations; pass normalization1=None "
                             "and normalization2=None")
        normalization1 = check_normalization(normalization1, "normalization1")
        normalization2 = check_normalization(normalization2, "normalization2")
        _check_sub_flow(attention, "attention", (FeedForward, GatedFeedForward), "feedforward")
        _check_sub_flow(feedforward, "feedforward", (Attention,), "attention")
        self.attention = attention
        self.feedforward = feedforward
        self.normalization1 = normalization1
        self.normalization2 = normalization2
        self.placement = placement

    def __repr__(self) -> str:
        return (f"Block(attention={self.attention!r}, feedforward={self.feedforward!r}, "
                f"normalization1={self.normalization1!r}, normalization2={self.normalization2!r}, "
                f"placement={self.placement!r})")

    @property
    def is_consistent_in_depth(self) -> bool:
        """False for a post-norm block with a normalization that is not idempotent
        (:attr:`ctformer.operators.Normalization.is_idempotent`)."""
        if self.placement != "post":
            return True
        return all(n is None or n.is_idempotent for n in (self.normalization1, self.normalization2))

    def parameters(self) -> dict:
        """Named arrays of every parameter of the block (see :meth:`ContinuousTransformer.parameters`)."""
        return named_parameters(attention=self.attention, feedforward=self.feedforward,
                                normalization1=self.normalization1,
                                normalization2=self.normalization2)

    def split_problem(self, grids: Grids, padding_mask=None) -> solvers.SplitProblem:
        r"""The layer as a split problem on ``grids``, acting on stored values.

        Parameters
        ----------
        grids : ctformer.Grids
            Discretizations of tokens, features, head features and the hidden variable.
        padding_mask : bool array of shape (..., N) or ctformer.operators.Padding, optional
            Tokens that are real (True) in padded batches; validated by the caller
            (:meth:`ContinuousTransformer.solve`). Only for nodal token discretizations.
            Combined with the attention's mask here, once
            (:meth:`ctformer.operators.Attention.discretize`): the flows build no mask.

        Returns
        -------
        ctformer.solvers.SplitProblem
            Flows in splitting order (attention, then feed-forward) and, for post-norm, the
            projections :math:`N_1, N_2`, each lifted by :meth:`Grids.lift` from point values
            to stored values (the identity for nodal grids). Each operator is discretized
            once per ``grids``.
        """
        if not isinstance(grids, Grids):
            raise TypeError(f"grids must be a ctformer.Grids, got {type(grids).__name__}")
        attention = None
        if self.attention is not None:
            attention = self.attention.discretize(grids) if padding_mask is None else \
                self.attention.discretize(grids, padding_mask=padding_mask)
        feedforward = self.feedforward.discretize(grids) if self.feedforward is not None else None
        flows, projections = [], []
        for op, normalization in ((attention, self.normalization1), (feedforward, self.normalization2)):
            if op is None:
                continue
            n = normalization.discretize(grids) if normalization is not None else None
            flows.append(_compose(op, n) if self.placement == "pre" and n is not None else op)
            projections.append(n if self.placement == "post" else None)
        flows = [grids.lift(f) for f in flows]
        projections = [grids.lift(p) for p in projections] if any(p is not None for p in projections) else []
        return solvers.SplitProblem(flows, projections)


def _check_sub_flow(op, name: str, other_kinds: tuple, other: str) -> None:
    """``op`` must not be of the other slot's kinds: the splitting runs attention first, so
    swapped operators would silently be another network. Other objects are not checked here
    (a solve needs their ``discretize``)."""
    inner = getattr(op, "operator", op)   # an output-normalized operator (Gemma 2) wraps one
    if isinstance(inner, other_kinds):
        raise TypeError(f"{name} got {type(inner).__name__}, an operator of the {other} sub-flow: "
                        f"pass it as {other}= (Block(attention, feedforward, ...))")


def _compose(op: Callable, normalization: Callable) -> Callable:
    def flow(u):
        return op(normalization(u))

    return flow

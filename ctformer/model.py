r"""The continuous Transformer: blocks of sub-flows evolved in depth by a splitting scheme.

A model with :math:`T` layers is the evolution equation of DESIGN.md section 1 on
:math:`t \in [0, T]`, with parameters piecewise constant on :math:`[l, l + 1)`:

.. math::

    \text{pre-norm:}\quad \partial_t u = \mathrm{Attn}(N_1 u) + F(N_2 u),
    \qquad
    \text{post-norm:}\quad \partial_t u = \mathrm{Attn}(u) + F(u) \ \text{constrained to}\ S_1,

where a post-norm step projects with :math:`N_1` after the attention sub-step and with
:math:`N_2` after the feed-forward sub-step. :class:`Block` turns one layer into a
:class:`ctformer.solvers.SplitProblem` on a given set of :class:`ctformer.operators.Grids`;
:class:`ContinuousTransformer` stacks the blocks and advances them with any
:class:`ctformer.solvers.Scheme`.

With midpoint grids of ``N`` tokens and ``d`` features, ``lie`` and one step per layer, the
solve is exactly the discrete network (DESIGN.md section 2; Tai, Liu, Li, Chan 2025):
:meth:`ContinuousTransformer.run`.
"""
from __future__ import annotations

import warnings
from typing import Callable, Sequence

import array_api_compat
import numpy as np

from . import solvers
from .discretizations import Discretization, Midpoint, as_discretization
from .model_inputs import as_state_array, check_key_mask, sample_initial
from .operators import Grids

__all__ = ["Block", "ContinuousTransformer", "InconsistentDepthLimitWarning"]

PLACEMENTS = ("pre", "post", "none")


class InconsistentDepthLimitWarning(UserWarning):
    """Refining depth on a post-norm model whose normalization is not a projection.

    A post-norm step projects onto the constraint set after every sub-step. When the
    normalization has a per-feature affine map or ``eps > 0`` it is not idempotent, so halving
    the step applies it twice as often and the discrete solutions have no consistent
    continuous-depth limit (DESIGN.md section 1).
    """


def _is_projection(norm) -> bool:
    """Whether a normalization operator is idempotent (a true projection)."""
    if norm is None:
        return True
    return bool(getattr(norm, "is_projection", False))


class Block:
    r"""One layer of the continuous Transformer: attention and feed-forward sub-flows.

    Parameters
    ----------
    attention : ctformer.operators.Attention or None
        The attention operator :math:`\mathrm{Attn}`; ``None`` drops the sub-flow.
    feedforward : ctformer.operators.FeedForward or None
        The feed-forward operator :math:`F`; ``None`` drops the sub-flow.
    norm1, norm2 : normalization operator or None
        :class:`ctformer.operators.LayerNormProjection`,
        :class:`ctformer.operators.SphereProjection` or ``None`` (identity). ``norm1`` belongs
        to attention, ``norm2`` to the feed-forward.
    placement : {"pre", "post", "none"}
        Where the norms act:

        - ``"pre"``: flows :math:`u \mapsto \mathrm{Attn}(N_1 u)` and
          :math:`u \mapsto F(N_2 u)`, no projections;
        - ``"post"``: flows :math:`\mathrm{Attn}`, :math:`F` followed by the projections
          :math:`N_1`, :math:`N_2`;
        - ``"none"``: no normalization (``norm1`` and ``norm2`` must be ``None``).

    Raises
    ------
    ValueError
        For an unknown placement, a block without sub-flows, or norms with ``"none"``.
    """

    def __init__(self, attention=None, feedforward=None, norm1=None, norm2=None, placement="pre"):
        if placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {placement!r}")
        if attention is None and feedforward is None:
            raise ValueError("a Block needs an attention or a feedforward operator (both are None)")
        if placement == "none" and (norm1 is not None or norm2 is not None):
            raise ValueError("placement='none' takes no norms; pass norm1=None and norm2=None")
        self.attention = attention
        self.feedforward = feedforward
        self.norm1 = norm1
        self.norm2 = norm2
        self.placement = placement

    def __repr__(self) -> str:
        return (
            f"Block(attention={self.attention!r}, feedforward={self.feedforward!r}, "
            f"norm1={self.norm1!r}, norm2={self.norm2!r}, placement={self.placement!r})"
        )

    @property
    def is_consistent_in_depth(self) -> bool:
        """False for a post-norm block whose norms are not idempotent projections."""
        if self.placement != "post":
            return True
        return _is_projection(self.norm1) and _is_projection(self.norm2)

    def split_problem(self, grids: Grids, key_mask=None) -> solvers.SplitProblem:
        r"""The layer as a split problem on ``grids``.

        Parameters
        ----------
        grids : ctformer.operators.Grids
            Discretizations of tokens, features, head features and the hidden variable.
        key_mask : bool array of shape (..., N), optional
            Keys to keep in attention (True = a real token), for padded batches. Only for
            nodal token discretizations.

        Returns
        -------
        ctformer.solvers.SplitProblem
            Flows in splitting order (attention, then feed-forward) acting on stored values
            (nodal values or Galerkin coefficients) of shape ``(..., N, d)``; for post-norm
            the projections :math:`N_1, N_2`.

        Notes
        -----
        Operators act on values at quadrature points. For a Galerkin discretization of the
        tokens or the features each flow is wrapped as
        :math:`c \mapsto \Pi\, f(E c)`, with :math:`E` the evaluation at the quadrature points
        (``to_quadrature``) and :math:`\Pi` the :math:`L^2` projection back
        (``from_quadrature``), on both axes. Each operator is discretized once per ``grids``.
        """
        if not isinstance(grids, Grids):
            raise TypeError(f"grids must be a ctformer.operators.Grids, got {type(grids).__name__}")
        if key_mask is not None and grids.tokens.kind == "galerkin":
            raise ValueError("key_mask needs a nodal token discretization, got a Galerkin one")
        attn = None
        if self.attention is not None:
            attn_op = self.attention.discretize(grids)
            attn = attn_op if key_mask is None else (lambda v, _a=attn_op: _a(v, key_mask=key_mask))
        ffn = self.feedforward.discretize(grids) if self.feedforward is not None else None
        n1 = self.norm1.discretize(grids) if self.norm1 is not None else None
        n2 = self.norm2.discretize(grids) if self.norm2 is not None else None

        flows, projections = [], []
        for op, norm in ((attn, n1), (ffn, n2)):
            if op is None:
                continue
            if self.placement == "pre" and norm is not None:
                flows.append(_compose(op, norm))
            else:
                flows.append(op)
            projections.append(norm if self.placement == "post" else None)

        if grids.tokens.kind == "galerkin" or grids.features.kind == "galerkin":
            flows = [_galerkin(f, grids) for f in flows]
            projections = [None if p is None else _galerkin(p, grids) for p in projections]
        if not any(p is not None for p in projections):
            projections = []
        return solvers.SplitProblem(flows, projections)


def _compose(op: Callable, norm: Callable) -> Callable:
    def flow(u):
        return op(norm(u))

    return flow


def _galerkin(f: Callable, grids: Grids) -> Callable:
    """Wrap ``f`` (acting on quadrature values) to act on stored values."""
    tokens, features = grids.tokens, grids.features

    def wrapped(c):
        g = tokens.to_quadrature(features.to_quadrature(c, axis=-1), axis=-2)
        g = f(g)
        return tokens.from_quadrature(features.from_quadrature(g, axis=-1), axis=-2)

    return wrapped


class ContinuousTransformer:
    r"""A Transformer as an evolution equation in depth, :math:`t \in [0, T]`, ``T = len(blocks)``.

    Parameters
    ----------
    blocks : sequence of Block
        Layer :math:`l` (parameters constant on :math:`[l, l + 1)`).
    final_norm : normalization operator or None
        Applied once at :math:`t = T` (pre-norm networks with a final LayerNorm).
    head_features, hidden : Discretization or None
        Default discretizations of the head-feature variable :math:`\sigma` and the FFN
        variable :math:`r` (a converted torch model stores ``Midpoint(d_h)`` and
        ``Midpoint(d_ff)``). ``None``: the same discretization as the features.
    features : Discretization or None
        The native feature discretization of a converted network (``Midpoint(d)``);
        :meth:`run` checks the width of its input against it. ``None``: any width.

    Notes
    -----
    The model is a pure description: nothing is discretized until :meth:`solve` is called
    with token and feature discretizations. See :mod:`ctformer.model` for the equations.
    """

    def __init__(self, blocks: Sequence[Block], final_norm=None, head_features=None, hidden=None,
                 features=None):
        blocks = list(blocks)
        if not blocks:
            raise ValueError("blocks must contain at least one Block")
        for i, b in enumerate(blocks):
            if not isinstance(b, Block):
                raise TypeError(f"blocks[{i}] must be a ctformer.model.Block, got {type(b).__name__}")
        for name, disc in (("head_features", head_features), ("hidden", hidden), ("features", features)):
            if disc is not None and not isinstance(disc, Discretization):
                raise TypeError(f"{name} must be a Discretization or None, got {type(disc).__name__}")
        self.blocks = blocks
        self.final_norm = final_norm
        self.head_features = head_features
        self.hidden = hidden
        self.features = features

    def __repr__(self) -> str:
        placements = sorted({b.placement for b in self.blocks})
        return (f"ContinuousTransformer(layers={self.layers}, placement={'/'.join(placements)}, "
                f"final_norm={self.final_norm is not None})")

    @property
    def layers(self) -> int:
        """Number of layers :math:`T` (the final time)."""
        return len(self.blocks)

    @property
    def warns_inconsistent_depth(self) -> bool:
        """True when refining depth (``steps_per_layer > 1``) has no consistent limit.

        That is the case for a post-norm block whose normalization is not an idempotent
        projection (per-feature gain or shift, or ``eps > 0``); :meth:`solve` then emits
        :class:`InconsistentDepthLimitWarning`.
        """
        return not all(b.is_consistent_in_depth for b in self.blocks)

    # -- grids ---------------------------------------------------------------------------
    def grids(self, tokens, features, head_features=None, hidden=None) -> Grids:
        """The :class:`ctformer.operators.Grids` used by :meth:`solve` for these choices."""
        tokens = as_discretization(tokens)
        features = as_discretization(features)
        head_features = self._default(head_features, self.head_features, features, "head_features")
        hidden = self._default(hidden, self.hidden, features, "hidden")
        return Grids(tokens=tokens, features=features, head_features=head_features, hidden=hidden)

    @staticmethod
    def _default(spec, own, features, name):
        if spec is None:
            return own if own is not None else features
        if isinstance(spec, str):
            return as_discretization(spec, own.n if own is not None else features.n)
        if not isinstance(spec, Discretization):
            raise TypeError(f"{name} must be a Discretization, a name or None, got {type(spec).__name__}")
        return spec

    # -- evolution -----------------------------------------------------------------------
    def solve(self, u0, *, tokens, features, head_features=None, hidden=None, scheme="lie",
              steps_per_layer=1, trajectory=False, key_mask=None):
        r"""Evolve :math:`u_0` from :math:`t = 0` to :math:`t = T`.

        Parameters
        ----------
        u0 : array of shape (..., N, d), or callable
            Values on the tokens x features grid (leading axes are a batch), or a function
            ``u0(x, y)`` broadcasting over ``x`` of shape ``(N, 1)`` and ``y`` of shape
            ``(1, d)``; it is sampled at the nodes (L2-projected for Galerkin rules).
        tokens, features : Discretization or str
            Discretizations of :math:`x` and :math:`y`. A name takes ``n`` from the shape of
            ``u0`` (which must then be an array).
        head_features, hidden : Discretization, str or None
            Discretizations of :math:`\sigma` and :math:`r`. Default: the model's own, else
            ``features``.
        scheme : str or ctformer.solvers.Scheme
            Time integrator, e.g. ``"lie"`` (the discrete Transformer) or ``"euler"``.
        steps_per_layer : int
            Steps :math:`k \ge 1` per layer; :math:`\Delta t = 1/k`.
        trajectory : bool
            Return the states at the layer boundaries :math:`t = 0, 1, \dots, T` instead of
            only the final state. The final norm (if any) is applied to the last entry.
        key_mask : bool array of shape (..., N), optional
            Attention keeps only keys where True (padding masks of real batches).

        Returns
        -------
        array of shape (..., N, d), or list of T + 1 arrays
            :math:`u(T)` (after the final norm), or the trajectory.

        Raises
        ------
        ValueError
            If ``u0`` does not match the grids, ``steps_per_layer`` is not a positive integer,
            the scheme is unknown (the message lists the known ones) or ``key_mask`` has the
            wrong shape.

        Warns
        -----
        InconsistentDepthLimitWarning
            When ``steps_per_layer > 1`` on a model with :attr:`warns_inconsistent_depth`.

        Notes
        -----
        On layer :math:`l` the scheme advances the :class:`ctformer.solvers.SplitProblem` of
        block :math:`l` by ``steps_per_layer`` steps of size :math:`1/k`:

        .. math::  u^{n+1} = \Phi_{\Delta t}(u^n), \qquad t \in [l, l + 1).
        """
        if isinstance(steps_per_layer, bool) or not isinstance(steps_per_layer, (int, np.integer)) \
                or steps_per_layer < 1:
            raise ValueError(f"steps_per_layer must be a positive integer, got {steps_per_layer!r}")
        steps = int(steps_per_layer)
        integrator = solvers.get(scheme)
        if steps > 1 and self.warns_inconsistent_depth:
            warnings.warn(
                "refining depth (steps_per_layer > 1) on a post-norm model whose LayerNorm is not an "
                "idempotent projection (per-feature gain/shift or eps > 0): no consistent "
                "continuous-depth limit exists (DESIGN.md section 1); results depend on the step "
                "count and no convergence order is meaningful",
                InconsistentDepthLimitWarning,
                stacklevel=2,
            )
        u, grids = self._initial_state(u0, tokens, features, head_features, hidden)
        if key_mask is not None:
            key_mask = check_key_mask(key_mask, u)

        dt = 1.0 / steps
        states = [u] if trajectory else None
        for block in self.blocks:
            problem = block.split_problem(grids, key_mask=key_mask)
            for _ in range(steps):
                u = integrator.step(problem, u, dt)
            if trajectory:
                states.append(u)
        if self.final_norm is not None:
            norm = self.final_norm.discretize(grids)
            if grids.tokens.kind == "galerkin" or grids.features.kind == "galerkin":
                norm = _galerkin(norm, grids)
            u = norm(u)
            if trajectory:
                states[-1] = u
        return states if trajectory else u

    def _initial_state(self, u0, tokens, features, head_features, hidden):
        if callable(u0) and not hasattr(u0, "shape"):
            for name, spec in (("tokens", tokens), ("features", features)):
                if not isinstance(spec, Discretization):
                    raise ValueError(
                        f"{name} given as {spec!r} needs n, which a callable u0 cannot provide; "
                        "pass a Discretization object"
                    )
            grids = self.grids(tokens, features, head_features, hidden)
            return sample_initial(u0, grids.tokens, grids.features), grids
        u = as_state_array(u0, "u0")
        if u.ndim < 2:
            raise ValueError(f"u0 must have shape (..., tokens, features), got shape {tuple(u.shape)}")
        tokens = as_discretization(tokens, u.shape[-2])
        features = as_discretization(features, u.shape[-1])
        grids = self.grids(tokens, features, head_features, hidden)
        if tuple(u.shape[-2:]) != (grids.tokens.n, grids.features.n):
            raise ValueError(
                f"u0 has shape {tuple(u.shape)}; its last two axes must be (tokens.n, features.n) = "
                f"({grids.tokens.n}, {grids.features.n})"
            )
        xp = array_api_compat.array_namespace(u)
        if not bool(xp.all(xp.isfinite(u))):
            raise ValueError("u0 contains NaN or inf")
        return u, grids

    def run(self, x, mask=None):
        r"""The discrete network: midpoint grids, ``lie``, one step per layer.

        Parameters
        ----------
        x : array of shape (N, d) or (B, N, d)
            Token states (e.g. embedding outputs), read as values on ``Midpoint(N)`` x
            ``Midpoint(d)``.
        mask : array of shape (N,) or (B, N), optional
            Attention/padding mask, boolean or 0/1, with 1 for a real token (the HuggingFace
            ``attention_mask`` convention; the opposite of torch's ``src_key_padding_mask``).

        Returns
        -------
        array, same shape as ``x``

        Raises
        ------
        ValueError
            If ``x`` has the wrong number of axes, a width other than the model's features, or
            ``mask`` has the wrong shape, values other than 0/1 or a row without real tokens.

        Notes
        -----
        With midpoint nodes every quadrature weight of a variable with ``n`` nodes is
        :math:`1/n`, so the kernel matrices are the torch weights, uniform token weights cancel
        in the softmax and one Lie step of size 1 is one block (DESIGN.md section 2).
        """
        x = as_state_array(x, "x")
        if x.ndim not in (2, 3):
            raise ValueError(f"x must have shape (N, d) or (B, N, d), got shape {tuple(x.shape)}")
        if self.features is not None and x.shape[-1] != self.features.n:
            raise ValueError(f"x has {x.shape[-1]} features, the model expects {self.features.n}")
        return self.solve(x, tokens=Midpoint(x.shape[-2]), features=Midpoint(x.shape[-1]),
                          scheme="lie", steps_per_layer=1, key_mask=mask)

    @classmethod
    def random_smooth(cls, seed=0, layers=2, heads=2, norm="pre", activation="gelu", mask=None,
                      diagonal="full", beta=4.0):
        """A model with smooth random parameters for convergence studies.

        See :func:`ctformer.random_models.random_smooth` for the parameters and the
        construction.
        """
        from .random_models import random_smooth

        return random_smooth(seed=seed, layers=layers, heads=heads, norm=norm, activation=activation,
                             mask=mask, diagonal=diagonal, beta=beta)

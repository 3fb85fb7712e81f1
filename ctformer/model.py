r"""The continuous Transformer: blocks of sub-flows evolved in depth by a splitting scheme.

A model with :math:`T` layers is the evolution equation of the design notes (section 1) on
:math:`t \in [0, T]`, with parameters piecewise constant on :math:`[l, l + 1)`:

.. math::

    \text{pre-norm:}\quad \partial_t u = \mathrm{Attn}(N_1 u) + F(N_2 u),
    \qquad
    \text{post-norm:}\quad \partial_t u = \mathrm{Attn}(u) + F(u) \ \text{constrained to}\ S_1,

where a post-norm step projects with :math:`N_1` after the attention sub-step and with
:math:`N_2` after the feed-forward sub-step. :class:`Block` turns one layer into a
:class:`ctformer.solvers.SplitProblem` on a :class:`ctformer.Grids` (the state space, which
lifts the operators' flows to stored values); :class:`ContinuousTransformer` stacks the
blocks and advances them with any :class:`ctformer.solvers.Scheme`.

A model is data: :meth:`ContinuousTransformer.parameters` is a flat mapping of named arrays,
the rest is a few structural options. Discretized operators are cached outside the model, so
a model pickles with the standard library before and after a solve.

With midpoint grids of ``N`` tokens and ``d`` features, ``lie`` and one step per layer, the
solve is exactly the discrete network (design notes, section 2; Tai, Liu, Li, Chan 2025):
:meth:`ContinuousTransformer.run`.
"""
from __future__ import annotations

from numbers import Real
from typing import Callable, Sequence

import array_api_compat
import numpy as np

from . import solvers, validation
from .discretizations import Discretization, Midpoint, as_discretization
from .kernels import is_host
from .operators.base import check_normalization, has_host_parameters
from .operators.functions import assign_parameter, named_parameters
from .evolution import evolve
from .model_inputs import as_state_array, check_padding_mask, check_steps
from .random_models import random_layers
from .solvers import InconsistentDepthLimitWarning
from .state import Grids

__all__ = ["Block", "ContinuousTransformer", "InconsistentDepthLimitWarning", "PLACEMENTS"]

#: Where the normalizations of a block act.
PLACEMENTS = ("pre", "post", "none")


def _check_parameter_names(own: dict, params) -> None:
    """``params`` must be a mapping with exactly the names of ``own`` (KeyError listing them)."""
    if not hasattr(params, "items") or not hasattr(params, "keys"):
        raise TypeError(f"params must be a mapping name -> array (like parameters()), got "
                        f"{type(params).__name__}")
    missing, unknown = sorted(set(own) - set(params)), sorted(set(params) - set(own))
    if missing or unknown:
        raise KeyError(f"params must have exactly the names of parameters(): missing {missing[:5]}"
                       f"{' ...' if len(missing) > 5 else ''}, unknown {unknown[:5]}"
                       f"{' ...' if len(unknown) > 5 else ''}")


def _checked_parameter(name: str, value, shape: tuple):
    """``value`` as the new parameter ``name`` of ``shape``: a read-only float64 host copy, or
    the tensor itself. Real numbers only, finite, of the parameter's shape."""
    what = f"params[{name!r}]"
    if not is_host(value):   # a tensor of another namespace: kept, so autograd sees it
        xp = array_api_compat.array_namespace(value)
        if not xp.isdtype(value.dtype, "real floating"):
            raise TypeError(f"{what} is a tensor of dtype {value.dtype}; parameters are real: "
                            "pass a real floating tensor (e.g. torch.float64)")
        _check_parameter_shape(what, tuple(value.shape), shape)
        if not bool(xp.all(xp.isfinite(value))):
            raise ValueError(f"{what} holds NaN or inf; parameters must be finite")
        return value
    array = np.asarray(value) if isinstance(value, (np.ndarray, np.generic, Real, list, tuple)) \
        else None
    if array is None or array.dtype.kind not in "iuf":
        kind = "complex numbers" if array is not None and array.dtype.kind == "c" else \
            f"a {type(value).__name__}"
        raise TypeError(f"{what} must be a real array of shape {shape} (a NumPy array, a number "
                        f"or a torch tensor), got {kind}")
    _check_parameter_shape(what, array.shape, shape)
    array = np.array(array, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} holds NaN or inf; parameters must be finite")
    array.setflags(write=False)
    return array


def _check_parameter_shape(what: str, got: tuple, shape: tuple) -> None:
    if tuple(got) != tuple(shape):
        raise ValueError(f"{what} has shape {tuple(got)}, the parameter has shape {tuple(shape)}")


def _device(array):
    """The device of an array of any namespace (``"cpu"`` for NumPy)."""
    return array_api_compat.device(array)


def _check_tensor_kinds(params: dict) -> None:
    """Tensor parameters must share one type, device and dtype (TypeError naming the odd one)."""
    tensors = [(name, v) for name, v in params.items() if not is_host(v)]
    for name, value in tensors[1:]:
        first, like = tensors[0]
        same = type(value) is type(like) and _device(value) == _device(like)
        if not same or value.dtype != like.dtype:
            raise TypeError(
                f"params[{name!r}] is a {type(value).__name__} of dtype {value.dtype} on "
                f"{_device(value)}, params[{first!r}] one of dtype {like.dtype} "
                f"on {_device(like)}: give every tensor parameter one dtype and "
                "device")


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
        For a normalization that is not a :class:`ctformer.operators.Normalization`, naming
        the argument.
    """

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


def _compose(op: Callable, normalization: Callable) -> Callable:
    def flow(u):
        return op(normalization(u))

    return flow


class ContinuousTransformer:
    r"""A Transformer as an evolution equation in depth, :math:`t \in [0, T]`, ``T = len(blocks)``.

    Parameters
    ----------
    blocks : sequence of Block
        Layer :math:`l` (parameters constant on :math:`[l, l + 1)`).
    final_normalization : ctformer.operators.Normalization or None
        Applied once at :math:`t = T` (pre-norm networks with a final LayerNorm).
    head_features, hidden : Discretization or None
        Default discretizations of the head-feature variable :math:`\sigma` and the FFN
        variable :math:`r` (a converted torch model stores ``Midpoint(d_h)`` and
        ``Midpoint(d_ff)``). ``None``: the same discretization as the features.
    features : Discretization or None
        The native feature discretization of a converted network (``Midpoint(d)``);
        :meth:`run` checks the width of its input against it. ``None``: any width.
    context_length : float or None
        The reference length :math:`L` of positions :math:`p(x) = L x - 1/2` for models
        whose operators depend on positions (RoPE, ALiBi, sliding windows). :meth:`run` on
        ``N`` tokens uses :math:`L = N` (positions :math:`0, \dots, N - 1`); :meth:`solve`
        uses this value unless its ``context_length`` keyword overrides it.

    Notes
    -----
    The model is a pure description: nothing is discretized until :meth:`solve` is called
    with token and feature discretizations. See :mod:`ctformer.model` for the equations.
    """

    def __init__(self, blocks: Sequence[Block], final_normalization=None, head_features=None,
                 hidden=None, features=None, *, context_length=None):
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
        self.final_normalization = check_normalization(final_normalization, "final_normalization")
        self.head_features = head_features
        self.hidden = hidden
        self.features = features
        self.context_length = context_length

    def __repr__(self) -> str:
        placements = sorted({b.placement for b in self.blocks})
        return (f"ContinuousTransformer(layers={self.layers}, placement={'/'.join(placements)}, "
                f"final_normalization={self.final_normalization is not None})")

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

    def parameters(self) -> dict:
        r"""Every parameter of the model as a flat mapping ``name -> array`` (host float64).

        Names are dotted paths, e.g. ``"blocks.0.attention.W_Q.1.weight"`` (the query kernel
        of head 1 in layer 0) or ``"final_normalization.gain"``. For a converted network the
        arrays hold exactly as many numbers as the torch or HuggingFace module has
        parameters (a :class:`~ctformer.kernels.PiecewiseConstant` kernel is its weight
        matrix, a piecewise-constant bias its vector). Structural constants (the inverse
        temperatures :math:`\beta_h`, ``eps``, the activation) are options, not parameters.

        The host arrays are read-only views of the model's own arrays (nothing is copied):
        an in-place edit such as ``v *= 2`` raises :class:`ValueError` (``output array is
        read-only``). Change values with :meth:`with_parameters`, which
        returns a new model; the old one, its cached discretizations and its pickled copies
        keep agreeing with each other. Tensors handed in by :meth:`with_parameters` are
        returned as they are (an optimizer updates them in place).
        """
        return named_parameters(blocks=self.blocks, final_normalization=self.final_normalization)

    def with_parameters(self, params) -> "ContinuousTransformer":
        r"""The same model with its parameters replaced by ``params`` (same names as :meth:`parameters`).

        Parameters
        ----------
        params : mapping
            Every name of :meth:`parameters`, each with a real array of the same shape and
            finite values: numbers, NumPy arrays (copied, as read-only float64 arrays, so a
            later edit of the caller's array changes nothing), or torch tensors (used as they
            are: then a solve with a torch ``u0`` differentiates with respect to them:
            ``params = {k: torch.tensor(v, requires_grad=True) ...}``,
            ``model.with_parameters(params).solve(u0, ...)``, ``loss.backward()``). All
            tensors must share one dtype and device, and a solve takes ``u0`` in that dtype.

        Returns
        -------
        ContinuousTransformer
            A new model; this one is unchanged. Operators holding tensors are discretized
            afresh at every solve (never cached), so in-place updates of the tensors (an
            optimizer step) are always seen. ``m.with_parameters(m.parameters())`` is the
            same computation as ``m`` (same results, same study identity).

        Raises
        ------
        KeyError
            For missing or unknown names (listed).
        TypeError
            For a value that is not a real array (a string, complex numbers, ...), or
            tensors of different dtypes or devices: the message names the parameter.
        ValueError
            For an array of another shape than the parameter's, or one holding NaN or inf.
        """
        import copy

        own = self.parameters()
        _check_parameter_names(own, params)
        checked = {name: _checked_parameter(name, value, np.shape(own[name]))
                   for name, value in params.items()}
        _check_tensor_kinds(checked)
        model = copy.deepcopy(self)
        for name, value in checked.items():
            assign_parameter(model, name, value)
        return model

    def _operators(self):
        """Every operator of the model (None where a block has none)."""
        for block in self.blocks:
            yield from (block.attention, block.feedforward, block.normalization1, block.normalization2)
        yield self.final_normalization

    def _check_namespaces(self, u) -> None:
        """A state and tensor parameters must live in one namespace and on one device."""
        if all(op is None or has_host_parameters(op) for op in self._operators()):
            return  # host parameters only, known since each operator was discretized (no walk)
        tensors = [v for v in self.parameters().values() if not is_host(v)]
        if not tensors:
            return
        like = tensors[0]
        if type(u) is not type(like) or _device(u) != _device(like):
            raise TypeError(
                f"the state is a {type(u).__module__}.{type(u).__name__} on "
                f"{_device(u)}, the parameters are {type(like).__module__}."
                f"{type(like).__name__} on {_device(like)}: pass u0 in the "
                "parameters' namespace and on their device")
        if u.dtype != like.dtype:
            name = next(k for k, v in self.parameters().items() if v is like)
            raise TypeError(f"u0 has dtype {u.dtype}, the tensor parameters (e.g. {name!r}) have "
                            f"dtype {like.dtype}: pass u0 as {like.dtype} (u0.to({like.dtype}))")

    # -- grids ---------------------------------------------------------------------------
    def grids(self, tokens, features, head_features=None, hidden=None, context_length=None) -> Grids:
        """The :class:`ctformer.Grids` used by :meth:`solve` for these choices."""
        tokens = as_discretization(tokens)
        features = as_discretization(features)
        head_features = self._default(head_features, self.head_features, features, "head_features")
        hidden = self._default(hidden, self.hidden, features, "hidden")
        length = self.context_length if context_length is None else context_length
        return Grids(tokens=tokens, features=features, head_features=head_features, hidden=hidden,
                     context_length=length)

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
              steps_per_layer=1, trajectory=False, padding_mask=None, context_length=None,
              checkpoint=False, rtol=None, atol=None):
        r"""Evolve :math:`u_0` from :math:`t = 0` to :math:`t = T`.

        Parameters
        ----------
        u0 : array of shape (..., N, d), or callable
            Stored values on the tokens x features grid (leading axes are a batch), or a
            function ``u0(x, y)`` broadcasting over ``x`` of shape ``(N, 1)`` and ``y`` of
            shape ``(1, d)``; it is sampled by :meth:`ctformer.Grids.sample` (nodal values,
            or the :math:`L^2` projection for Galerkin rules).
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
            only the final state. The final normalization (if any) is applied to the last entry.
        padding_mask : bool array of shape (..., N), optional
            Attention keeps only keys where True (padding masks of real batches).
        context_length : float, optional
            Overrides the model's reference length :math:`L` of positions.
        checkpoint : bool
            For a torch ``u0``: keep one state per layer for backpropagation and recompute
            the layer's steps in the backward pass (memory :math:`O(T)`, not
            :math:`O(T k)`).
        rtol, atol : float, optional
            Error control instead of fixed steps: the result is ``evolve(u0, ..., rtol=rtol,
            atol=atol).final`` (after the final normalization); ``steps_per_layer`` must then
            stay 1 (its default).

        Returns
        -------
        array of shape (..., N, d), or list of T + 1 arrays
            :math:`u(T)` (after the final normalization), or the trajectory, in the namespace,
            device and dtype of ``u0``.

        Raises
        ------
        ValueError
            If ``u0`` does not match the grids or is not finite, ``steps_per_layer`` is not a
            positive integer (or the layers would take more than 10**8 steps in all), the
            scheme is unknown (the message lists the known ones),
            ``padding_mask`` has the wrong shape, or the state stops being finite during the
            solve (the message names the layer).

        Warns
        -----
        InconsistentDepthLimitWarning
            When ``steps_per_layer > 1`` on a model with :attr:`warns_inconsistent_depth`.

        Notes
        -----
        The state is validated once, here; the time loop checks finiteness once per layer.
        """
        if rtol is not None or atol is not None:
            return self._solve_controlled(u0, tokens, features, head_features, hidden, scheme,
                                          steps_per_layer, trajectory, padding_mask,
                                          context_length, checkpoint, rtol, atol)
        save_at = solvers.SaveAt(layers=validation.boolean(trajectory, "trajectory"))
        solution = evolve(self, u0, tokens=tokens, features=features, head_features=head_features,
                          hidden=hidden, scheme=scheme, steps_per_layer=steps_per_layer,
                          save_at=save_at, padding_mask=padding_mask,
                          context_length=context_length,
                          checkpoint=validation.boolean(checkpoint, "checkpoint"))
        return self._readout(solution, trajectory)

    def _solve_controlled(self, u0, tokens, features, head_features, hidden, scheme,
                          steps_per_layer, trajectory, padding_mask, context_length, checkpoint,
                          rtol, atol):
        if steps_per_layer != 1:
            raise ValueError(f"steps_per_layer={steps_per_layer!r} and rtol/atol both given: "
                             "choose fixed steps or error control, not both")
        if validation.boolean(checkpoint, "checkpoint"):
            raise ValueError("checkpoint=True needs fixed steps (steps_per_layer), not rtol/atol")
        save_at = solvers.SaveAt(layers=validation.boolean(trajectory, "trajectory"))
        solution = evolve(self, u0, tokens=tokens, features=features, head_features=head_features,
                          hidden=hidden, scheme=scheme,
                          rtol=1e-6 if rtol is None else rtol, atol=1e-9 if atol is None else atol,
                          save_at=save_at, padding_mask=padding_mask, context_length=context_length)
        return self._readout(solution, trajectory)

    def _readout(self, solution, trajectory):
        """The final state after the final normalization (or the layer states, the last one so)."""
        grids = solution.grids
        final = grids.lift(self.final_normalization.discretize(grids)) \
            if self.final_normalization is not None else None
        if trajectory:
            states = [solution.states[i, ...] for i in range(len(solution.times))]
            if final is not None:
                states[-1] = final(states[-1])
            return states
        return solution.final if final is None else final(solution.final)

    def evolve(self, u0, *, tokens, features, head_features=None, hidden=None, scheme="tsit5",
               rtol=1e-6, atol=1e-9, steps_per_layer=None, save_at=None, events=(),
               max_steps=100_000, padding_mask=None, context_length=None, controller=None,
               initial=None):
        r"""Evolve :math:`u_0` in depth with error control (or fixed steps), keeping a :class:`Solution`.

        Inside layer :math:`l` the state obeys :math:`\partial_t u = \sum_k f^{(l)}_k(u)` on
        :math:`[l, l + 1)`; the layer boundaries are jump times that no step crosses. Each step's
        error estimate :math:`e` is measured in the grids' quadrature-weighted norm

        .. math::  \|e\| = \Bigl(\sum_{ij} w^x_i w^y_j \Bigl(\frac{e_{ij}}{\mathrm{atol} +
                   \mathrm{rtol} \max(|u_{ij}|, |u'_{ij}|)}\Bigr)^2 \Big/ \sum_{ij} w^x_i w^y_j
                   \Bigr)^{1/2}

        (a discrete :math:`L^2(X \times Y)` norm, so a tolerance means the same at every
        resolution), and a step is accepted when :math:`\|e\| \le 1`.

        Parameters
        ----------
        u0, tokens, features, head_features, hidden, padding_mask, context_length
            As for :meth:`solve`.
        scheme : str or ctformer.solvers.Scheme
            Default ``"tsit5"``. The embedded pairs (``bosh3``, ``dopri5``, ``tsit5``) estimate
            their error themselves; every other scheme by step doubling (one step of
            :math:`h` against two of :math:`h/2`, Richardson's estimate with the scheme's
            order on this model, :meth:`ctformer.solvers.Scheme.order`), three steps per
            attempted step.
        rtol, atol : float
            Relative and absolute tolerances (:class:`ctformer.solvers.PIController`).
        steps_per_layer : int, optional
            Fixed steps instead of error control: ``k`` steps of :math:`1/k` per layer (the
            same states as :meth:`solve`).
        save_at : ctformer.SaveAt, optional
            Which states to keep (default: the final one); ``SaveAt(dense=True)`` keeps the
            interpolants for :meth:`Solution.evaluate`.
        events : sequence of ctformer.Event
            Located on the dense output of the step where they fire; a terminal one ends the
            solve there.
        max_steps : int
            Most steps (accepted and rejected), default 100000.
        controller : ctformer.solvers.PIController, optional
            Full control of the step rule (PI coefficients, safety, bounds, ``dt0``,
            ``norm="rms"`` for the unweighted norm of scipy, diffrax and torchdiffeq). Its
            tolerances are used; ``rtol``/``atol``/``max_steps`` must then be left at their
            defaults or agree with it.
        initial : ctformer.Solution, saved result or xarray.Dataset, optional
            Restart: continue from the last saved state of an earlier solve (``u0`` must then be
            None), read back with :func:`ctformer.labelled.open_dataset` or given as it is. The
            continued states are bit for bit those of the uninterrupted solve: an
            error-controlled solve restarts at any accepted step's end (``SaveAt(steps=True)``
            or ``SaveAt(layers=True)``), using the step size and error history in its ``stats``;
            a fixed-step one at a layer boundary (:mod:`ctformer.solvers.restart`).

        Returns
        -------
        ctformer.Solution
            ``times``, ``states`` (in the namespace, device and dtype of ``u0``), ``final``,
            ``stats`` (``accepted``, ``rejected``, ``rhs_evaluations``, ``step_times``),
            ``evaluate(t)``, ``event_time``/``event_state``. The states are :math:`u(t)`, before
            the model's final normalization (which :meth:`solve` applies to its result).

        Raises
        ------
        ValueError
            For a bad tolerance (negative, NaN, both zero: the message names it), a
            ``controller`` that contradicts ``rtol``/``atol``, tolerances on a post-norm model
            without a continuous-depth limit (:attr:`warns_inconsistent_depth`), and the
            input errors of :meth:`solve`.
        ctformer.solvers.MaxStepsReached, ctformer.solvers.StepSizeTooSmall
            With the solution so far as ``exc.solution``.

        Notes
        -----
        On torch tensors the solve is differentiable through the accepted steps; step sizes
        and accept/reject decisions are plain floats, not part of the graph (as in diffrax).
        """
        return evolve(self, u0, tokens=tokens, features=features, head_features=head_features,
                      hidden=hidden, scheme=scheme, rtol=rtol, atol=atol,
                      steps_per_layer=steps_per_layer, save_at=save_at, events=events,
                      max_steps=max_steps, padding_mask=padding_mask,
                      context_length=context_length, controller=controller, initial=initial)

    def _initial_state(self, u0, tokens, features, head_features, hidden, context_length):
        if callable(u0) and not hasattr(u0, "shape"):
            for name, spec in (("tokens", tokens), ("features", features)):
                if not isinstance(spec, Discretization):
                    raise ValueError(
                        f"{name} given as {spec!r} needs n, which a callable u0 cannot provide; "
                        "pass a Discretization object"
                    )
            grids = self.grids(tokens, features, head_features, hidden, context_length)
            return grids.sample(u0), grids
        u = as_state_array(u0, "u0")
        if u.ndim < 2:
            raise ValueError(f"u0 must have shape (..., tokens, features), got shape {tuple(u.shape)}")
        tokens = as_discretization(tokens, u.shape[-2])
        features = as_discretization(features, u.shape[-1])
        grids = self.grids(tokens, features, head_features, hidden, context_length)
        grids.validate(u, "u0")
        return u, grids

    def run(self, x, padding_mask=None):
        r"""The discrete network: midpoint grids, ``lie``, one step per layer.

        Parameters
        ----------
        x : array of shape (N, d) or (B, N, d)
            Token states (e.g. embedding outputs), read as values on ``Midpoint(N)`` x
            ``Midpoint(d)``.
        padding_mask : array of shape (N,) or (B, N), optional
            Padding mask, boolean or 0/1, with 1 for a real token (the HuggingFace
            ``attention_mask`` convention; the opposite of torch's ``src_key_padding_mask``).

        Returns
        -------
        array, same shape as ``x``

        Raises
        ------
        ValueError
            If ``x`` has the wrong number of axes, a width other than the model's features, or
            ``padding_mask`` has the wrong shape, values other than 0/1 or a row without real
            tokens.

        Notes
        -----
        With midpoint nodes every quadrature weight of a variable with ``n`` nodes is
        :math:`1/n`, so the kernel matrices are the torch weights, uniform token weights cancel
        in the softmax and one Lie step of size 1 is one block (design notes, section 2).
        """
        x = as_state_array(x, "x")
        if x.ndim not in (2, 3):
            raise ValueError(f"x must have shape (N, d) or (B, N, d), got shape {tuple(x.shape)}")
        if self.features is not None and x.shape[-1] != self.features.n:
            raise ValueError(f"x has {x.shape[-1]} features, the model expects {self.features.n}")
        return self.solve(x, tokens=Midpoint(x.shape[-2]), features=Midpoint(x.shape[-1]),
                          scheme="lie", steps_per_layer=1, padding_mask=padding_mask,
                          context_length=x.shape[-2])

    @classmethod
    def random_smooth(cls, seed=0, layers=2, heads=2, placement="pre", activation="gelu", mask=None,
                      diagonal="full", beta=4.0, **options):
        """A model with smooth random parameters for convergence studies.

        See :func:`ctformer.random_models.random_layers` for the parameters (further keyword
        ``options`` are passed on) and the construction.
        """
        layout = random_layers(seed=seed, layers=layers, heads=heads, placement=placement,
                               activation=activation, mask=mask, diagonal=diagonal, beta=beta,
                               **options)
        blocks = [Block(**block) for block in layout["blocks"]]
        return cls(blocks, final_normalization=layout["final_normalization"],
                   head_features=layout.get("head_features"),
                   context_length=layout.get("context_length"))

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

from typing import Sequence

from .. import solvers, validation
from ..discretizations import Discretization, Midpoint, as_discretization
from ..kernels import is_host
from ..operators.base import check_normalization, has_host_parameters
from ..operators.functions import assign_parameter, named_parameters
from ..evolution import DEFAULT_ATOL as _ATOL, DEFAULT_MAX_STEPS as _MAX_STEPS, DEFAULT_RTOL as _RTOL, evolve
from ..model_inputs import as_state_array, check_padding_mask, check_steps
from ..random_models import random_layers
from ..solvers import InconsistentDepthLimitWarning
from ..state import Grids
# Block, parameter checks and a solve's steps have modules of their own; old names stay importable.
from . import block
from .block import PLACEMENTS, Block, _compose
from .checks import (_check_shared, _copy_to_assign, _check_parameter_names, _check_parameter_shape,
                     _check_tensor_kinds, _checked_parameter, _checked_parameters, _device)
from .solving import DEFAULT_STEPS_PER_LAYER as _ONE_STEP, _Solving, _on_state_device

__all__ = ["Block", "ContinuousTransformer", "InconsistentDepthLimitWarning", "PLACEMENTS"]


class ContinuousTransformer(_Solving):
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

    @validation.renamed(final_norm="final_normalization")
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

        The host arrays are read-only views of the model's own arrays (nothing is copied): an
        in-place edit such as ``v *= 2`` raises :class:`ValueError` (``output array is read-only``).
        Change values with :meth:`with_parameters`, which returns a new model; the old one, its
        cached discretizations and its pickled copies keep agreeing with each other. Tensors
        handed in by :meth:`with_parameters` are returned as they are (an optimizer updates them
        in place), NumPy values handed in beside tensors as the tensors they became.
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
            Given with tensors, NumPy arrays and numbers become tensors of that dtype and
            device (copies that no gradient reaches: frozen parameters), as a solve would
            assemble them anyway.

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
            For a value that is not a real array (a string, complex numbers, a torch ``meta``
            tensor), or tensors of different dtypes or devices: the message names it.
        ValueError
            For an array of another shape, one holding NaN or inf, a NumPy value beside tensors
            that overflows their dtype, or names of one weight shared by layers given two values.
        """
        checked = _checked_parameters(self, params)
        model = _copy_to_assign(self)
        for name, value in checked.items():
            assign_parameter(model, name, value)
        return _check_shared(model, checked)

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

    # -- evolution -----------------------------------------------------------------------
    @validation.renamed(key_mask="padding_mask")
    def solve(self, u0, *, tokens, features, head_features=None, hidden=None, scheme="lie",
              steps_per_layer=_ONE_STEP, trajectory=False, padding_mask=None, context_length=None,
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
            an array ``u0``; ``"NAME:N"`` gives it (it must then agree with an array's shape).
        head_features, hidden : Discretization, str or None
            Discretizations of :math:`\sigma` and :math:`r`. Default: the model's own, else
            ``features``.
        scheme : str or ctformer.solvers.Scheme
            Time integrator, e.g. ``"lie"`` (the discrete Transformer, the default, also with
            ``rtol``/``atol``, unlike :meth:`evolve`'s ``"tsit5"``) or ``"euler"``.
        steps_per_layer : int
            Steps :math:`k \ge 1` per layer; :math:`\Delta t = 1/k` (``None`` is refused).
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
            Error control: ``evolve(u0, ..., scheme=scheme, rtol=rtol, atol=atol).final``, then
            normalized, with this method's scheme (``"lie"``, order 1, takes about
            :math:`\mathrm{rtol}^{-1}` steps: below 1e-3 pass ``scheme="tsit5"``); ``steps_per_layer`` stays 1.

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
            scheme is unknown (the message lists the known ones), ``padding_mask`` has the
            wrong shape, or the state stops being finite during the solve (naming the layer).
        TypeError
            If ``u0`` is a torch tensor on the value-less ``meta`` device, or is not in the
            namespace, device and dtype of tensor parameters (:meth:`with_parameters`).

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
        with _on_state_device(u0):
            solution = evolve(self, u0, tokens=tokens, features=features, head_features=head_features,
                              hidden=hidden, scheme=scheme,  # None below would mean error control
                              steps_per_layer=check_steps(steps_per_layer, self.layers),
                              save_at=save_at, padding_mask=padding_mask, context_length=context_length,
                              checkpoint=validation.boolean(checkpoint, "checkpoint"))
            return self._readout(solution, trajectory)

    def evolve(self, u0, *, tokens, features, head_features=None, hidden=None, scheme="tsit5",
               rtol=_RTOL, atol=_ATOL, steps_per_layer=None, save_at=None, events=(),
               max_steps=_MAX_STEPS, padding_mask=None, context_length=None, controller=None,
               initial=None):
        r"""Evolve :math:`u_0` in depth with error control (or fixed steps), keeping a :class:`Solution`.

        Inside layer :math:`l` the state obeys :math:`\partial_t u = \sum_k f^{(l)}_k(u)` on
        :math:`[l, l + 1)`; the layer boundaries are jump times that no step crosses. Each step's
        error estimate :math:`e` is measured in the grids' quadrature-weighted norm

        .. math::  \|e\| = \Bigl(\sum_{ij} w^x_i w^y_j \Bigl(\frac{e_{ij}}{\mathrm{atol} +
                   \mathrm{rtol} \max(|u_{ij}|, |u'_{ij}|)}\Bigr)^2 \Big/ \sum_{ij} w^x_i w^y_j
                   \Bigr)^{1/2}

        (a discrete :math:`L^2(X \times Y)` norm, so a tolerance means the same at every
        resolution; padded tokens weigh 0, each sequence's real ones its total weight), and a
        step is accepted when :math:`\|e\| \le 1`.

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
            same states as :meth:`solve`); rtol, atol, max_steps, controller passed beside it
            are refused, a value equal to the default too.
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
            tolerances are used; ``rtol``/``atol``/``max_steps`` passed must agree with it.
        initial : ctformer.Solution, saved result or xarray.Dataset, optional
            Restart: continue from the last saved state of an earlier solve (``u0`` must then be
            None), read back with :func:`ctformer.labelled.open_dataset` or given as it is. The
            continued states are bit for bit those of the uninterrupted solve: an
            error-controlled solve restarts at any accepted step's end (``SaveAt(steps=True)``
            or ``SaveAt(layers=True)``), using the step size and error history in its ``stats``;
            a fixed-step one at a layer boundary (:mod:`ctformer.solvers.restart`). A restart
            with another scheme, model, discretization, context length, tolerance, error norm or
            padding mask than the saved solve's is refused, naming each (:mod:`~ctformer.solvers.restart_identity`).

        Returns
        -------
        ctformer.Solution
            ``times``, ``states`` (in the namespace, device and dtype of ``u0``), ``final``,
            ``stats`` (``accepted``, ``rejected``, ``rhs_evaluations``, ``step_times``),
            ``evaluate(t)``, ``event_time``/``event_state``/``event_terminal``. The states are
            :math:`u(t)`, before the model's final normalization (which :meth:`solve` applies).

        Raises
        ------
        ValueError
            For a bad tolerance (negative, NaN, both zero: the message names it), a ``controller``
            that contradicts ``rtol``/``atol``, tolerances on a post-norm model without a
            continuous-depth limit (:attr:`warns_inconsistent_depth`), and :meth:`solve`'s input errors.
        ctformer.solvers.MaxStepsReached, ctformer.solvers.StepSizeTooSmall
            With the solution so far as ``exc.solution``.

        Notes
        -----
        On torch tensors the solve is differentiable through the accepted steps; step sizes
        and accept/reject decisions are plain floats, not part of the graph (as in diffrax).
        """
        with _on_state_device(u0):
            return evolve(self, u0, tokens=tokens, features=features, head_features=head_features,
                          hidden=hidden, scheme=scheme, rtol=rtol, atol=atol,
                          steps_per_layer=steps_per_layer, save_at=save_at, events=events,
                          max_steps=max_steps, padding_mask=padding_mask,
                          context_length=context_length, controller=controller, initial=initial)

    @validation.renamed(mask="padding_mask")
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
            Left or right padding: every sequence keeps the positions :math:`0, \dots, N - 1`
            of the padded array; padded tokens get finite outputs that no real token reads.

        Returns
        -------
        array, same shape as ``x``

        Raises
        ------
        ValueError
            If ``x`` has the wrong number of axes, no tokens or features, a width other than the
            model's features, masked entries (a masked array), NaN or inf, or ``padding_mask``
            has the wrong shape, values other than 0/1 or a row without real tokens.
        TypeError
            If ``x`` or ``padding_mask`` is a torch tensor on the value-less ``meta`` device, ``x``
            not a real array or not in the namespace, device and dtype of tensor parameters.

        Notes
        -----
        With midpoint nodes every quadrature weight of a variable with ``n`` nodes is
        :math:`1/n`, so the kernel matrices are the torch weights, uniform token weights cancel
        in the softmax and one Lie step of size 1 is one block (design notes, section 2).
        """
        x = self._run_input(x, padding_mask)
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

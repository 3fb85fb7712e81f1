r"""Gradients of a loss on :math:`u(T)`: autograd of the discrete solve, and the continuous adjoint.

For a pre-norm model :math:`u' = \sum_k f_k(u)` on :math:`[0, T]` (parameters constant on each
layer) and a loss :math:`J(N(u(T)))` (:math:`N` the final normalization), the gradient with
respect to the initial state is :math:`\lambda(0)`, where the adjoint state solves

.. math::

    -\lambda'(t) = \Big(\sum_k \frac{\partial f_k}{\partial u}(u(t))\Big)^{\!T} \lambda(t), \qquad
    \lambda(T) = \Big(\frac{\partial N}{\partial u}(u(T))\Big)^{\!T} \nabla J .

The gradient with respect to a parameter :math:`\theta` of layer :math:`l` is

.. math::  \frac{dJ}{d\theta} = \int_l^{l+1} \lambda(t) \cdot \frac{\partial f}{\partial \theta}(u(t))\, dt ,

accumulated during the same backward solve.

Two routes give both (:func:`gradient`):

* ``route="autograd"`` (discretize, then optimize): torch's autograd differentiates the
  discrete solve; this is the exact gradient of the discrete map.
* ``route="adjoint"`` (optimize, then discretize): the adjoint equation is integrated backward
  in depth *with the same scheme*, together with the state, as the time-reversed split
  problem on :math:`z = (u, \lambda)` with sub-flows
  :math:`g_k(z) = \big(-f_k(u),\ (\partial f_k / \partial u)^T \lambda\big)` in reverse order.
  Memory is :math:`O(1)` in the number of steps (no tape); each vector-Jacobian product is one
  local autograd call.

The two differ by the discretization error of the backward solve, :math:`O(\Delta t^p)` with
:math:`p` the scheme's order; they do not coincide exactly for any of the library's schemes
(the discrete adjoint of an explicit method evaluates the Jacobians at the start of each step,
the backward solve at its end).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from . import solvers
from .evolution import _real_token_weights
from .model_inputs import as_state_array, check_padding_mask, check_steps
from .shared_tensors import check_unchanged, tied_copies
from .solvers.controller import DEFAULT_STEPS_PER_LAYER, is_default
from .validation import boolean, one_of

__all__ = ["gradient"]


def _torch():
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is the test extra
        raise ImportError('ctformer.adjoint needs torch: pip install "ctformer[demo]"') from None
    return torch


class _Augmented:
    """The backward state ``(z, g)``: ``z = stack(u, lambda)`` and the flat parameter
    gradient ``g``; adds and scales like one array, so every scheme can step it."""

    __slots__ = ("z", "g")

    def __init__(self, z, g):
        self.z, self.g = z, g

    def __add__(self, other):
        return _Augmented(self.z + other.z, self.g + other.g)

    def __rmul__(self, scalar):
        return _Augmented(scalar * self.z, scalar * self.g)

    __mul__ = __rmul__

    def __truediv__(self, scalar):
        return _Augmented(self.z / scalar, self.g / scalar)


def _vjps(torch, f: Callable, u, cotangent, params):
    r""":math:`(\partial f/\partial u)^T c` and the flat :math:`(\partial f/\partial \theta)^T c`."""
    with torch.enable_grad():
        x = u.detach().requires_grad_(True)
        out = f(x)
        # retain: the operators' constants were assembled from the parameters once, for the whole solve
        grads = torch.autograd.grad(out, [x, *params], grad_outputs=cotangent, allow_unused=True,
                                    retain_graph=bool(params))
    flat = [torch.zeros_like(p).reshape(-1) if g is None else g.reshape(-1)
            for p, g in zip(params, grads[1:])]
    return out.detach(), grads[0], (torch.cat(flat) if flat else cotangent.new_zeros(0))


def _backward_problem(torch, problem: solvers.SplitProblem, params) -> solvers.SplitProblem:
    """The time-reversed augmented problem on (stack(u, lambda), g), sub-flows reversed."""

    def reversed_flow(f):
        def g(state):
            u, lam = state.z[0], state.z[1]
            value, u_bar, theta_bar = _vjps(torch, f, u, lam, params)
            return _Augmented(torch.stack([-value, u_bar]), theta_bar)

        return g

    return solvers.SplitProblem([reversed_flow(f) for f in reversed(problem.flows)])


def _controlled_backward(torch, problems, params, state, controller, integrator, weights):
    r"""The backward solve with ``controller``: the augmented state packed into one row.

    The step sizes control :math:`(u, \lambda)` in the forward solve's norm (``weights``: the
    grids' token and feature weights, the tokens' per sequence for a padded batch) and
    leave the parameter gradient :math:`g` out of it (a seminorm): :math:`g` is a quadrature
    of :math:`\lambda \cdot \partial f/\partial \theta` and feeds nothing back, so steps that
    resolve :math:`(u, \lambda)` resolve its integrand. In the norm, each entry of :math:`g`
    starts a layer at 0 and grows like :math:`h`, its error like :math:`h^{p+1}`: at first
    order the relative error of the first step does not shrink with :math:`h`, and the steps
    fell to :math:`\mathrm{atol}/\mathrm{rtol}`.
    """
    shape, n_g = state.z.shape, state.g.numel()
    # the row's weights: the cell weights on every entry of (u, lambda) (token weights of
    # shape (..., N), padded tokens 0, are each sequence's own), zero on g
    cells = np.asarray(weights[0], dtype=np.float64)[..., :, None] * np.asarray(weights[1])
    cells = np.broadcast_to(cells, shape).reshape(-1)
    weights = (np.ones(1), np.concatenate([cells, np.zeros(n_g)]))

    def pack(a):
        return torch.cat([a.z.reshape(-1), a.g])[None, :]

    def unpack(row):
        flat = row[0]
        return _Augmented(flat[: flat.numel() - n_g].reshape(shape), flat[flat.numel() - n_g:])

    def packed(f):
        return lambda row: pack(f(unpack(row)))

    backward = [solvers.SplitProblem([packed(f) for f in _backward_problem(torch, p, params).flows])
                for p in reversed(problems)]
    solution = solvers.integrate(solvers.Piecewise.layers(backward), pack(state), controller,
                                 scheme=integrator, weights=weights, order=integrator.order(),
                                 what="the adjoint state", layered=True)
    return unpack(solution.final)


def _as_tensor(torch, u0):
    """``u0`` as a torch tensor, and whether the caller gave NumPy (then results go back as NumPy).

    Floating torch tensors are used as they are; NumPy arrays and lists become a CPU tensor
    of their floating dtype. Integers (NumPy or torch) become float64; boolean and complex
    values are refused here, under the name ``u0`` (the parameters are cast to ``u0``'s dtype
    next, and would otherwise be blamed for it).
    """
    arr = as_state_array(u0, "u0")
    if isinstance(arr, torch.Tensor):
        return arr, False
    if isinstance(arr, np.generic):  # a NumPy scalar: its shape () is refused by name later
        arr = np.asarray(arr)
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"u0 must be a torch tensor or a NumPy array for gradients, got "
                        f"{type(u0).__module__}.{type(u0).__name__}; convert it with torch.as_tensor")
    return torch.from_numpy(np.array(arr, copy=True)), True


def _loss_value(torch, loss: Callable, u):
    r"""``loss(u)`` checked to be a finite scalar torch tensor that depends on ``u``.

    Raises
    ------
    TypeError
        If the result is not a torch tensor (a Python or NumPy number has no gradient).
    ValueError
        If it is not a scalar, does not depend on ``u``, or is NaN or inf.
    """
    value = loss(u)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"loss must return a scalar torch tensor computed from its argument with "
                        f"torch operations, got {type(value).__name__} {value!r}; a Python or NumPy "
                        "number carries no gradient (return e.g. (u ** 2).sum(), not float(...))")
    if value.numel() != 1:
        raise ValueError(f"loss must return a scalar, got a tensor of shape {tuple(value.shape)}; "
                         "reduce it (e.g. with .sum())")
    if value.is_complex():
        raise ValueError(f"loss must return a real scalar, got dtype {value.dtype}; return e.g. "
                         "its absolute value squared")
    if not value.requires_grad:
        raise ValueError("loss returned a tensor that does not depend on its argument (no "
                         "gradient flows to it); compute the loss from u(T) with torch operations, "
                         "without .item(), .detach() or NumPy")
    if not bool(torch.isfinite(value.detach()).all()):
        raise ValueError(f"loss is {float(value.detach().reshape(()))} at u(T); its gradient "
                         "would be NaN")
    return value.reshape(())


def _loss_gradients(torch, loss: Callable, x, argument, params):
    """``loss(argument)`` checked, then its gradients: with respect to ``x`` (of which
    ``argument`` is a function) and the flat gradients of ``params`` (zeros where unused).

    Raises
    ------
    ValueError
        If the loss does not depend on ``x`` (only on other tensors that require gradients),
        or its gradient at ``argument`` has a NaN or inf entry (a finite loss that is not
        differentiable there, such as ``sqrt`` or ``abs`` at 0).
    """
    value = _loss_value(torch, loss, argument)
    grads = torch.autograd.grad(value, [x, argument, *params], allow_unused=True)
    if grads[0] is None:
        raise ValueError("loss returned a tensor that does not depend on its argument (no "
                         "gradient flows to it); compute the loss from u(T) with torch operations")
    _check_finite(torch, {"its argument u(T)": grads[1]}, f"the loss is finite there, "
                  f"{float(value.detach())!r}", "loss is not differentiable at u(T) (e.g. sqrt "
                  "or abs at 0): smooth it there, e.g. sqrt(x + 1e-12)")
    return grads[0], [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads[2:])]


def _check_finite(torch, gradients, what: str, cause: str):
    """Refuse a NaN or inf among ``gradients`` (name -> tensor): torch would hand it on silently.

    Raises
    ------
    ValueError
        Naming the first gradient with a NaN or inf entry, how many, ``what`` was
        differentiated and the likely ``cause``.
    """
    for name, g in gradients.items():
        bad = int((~torch.isfinite(g.detach())).sum())
        if bad:
            raise ValueError(f"the gradient of loss with respect to {name} has {bad} NaN or inf "
                             f"entries of {g.numel()} ({what}); {cause}")


def gradient(model, u0, loss: Callable, *, tokens, features, head_features=None, hidden=None,
             scheme="lie", steps_per_layer: int = DEFAULT_STEPS_PER_LAYER, route: str = "adjoint",
             parameters: bool = False, rtol=None, atol=None, padding_mask=None,
             context_length=None):
    r"""The gradient of ``loss(u(T))`` with respect to ``u0`` (and the model's parameters).

    Parameters
    ----------
    model : ContinuousTransformer
        A model without projections after sub-steps (pre-norm or no normalization) for
        ``route="adjoint"``; any model for ``route="autograd"``.
    u0 : torch.Tensor or numpy.ndarray
        Stored values on the grids (any device for torch), computed in their floating dtype
        (float32 stays float32). A NumPy array (or list) is computed in torch on the CPU, and
        the gradients come back as NumPy. A tensor that requires grad (a leaf or not) is
        used by value: the result carries no graph; ``u0.backward(result)`` carries it on
        to the tensors ``u0`` was computed from.
    loss : callable
        ``loss(u_T) -> scalar torch tensor``, differentiable by torch. It always receives a
        torch tensor (also for a NumPy ``u0``).
    tokens, features, head_features, hidden : Discretization or str
        As in :meth:`ContinuousTransformer.solve` (a name takes ``n`` from ``u0``'s shape).
    scheme : str
        Any name of :func:`ctformer.solvers.available`; default ``"lie"``, the default of
        :meth:`~ctformer.ContinuousTransformer.solve` (with ``steps_per_layer=1`` it is the
        discrete network), so both compute the same forward map. Every scheme works on both
        routes, ``"parallel"`` included.
    steps_per_layer : int
        Steps per layer, a positive integer (at most 10**8 steps over all layers).
    route : {"adjoint", "autograd"}
        Optimize-then-discretize (backward adjoint solve) or discretize-then-optimize.
    parameters : bool
        Also return the gradient with respect to every parameter of ``model.parameters()``.
    rtol, atol : float, optional
        Error control instead of ``steps_per_layer`` (which must stay 1): the forward solve is
        :meth:`~ctformer.ContinuousTransformer.evolve` with these tolerances, and on the adjoint
        route the backward solve of the augmented state :math:`(u, \lambda, g)` is
        error-controlled too, layer by layer from :math:`T` to 0, with the same controller and
        evolve's norm (the grids' weighted RMS, padded tokens at 0) over :math:`(u, \lambda)`. The
        parameter gradient :math:`g` is left out of the norm (a seminorm): it is a quadrature
        that feeds nothing back, so ``parameters=True`` takes the same steps as ``False``.
        A scheme of order :math:`p` takes about :math:`\mathrm{rtol}^{-1/p}` steps: the
        default ``"lie"`` (:math:`p = 1`) ten times more per decade; below ``rtol=1e-3``
        prefer ``"rk4"`` or ``"tsit5"``.
    padding_mask : bool array of shape (..., N), optional
        As in :meth:`~ctformer.ContinuousTransformer.solve` (1 for a real token): attention
        reads only real tokens, on both routes.
    context_length : float, optional
        As in :meth:`~ctformer.ContinuousTransformer.solve`: the reference length :math:`L`
        of positions, which a converted RoPE or ALiBi network needs (``N`` for the network
        on ``N`` tokens, as in :meth:`~ctformer.ContinuousTransformer.run`).

    Returns
    -------
    torch.Tensor or (torch.Tensor, dict)
        :math:`\partial J / \partial u_0` (the shape of ``u0``); with ``parameters=True``
        also a dict name -> gradient (the shapes of the parameters). Names that alias one
        weight (layers sharing it, as in ALBERT, or given one tensor by ``with_parameters``)
        each get that weight's whole gradient, the sum over the layers that use it, as torch's
        autograd of the model gives. NumPy arrays instead of tensors when ``u0`` was NumPy.

    Raises
    ------
    TypeError
        If ``u0`` is neither a torch tensor nor a NumPy array (or list), ``loss`` is not
        callable, ``parameters`` is not ``True`` or ``False``, or ``loss`` returns something
        other than a torch tensor.
    ValueError
        For an unknown ``route`` or ``scheme``, a ``steps_per_layer`` that is not a positive
        integer, a post-norm model on the adjoint route (its projections have no adjoint
        flow), a loss that is not a finite scalar depending on ``u(T)``, or a gradient with a
        NaN or inf entry (a loss not differentiable at ``u(T)``, or an overflowing solve).
    StaleConversionError
        If ``model`` was converted from a module whose tensors changed in place since (as
        :meth:`~ctformer.ContinuousTransformer.solve` raises): convert the module again.

    Notes
    -----
    The adjoint route's gradient differs from the autograd route's (the exact gradient of the
    discrete solve) by :math:`O(\Delta t^p)`, :math:`p` the scheme's order.
    """
    torch = _torch()
    one_of(route, "route", ("adjoint", "autograd"))
    parameters = boolean(parameters, "parameters")
    if not callable(loss):
        raise TypeError(f"loss must be a callable loss(u_T) -> scalar torch tensor, got "
                        f"{type(loss).__name__}")
    given = not is_default(steps_per_layer)  # before check_steps, which makes it a plain int
    steps_per_layer = check_steps(steps_per_layer, len(model.blocks))
    integrator = solvers.get(scheme)
    u0, numpy_in = _as_tensor(torch, u0)
    # the copy below shares nothing with a converted module, so it could not see a change
    check_unchanged(model)
    values = model.parameters()
    names = sorted(values)
    model = model.with_parameters(tied_copies(values, u0, parameters))
    # names that alias one weight all hold the tensor assigned last: differentiate that one
    used = model.parameters()
    params = list({id(used[n]): used[n] for n in names}.values()) if parameters else []
    kw = dict(tokens=tokens, features=features, head_features=head_features, hidden=hidden,
              scheme=integrator, steps_per_layer=steps_per_layer, padding_mask=padding_mask,
              context_length=context_length)
    control = _control(steps_per_layer, rtol, atol, given)
    if not isinstance(control, int):
        kw.update(rtol=control.rtol, atol=control.atol)
        del kw["steps_per_layer"]  # error control: solve's own default
    if route == "autograd":
        x = u0.detach().requires_grad_(True)
        u0_grad, grads = _loss_gradients(torch, loss, x, model.solve(x, **kw), params)
        cause = "the solve overflowed or is not differentiable at this state"
    else:
        u0_grad, grads = _adjoint_route(torch, model, u0, loss, params, control, integrator, kw)
        cause = ("the backward solve overflowed: take more steps_per_layer, or give rtol/atol "
                 "for error control")
    position = {id(p): i for i, p in enumerate(params)}
    grads = [grads[position[id(used[n])]] for n in names] if parameters else []
    _check_finite(torch, {"u0": u0_grad, **dict(zip(names, grads))}, f"route={route!r}", cause)
    convert = (lambda t: t.detach().cpu().numpy()) if numpy_in else (lambda t: t)
    return (convert(u0_grad), {n: convert(g) for n, g in zip(names, grads)}) if parameters \
        else convert(u0_grad)


def _control(steps_per_layer: int, rtol, atol, given: bool):
    """``steps_per_layer`` (fixed steps) or a :class:`~ctformer.solvers.PIController`;
    ``given``: the caller passed ``steps_per_layer`` (an explicit 1 beside rtol is refused)."""
    if rtol is None and atol is None:
        return steps_per_layer
    if given:
        raise ValueError(f"steps_per_layer={steps_per_layer!r} and rtol/atol both given: "
                         "choose fixed steps or error control, not both")
    return solvers.PIController(rtol=1e-6 if rtol is None else rtol,
                                atol=1e-9 if atol is None else atol)


def _adjoint_route(torch, model, u0, loss, params, control, integrator, kw):
    r"""Forward solve without a tape, then the augmented state :math:`(u, \lambda, g)` from
    :math:`T` back to 0: the gradients with respect to ``u0`` and to each of ``params``.
    ``kw``: the keywords of the equivalent :meth:`ContinuousTransformer.solve`."""
    # as solve reads them: names of discretizations, context_length, the padding mask
    u0, grids = model._initial_state(u0, kw["tokens"], kw["features"], kw["head_features"],
                                     kw["hidden"], kw["context_length"])
    mask = kw["padding_mask"]
    if mask is not None:
        if not grids.is_nodal:
            raise ValueError("padding_mask needs nodal token and feature discretizations, "
                             "got a Galerkin one")
        mask = check_padding_mask(mask, u0)
    # evolve's norm (padded tokens weigh 0): with rtol/atol the steps of solve/evolve
    weights = solvers.grid_weights(grids)
    weights = weights if mask is None else _real_token_weights(weights, mask)
    problems = [block.split_problem(grids, mask) for block in model.blocks]
    if solvers.projects(problems):
        raise ValueError("route='adjoint' needs a model without projections after sub-steps "
                         "(pre-norm or no normalization); use route='autograd' for post-norm")
    with torch.no_grad():   # the forward solve keeps no tape: only u(T) is needed
        u_t = solvers.integrate(solvers.Piecewise.layers(problems), u0.detach(), control,
                                scheme=integrator, weights=weights,
                                order=integrator.order(model), layered=True).final
    final = model.final_normalization
    final = grids.lift(final.discretize(grids)) if final is not None else (lambda v: v)
    with torch.enable_grad():
        x = u_t.detach().requires_grad_(True)
        lam, terminal = _loss_gradients(torch, loss, x, final(x), params)
    flat = [g.reshape(-1) for g in terminal]
    state = _Augmented(torch.stack([u_t.detach(), lam]), torch.cat(flat) if flat else lam.new_zeros(0))
    if isinstance(control, int):
        dt = 1.0 / control
        for problem in reversed(problems):
            backward = _backward_problem(torch, problem, params)
            for _ in range(control):
                state = integrator.step(backward, state, dt)
    else:
        state = _controlled_backward(torch, problems, params, state, control, integrator, weights)
    chunks = torch.split(state.g, [p.numel() for p in params]) if params else []
    return state.z[1], [c.reshape(p.shape) for c, p in zip(chunks, params)]


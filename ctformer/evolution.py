r"""Depth evolution of a :class:`~ctformer.ContinuousTransformer` with a :class:`~ctformer.Solution`.

Inside layer :math:`l` the state obeys :math:`\partial_t u = \sum_k f^{(l)}_k(u)` on
:math:`t \in [l, l + 1)`; the parameters jump at every integer depth. :func:`evolve` hands the
layers to the one time loop (:func:`ctformer.solvers.integrate`) as a piecewise problem whose
segment ends are those jump times, with either ``steps_per_layer`` fixed steps or a
:class:`~ctformer.solvers.PIController` whose error norm is the grids' quadrature-weighted
:math:`L^2(X \times Y)` norm (:func:`~ctformer.solvers.grid_weights`).
"""
from __future__ import annotations

import numpy as np

from . import solvers
from ._numerics import sequence_groups as _sequence_groups
from ._numerics.elementwise import add as threaded_add
from ._numerics.threads import fixed_threads
from .backend import to_host
from .discretizations import memory as _memory
from .model_inputs import check_padding_mask, check_steps
from .shared_tensors import check_unchanged
from .solvers.controller import DEFAULT_ATOL, DEFAULT_MAX_STEPS, DEFAULT_RTOL, is_default
from .solvers.events import check_events
from .solvers.restart import restart_point
from .solvers.restart_identity import computation, mask_digest, model_fingerprint, recorded, refuse_another
from .solvers.runge_kutta import summing

__all__ = ["evolve", "controller_for", "refuse_error_control"]


def _passed(value, default, marked: bool) -> bool:
    """Whether a caller passed ``value`` for a keyword whose default is ``default``: any object but
    the marked default (:data:`~ctformer.solvers.controller.DEFAULT_RTOL`, an explicit ``1e-6``
    included) when the signature has ``marked`` defaults, else any other value."""
    return not is_default(value) and (marked or value != default)


def controller_for(rtol, atol, controller, max_steps, *, marked=False):
    """The :class:`~ctformer.solvers.PIController` of ``rtol``, ``atol`` and ``max_steps``, or
    ``controller`` itself, whose settings must then not contradict those passed (``marked``:
    the caller's defaults are the marked objects, so an explicit default value counts)."""
    if controller is None:
        return solvers.PIController(rtol=rtol, atol=atol, max_steps=max_steps)
    if not isinstance(controller, solvers.PIController):
        raise TypeError(f"controller must be a ctformer.solvers.PIController or None, got "
                        f"{type(controller).__name__}")
    given = {"rtol": (rtol, 1e-6), "atol": (atol, 1e-9), "max_steps": (max_steps, 100_000)}
    # an array of several values is no setting of the controller (its != is no bool either)
    clash = [f"{name}={value!r}" for name, (value, default) in given.items()
             if _passed(value, default, marked) and (np.ndim(value) != 0 or bool(value != getattr(controller, name)))]
    if clash:
        raise ValueError(f"{', '.join(clash)} contradict{'s' if len(clash) == 1 else ''} the "
                         f"controller's ({controller!r}); set them on the controller only")
    return controller


def refuse_error_control(fixed: str, rtol, atol, controller, max_steps, *, marked=False) -> None:
    """Refuse by name a tolerance, controller or ``max_steps`` beside the option ``fixed``
    (``"steps_per_layer=2"``, ``"dt=0.1"``) that asks for fixed steps, which have no error
    control: they would be ignored. With ``marked`` defaults (the signature's are
    :data:`~ctformer.solvers.controller.DEFAULT_RTOL` and its kin) every value passed is refused,
    one equal to the default included; without, values other than the defaults."""
    given = [f"{name}={value!r}" for name, value, default in
             (("rtol", rtol, 1e-6), ("atol", atol, 1e-9), ("max_steps", max_steps, 100_000))
             if _passed(value, default, marked)] + (["controller"] if controller is not None else [])
    if given:
        raise ValueError(f"{fixed} and {', '.join(given)} both given: fixed steps take no error "
                         f"control; choose fixed steps (drop {', '.join(g.split('=')[0] for g in given)}) "
                         f"or error control (drop {fixed.split('=')[0]})")


def _fixed_steps(model, steps_per_layer, rtol, atol, controller, max_steps) -> int:
    """The checked ``steps_per_layer`` of a fixed-step solve (:func:`refuse_error_control`; as
    :meth:`~ctformer.ContinuousTransformer.solve` refuses ``rtol`` beside ``steps_per_layer``)."""
    refuse_error_control(f"steps_per_layer={steps_per_layer!r}", rtol, atol, controller, max_steps,
                         marked=True)
    steps = check_steps(steps_per_layer, len(model.blocks))
    if steps > 1 and model.warns_inconsistent_depth:
        solvers.warn_inconsistent_depth("steps_per_layer > 1 on a post-norm model whose "
                                        "normalization is not a projection", stacklevel=4)
    return steps


def _real_token_weights(weights, padding_mask):
    r"""The grids' token weights :math:`w^x_i` with the padded tokens of each sequence at zero and
    the real ones scaled so that every sequence keeps the total :math:`\sum_i w^x_i`.

    The error norm then reads only the tokens a user keeps (a padded token's state is never read
    by a real one), and a padded sequence is measured as that sequence alone on midpoint grids.
    """
    w_x, w_y = weights
    real = np.asarray(to_host(padding_mask), dtype=bool)
    w = w_x * real
    return w * (w_x.sum() / w.sum(axis=-1, keepdims=True)), w_y


def evolve(model, u0, *, tokens, features, head_features=None, hidden=None, scheme="tsit5",
           rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL, steps_per_layer=None, save_at=None, events=(),
           max_steps=DEFAULT_MAX_STEPS, padding_mask=None, context_length=None, controller=None,
           checkpoint=False, initial=None):
    """:meth:`ctformer.ContinuousTransformer.evolve` (see there)."""
    integrator = solvers.get(scheme)
    if steps_per_layer is not None:
        control = _fixed_steps(model, steps_per_layer, rtol, atol, controller, max_steps)
    else:
        control = controller_for(rtol, atol, controller, max_steps, marked=True)
        if model.warns_inconsistent_depth:
            raise ValueError(
                "rtol/atol: error control needs a continuous-depth limit, and this post-norm "
                "model has none (its normalization is not a projection, so the state after a "
                "layer depends on the step count, and halving the steps never converges); pass "
                "steps_per_layer=k for fixed steps, or use a normalization without affine map "
                "and eps=0")
    start = None
    if initial is not None:
        if u0 is not None:
            raise ValueError("u0 and initial both given: a restart takes its state from initial; "
                             "pass u0=None")
        start = restart_point(initial, controlled=steps_per_layer is None,
                              boundaries=range(len(model.blocks) + 1))
        if start.scheme is not None and start.scheme != integrator.label:
            raise ValueError(f"initial was solved with scheme {start.scheme!r}, this solve uses "
                             f"{integrator.label!r}: a restart continues with the scheme of the "
                             f"saved solve; pass that scheme ({start.scheme!r})")
        saved = recorded(initial)
        if start.t0 >= len(model.blocks):
            raise ValueError(f"initial ends at depth {start.t0:g}, the end of the model's "
                             f"{len(model.blocks)} layers: nothing is left to solve")
        u0 = start.u0
    u, grids = model._initial_state(u0, tokens, features, head_features, hidden, context_length)
    check_unchanged(model)  # a converted model whose module's tensors changed in place
    fingerprint = model_fingerprint(model)
    model._check_namespaces(u)
    if padding_mask is not None:
        if not grids.is_nodal:
            raise ValueError("padding_mask needs nodal token and feature discretizations, "
                             "got a Galerkin one")
        padding_mask = check_padding_mask(padding_mask, u)
    mask = mask_digest(padding_mask)  # a restart without the saved mask continues another solve
    if initial is not None:
        refuse_another(saved, {**computation(fingerprint, control, grids), "padding_mask": mask})

    def layered(mask):
        return solvers.Piecewise.layers((block.split_problem(grids, mask) for block in model.blocks),
                                        t0=0.0 if start is None else start.t0)

    problem = layered(padding_mask)
    # fixed steps of a NumPy batch: groups of whole sequences advanced side by side
    groups = None if steps_per_layer is None else _sequence_groups.plan(u, padding_mask, problem, layered)
    weights = solvers.grid_weights(grids) if u.ndim >= 2 else None
    if padding_mask is not None and weights is not None:
        weights = _real_token_weights(weights, padding_mask)
    # the order serves step doubling only: fixed steps skip its walk over the blocks
    # the thread count read once, not at every product of every step; the residual sums of
    # large NumPy states on torch's threads, where its products run (the same bits)
    with fixed_threads(), summing(threaded_add):
        return solvers.integrate(problem, u, control, scheme=integrator, save_at=save_at,
                                 events=check_events(events), weights=weights,
                                 order=None if steps_per_layer is not None else integrator.order(model),
                                 what="the state", layered=True,
                                 checkpoint=checkpoint,
                                 start=start,
                                 labels={"grids": grids, "model_fingerprint": fingerprint, "padding_mask": mask},
                                 groups=groups, memory=_memory)

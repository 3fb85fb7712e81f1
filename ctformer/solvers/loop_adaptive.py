r"""The error-controlled branch of :func:`ctformer.solvers.loop.integrate`.

Each attempted step from :math:`t` has the size :math:`h` the controller proposed, clipped to
the end :math:`b` of the current segment (a layer boundary is a jump time: no step crosses it).
A step whose scaled error norm exceeds 1 is rejected and retried smaller from the same state
(its first stage reused); an accepted step advances, is offered to the events and the saver,
and the controller proposes the next size. A layer with projections (a post-norm model)
starts from the projection of the state onto its constraint set. A step clipped to a boundary that is under half the
proposed size does not shrink the next proposal: the proposal carries over the boundary.
"""
from __future__ import annotations

import functools
import math


from ..backend import all_finite
from .controller import ControllerState
from .failures import MaxStepsReached, StepSizeTooSmall
from .solution import StepRecord

__all__ = ["run_adaptive"]


def run_adaptive(run, u, controller, weights, stepper, start=None) -> None:
    """Advance ``run`` (a :class:`~ctformer.solvers.loop._Run`) with ``controller``'s steps.

    ``start``: a :class:`~ctformer.solvers.restart.RestartPoint` (the next step size and the
    last accepted error of an earlier solve at this state), so that a restart takes the steps the
    uninterrupted solve would have taken.
    """
    boundaries = run.problem.boundaries
    span = boundaries[-1] - boundaries[0]
    h_min = controller.min_step(span)
    norm = functools.partial(controller.error_norm, weights=weights)
    q = stepper.order
    run.u, run.t = u, boundaries[0]
    run.saver.start(run.t, u)
    if run.events:
        run._start_events(run.t, u)
    state, h, nonfinite = ControllerState(), None, False
    if start is not None:
        state, h = ControllerState(err_prev=start.err_prev), start.h
    for a, b, problem in run.problem.segments:
        first = None
        if run.layered and problem.has_projections and float(a).is_integer():
            # a post-norm layer puts the state on its constraint set within any step, so the
            # limit jumps there as the layer starts (the saved state at a is the left limit);
            # from off the set, every step's error would be O(1) and the step would vanish
            run.u = problem.project_all(run.u)
        while run.t < b:
            if h is None:
                first = problem.rhs(run.u)
                # the starting rule estimates the local error, of order p for step doubling
                h = run.h0 = controller.initial_step(lambda t, v: problem.rhs(v), run.t, run.u,
                                                     getattr(stepper, "scheme_order", q), norm,
                                                     t_end=b, f0=first)
                if stepper.tableau is None:
                    first = None
            land = h >= b - run.t
            h_try = b - run.t if land else h
            _refuse_to_go_on(run, controller, h_try, h_min, land, nonfinite)
            u_new, error, ks, fsal = stepper.attempt(problem, run.u, h_try, first)
            if ks is not None:
                first = ks[0]  # F(u) is the same for the retried step
            err = _finite_norm(norm, error, run.u, u_new)
            nonfinite = not math.isfinite(err)
            accepted, h_next, state = controller.update(state, h_try, err, q)
            if not accepted:
                run.rejected += 1
                h = h_next
                continue
            t_new = b if land else run.t + h_try
            record = StepRecord(run.t, t_new - run.t, run.u, u_new, problem, ks, stepper.tableau)
            # a sliver clipped to a boundary says little about the step size: carry h over
            h = max(h_next, h) if land and h_try < 0.5 * h else h_next
            # one entry per accepted step (a terminal event's step too); the appends come first
            # and the step counts itself with no call after them (where Ctrl-C is raised), so an
            # interrupt finds the history of the steps counted in run.accepted, maybe longer
            # (run.settle trims it)
            run.step_times.append(t_new)
            run.step_sizes.append(h)
            run.step_errors.append(err)
            run.u, run.t, first = u_new, t_new, fsal
            run.done += 1
            run.accepted += 1
            if run._check_events(record, t_new, u_new):
                run._stop_at_event(record)
                return
            run.saver.step(record, t_new, u_new, end=land, done=run.accepted)


def _refuse_to_go_on(run, controller, h_try, h_min, land, nonfinite) -> None:
    """Raise where the solve cannot take its next step: the step budget spent
    (:class:`MaxStepsReached`) or a step below the smallest allowed (:class:`StepSizeTooSmall`);
    either carries the solution up to ``run.t``."""
    end = run.problem.boundaries[-1]
    if run.accepted + run.rejected >= controller.max_steps:
        raise MaxStepsReached(
            f"max_steps={controller.max_steps} steps ({run.accepted} accepted, "
            f"{run.rejected} rejected) reached at t={run.t:.6g} of {end:.6g} "
            f"with scheme {run.scheme.label!r}, rtol={controller.rtol:g}, "
            f"atol={controller.atol:g}; raise max_steps or loosen the tolerances{_noise_hint(run)} "
            f"(the solution up to t={run.t:.6g} is exc.solution)", run.solution(controller))
    if not h_try >= h_min and not land:  # NaN included
        why = (" after the state became NaN or inf (the right-hand side overflows)"
               if nonfinite else "")
        raise StepSizeTooSmall(
            f"the step size {h_try:.3g} fell below dt_min={h_min:.3g} at t={run.t:.6g}"
            f"{why} with scheme {run.scheme.label!r}, rtol={controller.rtol:g}, "
            f"atol={controller.atol:g}; the problem may be stiff or singular there, or the "
            f"tolerances below what the arithmetic resolves (the solution up to "
            f"t={run.t:.6g} is exc.solution)", run.solution(controller))


def _noise_hint(run) -> str:
    """Where a third of the steps or more were rejected: the words on what that points to. An
    error estimate at the rounding level of the state's dtype neither falls with the step nor
    stays below the tolerance, so steps are accepted and rejected by chance (a float32 state
    at rtol 1e-4 under lie's step doubling: 44241 of 100000 rejected)."""
    tried = run.accepted + run.rejected
    if not tried or run.rejected * 3 < tried:
        return ""
    dtype = getattr(run.u, "dtype", "")
    return (f"; {run.rejected / tried:.0%} of the steps were rejected: the error estimate may be "
            f"at the rounding level of the {dtype} state (tolerances below what it resolves: "
            f"loosen them, take a higher-order scheme such as tsit5, or solve in float64), or "
            f"the problem stiff")


def _finite_norm(norm, error, u, u_new) -> float:
    if not all_finite(u_new):
        return math.inf
    return norm(error, u, u_new)

r"""The one time loop: fixed or error-controlled steps over a piecewise-constant problem.

A :class:`Piecewise` problem is a split problem :math:`u' = \sum_k f_k^{(m)}(u)` whose data is
constant on each segment :math:`[t_m, t_{m+1})`: a converted network's layers
(:math:`t_m = m`), or one segment for particles and mean fields. The segment ends are jump
times: no step crosses one, and an error-controlled step is clipped to land on it, its size
carried over to the next segment. :func:`integrate` serves the models, the particles, the mean
fields and the adjoint, with

- fixed steps (an ``int``: steps per segment, :math:`h = (t_{m+1} - t_m)/k`), bit for bit the
  loop of ctformer 0.2: :math:`k` calls of ``scheme.step`` per segment;
- a :class:`~ctformer.solvers.controller.PIController`: embedded pairs estimate their error
  themselves, every other scheme by step doubling (:mod:`ctformer.solvers.steppers`).

Saved states (:class:`~ctformer.solvers.solution.SaveAt`), events (:class:`~ctformer.solvers.events.Event`)
and Ctrl-C (:class:`SolveInterrupted`, with what was computed) are handled here once for all of them.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import array_api_compat
import numpy as np

from ..backend import all_finite
from ..validation import is_integer, real
from .controller import ControllerState, PIController
from .events import Tracker
from .failures import MaxStepsReached, SolveFailed, SolveInterrupted, StepSizeTooSmall
from .loop_adaptive import run_adaptive
from .restart_identity import control_settings
from .saving import Saver
from .solution import SaveAt, Solution, StepRecord
from .steppers import stepper_for

__all__ = ["Piecewise", "integrate", "SolveInterrupted", "SolveFailed", "MaxStepsReached",
           "StepSizeTooSmall"]


@dataclass(frozen=True)
class Piecewise:
    r"""Split problems constant on segments: ``problems[m]`` on ``[boundaries[m], boundaries[m+1]]``.

    Parameters
    ----------
    boundaries : sequence of float
        Increasing segment ends :math:`t_0 < t_1 < \dots < t_M` (``M + 1`` values).
    problems : sequence of SplitProblem
        ``M`` problems.
    """

    boundaries: tuple
    problems: tuple

    def __post_init__(self):
        object.__setattr__(self, "boundaries", tuple(float(b) for b in self.boundaries))
        object.__setattr__(self, "problems", tuple(self.problems))
        if len(self.boundaries) != len(self.problems) + 1:
            raise ValueError(f"boundaries must have one entry more than problems, got "
                             f"{len(self.boundaries)} and {len(self.problems)}")
        if not all(math.isfinite(b) for b in self.boundaries):
            raise ValueError(f"boundaries must be finite, got {self.boundaries}")
        if any(b <= a for a, b in zip(self.boundaries, self.boundaries[1:])):
            raise ValueError(f"boundaries must increase, got {self.boundaries}")

    @classmethod
    def layers(cls, problems, t0: float = 0.0) -> "Piecewise":
        """Problem :math:`l` on :math:`[l, l + 1]`: a network's layers, from depth ``t0`` on."""
        problems = tuple(problems)
        first = int(np.floor(t0))
        if not 0 <= t0 < len(problems):
            raise ValueError(f"t0 must lie in [0, {len(problems)}) (the depth a restart starts "
                             f"from), got {t0!r}")
        return cls((float(t0),) + tuple(float(b) for b in range(first + 1, len(problems) + 1)),
                   problems[first:])

    @classmethod
    def single(cls, problem, t1: float, t0: float = 0.0) -> "Piecewise":
        """One problem on :math:`[t_0, t_1]` (particles, mean fields)."""
        if not (math.isfinite(t0) and math.isfinite(t1)):
            raise ValueError(f"t0 and t1 must be finite, got t0={t0!r}, t1={t1!r}")
        if not t0 < t1:
            raise ValueError(f"the interval [t0, t1] = [{t0!r}, {t1!r}] is empty: t1 must exceed the depth the solve starts from")
        return cls((t0, t1), (problem,))

    @property
    def segments(self):
        return zip(self.boundaries, self.boundaries[1:], self.problems)


class _Counter:
    """Sub-flow calls by flow count ``k`` (``stats['rhs_evaluations']``: ``k`` calls a right-hand side)."""

    def __init__(self):
        self.calls = {}

    def wrap(self, problem):
        from .base import SplitProblem

        k = len(problem.flows)
        self.calls.setdefault(k, 0)

        def counted(f):  # a bare closure: functools.wraps took 2.5 us per flow and solve
            def flow(u):
                self.calls[k] += 1
                return f(u)
            return flow

        return SplitProblem(flows=tuple(counted(f) for f in problem.flows),
                            projections=problem.projections, retraction=problem.retraction)


def integrate(problem: Piecewise, u0, control, *, scheme, save_at: SaveAt | None = None,
              events=(), weights=None, order: float | None = None, what: str = "the state",
              layered: bool = False, checkpoint: bool = False, save_every: int = 1, out=None,
              on_save=None, hint: str = "or the parameters too large", start=None,
              labels=None, groups=None, memory=None, interpolant=None) -> Solution:
    r"""Integrate ``u0`` over ``problem``'s segments with fixed or controlled steps.

    Parameters
    ----------
    problem : Piecewise
    u0 : array
        The validated initial state (any array namespace).
    control : int or PIController
        Steps per segment, or a controller. ``(steps, h)``: ``steps`` steps of exactly ``h``
        per segment (a caller that computed ``h`` itself; the segment must be ``steps * h`` long).
    scheme : Scheme
    save_at : SaveAt, optional
        Default: the final state only.
    events : sequence of Event
    weights : tuple (w_x, w_y), optional
        Token and feature weights of the controller's ``"l2"`` norm.
    order : float, optional
        Order of the scheme on this problem, for step doubling (default
        ``scheme.order(problem.problems)``: 1 where projections follow the sub-steps, and an
        embedded pair is then controlled by step doubling too).
    what : str
        What ``u`` is, for messages.
    layered : bool
        The segments are a network's layers (messages name the layer).
    checkpoint : bool
        Fixed steps on torch states: each segment under ``torch.utils.checkpoint``.
    save_every : int
        With ``SaveAt(steps=True)`` and fixed steps: keep every ``save_every``-th step.
    out : array, optional
        Preallocated storage for the saved states (a caller that checked the memory first).
    on_save : callable, optional
        ``on_save(u, t_start, t_end)`` before each state is saved.
    labels : dict, optional
        ``grids``, ``axes``, ``time_axis`` for every :class:`Solution` made (also the partial
        ones on exceptions).
    start : RestartPoint, optional
        Controlled steps: continue an earlier solve at ``problem``'s first boundary with its
        next step size and error history (:mod:`ctformer.solvers.restart`).
    groups : optional
        Fixed steps that keep only layers or the final state: independent groups of the
        batch axis, each advanced by its own problem in worker tasks
        (:class:`ctformer._numerics.sequence_groups.SequenceGroups`); the evaluations of the
        first group are counted.
    memory : module, optional
        :mod:`ctformer.discretizations.memory`: refuse the states ``save_at`` keeps beyond its
        budget (twice their bytes, with ``Solution.states`` stacked from them). None: no check.
    interpolant : callable, optional
        ``interpolant(record)``: the dense output events are located on (default the record's own).

    Returns
    -------
    Solution

    Raises
    ------
    FloatingPointError
        Fixed steps: the state stopped being finite (checked at each save and segment end).
    MaxStepsReached, StepSizeTooSmall
        Controlled steps, with the solution so far on the exception.
    SizeTooLargeError
        Saved states beyond ``memory``'s budget: before the first step where their count is
        known, else (every controlled step kept) with the solution so far as ``exc.solution``.
    SolveInterrupted
        On Ctrl-C, with the solution so far.
    """
    if save_at is not None and not isinstance(save_at, SaveAt):  # else an AttributeError deep inside
        raise TypeError(f"save_at must be a ctformer.SaveAt or None, got {type(save_at).__name__}; pass e.g. save_at=ctformer.SaveAt(times=[...])")
    save_at = SaveAt() if save_at is None else save_at
    counter = _Counter()
    problem = Piecewise(problem.boundaries, tuple(counter.wrap(p) for p in problem.problems))
    if groups is not None:
        first = groups.problems[0]
        groups = groups.with_first(Piecewise(first.boundaries, tuple(counter.wrap(p) for p in first.problems)))
    saver = Saver(save_at, problem, u0, every=save_every, out=out, on_save=on_save, memory=memory)
    controlled = isinstance(control, PIController)
    if not controlled:
        steps, h = _fixed_control(control, problem)
    saver.plan(None if controlled else steps, "the initial state and the steps asked for"
               if save_at.steps and not controlled else "the depths asked for")
    # a restart continues a saved solve: no occurrence at its start, the counts go on
    tracker = Tracker(events, getattr(start, "events_before", None), restart=start is not None)
    run = _Run(problem, scheme, saver, counter, tracker, what, layered, hint)
    run.labels, run.interpolant = dict(labels or {}), interpolant
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # reported by checks
            if controlled:
                # a problem with projections lowers the scheme's order (and so its stepper)
                order = scheme.order(problem.problems) if order is None else order
                run.adaptive(u0, control, weights, order,
                             start if getattr(start, "h", None) is not None else None)
            else:
                run.fixed(u0, steps, checkpoint, h, groups)
    except KeyboardInterrupt:
        run.settle(controlled)
        raise SolveInterrupted(run.interrupted_message(), run.solution(control)) from None
    except MemoryError as exc:
        if getattr(exc, "solution", False) is None:  # the saver's refusal mid-solve
            exc.solution = run.solution(control)
        raise
    return run.solution(control)


class _Run:
    """The state of one :func:`integrate` call (kept so an interrupt can report it)."""

    def __init__(self, problem, scheme, saver, counter, tracker, what, layered, hint):
        self.problem, self.scheme, self.saver, self.counter = problem, scheme, saver, counter
        self.tracker, self.events = tracker, tracker.events
        self.what, self.layered, self.hint = what, layered, hint
        self.t, self.u, self.done, self.total = problem.boundaries[0], None, 0, None
        self.accepted, self.rejected, self.step_times, self.h0 = 0, 0, [], None
        self.step_sizes, self.step_errors = [], []  # after each accepted step: for restarts

    # -- shared -----------------------------------------------------------------------------
    def _start_events(self, t, u):
        self.tracker.start(t, u)

    def _check_events(self, record: StepRecord, t_new, u_new) -> bool:
        """Record occurrences in the step just accepted; True when a terminal one ends the solve."""
        # the record's problem is the counted one: its slopes are counted once, there
        dense = record if self.interpolant is None else self.interpolant(record)
        return self.tracker.step(dense, t_new, u_new, None)

    def _stop_at_event(self, record):
        """A terminal event inside ``record``'s step ends the solve at the event depth."""
        t_event, u_event, _, _ = self.tracker.first
        self.step_times[-1] = t_event  # where it stopped; the full step stays counted
        self.saver.step(record, self.t, self.u, end=False, done=self.done, cut=t_event)
        self.saver.event(t_event, u_event)
        self.t, self.u = t_event, u_event

    def _nonfinite(self, t_start, t_end, h):
        if not all_finite(self.u):
            self._raise_nonfinite(t_start, t_end, h)

    def _raise_nonfinite(self, t_start, t_end, h):
        if self.layered:
            layer = int(np.floor(t_start + 1e-12))
            raise FloatingPointError(
                f"{self.what} became NaN or inf in layer {layer} (t in [{layer}, {layer + 1}]) "
                f"with scheme {self.scheme.name!r} and {round(1 / h)} steps per layer; the step "
                f"may be unstable (more steps per layer) {self.hint}")
        raise FloatingPointError(
            f"{self.what} became NaN or inf between t={t_start:.6g} and t={t_end:.6g} (scheme "
            f"{getattr(self.scheme, 'name', type(self.scheme).__name__)!r}, dt={h:.6g}); the step "
            f"may be too large {self.hint}")

    # -- fixed steps ------------------------------------------------------------------------
    def fixed(self, u, steps: int, checkpoint: bool, h_given=None, groups=None):
        self.u = u
        self.total = steps * len(self.problem.problems)
        self.saver.start(self.t, u)
        if self.events:
            self._start_events(self.t, u)
        plain = self.saver.plain and not self.events
        if plain and groups is not None:
            self._fixed_groups(groups, steps, h_given)
            return
        for a, b, problem in self.problem.segments:
            h = (b - a) / steps if h_given is None else h_given
            if plain:  # the fast path: nothing is looked at inside a segment
                self.u = _segment(self.scheme, problem, self.u, steps, h, checkpoint)
                self.done += steps
                self.t = b
                self.step_times.extend([a + s * h for s in range(1, steps)] + [b])  # as _fixed_segment
                self._nonfinite(a, b, h)
                self.saver.boundary(b, self.u)
                continue
            if checkpoint:
                raise ValueError("checkpoint=True keeps one state per layer: it cannot be combined "
                                 "with SaveAt(steps=True), SaveAt(times=...), dense output or events")
            if self._fixed_segment(a, b, problem, steps, h):
                return

    def _fixed_segment(self, a, b, problem, steps, h) -> bool:
        for s in range(1, steps + 1):
            u_old, t_old = self.u, self.t
            self.u = self.scheme.step(problem, u_old, h)
            self.t = b if s == steps else a + s * h
            self.done += 1
            self.accepted += 1
            self.step_times.append(self.t)
            record = StepRecord(t_old, self.t - t_old, u_old, self.u, problem)
            if self.saver.wants_check(self.done, s == steps):
                self._nonfinite(self.saver.last_time, self.t, h)
            if self._check_events(record, self.t, self.u):
                self._stop_at_event(record)
                return True
            self.saver.step(record, self.t, self.u, end=(s == steps), done=self.done)
        self._nonfinite(a, b, h)
        return False

    def _fixed_groups(self, groups, steps: int, h_given):
        """The fast path on groups of the batch (:class:`~ctformer._numerics.sequence_groups.
        SequenceGroups`): a pass of tasks covers the segments that take about
        ``groups.chunk_seconds`` (one segment first, to time it), so that Ctrl-C waits for one
        pass and keeps the state before it."""
        segments = [(a, b, (b - a) / steps if h_given is None else h_given) for a, b, _ in self.problem.segments]
        layers = self.saver.save_at.layers
        start, count = 0, 1
        while start < len(segments):
            chunk = segments[start:start + count]
            began = time.perf_counter()
            states, failed = groups.advance(self.scheme, self.u, [(start + i, h) for i, (_, _, h) in enumerate(chunk)],
                                            steps, keep=layers)
            elapsed = time.perf_counter() - began
            if failed is not None:
                self._raise_nonfinite(*chunk[failed])
            for a, b, h in chunk:
                self.done += steps
                self.step_times.extend([a + s * h for s in range(1, steps)] + [b])
            for (_, b, _), u in zip(chunk if layers else chunk[-1:], states):
                self.saver.boundary(b, u)
            self.u, self.t = states[-1], chunk[-1][1]
            start += len(chunk)
            count = max(1, int(groups.chunk_seconds * len(chunk) / max(elapsed, 1e-9)))

    # -- controlled steps -------------------------------------------------------------------
    def adaptive(self, u, controller: PIController, weights, order, start=None):
        run_adaptive(self, u, controller, weights, stepper_for(self.scheme, order), start)

    # -- results ----------------------------------------------------------------------------
    def settle(self, controlled: bool) -> None:
        """After an interrupt: the history of the steps counted in ``accepted`` only (a controlled
        step appends to it first, then counts itself with no call, where a signal is handled)."""
        if controlled:
            del self.step_times[self.accepted:], self.step_sizes[self.accepted:], self.step_errors[self.accepted:]

    def interrupted_message(self) -> str:
        kept = self.saver.finish_interrupted(self.t, self.u)
        where = (f"step {self.done} of {self.total}" if self.total is not None
                 else f"{self.accepted} accepted steps")
        return (f"{self.what.removeprefix('the ')} solve interrupted at t={self.t:.6g} ({where}); "
                f"kept {kept} states up to t={self.saver.last_time:.6g} in exc.result")

    def solution(self, control) -> Solution:
        controlled = isinstance(control, PIController)
        stats = {"accepted": self.accepted if controlled or self.accepted else self.done,
                 "rejected": self.rejected,
                 "rhs_evaluations": sum(c / k for k, c in self.counter.calls.items()),
                 "step_times": np.asarray(self.step_times, dtype=np.float64),
                 "initial_step": self.h0,
                 "events": list(self.tracker.fired)}
        if controlled:
            stats["step_sizes"] = np.asarray(self.step_sizes, dtype=np.float64)
            stats["step_errors"] = np.asarray(self.step_errors, dtype=np.float64)
        times, states = self.saver.result()
        t_event, u_event, i_event, terminal = self.tracker.first or (None,) * 4
        t_events, y_events = self.tracker.per_event(self.u if self.u is not None else self.saver.final)
        return Solution(times=times, states=states, final=self.saver.final, stats=stats, scheme=self.scheme.label,
                        rtol=control.rtol if controlled else None,
                        atol=control.atol if controlled else None,
                        norm=control.norm if controlled else None,
                        control=control_settings(control) if controlled else None,
                        event_time=t_event, event_state=u_event, event_index=i_event,
                        event_terminal=bool(terminal), t_events=t_events, y_events=y_events,
                        events_before=self.tracker.before if self.events else None,
                        records=self.saver.records, t0=self.problem.boundaries[0],
                        **self.labels)


def _fixed_control(control, problem: Piecewise):
    """``(steps, h)`` of a fixed-step ``control`` (``h`` None: each segment's length / steps)."""
    steps, h = control if isinstance(control, tuple) and len(control) == 2 else (control, None)
    if not is_integer(steps) or steps < 1:
        raise ValueError(f"control must be a positive integer (steps per segment), a pair "
                         f"(steps, h) or a PIController, got {control!r}")
    if h is not None:
        h = real(h, "control's step h", positive=True)
        for a, b, _ in problem.segments:
            if abs(steps * h - (b - a)) > 1e-9 * max(1.0, abs(a), abs(b)):
                raise ValueError(f"control = {control!r}: {steps} steps of h = {h!r} cover "
                                 f"{steps * h!r}, not the segment [{a!r}, {b!r}]")
    return int(steps), h


def _segment(scheme, problem, u, steps, h, checkpoint):
    if checkpoint:
        if not array_api_compat.is_torch_array(u):
            raise TypeError(f"checkpoint=True recomputes steps in torch's backward pass; the state "
                            f"is a {type(u).__module__}.{type(u).__name__}, not a torch tensor")
        from torch.utils.checkpoint import checkpoint as torch_checkpoint

        return torch_checkpoint(_steps, scheme, problem, u, steps, h, use_reentrant=False)
    return _steps(scheme, problem, u, steps, h)


def _steps(scheme, problem, u, steps, h):
    for _ in range(steps):
        u = scheme.step(problem, u, h)
    return u

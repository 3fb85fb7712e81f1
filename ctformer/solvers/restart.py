r"""Restarts: continue a solve from a saved state and get the bits of the uninterrupted solve.

A fixed-step solve restarts at a segment end (a layer boundary: ``SaveAt(layers=True)``), where
the uninterrupted solve would start the next segment from the same state with the same steps.
An error-controlled solve restarts at any accepted step's end: besides the state it needs the
step size the controller proposed there and the error of that step (the PI term), which every
controlled :class:`~ctformer.Solution` keeps in ``stats["step_sizes"]`` and
``stats["step_errors"]`` (one entry per accepted step, beside ``stats["step_times"]``) and
:func:`ctformer.labelled.to_netcdf` writes with it. The first stage :math:`F(u)` is recomputed,
which gives the bits the first-same-as-last stage had. A controlled solve that saved only its
initial state at :math:`t = 0` (``SaveAt(layers=True)``, stopped inside the first layer)
restarts there as a new solve: the controller chooses the first step as the saved solve did.
A fixed-step restart continues with the saved solve's step (``dt``, ``steps_per_layer``:
another one is refused). A solve that a terminal event stopped
ends inside a step, where the uninterrupted solve has no step end: it is not restarted. Events
go on as in the uninterrupted solve: a zero of a condition at the restart depth is not a new
occurrence, and ``terminal=n`` counts the occurrences the saved solve found up to that depth
(its ``events_before`` plus its ``t_events`` there).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import labelled_methods

__all__ = ["RestartPoint", "restart_point"]


@dataclass(frozen=True)
class RestartPoint:
    """Where a restart begins: depth ``t0``, state ``u0``, and for a controlled solve the next
    step size ``h`` and the previous accepted error ``err_prev`` (None for fixed steps);
    ``scheme``: the label of the scheme that made the saved states (None if not recorded);
    ``events_before``: how often each of its events fired up to ``t0`` (None without events)."""

    t0: float
    u0: object
    h: float | None = None
    err_prev: float | None = None
    scheme: str | None = None
    events_before: tuple | None = None


def _parts(initial):
    """``(times, states, stats, scheme, stop)`` of a Solution, a saved result or an xarray
    Dataset; ``stop``: the depth of a terminal event that ended the solve, else None."""
    if hasattr(initial, "kind") and hasattr(initial, "arrays"):  # ctformer.labelled.SavedResult
        stats = {key[len("stats_"):]: np.asarray(value) for key, value in initial.attrs.items()
                 if key.startswith("stats_")}
        if "step_times" in initial.arrays:
            stats["step_times"] = np.asarray(initial.arrays["step_times"])
        stop = initial.attrs.get("event_time") if initial.attrs.get("event_terminal") else None
        return initial.times, initial.states, stats, initial.attrs.get("scheme"), stop
    if hasattr(initial, "times") and hasattr(initial, "states") and hasattr(initial, "stats"):
        stop = initial.event_time if getattr(initial, "event_terminal", False) else None
        return initial.times, initial.states, initial.stats, getattr(initial, "scheme", None), stop
    raise TypeError(f"initial must be a ctformer.Solution, a result read by "
                    f"ctformer.labelled.open_dataset or an xarray Dataset written by ctformer, got "
                    f"{type(initial).__name__}")


def restart_point(initial, *, controlled: bool, boundaries) -> RestartPoint:
    """The :class:`RestartPoint` at the last saved state of ``initial``.

    Parameters
    ----------
    initial : Solution, SavedResult or xarray.Dataset
    controlled : bool
        Whether the continued solve is error-controlled.
    boundaries : sequence of float, or callable
        The segment ends of the problem (a fixed-step restart must start on one), or a function
        of ``t0`` that raises ValueError (saying why) when a fixed-step solve cannot continue
        from ``t0`` (a uniform time grid: :func:`ctformer.particles.timegrid.restart_of`).

    Raises
    ------
    ValueError
        If the last saved state is not where the solve can continue exactly: for fixed steps not
        on a segment end, for a controlled solve not at an accepted step's end, at the depth of
        a terminal event that stopped it inside a step, or without the step history (a
        fixed-step or pre-0.3 result).
    """
    if hasattr(initial, "attrs") and hasattr(initial, "data_vars"):  # an xarray Dataset
        initial = labelled_methods.read(initial)
    times, states, stats, scheme, stop = _parts(initial)
    if times is None or states is None or len(times) == 0:
        raise ValueError("initial has no saved state to restart from (its solve stopped before "
                         "any depth it was to save, the final one by default): solve with "
                         "SaveAt(steps=True) or SaveAt(layers=True) to restart from where it stops")
    t0, u0 = float(times[-1]), states[-1, ...]
    if hasattr(initial, "as_solved"):  # a saved file: the states in the solve's own library
        u0 = initial.as_solved(u0)
    before = _occurred(initial, t0)
    scheme = None if scheme is None else str(scheme)
    stopped = stop is not None and float(stop) == t0
    if not controlled:
        try:
            _on_boundary(t0, boundaries)
        except ValueError as exc:
            why = exc
        else:  # a terminal event exactly on a segment end is a step end: exact
            return RestartPoint(t0, u0, scheme=scheme, events_before=before)
        if stopped:
            _refuse_stop(t0)
        raise why
    step_times = np.asarray(stats.get("step_times", ()), dtype=np.float64)
    if "step_sizes" not in stats or "step_errors" not in stats:
        raise ValueError("initial has no step history (stats step_sizes/step_errors): it comes from "
                         "a fixed-step solve; restart it with steps_per_layer, or pass the state as "
                         "u0 (a new solve, not bit-identical to the uninterrupted one)")
    if stopped:
        _refuse_stop(t0)
    hits = np.flatnonzero(step_times == t0)
    if hits.size == 0 and t0 == 0.0 and len(times) == 1:
        # only the initial state was saved (stopped inside the first segment): a fresh start
        return RestartPoint(t0, u0, scheme=scheme, events_before=before)
    if hits.size == 0:
        raise ValueError(f"initial: the last saved depth t={t0!r} is not the end of an accepted "
                         f"step (an interpolated SaveAt time); save with SaveAt(steps=True) or "
                         f"SaveAt(layers=True) to restart exactly")
    i = int(hits[-1])
    sizes, errors = np.asarray(stats["step_sizes"]), np.asarray(stats["step_errors"])
    return RestartPoint(t0, u0, float(sizes[i]), float(errors[i]), scheme, before)


def _occurred(initial, t0: float):
    """How often each event of ``initial``'s computation fired up to ``t0`` (None without)."""
    before, t_events = getattr(initial, "events_before", None), getattr(initial, "t_events", None)
    if before is None or t_events is None:
        return None
    return tuple(int(b) + int(np.count_nonzero(np.asarray(t) <= t0)) for b, t in zip(before, t_events))


def _refuse_stop(t0: float) -> None:
    raise ValueError(f"initial ended at a terminal event at t={t0!r}, inside an accepted step: no "
                     f"step of the uninterrupted solve ends there, so a restart cannot continue it "
                     f"bit for bit; start a new solve from the event with u0=initial.event_state")


def _on_boundary(t0: float, boundaries) -> None:
    """ValueError unless a fixed-step solve can continue exactly from ``t0``."""
    if callable(boundaries):
        boundaries(t0)
    elif t0 not in [float(b) for b in boundaries]:
        raise ValueError(f"initial: a fixed-step solve restarts at a layer boundary, the last "
                         f"saved depth is t={t0!r}; save with SaveAt(layers=True), or restart "
                         f"with error control")

r"""What a depth (or time) integration returns: saved states, statistics, dense output.

A :class:`Solution` holds the states :math:`u(t_k)` at the depths chosen by :class:`SaveAt`,
the step statistics, and, when asked for (``SaveAt(dense=True)``), one interpolant per accepted
step, so that :meth:`Solution.evaluate` gives :math:`u(t)` at any depth of the interval:

- an error-controlled embedded pair with a continuous extension interpolates with the
  method's own dense weights, :math:`u(t_n + \theta h) = u_n + h \sum_i b_i(\theta) k_i`
  (order 3 for bosh3, 4 for dopri5 and tsit5: local error :math:`O(h^4)`, :math:`O(h^5)`);
- every other scheme, and every scheme with fixed steps (whose steps do not keep their stages),
  uses the cubic Hermite interpolant through :math:`u_n, u_{n+1}` and the right-hand sides
  :math:`F(u_n), F(u_{n+1})` (local error :math:`O(h^4)`), evaluated when first asked for (two
  right-hand sides per interpolated step, counted once in the statistics).

A solution pickles and copies with its dense output: the interpolants keep no right-hand side
(the solve's problem stays in the process that solved), so the Hermite slopes not yet evaluated
are evaluated then, counted as :meth:`Solution.evaluate` counts them, and the copy evaluates the
same bits in any process.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, fields

import array_api_compat
import numpy as np

from .. import validation
from ..labelled_methods import LabelledResult

__all__ = ["SaveAt", "Solution", "StepRecord", "hermite"]


@dataclass(frozen=True)
class SaveAt:
    r"""Which states a solve keeps.

    Parameters
    ----------
    times : sequence of float, optional
        Depths at which to keep :math:`u(t)`, inside the interval, increasing. A time that an
        accepted step ends on is taken from that step; others are interpolated inside their step
        (with the dense output of the step, see the module docstring), so they never shorten a
        step.
    steps : bool
        Keep the state after every accepted step (and the initial state).
    layers : bool
        Keep the state at every layer boundary :math:`t = 0, 1, \dots, T` (the segment ends of
        the problem: for particles and mean fields the start and the end).
    dense : bool
        Keep one interpolant per accepted step for :meth:`Solution.evaluate`. Memory: the end
        state and the stages of every step that the step before does not share (7 states per
        step for dopri5 and tsit5, 4 for bosh3; 3 for the others: the end state and the two
        Hermite slopes, made when first evaluated), counted in the memory budget as the kept
        states are; off by default for that reason.

    With none of ``times``, ``steps`` or ``layers``, only the final state is kept (the initial
    state is kept with ``steps`` or ``layers``, and with ``times`` when 0 is among them).

    Raises
    ------
    TypeError, ValueError
        For flags that are not booleans and for times that are not finite and increasing.
    """

    times: tuple | None = None
    steps: bool = False
    layers: bool = False
    dense: bool = False

    def __post_init__(self):
        for name in ("steps", "layers", "dense"):
            object.__setattr__(self, name, validation.boolean(getattr(self, name), name))
        if self.times is not None:
            times = np.asarray(self.times, dtype=np.float64).reshape(-1)
            if not np.all(np.isfinite(times)):
                raise ValueError(f"SaveAt: times must be finite, got {self.times!r}")
            if np.any(np.diff(times) <= 0):
                raise ValueError(f"SaveAt: times must be strictly increasing, got {self.times!r}")
            object.__setattr__(self, "times", tuple(float(t) for t in times))

    @property
    def final_only(self) -> bool:
        return self.times is None and not self.steps and not self.layers


@dataclass
class StepRecord:
    """One accepted step for interpolation: from ``u0`` at ``t0`` to ``u1`` at ``t0 + h``."""

    t0: float
    h: float
    u0: object
    u1: object
    problem: object
    ks: list | None = None
    tableau: object = None
    slopes: tuple | None = None

    def __call__(self, t: float, count=None):
        """The interpolated state at depth ``t`` inside the step."""
        theta = min(1.0, max(0.0, (t - self.t0) / self.h))
        if theta == 1.0:
            return self.u1
        if theta == 0.0:
            return self.u0
        if self._has_stages():
            return self.tableau.interpolate(self.u0, self.ks, self.h, theta)
        self.settle(count)
        return hermite(self.u0, self.u1, *self.slopes, self.h, theta)

    def _has_stages(self) -> bool:
        return self.ks is not None and self.tableau is not None and self.tableau.dense is not None

    def settle(self, count=None) -> None:
        """Evaluate the Hermite slopes :math:`F(u_0), F(u_1)` if this step interpolates with
        them and has not yet (``count(2)`` counts the two right-hand sides)."""
        if self.slopes is None and not self._has_stages():
            self.slopes = (self.problem.rhs(self.u0), self.problem.rhs(self.u1))
            if count is not None:
                count(2)

    def __getstate__(self):
        # the problem is this process's closures over the discretized operators: it neither
        # pickles nor is needed once the slopes are known, so a copy carries those instead
        self.settle()
        return {**self.__dict__, "problem": None}


def hermite(u0, u1, f0, f1, h: float, theta: float):
    r"""The cubic Hermite interpolant at :math:`t_0 + \theta h`.

    .. math::  u(\theta) = (1-\theta) u_0 + \theta u_1 + \theta(\theta - 1)\bigl((1 - 2\theta)
               (u_1 - u_0) + (\theta - 1) h f_0 + \theta h f_1\bigr)

    (Hairer, Norsett, Wanner I, section II.6, (6.7)): it matches :math:`u` and :math:`u'` at both
    ends.
    """
    return ((1 - theta) * u0 + theta * u1
            + theta * (theta - 1) * ((1 - 2 * theta) * (u1 - u0)
                                     + (theta - 1) * h * f0 + theta * h * f1))


@dataclass(eq=False)
class Solution(LabelledResult):
    r"""The result of :meth:`ctformer.ContinuousTransformer.evolve` and the particle and
    mean-field ``evolve`` methods.

    Attributes
    ----------
    times : numpy.ndarray
        The saved depths (host float64).
    states : array, shape (len(times), ...) + u0.shape
        The saved states, stacked, in the namespace, device and dtype of ``u0``.
    final : array, shape u0.shape
        The state at the end of the solve (at a terminal event, the event state), saved or not.
    stats : dict
        ``accepted``, ``rejected`` (step counts), ``rhs_evaluations`` (full right-hand sides;
        a splitting scheme's sub-flow evaluations divided by the number of sub-flows),
        ``step_times`` (the accepted steps' end depths, a host array), ``initial_step``,
        ``events`` (``(index, depth)`` of every crossing, in the order they happen); with error
        control ``step_sizes`` (the size the controller proposed after each accepted step) and
        ``step_errors`` (each accepted step's scaled error), one entry per accepted step. A
        terminal event stops the solve inside a step: that step was computed in full and counts
        in ``accepted``, ``rhs_evaluations``, ``step_sizes`` and ``step_errors``, and its entry
        in ``step_times`` is the event depth, where the solve stopped.
    scheme : str
        The scheme's label.
    rtol, atol : float or None
        The tolerances (None for fixed steps).
    norm : str or None
        ``"l2"`` or ``"rms"`` (None for fixed steps).
    control : dict or None
        The controller's other settings that choose the step sizes (``pcoeff``, ``icoeff``,
        ``safety``, ``factor_min``, ``factor_max``; None for fixed steps): a restart from this
        solution is refused with other values.
    grids : ctformer.Grids or None
        The grids of a model's solve.
    model_fingerprint : str or None
        A digest of the model's class, layers and sampled parameter values
        (:func:`ctformer.solvers.restart_identity.model_fingerprint`): a restart from this
        solution is refused with another model. None for particles and mean fields.
    padding_mask : str or None
        A digest of the padding mask of a model's solve (``"none"`` without one): a restart
        from this solution is refused with another mask. None for particles and mean fields.
    event_time, event_state : float, array or None
        Where the first terminal event (else the first event) fired, and the state there on the
        step's dense output; None when none did.
    event_index : int or None
        Its index in ``events``.
    event_terminal : bool
        Whether that event ended the solve (its first occurrence, or its ``n``-th with
        ``terminal=n``): ``times``, ``final``, ``step_times`` and :meth:`evaluate` end at
        ``event_time``.
    t_events, y_events : tuple or None
        Every occurrence of every event, as ``scipy.integrate.solve_ivp`` gives them:
        ``t_events[i]`` the depths where ``events[i]`` fired (float64, in order) and
        ``y_events[i]`` the states there, stacked (shape ``(len(t_events[i]),) + u0.shape``,
        on the steps' dense output); None for a solve without events.
    events_before : tuple of int or None
        How many times each event fired before this solve's start: zeros, or for a restart
        those of the solve it continues (which ``terminal=n`` counts on).
    axes : tuple of str or None
        Names of the state's axes for a solve without grids (``("particle", "dimension")``,
        ``("wavenumber",)``), used by :func:`ctformer.labelled.to_xarray`; None for a model.
    time_axis : str
        ``"depth"`` for a model, ``"time"`` for particles and mean fields.
    """

    times: np.ndarray
    states: object
    final: object
    stats: dict
    scheme: str
    rtol: float | None = None
    atol: float | None = None
    norm: str | None = None
    control: dict | None = None
    grids: object = None
    model_fingerprint: str | None = None
    padding_mask: str | None = None
    event_time: float | None = None
    event_state: object = None
    event_index: int | None = None
    event_terminal: bool = False
    t_events: tuple | None = None
    y_events: tuple | None = None
    events_before: tuple | None = None
    records: list = field(default_factory=list, repr=False)
    t0: float = 0.0
    axes: tuple | None = None
    time_axis: str = "depth"

    def __len__(self) -> int:
        return len(self.times)

    def __eq__(self, other) -> bool:
        """Field by field, arrays by shape, dtype and entries (NaN equal to NaN), so that a
        pickled or copied solution equals its original; the dense-output records by their
        steps (``t0``, ``h``, end states, stages), not by the problem objects they refer to."""
        if type(self) is not type(other):
            return NotImplemented
        names = [f.name for f in fields(self) if f.name != "records"]
        return (all(_same(getattr(self, n), getattr(other, n)) for n in names)
                and len(self.records) == len(other.records)
                and all(_same(_step(a), _step(b)) for a, b in zip(self.records, other.records)))

    __hash__ = None   # a mutable result holding arrays

    def __getstate__(self):
        # a pickle or a copy keeps no right-hand side (the solve's problem stays in this
        # process): the Hermite slopes not yet evaluated are evaluated here, counted in
        # stats["rhs_evaluations"] as evaluate() counts them, so that copy and original agree
        for record in self.records:
            record.settle(self._count)
        return dict(self.__dict__)

    def _count(self, n: int) -> None:
        self.stats["rhs_evaluations"] = self.stats.get("rhs_evaluations", 0) + n

    def evaluate(self, t):
        r"""Dense output: :math:`u(t)` at a depth or an array of depths.

        Parameters
        ----------
        t : float or array of float
            Depths inside the solved interval.

        Returns
        -------
        array
            ``u0.shape`` for a scalar ``t``, ``t.shape + u0.shape`` for an array.

        Raises
        ------
        TypeError
            If ``t`` is a boolean (``True`` is not the depth 1).
        ValueError
            If the solve did not keep its interpolants (pass ``save_at=SaveAt(dense=True)``)
            or a depth lies outside the solved interval.
        """
        if not self.records:
            raise ValueError("this Solution has no dense output: solve with "
                             "save_at=ctformer.SaveAt(dense=True) to keep one interpolant per step")
        if isinstance(t, (bool, np.bool_)) or np.asarray(t).dtype == bool:
            raise TypeError(f"t must be a depth or an array of depths, got {type(t).__name__} {t!r}")
        ts = np.asarray(t, dtype=np.float64)
        lo, hi = self.t0, self.records[-1].t0 + self.records[-1].h
        if self.event_terminal:  # the solve ended inside its last step, at the event
            hi = self.event_time
        span = (min(lo, hi), max(lo, hi))
        if not np.all(np.isfinite(ts)) or np.any(ts < span[0] - 1e-12 * max(1.0, abs(hi))) \
                or np.any(ts > span[1] + 1e-12 * max(1.0, abs(hi))):
            raise ValueError(f"t must lie in the solved interval [{span[0]:.6g}, {span[1]:.6g}], "
                             f"got {t!r}")
        values = [self._at(float(s)) for s in ts.reshape(-1)]
        if ts.ndim == 0:
            return values[0]
        # a state as this solution gives them (a record that wraps its steps, as the noise
        # clock of the sphere's mean fields does, has no u0 of its own)
        like = values[0] if values else self.records[0](self.t0)
        xp = array_api_compat.array_namespace(like)
        if not values:  # no depths: an empty stack, as for any other array of depths
            return xp.empty((*ts.shape, *like.shape), dtype=like.dtype,
                            device=array_api_compat.device(like))
        stacked = xp.stack(values)
        return xp.reshape(stacked, (*ts.shape, *values[0].shape))

    def _at(self, t: float):
        ends = [r.t0 + r.h for r in self.records]
        forward = self.records[0].h > 0
        if forward:
            i = min(bisect.bisect_left(ends, t), len(self.records) - 1)
        else:
            i = min(bisect.bisect_left([-e for e in ends], -t), len(self.records) - 1)

        return self.records[i](t, self._count)


def same_fields(a, b):
    """``a == b`` for result dataclasses holding arrays: the same type and every field equal,
    arrays (any namespace) by shape, dtype and entries, NaN equal to NaN (NotImplemented for
    another type)."""
    if type(a) is not type(b):
        return NotImplemented
    return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))


def _step(record):
    """What a dense-output record computes from (its problem is compared by the states)."""
    return [getattr(record, n, None) for n in ("t0", "h", "u0", "u1", "ks", "tableau", "slopes")]


def _same(a, b) -> bool:
    """Equality of result fields: arrays (any namespace) by shape, dtype and entries."""
    if a is b:
        return True
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        if not (hasattr(b, "shape") and hasattr(b, "dtype")) or type(a) is not type(b):
            return False
        from ..backend import to_host

        x, y = to_host(a), to_host(b)
        nan = x.dtype.kind in "fc"
        return x.shape == y.shape and x.dtype == y.dtype and bool(np.array_equal(x, y, equal_nan=nan))
    if isinstance(a, (tuple, list)) and type(a) is type(b):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    try:
        return bool(a == b)
    except (TypeError, ValueError):   # objects whose == is not one boolean
        return False

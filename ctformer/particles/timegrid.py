r"""The time grid of a particle or mean-field solve: steps, saved states, memory, interrupts.

A solve on :math:`[0, t_1]` takes :math:`\lceil t_1 / \Delta t \rceil` equal steps (the last one
lands on :math:`t_1`; more than 10**8 steps, or ``CTFORMER_MAX_STEPS``, are refused before the
first) and keeps the state at :math:`t = 0`, every ``save_every``-th step and the
end. Before any step, the saved states are checked against the free memory where the state
lives and the memory budget; a NaN or inf met during the solve is reported with its time
interval, and Ctrl-C ends with :class:`SolveInterrupted`, which carries what was computed.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace

import array_api_compat
import numpy as np

from .. import solvers
from .._numerics.threads import fixed_threads
from ..backend import floating_info
from ..discretizations import memory as _memory
from ..model_inputs import check_step_count
from ..solvers import SolveInterrupted
from ..solvers.controller import DEFAULT_ATOL, DEFAULT_MAX_STEPS, DEFAULT_RTOL  # noqa: F401 (the evolves' defaults)
from ..solvers.restart_identity import computation, recorded, refuse_another, system_fingerprint
from ..validation import integer, is_real
from ..labelled_methods import LabelledResult
from .lawson import NoiseClock, lawson_scheme

__all__ = ["SolveInterrupted", "Trajectory", "check_finite", "saved_count", "available_bytes",
           "check_memory", "time_steps", "march"]


@dataclass(eq=False)
class Trajectory(LabelledResult):
    r"""Saved states of a particle simulation.

    Attributes
    ----------
    times : numpy.ndarray, shape (T,)
        Saved times, the first 0 and the last ``t1``.
    positions : array, shape (T, n, d) or (T, batch, n, d)
        Positions on the sphere at ``times`` (same array library as the initial condition).
    beta, normalized, dt : float, bool, float or None
        The inverse temperature and SA / USA of the system that solved it, and its step
        (None: not recorded); written to the file's attributes.
    """

    times: np.ndarray
    positions: object
    beta: float | None = None
    normalized: bool | None = None
    dt: float | None = None

    # field by field, arrays by entries (a pickled or copied trajectory equals its original)
    __eq__, __hash__ = solvers.solution.same_fields, None

    @property
    def final(self):
        """Positions at the last saved time."""
        return self.positions[-1, ...]

    def __len__(self) -> int:
        return len(self.times)


def check_finite(xp, state, what, t_start, t_end, scheme, h, hint="or the velocities overflow"):
    """Raise FloatingPointError naming the time interval if ``state`` is not finite (one reduction)."""
    if not bool(xp.all(xp.isfinite(state))):
        raise FloatingPointError(
            f"{what} became NaN or inf between t={t_start:.6g} and t={t_end:.6g} (scheme "
            f"{getattr(scheme, 'name', type(scheme).__name__)!r}, dt={h:.6g}); the step may be "
            f"too large {hint}"
        )


def saved_count(steps: int, save_every: int) -> int:
    """Number of states a solve keeps: t = 0, every ``save_every``-th step, and the last."""
    return 1 + steps // save_every + (1 if steps % save_every else 0)


def available_bytes(like):
    """Free memory where ``like`` lives (host RAM, or a CuPy/torch array's CUDA device); None if unknown."""
    try:
        if array_api_compat.is_cupy_array(like):
            import cupy  # already imported: like is a CuPy array

            with like.device:
                free, _ = cupy.cuda.runtime.memGetInfo()
            return int(free) + int(cupy.get_default_memory_pool().free_bytes())
        if array_api_compat.is_torch_array(like) and like.device.type == "cuda":
            import torch  # already imported: like is a torch tensor

            return int(torch.cuda.mem_get_info(like.device)[0])
    except Exception:  # pragma: no cover - depends on the device
        return None
    return _memory.available_memory()  # the host's: the number the memory budget halves


def check_memory(count: int, like, save_every: int, steps: int) -> None:
    """Refuse, before any step, ``count`` states like ``like`` beyond the free memory where it lives or
    the memory budget (``CTFORMER_MEMORY_BUDGET``; on the host by default half the available memory)."""
    # finfo's bits are the real part's: a complex entry (circle, S^2 coefficients) holds two
    parts = 2 if array_api_compat.array_namespace(like).isdtype(like.dtype, "complex floating") else 1
    per_state = math.prod(like.shape) * parts * (floating_info(like.dtype).bits // 8)
    needed, free = count * per_state, available_bytes(like)
    device = getattr(getattr(like, "device", None), "type", "cpu") != "cpu" or array_api_compat.is_cupy_array(like)
    budget = _memory.memory_budget() if not device or os.environ.get(_memory.MEMORY_BUDGET_ENV) else None
    limits = [(b, w) for b, w in ((free, "available"), (budget, "allowed by the memory budget (half the "
              f"available memory, or {_memory.MEMORY_BUDGET_ENV})")) if b is not None and needed > b]
    if limits:
        limit, words = min(limits, key=lambda pair: pair[0])
        hint = max(1, math.ceil(steps / max(1, limit // per_state - 2)))
        raise _memory.SizeTooLargeError(
            f"saving with save_every={save_every} over {steps} steps keeps {count} states of "
            f"{per_state} bytes: {needed} bytes needed ({needed / 2**30:.3g} GiB), {limit} bytes "
            f"{words} ({limit / 2**30:.3g} GiB); raise save_every (to at least {hint}) or shorten t1")


def _real_number(value, name: str) -> float:
    if not is_real(value):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    return float(value)


def time_steps(t1, dt, save_every) -> tuple[int, float]:
    r"""Validate a uniform time grid on ``[0, t1]``; return the step count and the exact step.

    The count is :math:`\lceil t_1 / \Delta t \rceil` (less a relative :math:`10^{-12}`, so
    that ``t1 = k dt`` up to rounding takes ``k`` steps) and the step ``t1 / count`` (at most
    ``dt``), so that the last step lands on ``t1``.

    Raises
    ------
    TypeError
        If ``t1`` or ``dt`` is not a real number, or ``save_every`` not an integer.
    ValueError
        If ``t1`` is not finite and >= 0, ``dt`` not finite and > 0, ``save_every`` not a
        positive integer, or :math:`t_1 / \Delta t` exceeds the step limit
        :func:`~ctformer.model_inputs.max_steps` (10**8 unless ``CTFORMER_MAX_STEPS`` is set),
        all before the first step.
    """
    t1, dt = _real_number(t1, "t1"), _real_number(dt, "dt")
    if not (math.isfinite(t1) and t1 >= 0):
        raise ValueError(f"t1 must be finite and >= 0, got {t1}")
    if not (math.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be finite and > 0, got {dt}")
    integer(save_every, "save_every")
    with np.errstate(over="ignore"):
        ratio = float(np.float64(t1) / np.float64(dt))  # inf when t1 / dt overflows
    check_step_count(ratio * (1 - 1e-12), f"t1 / dt = {t1:.6g} / {dt:.6g}")
    steps = math.ceil(ratio * (1 - 1e-12)) if t1 > 0 else 0
    return steps, (t1 / steps if steps else 0.0)


def march(scheme, problem, state, steps: int, h: float, save_every: int, saved, *, what: str,
          build, hint: str = "or the velocities overflow", on_save=None):
    """Take ``steps`` steps of ``scheme``, keeping states in the preallocated ``saved``.

    The fixed-step path of the one loop (:func:`ctformer.solvers.integrate`): ``saved[0]``
    holds the initial state; every ``save_every``-th state and the last are checked for
    finiteness (the message names the interval), passed to ``on_save(state, t_start, t_end)``
    and stored. Returns ``build(times, saved)``. On Ctrl-C the last completed step is kept too
    and :class:`SolveInterrupted` carries ``build(times, saved[:len(times)])``.
    """
    if steps == 0:
        return build([0.0], saved[:1, ...])
    try:
        with fixed_threads():  # the thread count read once, not at every step
            solution = solvers.integrate(solvers.Piecewise.single(problem, steps * h), state,
                                         (steps, h), scheme=scheme, save_at=solvers.SaveAt(steps=True),
                                         what=f"the {what} solution", save_every=save_every,
                                         out=saved, on_save=on_save, hint=hint)
    except SolveInterrupted as exc:
        partial = exc.result
        message = str(exc).replace(f"{what} solution solve", f"{what} solve", 1)
        raise SolveInterrupted(message, build(list(partial.times), saved[:len(partial.times), ...])) \
            from None
    return build(list(solution.times), saved)


def restart_of(initial, t1, dt, scheme=None):
    r"""The :class:`~ctformer.solvers.restart.RestartPoint` of ``initial`` (None for a new solve).

    Error control (``dt`` None): the last saved state must end an accepted step. Fixed steps:
    it must lie on the uninterrupted solve's grid :math:`t = k\,h`, :math:`h = t_1/\lceil
    t_1/\Delta t\rceil`, :math:`0 \le k <` the step count. Either way before ``t1``, and,
    when ``scheme`` is given and ``initial`` records one, made by the same scheme.
    """
    if initial is None:
        return None
    from ..solvers.restart import restart_point

    t1 = _real_number(t1, "t1")
    grid = None
    if dt is not None:
        steps, h = time_steps(t1, dt, 1)

        def grid(t0):
            _before(t0, t1)
            k = round(t0 / h) if steps else -1
            if not (0 <= k < steps and k * h == t0):
                raise ValueError(f"initial: a fixed-step restart continues the grid t = k*{h!r} "
                                 f"(t1 / ceil(t1 / dt) for t1={t1!r}, dt={float(dt)!r}); the last "
                                 f"saved time t={t0!r} is not on it: pass the t1 and dt of the "
                                 f"saved solve, or restart with error control (dt=None)")
    start = restart_point(initial, controlled=dt is None, boundaries=grid or (0.0, t1))
    _before(start.t0, t1)
    if scheme is not None and start.scheme is not None:
        label = solvers.get(scheme).label
        if start.scheme != label:
            raise ValueError(f"initial was solved with scheme {start.scheme!r}, this solve uses "
                             f"{label!r}: a restart continues with the scheme of the saved solve "
                             f"(pass scheme={start.scheme!r})")
    return start


def _before(t0: float, t1: float) -> None:
    if not t0 < t1:
        raise ValueError(f"initial ends at t={t0!r}, not before t1={t1!r}: nothing is left to "
                         f"solve; pass a t1 beyond the saved time")


def _grid_times(solution, t0: float, k: int, h: float, steps_only: bool):
    """A fixed-step restart from :math:`t_0 = k h`: the loop's step ends :math:`t_0 + s h` become
    the uninterrupted solve's :math:`(k + s) h` (equal up to rounding; the states are the same)."""
    def exact(times):
        t = np.array(times, dtype=np.float64)
        s = np.rint((t - t0) / h)
        hit = (s >= 1) & (t0 + s * h == t)
        t[hit] = (k + s[hit]) * h
        return t

    solution.stats["step_times"] = exact(solution.stats["step_times"])
    if steps_only:  # requested times (SaveAt(times=...)) are kept as they were asked for
        solution.times = exact(solution.times)
    return solution


def evolve_on(problem, state, t1, *, scheme, rtol, atol, dt, save_at, events, max_steps,
              controller, what: str, hint: str = "or the velocities overflow", start=None,
              axes=None, system=None, initial=None, interpolant=None):
    r"""``evolve`` of a particle or mean-field system: one segment :math:`[0, t_1]`, no jump times.

    Fixed steps when ``dt`` is given (:func:`time_steps`: :math:`\lceil t_1/\Delta t \rceil`
    equal steps), else the controller of ``rtol``, ``atol``, ``max_steps`` (or ``controller``).
    The norm weighs every particle (or coefficient) alike: weight :math:`1/n` per particle.
    ``start`` (:func:`restart_of`) continues a saved solve ``initial`` (the same grid, or step
    size and error history) of the same ``system`` and control, else refused by name.
    ``interpolant(record)``: the dense output events are located on (default: the step's own).
    """
    from ..evolution import controller_for, refuse_error_control
    scheme = solvers.get(scheme)
    t1 = _real_number(t1, "t1")
    if not (math.isfinite(t1) and t1 > 0):
        raise ValueError(f"t1 must be finite and > 0, got {t1}")
    t0 = 0.0 if start is None else start.t0
    k = 0
    if dt is not None:
        refuse_error_control(f"dt={dt!r}", rtol, atol, controller, max_steps, marked=True)
        steps, h = time_steps(t1, dt, 1)
        k = round(t0 / h)  # on the grid: restart_of checked it
        control = (steps - k, h)
        t_end = steps * h
    else:
        control = controller_for(rtol, atol, controller, max_steps, marked=True)
        t_end = t1
    fingerprint = None if system is None else system_fingerprint(system)
    if initial is not None:
        refuse_another(recorded(initial), computation(fingerprint, control))
    with fixed_threads():
        solution = solvers.integrate(solvers.Piecewise.single(problem, t_end, t0), state, control,
                                     scheme=scheme, save_at=save_at, events=solvers.events.check_events(events),
                                     order=scheme.nominal_order, what=f"the {what} solution", hint=hint,
                                     start=start, memory=_memory, interpolant=interpolant,  # memory: saved states
                                     labels={"axes": axes, "time_axis": "time", "model_fingerprint": fingerprint})
    if k:
        solution = _grid_times(solution, t0, k, h, save_at is None or save_at.times is None)
    return solution


def evolve_coefficients(field, rho0, t1, *, scheme, dt, what, axes, size: int, dtype, mass_of,
                        initial=None, **options):
    r"""``evolve`` of a spectral mean field (zonal, S^2) from ``rho0`` or a saved solve ``initial``.

    The state is the coefficient vector :math:`c` (``size`` entries of ``dtype``,
    ``field.coefficients_of(rho0)``), with noise followed by the integrating factor's clock
    :math:`\tau = 0` (which stays 0 under the Lawson steps of a Runge-Kutta scheme,
    :func:`~ctformer.particles.lawson.lawson_scheme`). ``initial`` (``rho0`` None): the last
    saved state of a Solution or a dataset written from one (:func:`restart_of`), continued
    bit for bit. With ``dt``, fixed steps refused above ``field.stable_step(t1, scheme, mass_of(c))``. ``options`` are
    ``rtol``, ``atol``, ``save_at``, ``events``, ``max_steps``, ``controller`` of :func:`evolve_on`.
    """
    scheme = solvers.get(scheme)
    start = restart_of(initial, t1, dt, scheme)
    stepper, problem = lawson_scheme(field, scheme)
    if start is None:
        c = field.coefficients_of(rho0, name="rho0")
        state = np.concatenate([c, [0.0]]) if field.noise else c
    else:
        if rho0 is not None:
            raise ValueError("rho0 and initial both given: a restart takes its state from initial; "
                             "pass rho0=None")
        state = _saved_state(field, start.u0, size, dtype)
        c = state[:size]
    if dt is not None:
        steps, h = time_steps(t1, dt, 1)
        bound = field.stable_step(t1, scheme, mass_of(c))
        if steps and h > bound:
            raise ValueError(f"dt={h:.6g} is above the stable step {bound:.4g} of scheme {scheme.name!r} "
                             f"for t1={float(t1):.6g}; use dt <= {bound:.4g} or a lower degree")
    # Lawson steps (a problem without projections) interpolate by a Lawson step from the step's start
    lawson = None if problem.has_projections else getattr(stepper, "tableau", None)
    clock = NoiseClock(field._diffusion, lawson) if field.noise else None
    asked = options.get("save_at")
    if clock is not None:
        options["events"] = tuple(replace(e, condition=clock.condition(e.condition))
                                  for e in options.get("events", ()))
        options["interpolant"] = clock.record  # events inside a step: where the saved states are
        if asked is not None and asked.times is not None:
            options["save_at"] = replace(asked, dense=True)  # the steps to interpolate in
    solution = evolve_on(problem, state, t1, scheme=stepper, dt=dt, what=what, start=start,
                         hint="or the density under-resolved (raise degree)", axes=axes,
                         system=field, initial=initial, **options)
    return solution if clock is None else clock.output(solution, asked)


def _saved_state(field, u0, size: int, dtype):
    """The saved state ``u0`` as this field's state, refused when another field made it."""
    from ..backend import to_host

    u = to_host(u0) if array_api_compat.is_array_api_obj(u0) else np.asarray(u0)
    expected = size + (1 if field.noise else 0)
    kind = "complex" if np.dtype(dtype).kind == "c" else "real"
    if u.shape != (expected,) or (np.iscomplexobj(u) != (kind == "complex")):
        raise ValueError(f"initial holds states of shape {u.shape} and dtype {u.dtype}; {field!r} has "
                         f"{kind} states of shape ({expected},) ({size} coefficients"
                         f"{' and the noise clock' if field.noise else ''}): restart with the "
                         f"solver (degree, noise) of the saved solve")
    if field.noise and u[-1] != 0:
        raise ValueError(f"initial's last entry {u[-1]!r} is not the noise clock (0 after every "
                         f"step): the saved solve had no noise or another degree; restart with "
                         f"the solver of the saved solve")
    return np.array(u, dtype=dtype)

r"""The cases of a convergence study: one solve per level, evaluated on a common grid.

:class:`StudyCase` holds what every case shares (model, initial state, scheme, the state space
with the refined variable left open, evaluation points) and is shipped once to the workers;
:func:`compute_case` solves one level and returns its values on the evaluation grid, the wall
time of the solve and the smallest feature standard deviation met at the layer boundaries.
Both live at module level so that executors and Dask pickle them by reference.

A study needs of its model only ``solve(u0, *, tokens, features, head_features, hidden,
scheme, steps_per_layer, trajectory)``; ``grids(...)`` (default discretizations of the inner
variables) and ``parameters()`` (identity) are used when present.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import NoReturn

import numpy as np

from ..backend import floating_info, to_host
from ..solvers import InconsistentDepthLimitWarning
from ..state import AXES, Grids
from .execution import add_note
from .identity import array_identity
from .refinement import VARIABLES, Refinement

__all__ = ["StudyCase", "compute_case", "VARIABLES"]


@dataclass
class StudyCase:
    """Everything a case needs; shipped once to the executor's workers.

    ``fixed`` maps each of ``tokens``, ``features``, ``head_features``, ``hidden`` to its fixed
    discretization (``None`` for the refined one, or for the model's default); ``family`` is the
    (name, domain) of the refined discretization; ``points`` and ``point_weights`` are the
    evaluation points along a refined token or feature axis; ``context_length`` the reference
    length of positions (``None``: the model's own).
    """

    model: object
    u0: object
    scheme: object
    refinement: Refinement
    family: tuple | None
    fixed: dict
    steps_per_layer: int
    points: np.ndarray | None = None
    point_weights: np.ndarray | None = None
    context_length: object = None

    def _length(self) -> dict:
        """``context_length`` for the model, only when the study gives one (a model with just
        ``solve`` need not take the keyword)."""
        return {} if self.context_length is None else {"context_length": self.context_length}

    def discretizations(self, level: int) -> dict:
        """The four discretizations of ``level`` (``None``: the model's default)."""
        return self.refinement.discretizations(self.fixed, self.family, level)

    def steps(self, level: int) -> int:
        """Steps per layer of ``level``."""
        return self.refinement.steps(level, self.steps_per_layer)

    def h(self, level: int) -> float:
        """The mesh width or time step of ``level``."""
        return self.refinement.h(level, self.discretizations(level))

    @property
    def refine(self) -> str:
        """The refined variable's name."""
        return self.refinement.variable

    def grids(self, level: int) -> Grids:
        """The state space of ``level`` (through ``model.grids`` when the model has it)."""
        chosen = self.discretizations(level)
        build = getattr(self.model, "grids", None)
        if callable(build):
            return build(chosen["tokens"], chosen["features"], chosen["head_features"],
                         chosen["hidden"], **self._length())
        return Grids(chosen["tokens"], chosen["features"], chosen["head_features"], chosen["hidden"],
                     **self._length())

    def evaluate(self, u, grids: Grids) -> np.ndarray:
        """Values of the stored state ``u`` on the evaluation grid (host float64)."""
        points = {var: (self.points if var == self.refine else None) for var in AXES}
        return to_host(grids.evaluate(u, **points), np.float64)

    def evaluation_axes(self, grids: Grids) -> tuple:
        """(points, weights) of the evaluation grid on the token axis and the feature axis."""
        axes = []
        for var in AXES:
            if var == self.refine:
                axes.append((self.points, self.point_weights))
            else:
                disc = getattr(grids, var)
                axes.append((np.asarray(disc.quadrature_nodes), np.asarray(disc.quadrature_weights)))
        return tuple(axes)

    def initial_identity(self, level: int) -> str:
        """Hash of the exact initial data of ``level``, sampled on that level's grid."""
        if callable(self.u0) and not hasattr(self.u0, "shape"):
            return array_identity(self.grids(level).sample(self.u0))
        return array_identity(self.u0)


def compute_case(study: StudyCase, level: int) -> dict:
    """Solve one level; return its values on the evaluation grid (module-level: picklable).

    Raises
    ------
    FloatingPointError
        When the solution at ``level`` holds NaN or inf (the message names the level).
    Exception
        Whatever the model or the discretizations raise, its message prefixed with the refined
        variable and ``level`` (the same type; one whose constructor does not take a message
        is re-raised as it is, with the level in a note).
    """
    try:
        states, seconds = _solve(study, level)
    except Exception as exc:  # the level is named here: a worker's error reaches the user bare
        _raise_at_level(exc, study.refine, level)
    if not np.all(np.isfinite(to_host(states[-1]))):
        # checked before evaluating: interpolating a NaN state failed with a message that
        # named neither the level nor the cause
        raise FloatingPointError(f"the solution at {study.refine} level {level} is not finite "
                                 "(NaN or inf): the solve diverged there; take more steps per "
                                 "layer, or leave out that level")
    try:
        grids = study.grids(level)
        values = study.evaluate(states[-1], grids)
        min_std = grids.min_feature_std(states)
    except Exception as exc:
        _raise_at_level(exc, study.refine, level)
    if not np.all(np.isfinite(values)):
        raise FloatingPointError(f"the solution at {study.refine} level {level} is not finite "
                                 "on the evaluation grid")
    return {"level": level, "values": values, "seconds": seconds, "min_feature_std": min_std,
            "eps": _unit_roundoff(states[-1])}


def _unit_roundoff(u) -> float:
    """The unit roundoff of the solved state's dtype (float64's for one without a float dtype):
    a float32 study's errors stall near its rounding, not at float64's."""
    try:
        return float(floating_info(getattr(u, "dtype", None)).eps)
    except TypeError:
        return float(np.finfo(np.float64).eps)


def _solve(study: StudyCase, level: int) -> tuple:
    """The layer-boundary states of ``level`` and the wall time of the solve."""
    chosen = study.discretizations(level)
    with warnings.catch_warnings():
        # convergence() has warned once already; do not repeat it for every case
        warnings.simplefilter("ignore", InconsistentDepthLimitWarning)
        start = time.perf_counter()
        states = study.model.solve(study.u0, tokens=chosen["tokens"], features=chosen["features"],
                                   head_features=chosen["head_features"], hidden=chosen["hidden"],
                                   scheme=study.scheme, steps_per_layer=study.steps(level),
                                   trajectory=True, **study._length())
        return states, time.perf_counter() - start


def _raise_at_level(exc: Exception, variable: str, level) -> NoReturn:
    """Raise ``exc`` with the case's variable and level at the head of its message: as an
    exception of the same type (``except FloatingPointError`` still catches it) chained to
    ``exc``, or ``exc`` itself with a note where its type does not take one message
    (``KeyError`` quotes it, ``UnicodeError`` takes five arguments)."""
    prefix = f"{variable} level {level}"
    message = f"{prefix}: {exc}"
    try:
        named = type(exc)(message)
    except Exception:
        named = None
    if named is None or str(named) != message:
        add_note(exc, f"raised by the case at {prefix}")
        raise exc
    raise named from exc

"""Time integrators for depth: splitting and Runge-Kutta schemes with their orders.

>>> import ctformer.solvers as s
>>> s.available()
['lie', 'strang', 'parallel', 'euler', 'heun', 'rk4', 'bosh3', 'dopri5', 'tsit5']
>>> s.get("rk4").order(), s.get("strang").order()
(4.0, 2.0)

``order(problem)`` is the order on that problem: 1 for every scheme on a post-norm model.
A Runge-Kutta method is one :class:`ButcherTableau` and :func:`register_tableau`; the embedded
pairs ``bosh3``, ``dopri5`` and ``tsit5`` (:mod:`ctformer.solvers.tableaus`) carry their error
weights and dense output.

:func:`integrate` is the one time loop (fixed steps or a :class:`PIController`) over a
:class:`Piecewise` problem, returning a :class:`Solution`.
"""
from .base import (InconsistentDepthLimitWarning, Scheme, SplitProblem, available, check_dt, get,
                   projects, register, warn_inconsistent_depth)
from .splitting import Lie, Parallel, Strang
from .runge_kutta import (EULER_TABLEAU, HEUN_TABLEAU, RK4, RK4_TABLEAU, TABLEAUS, ButcherTableau,
                          Euler, Heun, RungeKutta, register_tableau)
from .tableaus import BOSH3_TABLEAU, DOPRI5_TABLEAU, TSIT5_TABLEAU
from .substeps import SUBSTEPS
from .controller import ControllerState, PIController
from .norms import grid_weights, rms, weighted_rms
from .solution import SaveAt, Solution
from .events import Event
from .loop import (MaxStepsReached, Piecewise, SolveFailed, SolveInterrupted, StepSizeTooSmall,
                   integrate)

__all__ = ["Scheme", "SplitProblem", "available", "get", "register", "integrate", "check_dt", "projects",
           "Euler", "Heun", "RK4", "Lie", "Strang", "Parallel", "RungeKutta", "ButcherTableau",
           "TABLEAUS", "EULER_TABLEAU", "HEUN_TABLEAU", "RK4_TABLEAU", "register_tableau",
           "BOSH3_TABLEAU", "DOPRI5_TABLEAU", "TSIT5_TABLEAU",
           "SUBSTEPS", "InconsistentDepthLimitWarning", "warn_inconsistent_depth",
           "PIController", "ControllerState", "weighted_rms", "rms", "grid_weights",
           "SaveAt", "Solution", "Event", "Piecewise", "MaxStepsReached", "StepSizeTooSmall",
           "SolveFailed", "SolveInterrupted"]

_RENAMED = {"ClassicalRK4": "RK4"}  # 0.2 renamed these; the old name says where to go


def __getattr__(name):
    if name in _RENAMED:
        raise AttributeError(f"ctformer.solvers.{name} was renamed ctformer.solvers.{_RENAMED[name]} "
                             f"in 0.2; use {_RENAMED[name]}")
    raise AttributeError(f"module 'ctformer.solvers' has no attribute {name!r}")

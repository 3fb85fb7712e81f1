"""Time integrators for depth: splitting and Runge-Kutta schemes with their orders.

>>> import ctformer.solvers as s
>>> s.available()
['lie', 'strang', 'parallel', 'euler', 'heun', 'rk4']
>>> s.get("rk4").order(), s.get("strang").order()
(4.0, 2.0)

``order(problem)`` is the order on that problem: 1 for every scheme on a post-norm model.
A Runge-Kutta method is one :class:`ButcherTableau` and :func:`register_tableau`.
"""
from .base import (InconsistentDepthLimitWarning, Scheme, SplitProblem, available, check_dt, get,
                   integrate, projects, register, warn_inconsistent_depth)
from .splitting import Lie, Parallel, Strang
from .runge_kutta import (EULER_TABLEAU, HEUN_TABLEAU, RK4, RK4_TABLEAU, TABLEAUS, ButcherTableau,
                          Euler, Heun, RungeKutta, register_tableau)
from .substeps import SUBSTEPS

__all__ = ["Scheme", "SplitProblem", "available", "get", "register", "integrate", "check_dt", "projects",
           "Euler", "Heun", "RK4", "Lie", "Strang", "Parallel", "RungeKutta", "ButcherTableau",
           "TABLEAUS", "EULER_TABLEAU", "HEUN_TABLEAU", "RK4_TABLEAU", "register_tableau",
           "SUBSTEPS", "InconsistentDepthLimitWarning", "warn_inconsistent_depth"]

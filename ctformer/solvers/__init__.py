"""Time integrators for depth: splitting and Runge-Kutta schemes with their orders.

>>> import ctformer.solvers as s
>>> s.available()
['lie', 'strang', 'parallel', 'euler', 'heun', 'rk4']
"""
from .base import (InconsistentDepthLimitWarning, Scheme, SplitProblem, available, check_dt, get,
                   integrate, warn_inconsistent_depth)
from .splitting import Lie, Parallel, Strang
from .runge_kutta import TABLEAUS, ButcherTableau, ClassicalRK4, Euler, Heun, RungeKutta
from .substeps import SUBSTEPS

#: The classical Runge-Kutta scheme (the class behind ``get("rk4")``).
RK4 = ClassicalRK4

__all__ = ["Scheme", "SplitProblem", "available", "get", "integrate", "check_dt", "Euler", "Heun", "RK4",
           "Lie", "Strang", "Parallel", "RungeKutta", "ButcherTableau", "TABLEAUS", "SUBSTEPS",
           "InconsistentDepthLimitWarning", "warn_inconsistent_depth"]

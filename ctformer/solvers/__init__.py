"""Time integrators for depth: splitting and Runge-Kutta schemes with their orders.

>>> import ctformer.solvers as s
>>> s.available()
['lie', 'strang', 'parallel', 'euler', 'rk4']
"""
from .base import Scheme, SplitProblem, available, get
from .splitting import Lie, Parallel, Strang
from .runge_kutta import RK4, Euler
from .substeps import SUBSTEPS

__all__ = ["Scheme", "SplitProblem", "available", "get", "Euler", "Lie", "Strang", "Parallel",
           "RK4", "SUBSTEPS"]

"""Time integrators for depth: splitting and Runge-Kutta schemes with their orders."""
from .base import Scheme, SplitProblem, available, get
from .splitting import Lie
from .runge_kutta import Euler

__all__ = ["Scheme", "SplitProblem", "available", "get", "Euler", "Lie"]

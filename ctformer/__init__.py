"""ctformer: the Transformer as a discretized integro-differential equation.

The public entry points:

- :mod:`ctformer.discretizations`: the nine discretizations of an interval,
- :mod:`ctformer.kernels` and :mod:`ctformer.operators`: feature kernels, attention, feed-forward
  layers, normalizations,
- :class:`ContinuousTransformer` and :class:`Block`: the evolution equation in depth,
- :mod:`ctformer.solvers`: splitting and Runge-Kutta schemes, error control in depth
  (:class:`Solution`, :class:`SaveAt`, :class:`Event`),
- :mod:`ctformer.bridges`: torch and HuggingFace networks as discretizations,
- :mod:`ctformer.studies`: convergence studies,
- :mod:`ctformer.particles`: tokens as particles on the sphere,
- :mod:`ctformer.adjoint`: gradients of a loss on the final state (torch).
"""
from .cli import loading as _loading  # the standard library only

# Ctrl-C while the command line is still loading the package (seconds, on a first run): one
# line and status 130 there, as at any later moment; a program that imports ctformer is
# untouched (ctformer.cli.loading)
with _loading():
    from . import adjoint, backend, discretizations, kernels, operators, solvers
    from .backend import get_backend
    from .state import Grids
    from .solvers import Event, InconsistentDepthLimitWarning, SaveAt, Solution
    from .model import Block, ContinuousTransformer
    from . import bridges, labelled

#: The release (the one place it is written: pyproject.toml reads it; CHANGELOG.md lists the
#: changes of each release).
__version__ = "0.2.0"
__all__ = [
    "backend", "discretizations", "kernels", "operators", "solvers", "bridges", "adjoint", "labelled",
    "get_backend", "Grids", "Block", "ContinuousTransformer", "InconsistentDepthLimitWarning",
    "Solution", "SaveAt", "Event",
    "__version__",
]

"""ctformer: the Transformer as a discretized integro-differential equation."""
from . import backend, discretizations, operators, solvers
from .backend import get_backend

__version__ = "0.1.0"
__all__ = ["backend", "discretizations", "operators", "solvers", "get_backend", "__version__"]

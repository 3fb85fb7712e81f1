r"""The cases of a convergence study: one solve per level, evaluated on a common grid.

:class:`StudyCase` holds what every case shares (model, initial state, scheme, fixed
discretizations, evaluation points) and is shipped once to the workers; :func:`compute_case`
solves one level and returns its values on the evaluation grid, the wall time of the solve and
the smallest feature standard deviation met at the layer boundaries. Both live at module level
so that executors and Dask can pickle them by reference.
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass

import numpy as np

from ..discretizations import Midpoint, get
from .execution import case_key

__all__ = ["StudyCase", "compute_case", "model_fingerprint", "initial_fingerprint", "to_host",
           "depth_warning_category", "AXIS"]

AXIS = {"tokens": -2, "features": -1}


def to_host(array) -> np.ndarray:
    """A float64 NumPy copy of a NumPy or CuPy array (small arrays only: results, probes)."""
    if hasattr(array, "get") and not isinstance(array, np.ndarray):  # CuPy
        array = array.get()
    return np.asarray(array, dtype=np.float64)


def _fingerprint_array(values) -> str:
    return case_key({"v": np.round(to_host(values), 10).ravel().tolist()})


def _probe_state(x, y):
    return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def model_fingerprint(model) -> str:
    """A key that changes when the model does: a probe solve on a 5 x 6 midpoint grid."""
    probe = model.solve(_probe_state, tokens=Midpoint(5), features=Midpoint(6),
                        scheme="lie", steps_per_layer=1)
    return _fingerprint_array(probe)


def initial_fingerprint(u0) -> str:
    """A key of the initial state: its values on a 7 x 5 grid (or of the array itself)."""
    if callable(u0):
        x, y = np.meshgrid(np.linspace(0, 1, 7), np.linspace(0, 1, 5), indexing="ij")
        return _fingerprint_array(u0(x, y))
    return _fingerprint_array(u0)


@dataclass
class StudyCase:
    """Everything a case needs; shipped once to the executor's workers.

    ``fixed`` maps each of ``tokens``, ``features``, ``head_features``, ``hidden`` to its fixed
    discretization (``None`` for the refined one, or for the model's default); ``family`` is the
    (name, domain) of the refined discretization; ``points`` and ``point_weights`` are the
    evaluation points along a refined token or feature axis.
    """

    model: object
    u0: object
    scheme: object
    refine: str
    family: tuple | None
    fixed: dict
    steps_per_layer: int
    points: np.ndarray | None = None
    point_weights: np.ndarray | None = None

    def grids(self, level: int) -> tuple[dict, int]:
        """Discretizations and steps per layer of level ``level``."""
        grids = dict(self.fixed)
        steps = self.steps_per_layer
        if self.refine == "time":
            steps = level
        else:
            name, domain = self.family
            grids[self.refine] = get(name, level, domain=domain)
        return grids, steps

    def evaluation_axes(self, grids: dict):
        """Points and weights of the evaluation grid on the token and feature axes."""
        axes = {}
        for var in ("tokens", "features"):
            d = grids[var]
            if var == self.refine:
                axes[var] = (self.points, self.point_weights)
            else:
                axes[var] = (np.asarray(d.quadrature_nodes), np.asarray(d.quadrature_weights))
        return axes

    def evaluate(self, u, grids: dict):
        """Values of ``u`` on the evaluation grid (host array)."""
        for var, axis in AXIS.items():
            d = grids[var]
            if var == self.refine:
                u = d.interpolate(u, self.points, axis=axis)
            else:
                u = d.to_quadrature(u, axis=axis)
        return to_host(u)


def _min_feature_std(states, grids) -> float:
    tokens, features = grids["tokens"], grids["features"]
    w = np.asarray(features.quadrature_weights)
    smallest = math.inf
    for u in states:
        q = to_host(features.to_quadrature(tokens.to_quadrature(u, axis=-2), axis=-1))
        mean = q @ w / w.sum()
        var = ((q - mean[..., None]) ** 2) @ w / w.sum()
        smallest = min(smallest, float(np.sqrt(var.min())))
    return smallest


def compute_case(study: StudyCase, level: int) -> dict:
    """Solve one level; return its values on the evaluation grid (module-level: picklable)."""
    grids, steps = study.grids(level)
    with warnings.catch_warnings():
        if getattr(study.model, "warns_inconsistent_depth", False):
            # convergence() has warned once already; do not repeat it for every case
            warnings.simplefilter("ignore", depth_warning_category())
        start = time.perf_counter()
        states = study.model.solve(study.u0, tokens=grids["tokens"], features=grids["features"],
                                   head_features=grids["head_features"], hidden=grids["hidden"],
                                   scheme=study.scheme, steps_per_layer=steps, trajectory=True)
        seconds = time.perf_counter() - start
    values = study.evaluate(states[-1], grids)
    if not np.all(np.isfinite(values)):
        raise FloatingPointError(f"the solution at {study.refine} level {level} is not finite")
    return {"level": level, "values": values, "seconds": seconds,
            "min_feature_std": _min_feature_std(states, grids)}


def depth_warning_category():
    """The warning class for depth refinement without a consistent limit."""
    try:
        from ..model import InconsistentDepthLimitWarning
    except ImportError:  # pragma: no cover - the model module defines it
        return UserWarning
    return InconsistentDepthLimitWarning

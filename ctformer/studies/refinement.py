r"""What a study refines: time (steps per layer) or one space variable, as objects.

A study refines one variable on a sequence of levels, the others fixed. Everything that
depends on which variable that is lives here, once:

=====================  ==========================================  ================================
                       :class:`TimeRefinement`                     :class:`SpaceRefinement`
=====================  ==========================================  ================================
level :math:`n`        steps per layer :math:`k`                   size of the refined
                                                                   discretization
:math:`h` of a level   :math:`\Delta t = 1 / k`                    the discretization's ``h``
expected order         ``scheme.order(model)`` (1 on post-norm)    the discretization's ``order``
method (label)         the scheme, e.g. ``"strang (heun)"``        the discretization's name
=====================  ==========================================  ================================

Galerkin elements refined in the FFN hidden variable :math:`r` only ever evaluate the integral
:math:`\int W_2(y, r)\, \phi(\dots)\, dr` at their :math:`q` Gauss points per element: a
composite Gauss rule of order :math:`2q` (:meth:`SpaceRefinement.gauss_points`).

:func:`as_refinement` turns the strings ``"tokens"``, ``"features"``, ``"hidden"``,
``"time"`` of :func:`ctformer.studies.convergence` into these objects.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from ..state import AXES
from .arguments import check_window, evaluation_points, level_discretization, refined_family

__all__ = ["Refinement", "TimeRefinement", "SpaceRefinement", "as_refinement", "scheme_problem",
           "VARIABLES"]

#: The variables a study refines (the names :func:`as_refinement` accepts).
VARIABLES = ("tokens", "features", "hidden", "time")


class Refinement(abc.ABC):
    """The refined variable of a study: the levels' steps, discretizations, ``h`` and orders.

    Attributes
    ----------
    variable : str
        ``"tokens"``, ``"features"``, ``"hidden"`` or ``"time"``.
    size_name, step_name : str
        Column names of a level's size and step in printed tables (``"n"``/``"h"``, or
        ``"steps"``/``"dt"``).
    """

    variable: str
    size_name: ClassVar[str] = "n"
    step_name: ClassVar[str] = "h"

    @property
    def refines_depth(self) -> bool:
        """Whether the levels refine depth (time), where post-norm limits may not exist."""
        return False

    def family(self, specs: dict):
        """The refined discretization family from the study's four specs (None for time)."""
        return None

    def discretizations(self, fixed: dict, family, level: int) -> dict:
        """The four discretizations of ``level`` (``None``: the model's default)."""
        return dict(fixed)

    def steps(self, level: int, steps_per_layer: int) -> int:
        """Steps per layer of ``level``."""
        return steps_per_layer

    def cost(self, level: int) -> float:
        """Work of a level relative to the others (weights the progress bar)."""
        return float(level)

    @abc.abstractmethod
    def h(self, level: int, discretizations: dict) -> float:
        """The mesh width or time step of ``level``."""

    @abc.abstractmethod
    def expected_order(self, scheme, model, family, coarsest: int) -> float:
        """The theoretical order of the refined method on ``model``."""

    @abc.abstractmethod
    def method(self, scheme, family) -> str:
        """The refined method's label (a scheme or a discretization name)."""

    def gauss_points(self, family, coarsest: int):
        """:math:`q` when the levels act as composite Gauss rules of order :math:`2q`, else None."""
        return None

    def check_window(self, window):
        """The error window ``(a, b)``, or None; only a refined token or feature axis has one."""
        return check_window(window, self.variable)

    def evaluation_points(self, family, coarsest: int, fine: int, window, evaluate):
        """Points and weights along a refined token or feature axis (None, None otherwise)."""
        return None, None


@dataclass(frozen=True)
class TimeRefinement(Refinement):
    r"""Refine depth: level :math:`k` takes :math:`k` steps per layer, :math:`\Delta t = 1/k`.

    The expected order is ``scheme.order(model)``: the scheme's order on that model, 1 where
    the model projects after sub-steps (post-norm).
    """

    variable: ClassVar[str] = "time"
    size_name: ClassVar[str] = "steps"
    step_name: ClassVar[str] = "dt"

    @property
    def refines_depth(self) -> bool:
        return True

    def steps(self, level: int, steps_per_layer: int) -> int:
        return level

    def h(self, level: int, discretizations: dict) -> float:
        return 1.0 / level

    def cost(self, level: int) -> float:
        """Work of a level relative to others (for the progress bar): its step count."""
        return float(level)

    def expected_order(self, scheme, model, family, coarsest: int) -> float:
        return float(scheme.order(scheme_problem(model)))

    def method(self, scheme, family) -> str:
        return scheme.label


@dataclass(frozen=True)
class SpaceRefinement(Refinement):
    """Refine one space variable: level :math:`n` is the refined discretization of size :math:`n`.

    Parameters
    ----------
    variable : {"tokens", "features", "hidden"}

    Raises
    ------
    ValueError
        For another variable.
    """

    variable: str

    def __post_init__(self):
        if self.variable not in VARIABLES[:-1]:
            raise ValueError(f"a SpaceRefinement refines one of {', '.join(VARIABLES[:-1])}, "
                             f"got {self.variable!r}; use TimeRefinement() for time")

    def family(self, specs: dict):
        return refined_family(specs[self.variable], self.variable)

    def discretizations(self, fixed: dict, family, level: int) -> dict:
        return {**fixed, self.variable: level_discretization(family, level)}

    def h(self, level: int, discretizations: dict) -> float:
        return discretizations[self.variable].h

    def cost(self, level: int) -> float:
        """Work of a level relative to others (for the progress bar): attention is quadratic in
        the tokens, the feature kernels in the features; the hidden variable is linear."""
        return float(level) if self.variable == "hidden" else float(level) ** 2

    def expected_order(self, scheme, model, family, coarsest: int) -> float:
        return float(level_discretization(family, coarsest).order)

    def method(self, scheme, family) -> str:
        return family[0] if isinstance(family, tuple) else family.label

    def gauss_points(self, family, coarsest: int):
        if self.variable != "hidden":
            return None
        disc = level_discretization(family, coarsest)
        # Galerkin elements (kind "galerkin") declare their Gauss points per element
        return disc.gauss_points if disc.kind == "galerkin" else None

    def evaluation_points(self, family, coarsest: int, fine: int, window, evaluate):
        if self.variable not in AXES:
            return None, None
        return evaluation_points(self.variable, family, coarsest, fine, window, evaluate)


def scheme_problem(model):
    """``model`` as :meth:`Scheme.order` reads it: a ContinuousTransformer, else None.

    A study's model is anything with ``solve``; only a
    :class:`ctformer.ContinuousTransformer` declares its blocks (and so its projections).
    """
    from ..model import ContinuousTransformer

    return model if isinstance(model, ContinuousTransformer) else None


def as_refinement(refine) -> Refinement:
    """A :class:`Refinement` from ``"tokens"``, ``"features"``, ``"hidden"``, ``"time"`` or itself.

    Raises
    ------
    ValueError
        For any other value, naming the accepted ones.
    """
    if isinstance(refine, Refinement):
        return refine
    if isinstance(refine, str) and refine == "time":
        return TimeRefinement()
    if isinstance(refine, str) and refine in VARIABLES:
        return SpaceRefinement(refine)
    raise ValueError(f"refine must be one of {', '.join(VARIABLES)} or a Refinement "
                     f"(TimeRefinement(), SpaceRefinement(variable)), got {refine!r}")

r"""The :class:`Scheme` contract: one time step of a split evolution equation.

Depth is time. Inside one layer :math:`[l, l+1)` the parameters are constant and the state
obeys

.. math::  \partial_t u = \sum_{k=1}^{K} f_k(u),

with sub-flows :math:`f_1` = attention and :math:`f_2` = feed-forward (DESIGN.md section 1).
A post-norm model additionally projects onto the constraint set after sub-step :math:`k`
(``projections[k]``). A :class:`SplitProblem` carries exactly this data and a
:class:`Scheme` advances it by ``dt``.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Callable, ClassVar

__all__ = ["SplitProblem", "Scheme", "register", "get", "available"]

Flow = Callable[[object], object]


@dataclass(frozen=True)
class SplitProblem:
    r"""An autonomous split problem :math:`u' = \sum_k f_k(u)` with optional projections.

    Parameters
    ----------
    flows : sequence of callables
        Sub-flow right-hand sides :math:`f_k(u)`, in splitting order (attention, then FFN).
    projections : sequence of callables or None, optional
        ``projections[k]`` is applied after sub-step ``k`` (post-norm models); ``None`` or an
        empty sequence means no projection.
    """

    flows: tuple
    projections: tuple = field(default=())

    def __post_init__(self):
        object.__setattr__(self, "flows", tuple(self.flows))
        proj = tuple(self.projections or ())
        if proj and len(proj) != len(self.flows):
            raise ValueError(
                f"projections must be empty or one per flow ({len(self.flows)}), got {len(proj)}"
            )
        object.__setattr__(self, "projections", proj)
        if not self.flows:
            raise ValueError("a SplitProblem needs at least one flow")

    def rhs(self, u):
        """The full right-hand side :math:`\\sum_k f_k(u)`."""
        total = self.flows[0](u)
        for f in self.flows[1:]:
            total = total + f(u)
        return total

    def project(self, k: int, u):
        """Apply the projection that follows sub-step ``k`` (identity if there is none)."""
        if self.projections and self.projections[k] is not None:
            return self.projections[k](u)
        return u

    def project_all(self, u):
        """Apply every projection in order (after an unsplit step)."""
        for k in range(len(self.flows)):
            u = self.project(k, u)
        return u

    @property
    def has_projections(self) -> bool:
        return any(p is not None for p in self.projections)


_REGISTRY: dict[str, type["Scheme"]] = {}


def register(cls):
    """Class decorator: make ``cls`` available as ``get(cls.name)``."""
    _REGISTRY[cls.name] = cls
    return cls


def available() -> list[str]:
    """Names accepted by :func:`get`."""
    return list(_REGISTRY)


def get(name, **kwargs) -> "Scheme":
    """Return a scheme by name (``"euler"``, ``"lie"``, ...) or pass a :class:`Scheme` through."""
    if isinstance(name, Scheme):
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown scheme {name!r}; known schemes: {', '.join(available())}")
    return _REGISTRY[name](**kwargs)


class Scheme(abc.ABC):
    """One step ``u -> u(t + dt)`` of a :class:`SplitProblem`; ``order`` is its order in dt."""

    name: ClassVar[str]
    order: ClassVar[float]

    @abc.abstractmethod
    def step(self, problem: SplitProblem, u, dt: float):
        """Advance ``u`` by ``dt``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

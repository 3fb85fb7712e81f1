r"""The :class:`Scheme` contract: one time step of a split evolution equation.

Depth is time. Inside one layer :math:`[l, l+1)` the parameters are constant and the state
obeys

.. math::  \partial_t u = \sum_{k=1}^{K} f_k(u),

with sub-flows :math:`f_1` = attention and :math:`f_2` = feed-forward (design notes, section 1).
A post-norm model additionally projects onto the constraint set after sub-step :math:`k`
(``projections[k]``). A :class:`SplitProblem` carries exactly this data and a
:class:`Scheme` advances it by ``dt``.
"""
from __future__ import annotations

import abc
import warnings
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Protocol, Sequence, runtime_checkable

import array_api_compat
import numpy as np

from ..validation import is_real

__all__ = ["SplitProblem", "Scheme", "register", "get", "available", "check_dt",
           "projects", "LayeredModel", "NormalizedBlock", "InconsistentDepthLimitWarning",
           "warn_inconsistent_depth"]


class InconsistentDepthLimitWarning(UserWarning):
    """Refining depth on a post-norm model whose normalization is not a projection.

    A post-norm step projects onto the constraint set after every sub-step. When the
    normalization has a per-feature affine map or ``eps > 0`` it is not idempotent, so halving
    the step applies it twice as often and the discrete solutions have no consistent
    continuous-depth limit (design notes, section 1): no convergence order is meaningful.
    """


def warn_inconsistent_depth(what: str, stacklevel: int = 2) -> None:
    """Warn that ``what`` refines depth where no continuous-depth limit exists."""
    warnings.warn(f"{what}: no consistent continuous-depth limit exists (the normalization is "
                  "applied once per sub-step and is not idempotent); results depend on the step "
                  "count and no convergence order is meaningful", InconsistentDepthLimitWarning,
                  stacklevel=stacklevel + 1)


_INF = float("inf")


def check_dt(dt) -> float:
    """Validate a time step: a finite positive real number."""
    if type(dt) is float and 0.0 < dt < _INF:  # the common case, checked every step
        return dt
    if not is_real(dt):
        raise TypeError(f"dt must be a real number, got {type(dt).__name__}")
    value = float(dt)
    if not value > 0.0 or value == float("inf"):
        raise ValueError(f"dt must be a finite positive number, got {dt!r}")
    return value

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
    retraction : bool
        The projections are retractions onto a manifold that the exact flow leaves invariant
        (particles on the sphere): they move a step's result by its local error only, so they
        keep every scheme's order (:func:`projects` is False). Not so for a post-norm model,
        whose projections change the flow (default False).
    """

    flows: tuple
    projections: tuple = field(default=())
    retraction: bool = False

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
        if not self.projections:
            return u
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


_LISTED_FIRST = ("lie", "strang", "parallel", "euler", "heun", "rk4")


def available() -> list[str]:
    """Names accepted by :func:`get`: the splitting schemes, then the Runge-Kutta methods."""
    first = [name for name in _LISTED_FIRST if name in _REGISTRY]
    return first + [name for name in _REGISTRY if name not in first]


def get(name, **kwargs) -> "Scheme":
    """Return a scheme by name (``"euler"``, ``"lie"``, ...) or pass a :class:`Scheme` through."""
    if isinstance(name, Scheme):
        return name
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"unknown scheme {name!r}; known schemes: {', '.join(available())}")
    return _REGISTRY[name](**kwargs)


@runtime_checkable
class LayeredModel(Protocol):
    """What :func:`projects` reads of a model: its layers (:class:`ctformer.ContinuousTransformer`)."""

    blocks: Sequence


@runtime_checkable
class NormalizedBlock(Protocol):
    """What :func:`projects` reads of a layer (:class:`ctformer.Block`): its sub-flows, their
    normalizations and where the normalizations act (``"pre"``, ``"post"`` or ``"none"``)."""

    attention: object
    feedforward: object
    normalization1: object
    normalization2: object
    placement: str


def projects(problem) -> bool:
    r"""Whether ``problem`` projects after its sub-steps with a projection that is not the identity.

    Parameters
    ----------
    problem : None, SplitProblem, Block, ContinuousTransformer or a sequence of them
        ``None`` stands for a problem without projections. A
        :class:`ctformer.ContinuousTransformer` (a :class:`LayeredModel`) projects when one
        of its blocks does; a :class:`ctformer.Block` (a :class:`NormalizedBlock`) projects
        when it is post-norm (``placement="post"``) with a normalization after one of its
        sub-flows: its split problem carries those normalizations as ``projections``.

    Returns
    -------
    bool

    Raises
    ------
    TypeError
        For anything else, naming what is accepted.
    """
    if problem is None:
        return False
    if isinstance(problem, SplitProblem):
        return problem.has_projections and not problem.retraction
    if isinstance(problem, (list, tuple)):
        return any(projects(p) for p in problem)
    if isinstance(problem, NormalizedBlock):
        pairs = ((problem.attention, problem.normalization1),
                 (problem.feedforward, problem.normalization2))
        return problem.placement == "post" and any(op is not None and n is not None for op, n in pairs)
    if isinstance(problem, LayeredModel):
        return any(projects(block) for block in problem.blocks)
    raise TypeError(f"problem must be None, a SplitProblem, a Block, a ContinuousTransformer or a "
                    f"list or tuple of them, got {type(problem).__name__}")


class _OrderMethod:
    """:meth:`Scheme.order` as a method that refuses to be compared with a number.

    Schemes of ctformer 0.1 had an attribute ``order = p``; code written then, such as
    ``scheme.order == 2``, would compare a bound method with a number and quietly be
    ``False``. Read on a scheme, this descriptor gives a :class:`_BoundOrder`, which is called
    like the method and raises a ``TypeError`` naming the remedy when compared with a number.
    Read on the class it is the plain function (what documentation tools inspect).
    """

    def __init__(self, func):
        self.__func__ = func
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __get__(self, scheme, owner=None):
        return self.__func__ if scheme is None else _BoundOrder(self.__func__, scheme)


class _BoundOrder:
    """``scheme.order``: call it (``scheme.order(problem)``); comparing it with a number raises."""

    __slots__ = ("__func__", "__self__")

    def __init__(self, func, scheme):
        self.__func__, self.__self__ = func, scheme

    def __call__(self, problem=None) -> float:
        return self.__func__(self.__self__, problem)

    def _refuse(self, other):
        if is_real(other):
            name = type(self.__self__).__name__
            raise TypeError(f"{name}.order is a method (since ctformer 0.2), not a number: compare "
                            f"{name}.order(problem) (the order on that problem) or "
                            f"{name}.nominal_order (on problems whose projections are the identity) "
                            f"with {other!r}")
        return NotImplemented

    def __eq__(self, other):
        if isinstance(other, _BoundOrder):
            return self.__func__ is other.__func__ and self.__self__ is other.__self__
        return self._refuse(other)

    def __ne__(self, other):
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __lt__ = __le__ = __gt__ = __ge__ = _refuse

    def __float__(self):
        name = type(self.__self__).__name__
        raise TypeError(f"{name}.order is a method (since ctformer 0.2), not a number: call "
                        f"{name}.order(problem), or read {name}.nominal_order")

    def __hash__(self):
        return hash((self.__func__, id(self.__self__)))

    def __repr__(self):
        return f"<bound method order of {self.__self__!r}>"


class Scheme(abc.ABC):
    r"""One step ``u -> u(t + dt)`` of a :class:`SplitProblem`; :meth:`order` is its order in dt.

    A scheme declares ``name`` (its registry name) and ``nominal_order``, its order on
    problems whose projections are the identity (pre-norm models, or no normalization).

    A scheme is a value: two of the same type with equal public attributes (its options, e.g.
    ``substep``) are equal and hash alike; attributes named ``_...`` are per-solve caches (the
    first-same-as-last stage of a Runge-Kutta pair), left out of equality and reset to
    ``None`` by pickling and copying. A scheme class made at run time
    (:func:`~ctformer.solvers.runge_kutta.register_tableau` without a class) pickles by its
    registered name.
    """

    name: ClassVar[str]
    nominal_order: ClassVar[float]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # 0.1 schemes declared ``order = p``; that would hide the method and fail far away
        if "order" in vars(cls) and not callable(vars(cls)["order"]):
            raise TypeError(f"{cls.__name__} sets order = {vars(cls)['order']!r}; declare "
                            f"nominal_order = {vars(cls)['order']!r} instead (order(problem) is a "
                            f"method since ctformer 0.2)")
        if callable(vars(cls).get("order")) and not isinstance(vars(cls)["order"], _OrderMethod):
            cls.order = _OrderMethod(vars(cls)["order"])

    @abc.abstractmethod
    def step(self, problem: SplitProblem, u, dt: float):
        """Advance ``u`` by ``dt``."""

    def order(self, problem=None) -> float:
        r"""The order in :math:`\Delta t` of this scheme on ``problem``.

        .. math::  p(\text{problem}) = \begin{cases} p_{\text{nominal}} & \text{projections
                   are the identity,} \\ \min(1, p_{\text{nominal}}) & \text{otherwise.}
                   \end{cases}

        Projecting after sub-steps is a first-order approximation of the projected flow
        :math:`u' = P_{T_u S} \sum_k f_k(u)` whatever the sub-step method, so on a post-norm
        model every scheme is first order (:mod:`ctformer.solvers.splitting`).

        Parameters
        ----------
        problem : None, SplitProblem, Block, ContinuousTransformer or a sequence of them, optional
            The problem the scheme solves (see :func:`projects`); ``None``, the default, gives
            the nominal order.

        Returns
        -------
        float
        """
        nominal = float(self.nominal_order)
        return min(1.0, nominal) if projects(problem) else nominal

    order = _OrderMethod(order)

    @property
    def label(self) -> str:
        """A short name for tables and plots: :attr:`name`, with the sub-step method if any."""
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    # -- value identity: a scheme is its type and its public options --------------------------
    def __eq__(self, other) -> bool:
        if type(self) is not type(other):
            return False
        try:
            return bool(_options(self) == _options(other))
        except (TypeError, ValueError):  # options that do not compare (arrays): only itself
            return self is other

    def __hash__(self) -> int:
        return hash((type(self).__module__, type(self).__qualname__, getattr(self, "name", None)))

    def __getstate__(self):
        # attributes named "_..." are per-solve caches (the FSAL stage of the last step, which
        # holds that step's problem and arrays): a copy or a pickle starts without them
        return {k: (None if k.startswith("_") else v) for k, v in self.__dict__.items()}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __reduce_ex__(self, protocol):
        cls = type(self)
        if _importable(cls):
            return super().__reduce_ex__(protocol)
        # a class made at run time (register_tableau without a scheme class) is found again
        # through the registry, by its registered name
        return (_registered, (cls.name,), self.__getstate__())


def _options(scheme) -> dict:
    return {k: v for k, v in scheme.__dict__.items() if not k.startswith("_")}


def _importable(cls) -> bool:
    """Whether pickle finds ``cls`` again as ``module.qualname``."""
    import sys

    found = sys.modules.get(cls.__module__)
    for part in cls.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is cls


def _registered(name: str) -> "Scheme":
    """An empty instance of the scheme registered as ``name`` (unpickling; state follows)."""
    if name not in _REGISTRY:
        raise ValueError(f"cannot unpickle the scheme {name!r}: no scheme of that name is registered "
                         f"in this process (known: {', '.join(available())}); import the module that "
                         "registers it (register_tableau) before unpickling")
    cls = _REGISTRY[name]
    return cls.__new__(cls)

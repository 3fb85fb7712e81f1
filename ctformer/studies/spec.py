r"""The arguments of a convergence study as one checked, frozen value.

:func:`ctformer.studies.convergence` takes its arguments as keywords (the public signature)
and turns them into a :class:`StudySpec` once, where they enter: every check happens in
:meth:`StudySpec.checked`, and the steps after it (building the cases, measuring) read the
spec instead of passing the keywords on.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import solvers
from ..validation import integer, one_of, real
from .arguments import check_levels
from .refinement import Refinement, as_refinement

__all__ = ["StudySpec", "smooth_initial_state", "NORMS", "REFERENCES", "EVALUATIONS"]

NORMS = ("l2", "max")
REFERENCES = ("finest", "richardson")
EVALUATIONS = ("interpolate", "coarsest-nodes")


def smooth_initial_state(x, *coordinates):
    r"""The default initial state of studies: ``u0(x, y)``, or ``u0(x1, x2, y)`` on a square.

    .. math::  u_0(x, y) = \cos\big(4 y + 1.5 \sin(\pi x + 0.5)\big) + 0.3 \sin(\pi x y),

    and on a two-dimensional token domain (a :class:`~ctformer.discretizations.Product`)

    .. math::  u_0(x_1, x_2, y) = \cos\big(4 y + 1.5 \sin(\pi x_1 + 0.5) \cos(\pi x_2)\big)
               + 0.3 \sin(\pi x_1 y),

    whose slice :math:`x_2 = 0` is the interval's state. Its feature variance is bounded below
    uniformly in the tokens, so LayerNorm stays smooth.
    """
    if len(coordinates) == 1:
        (y,) = coordinates
        return np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)
    if len(coordinates) == 2:
        x2, y = coordinates
        return (np.cos(4.0 * y + 1.5 * np.sin(np.pi * x + 0.5) * np.cos(np.pi * x2))
                + 0.3 * np.sin(np.pi * x * y))
    raise TypeError(f"smooth_initial_state takes (x, y) or (x1, x2, y), got "
                    f"{1 + len(coordinates)} arguments")


@dataclass(frozen=True)
class StudySpec:
    """A convergence study's checked arguments (see :func:`ctformer.studies.convergence`).

    Attributes
    ----------
    refinement : Refinement
        What the levels refine.
    levels : tuple of int
        Strictly increasing sizes, or steps per layer.
    tokens, features, head_features, hidden : spec or None
        The discretization specs as given; the refined one names its family.
    scheme : Scheme
    steps_per_layer : int
    u0 : callable or array
        Default :func:`ctformer.studies.smooth_initial_state`.
    reference : {"finest", "richardson"} or callable
    error_norm : {"l2", "max"}
    fine : int or None
        ``None``: enough points for every measured level (the study resolves it).
    window : tuple of float or None
    evaluate : {"interpolate", "coarsest-nodes"}
    expected_order : float or None
        Given by the user; ``None`` to take the refined method's order on the model.
    fit_levels : int or None
    context_length : float, tuple or None
        The reference length of positions; ``None``: the model's own.
    """

    refinement: Refinement
    levels: tuple
    tokens: object = None
    features: object = None
    head_features: object = None
    hidden: object = None
    scheme: solvers.Scheme = None
    steps_per_layer: int = 1
    u0: object = None
    reference: object = "finest"
    error_norm: str = "l2"
    fine: int | None = None
    window: tuple | None = None
    evaluate: str = "interpolate"
    expected_order: float | None = None
    fit_levels: int | None = None
    context_length: object = None

    @classmethod
    def checked(cls, *, refine, levels, tokens=None, features=None, head_features=None,
                hidden=None, scheme="lie", steps_per_layer=1, u0: Callable | None = None,
                reference="finest", error_norm=None, fine=None, window=None,
                evaluate="interpolate", expected_order=None, fit_levels=None,
                context_length=None) -> "StudySpec":
        """Check every argument of a study once; raise naming the argument otherwise.

        Raises
        ------
        ValueError, TypeError
            As documented by :func:`ctformer.studies.convergence`.
        """
        refinement = as_refinement(refine)
        levels = tuple(check_levels(levels))
        error_norm = one_of("l2" if error_norm is None else error_norm, "error_norm", NORMS)
        if not (callable(reference) or (isinstance(reference, str) and reference in REFERENCES)):
            raise ValueError(f"reference must be 'finest', 'richardson' or a callable u(x, y), "
                             f"got {reference!r}")
        fine = None if fine is None else integer(fine, "fine", minimum=2)
        steps_per_layer = integer(steps_per_layer, "steps_per_layer")
        if fit_levels is not None:
            fit_levels = integer(fit_levels, "fit_levels", minimum=2)
        scheme = solvers.get(scheme)
        window = refinement.check_window(window)
        evaluate = one_of(evaluate, "evaluate", EVALUATIONS)
        _refuse_unread(refinement, fine, evaluate, steps_per_layer)
        u0 = smooth_initial_state if u0 is None else u0
        if not callable(u0) and refinement.variable in ("tokens", "features"):
            raise ValueError("u0 must be a callable u0(x, y) when refining tokens or features "
                             "(it is sampled on every grid)")
        shape = None if callable(u0) else tuple(getattr(u0, "shape", None) or np.shape(u0))
        if shape is not None and len(shape) != 2:  # the error norm integrates over (x, y) only
            raise ValueError(f"u0 must be one state of shape (tokens, features), got shape {shape}: "
                             "a study measures the error of one solution; run one study per state")
        if expected_order is not None:
            expected_order = real(expected_order, "expected_order", positive=True)
        return cls(refinement, levels, tokens, features, head_features, hidden, scheme,
                   steps_per_layer, u0, reference, error_norm, fine, window, evaluate,
                   expected_order, fit_levels, context_length)

    @property
    def specs(self) -> dict:
        """The four discretization specs by variable."""
        return {"tokens": self.tokens, "features": self.features,
                "head_features": self.head_features, "hidden": self.hidden}


def _refuse_unread(refinement, fine, evaluate, steps_per_layer) -> None:
    """Refuse an argument this study would not read (it was silently ignored before).

    ``fine`` is read only along a refined token or feature axis with
    ``evaluate="interpolate"``; ``evaluate`` only along a refined token or feature axis
    (its default, ``"interpolate"``, is accepted everywhere); ``steps_per_layer`` only when
    time is not refined (its default, 1, is accepted everywhere).
    """
    variable = refinement.variable
    spatial = variable in ("tokens", "features")
    if fine is not None and not (spatial and evaluate == "interpolate"):
        where = f"evaluate={evaluate!r}" if spatial else f"refine={variable!r}"
        raise ValueError(f"fine={fine} sets the evaluation points of a refined token or "
                         f"feature axis with evaluate='interpolate'; with {where} no such points "
                         "are used and it would be ignored: leave fine out")
    if evaluate != "interpolate" and not spatial:
        raise ValueError(f"evaluate={evaluate!r} chooses where a refined token or feature axis "
                         f"is compared; with refine={variable!r} the solutions are compared at "
                         "the fixed grids' quadrature points and it would be ignored: leave "
                         "evaluate out")
    if steps_per_layer != 1 and refinement.refines_depth:
        raise ValueError(f"steps_per_layer={steps_per_layer} fixes the steps when time is not "
                         "refined; with refine='time' the steps per layer are the levels and it "
                         "would be ignored: leave steps_per_layer out")

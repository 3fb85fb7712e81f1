r"""The :class:`Grids` of a discretized model and the :class:`Operator` contract.

A continuous operator (attention, feed-forward, normalization) acts on functions
:math:`u(x, y)` of the token variable :math:`x` and the feature variable :math:`y`. Given one
discretization per continuous variable (a :class:`Grids`), it becomes a callable on arrays of
values at quadrature points, shaped ``(..., Nq_tokens, Nq_features)`` where the last two axes
hold :math:`u` at ``grids.tokens.quadrature_nodes`` x ``grids.features.quadrature_nodes``
(nodal values for quadrature and spectral rules). Leading axes are batch axes.

:meth:`Operator.discretize` builds that callable once per :class:`Grids` and caches it; host
matrices are built once, device copies once per backend and dtype.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Callable

import array_api_compat
import numpy as np

from ..backend import backend_of

__all__ = ["Grids", "Operator", "check_state", "device_array"]


@dataclass(frozen=True)
class Grids:
    r"""One discretization per continuous variable of the model.

    Parameters
    ----------
    tokens : Discretization
        The token variable :math:`x \in X`.
    features : Discretization
        The feature variable :math:`y \in Y`.
    head_features : Discretization, optional
        The per-head feature variable :math:`\sigma \in Y_h` (all heads share it). Default:
        ``features``.
    hidden : Discretization, optional
        The FFN variable :math:`r \in R`. Default: ``features``.

    Raises
    ------
    TypeError
        If a field is not a discretization.

    Notes
    -----
    Frozen and hashable: operators key their caches by it. Two ``Grids`` with equal
    discretizations are equal.
    """

    tokens: object
    features: object
    head_features: object = None
    hidden: object = None

    def __post_init__(self):
        if self.head_features is None:
            object.__setattr__(self, "head_features", self.features)
        if self.hidden is None:
            object.__setattr__(self, "hidden", self.features)
        for name in ("tokens", "features", "head_features", "hidden"):
            disc = getattr(self, name)
            if not (hasattr(disc, "quadrature_nodes") and hasattr(disc, "quadrature_weights")):
                raise TypeError(f"Grids.{name} must be a Discretization, got {type(disc).__name__}")

    @property
    def shape(self) -> tuple[int, int]:
        """``(Nq_tokens, Nq_features)``: the last two axes of the arrays operators act on."""
        return (len(self.tokens.quadrature_nodes), len(self.features.quadrature_nodes))


def check_state(u, grids: Grids, argname: str = "u"):
    """Validate an array of values at the quadrature points of ``grids``.

    Parameters
    ----------
    u : array, shape (..., Nq_tokens, Nq_features)
        Real floating array.
    grids : Grids
        The grids ``u`` lives on.
    argname : str
        Name used in messages.

    Returns
    -------
    namespace
        The array namespace of ``u``.

    Raises
    ------
    TypeError
        If ``u`` is not a real floating array.
    ValueError
        If the last two axes do not match ``grids.shape`` or ``u`` contains NaN or inf.
    """
    try:
        xp = array_api_compat.array_namespace(u)
    except TypeError:
        raise TypeError(f"{argname} must be a NumPy or CuPy array, got {type(u).__name__}") from None
    if not xp.isdtype(u.dtype, "real floating"):
        raise TypeError(f"{argname} must be a real floating array, got dtype {u.dtype}")
    if u.ndim < 2 or tuple(u.shape[-2:]) != grids.shape:
        raise ValueError(
            f"{argname} must have shape (..., {grids.shape[0]}, {grids.shape[1]}) (values at the "
            f"quadrature points of tokens {grids.tokens!r} x features {grids.features!r}), "
            f"got shape {tuple(u.shape)}"
        )
    if not bool(xp.all(xp.isfinite(u))):
        raise ValueError(f"{argname} contains NaN or inf")
    return xp


def device_array(owner, u, key, host):
    """Device copy of the host array ``host`` in the dtype of ``u``, on ``u``'s backend.

    Built once per ``(owner, key, dtype)`` through ``Backend.cached``; ``None`` stays ``None``.
    """
    if host is None:
        return None
    dtype = np.dtype(str(u.dtype))
    return backend_of(u).cached(owner, (*key, dtype.str), lambda: np.asarray(host).astype(dtype))


class Operator(abc.ABC):
    r"""An operator of the continuous model, discretized on demand.

    Subclasses implement :meth:`_discretize`, which returns a function of the array ``u``
    (shape ``(..., Nq_tokens, Nq_features)``) for one :class:`Grids`.
    """

    def discretize(self, grids: Grids) -> Callable:
        """The discretized operator on ``grids``: a callable ``f(u)``, built once per grids.

        Parameters
        ----------
        grids : Grids
            Discretizations of the continuous variables.

        Returns
        -------
        callable
            ``f(u)`` mapping an array of shape ``(..., Nq_tokens, Nq_features)`` to one of the
            same shape, on the same backend and with the same dtype.

        Raises
        ------
        TypeError
            If ``grids`` is not a :class:`Grids`.
        """
        if not isinstance(grids, Grids):
            raise TypeError(f"grids must be a ctformer.operators.Grids, got {type(grids).__name__}")
        cache = self.__dict__.setdefault("_discretized", {})
        if grids not in cache:
            cache[grids] = self._discretize(grids)
        return cache[grids]

    @abc.abstractmethod
    def _discretize(self, grids: Grids) -> Callable: ...

    def __call__(self, u, grids: Grids, **kwargs):
        """Apply the operator on ``grids``: ``self.discretize(grids)(u, **kwargs)``."""
        return self.discretize(grids)(u, **kwargs)

r"""Feature functions: biases and affine parameters as functions of one continuous variable.

A bias :math:`b(y)`, a LayerNorm gain :math:`g(y)` or shift :math:`c(y)` is a function on an
interval (features :math:`Y`, head features :math:`Y_h` or the FFN variable :math:`R`). It can
be given as

* ``None``: absent (zero for a bias),
* a number: the constant function,
* a callable ``b(s)``: evaluated, vectorized, at the *reference coordinates*
  :math:`s = (y - a)/(b - a) \in [0, 1]` of the quadrature nodes (see
  :class:`FeatureFunction`),
* a 1-D array of ``d`` values: the piecewise-constant function equal to ``values[i]`` on the
  cell :math:`[a + i L / d, a + (i + 1) L / d)` of the uniform partition of :math:`[a, b]`,
  :math:`L = b - a`. This is the embedding of a torch bias or LayerNorm weight of length ``d``:
  on ``Midpoint(d)`` its node values are exactly ``values``.

:func:`as_feature_function` turns any of these into a :class:`FeatureFunction`, whose
:meth:`FeatureFunction.evaluate` gives the host array of values at the quadrature nodes of a
discretization.
"""
from __future__ import annotations

import math
from numbers import Integral, Real

import array_api_compat
import numpy as np

from ..discretizations.base import real_host_array
from ..kernels import (Convolution, Kernel, Smooth, _to_host, callable_parameters, cell_index, is_host,
                       read_only)

__all__ = ["FeatureFunction", "as_feature_function", "cell_index", "named_parameters",
           "assign_parameter"]


class FeatureFunction:
    r"""A function of one continuous variable, evaluated at quadrature nodes.

    Every function of a model acts on the reference variable. Kernels are defined on the
    reference square :math:`[0, 1]^2` (:mod:`ctformer.kernels`), arrays of cell values on the
    uniform cells of the domain, and a callable ``b`` is evaluated at

    .. math::  s_j = \frac{y_j - a}{b - a} \in [0, 1],

    not at the nodes :math:`y_j` of the domain :math:`[a, b]` themselves. A model therefore
    gives the same result whatever the domain of its discretizations: features on
    ``GaussLegendre(5, (0, 5))`` and on ``GaussLegendre(5, (0, 1))`` are the same model (same
    node values, same numbers). On the default domain :math:`[0, 1]`, :math:`s_j = y_j`.

    Parameters
    ----------
    spec : None, float, callable or 1-D array_like
        See the module docstring. Arrays and numbers must be finite.
    name : str
        Name of the parameter (used in error messages), e.g. ``"b_O"``.

    Raises
    ------
    TypeError
        If ``spec`` is none of the accepted kinds, or holds complex numbers.
    ValueError
        If an array is not 1-D, empty, or contains NaN or inf; if a number is not finite.
    """

    def __init__(self, spec, name: str = "feature function"):
        self.name = name
        self.kind: str
        if spec is None:
            self.kind = "none"
            self.spec = None
        elif isinstance(spec, Real) and not isinstance(spec, bool):
            value = float(spec)
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {spec!r}")
            self.kind = "constant"
            self.spec = value
        elif callable(spec) and not hasattr(spec, "__array__"):
            self.kind = "callable"
            self.spec = spec
        else:
            try:
                values = np.array(real_host_array(_to_host(spec), name))
            except TypeError as exc:
                if "complex" in str(exc):
                    raise
                raise TypeError(
                    f"{name} must be None, a number, a callable b(y) or a 1-D array of values, "
                    f"got {type(spec).__name__}"
                ) from None
            if values.ndim == 0:  # a 0-d array or scalar tensor is a number
                if not math.isfinite(float(values)):
                    raise ValueError(f"{name} must be finite, got {float(values)!r}")
                self.kind = "constant"
                self.spec = float(values)
                return
            if values.ndim != 1 or values.size == 0:
                raise ValueError(f"{name} must be a non-empty 1-D array of values, got shape {values.shape}")
            if not np.all(np.isfinite(values)):
                raise ValueError(f"{name} contains NaN or inf")
            values.setflags(write=False)
            self.kind = "piecewise-constant"
            self.spec = values

    def _evaluate_in_namespace(self, disc):
        """Values at the nodes when the spec is an array of another namespace (torch)."""
        xp = array_api_compat.array_namespace(self.spec)
        device = array_api_compat.device(self.spec)
        nodes = disc.quadrature_nodes
        if self.kind == "constant":
            return self.spec * xp.ones(nodes.shape, dtype=self.spec.dtype, device=device)
        index = cell_index(nodes, disc.domain, self.spec.shape[0])
        return xp.take(self.spec, xp.asarray(index, device=device), axis=0)

    def parameters(self) -> dict:
        """The numbers of the function: ``{"": array}`` for a number or an array of cell
        values, a callable's own ``parameters()`` when it has one, else nothing. Host arrays
        are read-only views (:func:`ctformer.kernels.read_only`)."""
        if self.kind == "none":
            return {}
        if self.kind == "callable":
            return callable_parameters(self.spec)
        return {"": read_only(np.asarray(self.spec, dtype=np.float64)) if is_host(self.spec)
                else self.spec}

    @property
    def is_none(self) -> bool:
        """True when the function is absent (``None``)."""
        return self.kind == "none"

    @property
    def is_constant(self) -> bool:
        """True for a number (a constant function)."""
        return self.kind == "constant"

    def evaluate(self, disc) -> np.ndarray | None:
        """Values at ``disc.quadrature_nodes`` (host float64 array), or ``None`` when absent.

        A callable is evaluated at the reference coordinates
        :math:`(y_j - a)/(b - a)` of the nodes (see the class docstring).

        Parameters
        ----------
        disc : Discretization
            The discretization of the variable the function lives on.

        Returns
        -------
        ndarray of shape (nq,) or None

        Raises
        ------
        ValueError
            If a callable returns values of the wrong shape or non-finite values.
        """
        nodes = disc.quadrature_nodes
        if self.kind == "none":
            return None
        if not is_host(self.spec):   # a tensor handed in by with_parameters: stay in its namespace
            return self._evaluate_in_namespace(disc)
        if self.kind == "constant":
            return np.full(nodes.shape, self.spec)
        if self.kind == "piecewise-constant":
            return self.spec[cell_index(nodes, disc.domain, self.spec.size)]
        a, b = disc.domain
        reference = (np.asarray(nodes, dtype=np.float64) - a) / (b - a)
        if not all(is_host(v) for v in callable_parameters(self.spec).values()):
            return self.spec(reference)          # a parametrized function of tensors
        values = real_host_array(_to_host(self.spec(reference)), f"{self.name}: the callable")
        values = np.broadcast_to(values, nodes.shape).copy() if values.ndim == 0 else values
        if values.shape != nodes.shape:
            raise ValueError(
                f"{self.name}: the callable returned shape {values.shape} for {nodes.size} nodes; "
                "it must be vectorized (one value per point)"
            )
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{self.name}: the callable returned NaN or inf")
        return values

    def __repr__(self) -> str:
        if self.kind == "piecewise-constant":
            return f"FeatureFunction(piecewise-constant, {self.spec.size} cells)"
        return f"FeatureFunction({self.spec!r})"


def as_feature_function(spec, name: str = "feature function") -> FeatureFunction:
    """Return ``spec`` as a :class:`FeatureFunction` (unchanged if it already is one).

    Parameters
    ----------
    spec : None, float, callable, 1-D array_like or FeatureFunction
        The function; see the module docstring.
    name : str
        Parameter name for error messages.

    Returns
    -------
    FeatureFunction
    """
    if isinstance(spec, FeatureFunction):
        return spec
    return FeatureFunction(spec, name)


def named_parameters(**components) -> dict:
    """Flatten the ``parameters()`` of named components into one ``name -> array`` mapping.

    A component may be ``None`` (skipped), an object with ``parameters()``, or a list of
    them (named by index). Names are joined with dots; an empty inner name stands for the
    component itself. Host arrays are read-only views (:func:`ctformer.kernels.read_only`).
    """
    out = {}
    for prefix, component in components.items():
        if component is None:
            continue
        if isinstance(component, (list, tuple)):
            out.update(named_parameters(**{f"{prefix}.{i}": c for i, c in enumerate(component)}))
            continue
        for name, value in component.parameters().items():
            out[f"{prefix}.{name}" if name else prefix] = read_only(value)
    return out


def assign_parameter(root, name: str, value) -> None:
    """Put ``value`` where :func:`named_parameters` found the parameter ``name`` of ``root``.

    The dotted path walks attributes and list indices; a feature function takes the value as
    its numbers (``"b_O"``), or passes the rest of the path to its parametrized callable
    (``"b_O.phase"``); so do a :class:`~ctformer.kernels.Smooth` kernel (to its function,
    ``"W.width"``) and a :class:`~ctformer.kernels.Convolution` (to its profile). A kernel is
    frozen: its own numbers (``"W_1.weight"``) are replaced through its private ``_replace``,
    which is only right on the fresh copy that ``with_parameters`` has just made.

    Raises
    ------
    KeyError
        If the path does not lead to a parameter.
    """
    parts = name.split(".")
    holder, obj = None, root
    for depth, part in enumerate(parts):
        if isinstance(obj, FeatureFunction):
            if obj.kind != "callable":
                raise KeyError(f"parameter {name!r}: {'.'.join(parts[:depth])} has no part {part!r}")
            obj = obj.spec
        elif isinstance(obj, (Smooth, Convolution)) and not hasattr(obj, part):
            # these kernels list their function's own parameters() as theirs
            obj = obj.function if isinstance(obj, Smooth) else obj.profile
        holder = obj
        try:
            obj = obj[int(part)] if isinstance(obj, (list, tuple)) else getattr(obj, part)
        except (AttributeError, IndexError, ValueError):
            raise KeyError(f"parameter {name!r} does not exist (no {part!r} in "
                           f"{type(holder).__name__})") from None
    value = _stored_form(obj.spec if isinstance(obj, FeatureFunction) else obj, value)
    if isinstance(obj, FeatureFunction):
        obj.spec = value
    elif isinstance(holder, list):
        holder[int(parts[-1])] = value
    elif isinstance(holder, Kernel):
        holder._replace(parts[-1], value)   # kernels are frozen: this is the fresh copy's
    else:
        setattr(holder, parts[-1], value)


def _stored_form(current, value):
    """``value`` in the form the model stored ``current`` in: a host number that replaces a
    Python number is a Python number again (an ``int`` when it was one and stays integral),
    so that ``with_parameters(parameters())`` is the same model, with the same identity."""
    if isinstance(current, Real) and not isinstance(current, bool) and is_host(value) \
            and np.ndim(value) == 0:
        number = float(value)
        return int(number) if isinstance(current, Integral) and number.is_integer() else number
    return value

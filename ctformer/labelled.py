r"""Labelled results: every result as an :class:`xarray.Dataset`, a netCDF file or a zarr store.

A result of ctformer is a few arrays and the settings that made them. :func:`to_xarray` names
the axes, attaches the grids' nodes as coordinates and their quadrature weights as data
variables, and keeps the settings as attributes, so that a saved file says what it holds
without ctformer:

* a model solution (depth solve): ``state(depth, batch, token, feature)``, with
  ``token_x, token_y`` in place of ``token`` on a product token domain; the stored values
  (point values, or Galerkin coefficients at the element nodes: attribute ``tokens_nodal``),
  ``token_weight`` and ``feature_weight`` such that
  :math:`\int\!\!\int u \approx \sum_{ij} w^x_i w^y_j u_{ij}`;
* particles: ``positions(time, batch, particle, dimension)``;
* the mean field on the circle: ``density(time, angle)``, the Fourier coefficients
  ``coefficients(time, wavenumber, part)`` with ``part = ("re", "im")``, the tracers;
* a convergence study: ``n, h, error, order, seconds`` along ``level``.

Attributes are netCDF-legal: strings, numbers and 1-D numeric arrays. ``None`` is left out
(an absent ``rtol`` means a fixed-step solve), a boolean becomes the integer 0 or 1, and a
nested value (a study's parameters) becomes JSON text in an attribute whose name ends in
``_json``. Every dataset carries ``ctformer_result`` (the result's class) and
``ctformer_version``; ``ctformer_array_attributes_json`` names the 1-D array attributes.

:func:`to_netcdf` (h5netcdf) and :func:`to_zarr` write atomically; :func:`from_xarray` and
:func:`open_dataset` give back the arrays a restart needs, bit for bit
(:mod:`ctformer.labelled_files`).

Converters are registered by class (:func:`register`); :func:`to_xarray` uses the first
class of the result's method resolution order that has one.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import labelled_methods
from . import labelled_attrs
from .labelled_attrs import as_json, common_attrs, legal_attrs, set_attr
from .backend import to_host
from .solvers.restart_identity import fixed_step
from .labelled_files import (ARRAY_ATTRS, INSTALL_HINT, PART, SavedResult, _xarray, from_xarray,
                             join_parts, open_dataset, split_parts, to_netcdf, to_zarr)

__all__ = ["to_xarray", "to_netcdf", "to_zarr", "from_xarray", "open_dataset", "register",
           "converters", "SavedResult", "solution_to_xarray", "trajectory_to_xarray",
           "mean_field_to_xarray", "convergence_to_xarray", "work_precision_to_xarray",
           "split_parts", "join_parts", "PART",
           "INSTALL_HINT"]

_CONVERTERS: dict = {}
_BUILTINS_LOADED = [False]


# -- the registry --------------------------------------------------------------------------------
def register(cls, converter=None):
    """Register ``converter(result, **options) -> xarray.Dataset`` for results of class ``cls``.

    Use as ``register(Solution, solution_to_xarray)`` or as a decorator ``@register(Solution)``.
    A later registration for the same class replaces the earlier one.

    Raises
    ------
    TypeError
        If ``cls`` is not a class or ``converter`` is not callable.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register: cls must be a class, got {type(cls).__name__} {cls!r}")

    def add(fn):
        if not callable(fn):
            raise TypeError(f"register: the converter for {cls.__name__} must be callable, got "
                            f"{type(fn).__name__}")
        _CONVERTERS[cls] = fn
        return fn

    return add if converter is None else add(converter)


def _load_builtins() -> None:
    """Register the converters of ctformer's own results (imported on first use: no cycles)."""
    if _BUILTINS_LOADED[0]:
        return
    from .particles.meanfield import MeanFieldSolution
    from .particles.spherical import SphericalSolution
    from .particles.timegrid import Trajectory
    from .particles.zonal import ZonalSolution
    from .studies.results import ConvergenceResult
    from .studies.tolerance import WorkPrecision

    # the sphere's solutions are MeanFieldSolutions with their own layout: registered first,
    # or the circle's converter (its 2 pi / N weights, rfft coefficients) took them
    for cls, fn in ((Trajectory, trajectory_to_xarray), (ZonalSolution, _sphere_to_xarray),
                    (SphericalSolution, _sphere_to_xarray),
                    (MeanFieldSolution, mean_field_to_xarray),
                    (ConvergenceResult, convergence_to_xarray),
                    (WorkPrecision, work_precision_to_xarray)):
        _CONVERTERS.setdefault(cls, fn)
    try:  # the adaptive depth solve's result, once it exists
        from .solvers.solution import Solution
    except ImportError:
        Solution = None
    if Solution is not None:
        _CONVERTERS.setdefault(Solution, solution_to_xarray)
    _BUILTINS_LOADED[0] = True


def converters() -> dict:
    """A copy of the registry: ``{class: converter}``."""
    _load_builtins()
    return dict(_CONVERTERS)


def to_xarray(result, **options):
    """The result as a labelled :class:`xarray.Dataset` (layout: module notes and docs page).

    Parameters
    ----------
    result : Solution, Trajectory, MeanFieldSolution or ConvergenceResult
        Or any object whose class (or a base class) was :func:`register`-ed.
    **options
        Passed to the converter, except ``attrs``: a dict of extra attributes, made
        netCDF-legal as the others and added to the converter's.

    Raises
    ------
    TypeError
        If no converter is registered for the result's class (the message lists those that are).
    ValueError
        If ``attrs`` names an attribute that the result writes itself (``rtol``, ``scheme``...).
    ImportError
        If xarray is not installed (one line with the install command).
    """
    _load_builtins()
    extra = legal_attrs(options.pop("attrs", None))
    for cls in type(result).__mro__:
        if cls in _CONVERTERS:
            ds = _CONVERTERS[cls](result, **options)
            labelled_methods.add_extra(ds.attrs, extra)
            arrays = sorted(k for k, v in ds.attrs.items() if isinstance(v, np.ndarray))
            if arrays:  # netCDF reads a 1-D attribute of one value back as a number
                ds.attrs[ARRAY_ATTRS] = as_json(arrays)
            return ds
    known = ", ".join(sorted(c.__name__ for c in _CONVERTERS))
    raise TypeError(f"to_xarray: no converter for {type(result).__name__}; results with one: "
                    f"{known} (add one with ctformer.labelled.register)")


def _grid_attrs(attrs: dict, grids) -> None:
    """Each discretization by its repr, label and size; the context length."""
    for name in ("tokens", "features", "head_features", "hidden"):
        disc = getattr(grids, name)
        attrs[name], attrs[f"{name}_label"], attrs[f"{name}_n"] = repr(disc), disc.label, disc.n
        attrs[f"{name}_nodal"] = int(disc.nodal)
    attrs["tokens_atoms"] = int(grids.tokens.atoms)
    set_attr(attrs, "context_length", grids.context_length)


def _own_attrs_kept(converter):
    """A converter called directly with ``attrs=`` refuses, as :func:`to_xarray` does, a name
    that the result writes itself (before, ``solution_to_xarray(s, attrs={"rtol": 1e-3})``
    wrote 0.001 over the solve's rtol)."""
    @functools.wraps(converter)
    def convert(result, *, attrs=None, **options):
        ds = converter(result, **options)
        labelled_methods.add_extra(ds.attrs, legal_attrs(attrs))
        return ds
    return convert


convergence_to_xarray = _own_attrs_kept(labelled_attrs.convergence_to_xarray)
work_precision_to_xarray = _own_attrs_kept(labelled_attrs.work_precision_to_xarray)


# -- arrays ----------------------------------------------------------------------------------------
def _host(values) -> np.ndarray:
    """A host NumPy copy of a NumPy, CuPy or torch array."""
    return np.array(to_host(values), copy=True)


def _saved_states(solution) -> np.ndarray:
    """The saved states on the host; none saved (a terminal event before every requested time):
    an empty depth axis in front of the final state's shape."""
    if solution.states is not None or solution.final is None:
        return _host(solution.states)
    final = _host(solution.final)
    return np.empty((0,) + final.shape, dtype=final.dtype)


def _event_variable(data: dict, solution, expected: tuple, shape: tuple, dims: tuple) -> None:
    """``event_state(dims)``: the state at ``event_time`` laid out as one saved state (``shape``:
    a product token grid's two axes), when an event fired."""
    _occurrences(data, solution, expected, shape, dims)
    event = getattr(solution, "event_state", None)
    if event is None:
        return
    values = _host(event)
    if values.shape != expected:
        raise ValueError(f"solution.event_state has shape {values.shape}, expected that of one "
                         f"saved state {expected}")
    values, dims = split_parts(values.reshape(shape), dims)
    data["event_state"] = (dims, values)


def _occurrences(data: dict, solution, expected: tuple, shape: tuple, dims: tuple) -> None:
    """Every event's occurrences along ``occurrence`` (event 0's in order, then event 1's ...):
    ``occurrence_event`` (its index), ``occurrence_time`` and ``occurrence_state``."""
    t_events, y_events = getattr(solution, "t_events", None), getattr(solution, "y_events", None)
    if t_events is None or y_events is None:
        return
    index = np.concatenate([np.full(len(t), i, dtype=np.int64) for i, t in enumerate(t_events)]
                           + [np.zeros(0, dtype=np.int64)])
    times = np.concatenate([np.asarray(t, dtype=np.float64) for t in t_events] + [np.zeros(0)])
    states = [_host(y) for y in y_events]
    if any(y.shape[1:] != expected for y in states):
        raise ValueError(f"solution.y_events hold states of shapes {[y.shape[1:] for y in states]}, "
                         f"expected that of one saved state {expected}")
    values = np.concatenate(states) if states else np.empty((0,) + expected)
    values, tail = split_parts(values.reshape((len(times),) + shape), ("occurrence",) + dims)
    data.update(occurrence_event=(("occurrence",), index), occurrence_time=(("occurrence",), times),
                occurrence_state=(tail, values))


def _batch_dims(count: int) -> tuple:
    return ("batch",) if count == 1 else tuple(f"batch_{i}" for i in range(count))


def _part_coord() -> np.ndarray:
    return np.array(PART, dtype=object)


def _token_space(grids, n_tokens: int):
    """Token dims, their shape, coordinates and weight variable (see the module notes)."""
    if grids is None:
        return ("token",), (n_tokens,), {}, {}
    tokens = grids.tokens
    if tokens.n != n_tokens:
        raise ValueError(f"the states have {n_tokens} values on the token axis but the grids' "
                         f"tokens {tokens!r} have n = {tokens.n}; pass the grids of this solve")
    nodes, weights = np.asarray(tokens.nodes), np.asarray(tokens.weights)
    if tokens.dimension == 2 and not tokens.atoms and hasattr(tokens, "first"):
        n1, n2 = tokens.shape
        dims = ("token_x", "token_y")
        coords = {"token_x": np.asarray(tokens.first.nodes), "token_y": np.asarray(tokens.second.nodes)}
        return dims, (n1, n2), coords, {"token_weight": (dims, weights.reshape(n1, n2))}
    if tokens.dimension == 2:  # atoms first, then the raster: one token axis, (x, y) per token
        coords = {"token_x": ("token", nodes[:, 0]), "token_y": ("token", nodes[:, 1])}
    else:
        coords = {"token": nodes}
    return ("token",), (n_tokens,), coords, {"token_weight": (("token",), weights)}


def _feature_space(grids, n_features: int):
    if grids is None:
        return {}, {}
    features = grids.features
    if features.n != n_features:
        raise ValueError(f"the states have {n_features} values on the feature axis but the "
                         f"grids' features {features!r} have n = {features.n}")
    return ({"feature": np.asarray(features.nodes)},
            {"feature_weight": (("feature",), np.asarray(features.weights))})


# -- converters --------------------------------------------------------------------------------------
@_own_attrs_kept
def solution_to_xarray(solution, *, attrs=None):
    r"""A depth solve: ``state(depth, batch..., token | token_x, token_y, feature)``.

    Reads ``times`` (saved depths), ``states`` (shape ``(T, ..., N, d)``), ``grids`` (or
    None: then no coordinates or weights), ``scheme``, ``rtol``, ``atol``, ``event_time`` and
    ``stats`` (``step_times`` becomes the variable ``step_times(step)``, the other entries
    attributes ``stats_<name>``). One leading batch axis is ``batch``, several are
    ``batch_0, batch_1, ...``.
    """
    xr = _xarray()
    states, times = _saved_states(solution), np.asarray(solution.times, dtype=np.float64)
    if getattr(solution, "axes", None) is not None:
        return _named_solution(xr, solution, states, times, attrs)
    if states.ndim < 3 or states.shape[0] != times.shape[0]:
        raise ValueError(f"solution.states must have shape (T, ..., N, d) with T = {times.shape[0]} "
                         f"saved depths, got {states.shape}")
    grids = getattr(solution, "grids", None)
    token_dims, token_shape, coords, data = _token_space(grids, states.shape[-2])
    feature_coords, feature_data = _feature_space(grids, states.shape[-1])
    coords.update(feature_coords)
    data.update(feature_data)
    batch = _batch_dims(states.ndim - 3)
    shape = states.shape[1:-2] + token_shape + states.shape[-1:]
    values, dims = split_parts(states.reshape((len(times),) + shape),
                               ("depth",) + batch + token_dims + ("feature",))
    data["state"] = (dims, values)
    _event_variable(data, solution, states.shape[1:], shape, batch + token_dims + ("feature",))
    step_times = (getattr(solution, "stats", None) or {}).get("step_times")
    if step_times is not None:
        data["step_times"] = (("step",), np.asarray(step_times, dtype=np.float64))
    coords["depth"] = times
    if "part" in dims:
        coords["part"] = _part_coord()
    out = _identity_attrs(solution, attrs)
    if grids is not None:
        _grid_attrs(out, grids)
    return xr.Dataset(data, coords=coords, attrs=out)


def _named_solution(xr, solution, states, times, attrs):
    """A solve without grids (particles, mean fields): ``state(time, batch..., *solution.axes)``."""
    axes, time = tuple(solution.axes), getattr(solution, "time_axis", "time")
    if states.ndim < 1 + len(axes) or states.shape[0] != times.shape[0]:
        raise ValueError(f"solution.states must have shape (T, ...) + {len(axes)} axes {axes} with "
                         f"T = {times.shape[0]} saved times, got {states.shape}")
    tail = _batch_dims(states.ndim - 1 - len(axes)) + axes
    values, dims = split_parts(states, (time,) + tail)
    data = {"state": (dims, values)}
    _event_variable(data, solution, states.shape[1:], states.shape[1:], tail)
    step_times = (getattr(solution, "stats", None) or {}).get("step_times")
    if step_times is not None:
        data["step_times"] = (("step",), np.asarray(step_times, dtype=np.float64))
    coords = {time: times}
    if "part" in dims:
        coords["part"] = _part_coord()
    return xr.Dataset(data, coords=coords, attrs=_identity_attrs(solution, attrs))


def _identity_attrs(solution, attrs) -> dict:
    """The common attributes and what a restart checks (restart_identity), for every solve."""
    out = common_attrs(solution, "Solution", attrs)
    # t0: where the solve began (with stats_accepted and step_times, a fixed solve's step)
    for name in ("norm", "model_fingerprint", "padding_mask", "t0"):
        set_attr(out, name, getattr(solution, name, None))
    if getattr(solution, "rtol", None) is None:  # fixed steps: the step (a restart compares it)
        stats = getattr(solution, "stats", None) or {}
        h = fixed_step(stats.get("accepted"), stats.get("step_times"), getattr(solution, "t0", None),
                       bool(getattr(solution, "event_terminal", False)))
        if h is not None and h > 0:
            set_attr(out, *(("steps_per_layer", round(1.0 / h)) if getattr(solution, "grids", None)
                            is not None else ("dt", h)))
    # the file holds NumPy values; a torch solve's rounding differs from NumPy's (as_solved)
    values = solution.final if solution.states is None else solution.states
    if values is not None:
        out["array_namespace"] = type(values).__module__.partition(".")[0]
        out["device"] = str(getattr(values, "device", "cpu"))
    return out


@_own_attrs_kept
def trajectory_to_xarray(trajectory, *, attrs=None):
    """Particles: ``positions(time, batch..., particle, dimension)`` (integer coordinates)."""
    xr = _xarray()
    positions, times = _host(trajectory.positions), np.asarray(trajectory.times, dtype=np.float64)
    if positions.ndim < 3 or positions.shape[0] != times.shape[0]:
        raise ValueError(f"trajectory.positions must have shape (T, ..., n, d) with T = "
                         f"{times.shape[0]} saved times, got {positions.shape}")
    dims = ("time",) + _batch_dims(positions.ndim - 3) + ("particle", "dimension")
    coords = {"time": times, "particle": np.arange(positions.shape[-2]),
              "dimension": np.arange(positions.shape[-1])}
    return xr.Dataset({"positions": (dims, positions)}, coords=coords,
                      attrs=common_attrs(trajectory, "Trajectory", attrs))


@_own_attrs_kept
def mean_field_to_xarray(solution, *, attrs=None):
    r"""The mean field: ``density(time, angle)``, ``coefficients(time, wavenumber, part)``.

    ``angle_weight`` is the trapezoid weight :math:`2\pi/N` (so the mass is
    ``(density * angle_weight).sum("angle")``); the coefficients are ``numpy.fft.rfft`` of the
    density values, :math:`c_k = N \hat\rho_k`; ``tracers(time, tracer)`` when there are tracers.
    """
    xr = _xarray()
    times, grid = np.asarray(solution.times, dtype=np.float64), np.asarray(solution.grid)
    coefficients, dims = split_parts(_host(solution.coefficients), ("time", "wavenumber"))
    n = grid.shape[0]
    data = {"density": (("time", "angle"), _host(solution.density)),
            "coefficients": (dims, coefficients),
            "angle_weight": (("angle",), np.full(n, 2 * math.pi / n))}
    coords = {"time": times, "angle": grid, "wavenumber": np.arange(coefficients.shape[1]),
              "part": _part_coord()}
    if solution.tracers is not None:
        tracers = _host(solution.tracers)
        data["tracers"] = (("time", "tracer"), tracers)
        coords["tracer"] = np.arange(tracers.shape[1])
    out = common_attrs(solution, "MeanFieldSolution", attrs)
    out.update(n_modes=n, max_wavenumber=coefficients.shape[1] - 1,
               coefficient_normalization="numpy.fft.rfft of the density at the angles")
    return xr.Dataset(data, coords=coords, attrs=out)


def _sphere_to_xarray(solution, *, attrs=None):
    """Zonal and :math:`S^2` mean fields: their own layout (:mod:`ctformer.particles.sphere_labelled`)."""
    return type(solution)._dataset(solution, attrs)


labelled_methods.install(to_xarray=to_xarray, to_netcdf=to_netcdf, to_zarr=to_zarr,
                         from_xarray=from_xarray, legal_attrs=legal_attrs)

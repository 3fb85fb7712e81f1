r"""The attributes of a labelled result in netCDF-legal form, and the studies' datasets.

netCDF keeps strings, numbers and 1-D numeric arrays as attributes. A value is stored as it
is where it is one of those; a boolean as the integer 0 or 1; ``None`` is left out; anything
nested (a study's parameters) as JSON text under a name that ends in ``_json``, with
non-finite floats as strings so that the text stays strict JSON.

A study (:func:`convergence_to_xarray`, :func:`work_precision_to_xarray`) is a short table
whose settings are most of what it says: its converters live here, beside the rules.
"""
from __future__ import annotations

import hashlib
import json
import math
import sys

import numpy as np

__all__ = ["common_attrs", "legal_attrs", "set_attr", "as_json", "convergence_to_xarray",
           "work_precision_to_xarray"]


def _jsonable(value):
    """Plain JSON data: non-finite floats as strings, arrays as lists, other objects by repr."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else str(float(value))
    return repr(value)


def as_json(value) -> str:
    """Strict JSON text of ``value`` (sorted keys; see :func:`_jsonable`)."""
    return json.dumps(_jsonable(value), sort_keys=True, allow_nan=False)


def legal_attrs(extra) -> dict:
    """The caller's ``extra`` attributes by the rules of :func:`set_attr`."""
    out = {}
    for key, value in (extra or {}).items():
        if str(key).endswith("_json") and isinstance(value, str) and not _parses(value):
            # open_dataset parses every text attribute named *_json: the file would not read back
            raise ValueError(f"attrs: {str(key)!r} ends in '_json', which marks JSON text that "
                             f"open_dataset parses, but its value {value!r} is not JSON; give "
                             f"another name (e.g. {str(key)[:-5]!r}), or a dict to be written as JSON")
        set_attr(out, str(key), value)
    return out


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def set_attr(attrs: dict, name: str, value) -> None:
    """Store ``value`` under ``name`` in netCDF-legal form (module notes); None is left out."""
    if value is None:
        return
    if isinstance(value, (bool, np.bool_)):
        attrs[name] = int(value)
    elif isinstance(value, int) and not -2 ** 63 <= value < 2 ** 63:  # no netCDF type holds it: JSON, exact
        attrs[f"{name}_json"] = as_json(value)
    elif isinstance(value, (str, int, float, np.integer, np.floating)):
        attrs[name] = value.item() if isinstance(value, np.generic) else value
    elif isinstance(value, (list, tuple, np.ndarray)) and np.asarray(value).dtype.kind in "iuf" \
            and np.asarray(value).ndim == 1:
        attrs[name] = np.asarray(value)
    else:
        attrs[f"{name}_json"] = as_json(value)


def common_attrs(result, kind: str, extra) -> dict:
    """Class, version, scheme, tolerances, event, step statistics, and the caller's ``attrs``."""
    # the package is imported whenever this module is (no import upwards: it is the top)
    attrs = {"ctformer_result": kind, "ctformer_version": sys.modules["ctformer"].__version__}
    scheme = getattr(result, "scheme", None)
    if scheme is not None:
        attrs["scheme"] = scheme if isinstance(scheme, str) else getattr(scheme, "name", repr(scheme))
    for name in ("rtol", "atol", "event_time", "dt", "beta", "normalized", "events_before",
                 "control"):  # control: a dict, written as control_json
        set_attr(attrs, name, getattr(result, name, None))
    if getattr(result, "event_time", None) is not None:  # its state: the variable event_state
        for name in ("event_index", "event_terminal"):
            set_attr(attrs, name, getattr(result, name, None))
    stats = getattr(result, "stats", None) or {}
    for key, value in stats.items():
        if key != "step_times":
            set_attr(attrs, f"stats_{key}", value)
    attrs.update(legal_attrs(extra))
    return attrs


# -- the studies -------------------------------------------------------------------------------------
def work_precision_to_xarray(result, *, attrs=None):
    """A work-precision study: ``error, rhs_evaluations, accepted, rejected, seconds`` on
    ``(scheme, rtol)`` (NaN where a scheme lacks a tolerance); attributes ``reference`` and
    ``floor`` (errors at or below it are the states' rounding: ``1e-13`` in float64,
    ``10 * 2**-23`` in float32; :meth:`~ctformer.studies.WorkPrecision.slope` leaves them out)."""
    from .labelled_files import _xarray

    xr = _xarray()
    schemes = result.schemes
    rtols = sorted({lv.rtol for lv in result.levels}, reverse=True)
    names = ("error", "rhs_evaluations", "accepted", "rejected", "seconds", "atol")
    table = {name: np.full((len(schemes), len(rtols)), np.nan) for name in names}
    for lv in result.levels:
        i, j = schemes.index(lv.scheme), rtols.index(lv.rtol)
        for name in names:
            table[name][i, j] = getattr(lv, name)
    data = {name: (("scheme", "rtol"), values) for name, values in table.items()}
    out = common_attrs(result, "WorkPrecision", attrs)
    out["reference"] = result.reference
    set_attr(out, "floor", getattr(result, "floor", None))
    # variable-length strings (object): zarr 3 has no specification for fixed-width ones
    return xr.Dataset(data, coords={"scheme": np.array(schemes, dtype=object),
                                    "rtol": np.array(rtols)}, attrs=out)


#: A row's size and step under either name: ``n, h``, or ``steps, dt`` (a time study's names
#: in its printed table, CSV and JSON).
_ROW_NAMES = {"n": ("n", "steps"), "h": ("h", "dt")}


def _row_value(row, name: str):
    for key in _ROW_NAMES.get(name, (name,)):
        if isinstance(row, dict) and key in row:
            return row[key]
        if not isinstance(row, dict) and hasattr(row, key):
            return getattr(row, key)
    raise ValueError(f"a study's table row has none of {_ROW_NAMES.get(name, (name,))}: {row!r}; "
                     "pass a ConvergenceResult made by ctformer.studies.convergence")


def convergence_to_xarray(result, *, attrs=None):
    """A study: ``n, h`` (coordinates), ``error, order, seconds`` along ``level``.

    The reference level's error and the first order are NaN. Attributes: the study's summary
    (``refine``, ``method``, ``reference``, ``norm``, orders, ``consistent_limit`` as 0/1,
    ``gauss_points`` and ``limitation`` when set, ``floor`` and ``rounding``: the rounding
    floor left out of the observed order and the states' unit roundoff, ``2**-23`` for a
    float32 study), ``size_name`` and ``step_name`` (what the printed table, the CSV and the
    JSON call ``n`` and ``h``: ``steps`` and ``dt`` when refining time; also the coordinates'
    ``long_name``), ``study_parameters_json`` (discretizations, scheme, model identity),
    ``study_identity`` (SHA-256 of that JSON text) and ``model_identity`` when the study ran
    with a store. A row's size and step are read as ``n, h`` or as ``steps, dt``.
    """
    from .labelled_files import _xarray

    xr = _xarray()
    rows = result.table

    def column(name, dtype=np.float64):
        values = (_row_value(r, name) for r in rows)
        return np.array([np.nan if v is None else v for v in values], dtype=dtype)

    refinement = getattr(result, "refinement", None)
    names = {"n": getattr(refinement, "size_name", "n"), "h": getattr(refinement, "step_name", "h")}
    data = {"error": (("level",), column("error")), "order": (("level",), column("order")),
            "seconds": (("level",), column("seconds"))}
    coords = {"level": column("level", np.int64),
              "n": (("level",), column("n", np.int64), {"long_name": names["n"]}),
              "h": (("level",), column("h"), {"long_name": names["h"]})}
    out = common_attrs(result, "ConvergenceResult", None)
    set_attr(out, "scheme", result.parameters.get("scheme"))
    for name in ("refine", "method", "reference", "norm", "observed_order", "expected_order",
                 "consistent_limit", "gauss_points", "limitation", "min_feature_std",
                 "wall_seconds", "floor", "rounding"):
        set_attr(out, name, getattr(result, name, None))
    out.update(size_name=names["n"], step_name=names["h"])
    parameters = as_json(result.parameters)
    out["study_parameters_json"] = parameters
    out["study_identity"] = hashlib.sha256(parameters.encode()).hexdigest()
    set_attr(out, "model_identity", result.parameters.get("model"))
    for key, value in (attrs or {}).items():
        set_attr(out, str(key), value)
    return xr.Dataset(data, coords=coords, attrs=out)

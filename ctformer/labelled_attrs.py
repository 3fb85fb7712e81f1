r"""The attributes of a labelled result in netCDF-legal form.

netCDF keeps strings, numbers and 1-D numeric arrays as attributes. A value is stored as it
is where it is one of those; a boolean as the integer 0 or 1; ``None`` is left out; anything
nested (a study's parameters) as JSON text under a name that ends in ``_json``, with
non-finite floats as strings so that the text stays strict JSON.
"""
from __future__ import annotations

import json
import math
import sys

import numpy as np

__all__ = ["common_attrs", "legal_attrs", "set_attr", "as_json"]


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
        set_attr(out, str(key), value)
    return out


def set_attr(attrs: dict, name: str, value) -> None:
    """Store ``value`` under ``name`` in netCDF-legal form (module notes); None is left out."""
    if value is None:
        return
    if isinstance(value, (bool, np.bool_)):
        attrs[name] = int(value)
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

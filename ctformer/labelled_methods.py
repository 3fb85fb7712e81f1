"""``to_xarray``, ``to_netcdf`` and ``to_zarr`` as methods of every result (a mixin).

The result classes live in low layers (solvers, particles, studies); the conversions in
:mod:`ctformer.labelled` know them all. This mixin has no imports: :mod:`ctformer.labelled`
installs the three functions here when ``ctformer`` is imported, so a method call never imports
upwards.
"""
from __future__ import annotations

__all__ = ["LabelledResult", "install", "convert", "read", "legal_attrs", "add_extra", "PART"]

_FUNCTIONS: dict = {}
#: Labels of the ``part`` axis of complex values (real, imaginary) in every file.
PART = ("re", "im")


def install(**functions) -> None:
    """Called by :mod:`ctformer.labelled`: the functions the methods below delegate to."""
    _FUNCTIONS.update(functions)


def _call(name, result, *args, **options):
    try:
        function = _FUNCTIONS[name]
    except KeyError:  # only when ctformer.labelled failed to import
        raise ImportError(f"{name} needs ctformer.labelled (import ctformer first)") from None
    return function(result, *args, **options)


def convert(result, **options):
    """:func:`ctformer.labelled.to_xarray` (for modules below it)."""
    return _call("to_xarray", result, **options)


def legal_attrs(extra) -> dict:
    """The attributes ``extra`` in netCDF-legal form, by the rules of :mod:`ctformer.labelled`."""
    return _call("legal_attrs", extra)


#: What a restart or :func:`ctformer.labelled.open_dataset` reads from a file's attributes:
#: refused as the caller's extra attributes even where the result writes none (``rtol`` on a
#: fixed-step solve would make its file claim error control).
RESERVED = frozenset({"ctformer_result", "ctformer_version", "scheme", "rtol", "atol", "norm", "control",
                      "dt", "steps_per_layer", "t0", "model_fingerprint", "padding_mask", "tokens", "features",
                      "head_features", "hidden", "context_length", "event_time", "event_index",
                      "event_terminal", "events_before", "array_namespace", "device",
                      "ctformer_array_attributes", "stats_accepted"})


def add_extra(attrs: dict, extra: dict) -> None:
    """The caller's attributes ``extra`` into ``attrs``, unless one names an attribute of the
    result, or one that a restart reads (:data:`RESERVED`): a restart reads ``rtol``,
    ``scheme``, ``norm`` ... from the file, and the result's own must stay there (ValueError
    naming them and another name to use)."""
    def read_as(name):  # open_dataset reads "x_json" back as "x": the two would be one attribute
        return name.removesuffix("_json")

    taken = {read_as(name) for name in attrs}
    clash = sorted(name for name in extra if name in attrs or read_as(name) in RESERVED | taken)
    twins = sorted(name for name in extra if name.endswith("_json") and read_as(name) in extra)
    if twins:
        raise ValueError(f"to_xarray: attrs names both {read_as(twins[0])!r} and {twins[0]!r}, which a file "
                         f"reads back as one attribute {read_as(twins[0])!r}; keep one of them")
    if clash:
        shown = ", ".join(f"{name} (the result's: {attrs[name]!r})" if name in attrs else
                          f"{name} (read by a restart from the file)" if read_as(name) in RESERVED else
                          f"{name} (read back as the result's {read_as(name)!r})" for name in clash)
        raise ValueError(f"to_xarray: attrs names attributes that the result writes itself: "
                         f"{shown}; give your attributes other names (e.g. 'run_{clash[0]}')")
    attrs.update(extra)


def read(dataset):
    """:func:`ctformer.labelled.from_xarray` (for modules below it: a restart reads a Dataset)."""
    return _call("from_xarray", dataset)


class LabelledResult:
    """Results that convert to labelled :class:`xarray.Dataset` objects and files."""

    __slots__ = ()

    def to_xarray(self, **options):
        """This result as an :class:`xarray.Dataset` (:func:`ctformer.labelled.to_xarray`)."""
        return _call("to_xarray", self, **options)

    def to_netcdf(self, path, **options):
        """Write this result to a netCDF file, atomically (:func:`ctformer.labelled.to_netcdf`)."""
        return _call("to_netcdf", self, path, **options)

    def to_zarr(self, path, **options):
        """Write this result to a zarr store, atomically (:func:`ctformer.labelled.to_zarr`)."""
        return _call("to_zarr", self, path, **options)

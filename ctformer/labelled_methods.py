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


def add_extra(attrs: dict, extra: dict) -> None:
    """The caller's attributes ``extra`` into ``attrs``, unless one names an attribute of the
    result: a restart reads ``rtol``, ``scheme``, ``norm`` ... from the file, and the result's
    own must stay there (ValueError naming them and another name to use)."""
    clash = sorted(name for name in extra if name in attrs)
    if clash:
        shown = ", ".join(f"{name} (the result's: {attrs[name]!r})" for name in clash)
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

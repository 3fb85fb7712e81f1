r"""Labelled datasets of the sphere mean fields (:class:`ZonalSolution`, :class:`SphericalSolution`).

The circle's layout (``density(time, angle)``, ``rfft`` coefficients) does not fit these
solutions, so they carry their own (xarray is imported when a conversion is asked for):

* zonal: ``density(time, node)`` at the Gauss-Jacobi nodes (coordinate ``node`` = :math:`s_j`),
  ``node_weight(node)`` (:math:`\int f\,d\sigma = \sum_j q_j f(s_j)`),
  ``coefficients(time, degree)`` (orthonormal Gegenbauer in :math:`L^2(d\sigma)`);
* :math:`S^2`: ``density(time, colatitude, longitude)``, ``weight(colatitude, longitude)``,
  ``coefficients(time, lm, part)`` (:math:`a_{lm}`, :math:`m \ge 0`, healpy order; coordinates
  ``l(lm)``, ``m(lm)``; ``part`` = ``re``, ``im``, as every complex value of the library's files).

``to_netcdf`` / ``to_zarr`` write these datasets through :mod:`ctformer.labelled_files`.
"""
from __future__ import annotations

import sys

import numpy as np

from ..labelled_methods import PART, LabelledResult, add_extra, convert, legal_attrs

__all__ = ["zonal_dataset", "spherical_dataset", "SphereLabelled", "recorded_field"]


def _xarray():
    try:
        import xarray
    except ImportError as exc:  # pragma: no cover - in the io and test extras
        raise ImportError('labelled results need xarray (pip install "ctformer[io]")') from exc
    return xarray


def _attrs(kind: str, extra, **own) -> dict:
    """Class, version and the result's ``own`` attributes, then the caller's ``extra``, both by
    the rules of every result's attributes (a boolean as 0/1, None left out, a nested value as
    ``<name>_json``); ValueError when ``extra`` names one of the result's (as
    :func:`ctformer.labelled.to_xarray`)."""
    version = getattr(sys.modules.get("ctformer"), "__version__", "unknown")
    out = {"ctformer_result": kind, "ctformer_version": version, **legal_attrs(own)}
    extra = legal_attrs(extra) if extra is not None else {}
    add_extra(out, extra)
    return out


def recorded_field(field) -> dict:
    """What a solution records of the mean field that solved it: ``beta``, ``normalized``, ``noise``."""
    return {"beta": float(field.beta), "normalized": bool(field.normalized), "noise": float(field.noise)}


def _field(solution) -> dict:
    """``beta``, ``noise`` and ``normalized`` of the field that solved it, those it records."""
    return {name: getattr(solution, name, None) for name in ("beta", "noise", "normalized")}


def zonal_dataset(solution, attrs=None):
    """The :class:`ZonalSolution` as an :class:`xarray.Dataset` (layout: module notes)."""
    xr = _xarray()
    c = np.asarray(solution.coefficients, dtype=np.float64)
    data = {"density": (("time", "node"), np.asarray(solution.density, dtype=np.float64)),
            "node_weight": (("node",), np.asarray(solution.weights)),
            "coefficients": (("time", "degree"), c)}
    coords = {"time": np.asarray(solution.times, dtype=np.float64), "node": np.asarray(solution.grid),
              "degree": np.arange(c.shape[1])}
    out = _attrs("ZonalSolution", attrs, **_field(solution), dimension=int(solution.dimension), max_degree=c.shape[1] - 1,
                 coefficient_normalization="orthonormal Gegenbauer polynomials of s in L2(surface measure)")
    return xr.Dataset(data, coords=coords, attrs=out)


def spherical_dataset(solution, attrs=None):
    """The :class:`SphericalSolution` as an :class:`xarray.Dataset` (layout: module notes)."""
    xr = _xarray()
    a = np.asarray(solution.coefficients, dtype=np.complex128)
    lmax = int(round((np.sqrt(8 * a.shape[1] + 1) - 3) / 2))
    l = np.concatenate([np.arange(m, lmax + 1) for m in range(lmax + 1)])
    m = np.concatenate([np.full(lmax + 1 - k, k) for k in range(lmax + 1)])
    theta, phi = solution.grid
    data = {"density": (("time", "colatitude", "longitude"), np.asarray(solution.density, dtype=np.float64)),
            "weight": (("colatitude", "longitude"), np.asarray(solution.weights)),
            "coefficients": (("time", "lm", "part"), np.stack([a.real, a.imag], axis=-1))}
    coords = {"time": np.asarray(solution.times, dtype=np.float64), "colatitude": np.asarray(theta),
              "longitude": np.asarray(phi), "l": (("lm",), l), "m": (("lm",), m),
              "part": np.array(PART, dtype=object)}
    out = _attrs("SphericalSolution", attrs, **_field(solution), max_degree=lmax,
                 coefficient_normalization="orthonormal spherical harmonics, healpy order")
    return xr.Dataset(data, coords=coords, attrs=out)


class SphereLabelled:
    """Mixin: ``to_xarray`` through ``_dataset``; the files written from that dataset."""

    __slots__ = ()
    _dataset = None

    def to_xarray(self, *, attrs=None):
        """This solution as an :class:`xarray.Dataset` (:mod:`ctformer.particles.sphere_labelled`):
        :func:`ctformer.labelled.to_xarray`, which refuses ``attrs`` naming the result's own."""
        return convert(self, attrs=attrs)

    def to_netcdf(self, path, *, attrs=None):
        """Write :meth:`to_xarray` to a netCDF file, atomically."""
        return LabelledResult.to_netcdf(self.to_xarray(attrs=attrs), path)

    def to_zarr(self, path, *, attrs=None):
        """Write :meth:`to_xarray` to a zarr store, atomically."""
        return LabelledResult.to_zarr(self.to_xarray(attrs=attrs), path)

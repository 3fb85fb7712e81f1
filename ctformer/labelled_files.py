r"""Files of labelled results: atomic netCDF and zarr writes, exact reading back.

:func:`to_netcdf` (h5netcdf) and :func:`to_zarr` write atomically: to a temporary sibling,
flushed to disk, then renamed over the target (a file by :func:`os.replace`; a store, a
directory, by a rename, with the old store moved aside first and removed after). A reader
sees the old result or the new one, never a part of one. :func:`from_xarray` and
:func:`open_dataset` give back the arrays a restart needs (times, states, final state), bit
for bit: floating-point data is written without a fill value, scale or compression that
could change a bit, and complex values as their exact real and imaginary parts (the ``part``
axis, :func:`join_parts`). The layout is that of :mod:`ctformer.labelled`, which re-exports
everything here.
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import labelled_methods
from .atomic import check_directory
from .labelled_methods import PART

__all__ = ["to_netcdf", "to_zarr", "from_xarray", "open_dataset", "SavedResult", "split_parts",
           "join_parts", "PART", "INSTALL_HINT", "ARRAY_ATTRS"]

INSTALL_HINT = 'pip install "ctformer[io]"'
#: The attribute naming the 1-D array attributes (JSON), which netCDF reads back as a number
#: when they hold one value: :func:`from_xarray` makes them arrays again.
ARRAY_ATTRS = "ctformer_array_attributes_json"


def _xarray():
    try:
        import xarray
    except ImportError:
        raise ImportError(f"labelled results need xarray: {INSTALL_HINT}") from None
    return xarray


def _need(caller: str, *modules: str) -> None:
    """Import ``modules`` (xarray's file backends), or say in one line which is missing and
    the extra that installs it, before anything is written: xarray's own messages name no
    extra (and for h5netcdf, at read time, not even an ImportError of its own)."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"{caller} needs {module}, which is not installed or does not "
                              f"import ({exc}): {INSTALL_HINT}") from None


def split_parts(values: np.ndarray, dims: tuple):
    """Complex values as their exact real and imaginary parts on a trailing ``part`` axis."""
    if np.iscomplexobj(values):
        return np.stack([values.real, values.imag], axis=-1), dims + ("part",)
    return values, dims


def join_parts(values: np.ndarray, dims: tuple) -> np.ndarray:
    """Inverse of :func:`split_parts`, bit for bit (a view of the pairs as complex numbers)."""
    if "part" not in dims:
        return values
    if dims[-1] != "part":
        values = np.moveaxis(values, dims.index("part"), -1)
    pairs = np.ascontiguousarray(values)
    return pairs.view(np.result_type(pairs.dtype, np.complex64))[..., 0]


# -- files ----------------------------------------------------------------------------------------------
def _dataset(result, options):
    xr = _xarray()
    if isinstance(result, xr.Dataset) and not options:
        return result
    return labelled_methods.convert(result, **options)  # ctformer.labelled.to_xarray


def _exact_encoding(ds) -> dict:
    """No fill value on floating-point variables: nothing may change a bit on the way back."""
    return {name: {"_FillValue": None} for name, var in ds.variables.items() if var.dtype.kind in "fc"}


def to_netcdf(result, path, **options) -> Path:
    """Write ``to_xarray(result, **options)`` (or a Dataset) to a netCDF-4 file (h5netcdf).

    Atomic: written to a temporary file beside ``path``, flushed to disk, renamed over it.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    FileNotFoundError
        If the directory of ``path`` does not exist (it is not created).
    IsADirectoryError
        If ``path`` is a directory (nothing is replaced then).
    ImportError
        If xarray, h5netcdf or h5py is missing (nothing is written; the message names the
        package and ``pip install "ctformer[io]"``).
    """
    path = check_directory(path, "to_netcdf")
    if path.is_dir():
        raise IsADirectoryError(f"to_netcdf: {str(path)!r} is a directory (a zarr store?); give a "
                                "file name, or write a store with to_zarr (nothing was written)")
    ds = _dataset(result, options)
    _need("to_netcdf", "h5netcdf", "h5py")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        try:
            ds.to_netcdf(tmp, engine="h5netcdf", encoding=_exact_encoding(ds))
        except ImportError as exc:  # h5netcdf, or its HDF5 library h5py, is missing
            raise ImportError(f"to_netcdf needs h5netcdf and h5py ({exc}): {INSTALL_HINT}") from None
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes private files; these are plain results
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _is_zarr_store(path: Path) -> bool:
    return path.is_dir() and any((path / name).exists() for name in ("zarr.json", ".zgroup", ".zattrs"))


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(folder, name), "rb") as handle:
                os.fsync(handle.fileno())


def _zarr_writes(zarr_format) -> None:
    """zarr 2 (the last release for Python 3.10) cannot write format 3, the default: xarray
    then failed inside zarr with a TypeError about a keyword ``zarr_format``."""
    version = getattr(importlib.import_module("zarr"), "__version__", "")
    major = version.split(".")[0]
    if zarr_format == 3 and major.isdigit() and int(major) < 3:
        raise ImportError(f"to_zarr: zarr_format=3 (the default) needs zarr 3 or newer, but zarr "
                          f"{version} is installed: pip install -U \"zarr>=3\" (Python 3.11 or newer)")


def to_zarr(result, path, *, zarr_format: int = 3, **options) -> Path:
    """Write ``to_xarray(result, **options)`` (or a Dataset) to a zarr store (a directory).

    Written to a temporary directory beside ``path`` with consolidated metadata (so that
    ``xarray.open_zarr(path)`` reads it in one request), flushed, then renamed into place; an
    existing store at ``path`` is moved aside first and removed after.

    Raises
    ------
    FileExistsError
        If ``path`` exists and is not a zarr store (nothing is replaced then).
    FileNotFoundError
        If the directory of ``path`` does not exist (it is not created).
    ImportError
        If xarray or zarr is missing (nothing is written; the message names the package and
        ``pip install "ctformer[io]"``), or if ``zarr_format`` is 3 and zarr is older than 3.
    """
    path = check_directory(path, "to_zarr")
    ds = _dataset(result, options)
    _need("to_zarr", "zarr")
    _zarr_writes(zarr_format)
    if path.exists() and not _is_zarr_store(path):
        raise FileExistsError(f"to_zarr: {path} exists and is not a zarr store; refusing to "
                              "replace it (remove it or choose another path)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    old = None
    try:
        with warnings.catch_warnings():  # zarr 3 notes that v3 consolidation is not in the spec
            warnings.filterwarnings("ignore", message="Consolidated metadata")
            ds.to_zarr(tmp, mode="w", encoding=_exact_encoding(ds), consolidated=True,
                       zarr_format=zarr_format)
        _fsync_tree(tmp)
        os.chmod(tmp, 0o755)
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "store")
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not path.exists():
            os.replace(old / "store", path)
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return path


# -- reading back ------------------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class SavedResult:
    """The arrays of a saved result, as a restart needs them.

    Attributes
    ----------
    kind : str
        The result's class: ``"Solution"``, ``"Trajectory"``, ``"MeanFieldSolution"``,
        ``"ZonalSolution"``, ``"SphericalSolution"``, ``"ConvergenceResult"`` or
        ``"WorkPrecision"``.
    times : numpy.ndarray or None
        Saved depths or times (None for a study).
    states : numpy.ndarray or None
        The saved states in the solver's layout: ``(T, ..., N, d)`` for a solution (a product
        token grid back in raster order), ``(T, ..., n, d)`` for particles, the
        coefficients ``(T, K + 1)`` for a mean field (complex on the circle and on
        :math:`S^2`); None for a study.
    arrays : dict
        The other variables and coordinates by name (``tracers``, ``density``, weights, the
        study's columns, ``event_state`` in the layout of one state, ...).
    attrs : dict
        The attributes, ``*_json`` ones parsed (under the name without the suffix), the 1-D
        array ones (named in ``ctformer_array_attributes``) as arrays.
    dataset : xarray.Dataset
        The dataset it was read from (in memory).
    """

    kind: str
    times: np.ndarray | None
    states: np.ndarray | None
    arrays: dict = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)
    dataset: object = None

    @property
    def final(self):
        """The last saved state (None for a study and when no state was saved)."""
        return None if self.states is None or len(self.states) == 0 else self.states[-1, ...]

    @property
    def event_time(self):
        """Where the solution's event fired (:attr:`ctformer.Solution.event_time`), or None."""
        return self.attrs.get("event_time")

    @property
    def event_state(self):
        """The state at :attr:`event_time` in the solver's layout, bit for bit, or None."""
        return self.arrays.get("event_state")

    @property
    def event_index(self):
        """The event's index in ``events``, or None."""
        return self.attrs.get("event_index")

    @property
    def event_terminal(self) -> bool:
        """Whether the event ended the solve (False when none fired)."""
        return bool(self.attrs.get("event_terminal", 0))

    @property
    def events_before(self):
        """:attr:`ctformer.Solution.events_before`: a tuple of ints, or None without events."""
        before = self.attrs.get("events_before")
        return None if before is None else tuple(int(c) for c in np.atleast_1d(before))

    @property
    def t_events(self):
        """:attr:`ctformer.Solution.t_events`: each event's depths, or None without events."""
        return self._per_event("occurrence_time")

    @property
    def y_events(self):
        """:attr:`ctformer.Solution.y_events`: each event's states (solver layout, bit for bit)."""
        return self._per_event("occurrence_state")

    def as_solved(self, values):
        """``values`` (this file's NumPy arrays, e.g. :attr:`states`) in the array library and
        on the device of the solve that wrote it (attributes ``array_namespace``, ``device``),
        the same bits: a torch solve continues in torch, whose rounding is not NumPy's.

        Raises
        ------
        ImportError
            If the solve's library (torch, CuPy) is not installed here.
        """
        library = self.attrs.get("array_namespace", "numpy")
        if library == "numpy" or values is None:
            return values
        try:
            module = importlib.import_module(library)
        except ImportError:
            raise ImportError(f"as_solved: the result was solved in {library}, which is not "
                              f"installed here; install it, or use the NumPy values as they "
                              f"are") from None
        if library == "torch":
            return module.as_tensor(values, device=self.attrs.get("device", "cpu"))
        return module.asarray(values)

    def _per_event(self, name):
        if self.events_before is None or name not in self.arrays:
            return None
        index = np.asarray(self.arrays["occurrence_event"])
        return tuple(self.arrays[name][index == i] for i in range(len(self.events_before)))


_STATE = {"Solution": ("state", "depth"), "Trajectory": ("positions", "time"),
          "MeanFieldSolution": ("coefficients", "time"), "ConvergenceResult": (None, None),
          "ZonalSolution": ("coefficients", "time"), "SphericalSolution": ("coefficients", "time"),
          "WorkPrecision": (None, None)}


def _decoded_attrs(attrs: dict) -> dict:
    out = {}
    for key, value in attrs.items():
        if key.endswith("_json") and isinstance(value, str):
            out[key[: -len("_json")]] = json.loads(value)
        else:
            out[key] = value
    for key in out.get(ARRAY_ATTRS[: -len("_json")], ()):  # 1-D arrays, as they were written
        if key in out:
            out[key] = np.atleast_1d(np.asarray(out[key]))
    return out


def _state_values(var) -> np.ndarray:
    """A state variable in the solver's layout: complex parts joined, token_x, token_y merged."""
    dims = tuple(var.dims)
    values = join_parts(np.asarray(var.values), dims)
    dims = tuple(d for d in dims if d != "part")
    if "token_x" in dims:
        i = dims.index("token_x")
        values = values.reshape(values.shape[:i] + (-1,) + values.shape[i + 2:])
    return values


def from_xarray(ds) -> SavedResult:
    """The arrays of a dataset made by :func:`to_xarray` (or read from a file), exactly.

    Raises
    ------
    ValueError
        If ``ds`` has no ``ctformer_result`` attribute naming a known result.
    """
    kind = ds.attrs.get("ctformer_result")
    if kind not in _STATE:
        raise ValueError(f"from_xarray: the dataset's attribute ctformer_result is {kind!r}, "
                         f"expected one of {sorted(_STATE)} (a dataset written by ctformer.labelled)")
    name, axis = _STATE[kind]
    if kind == "Solution" and axis not in ds.dims:  # particles and mean fields: time, not depth
        axis = "time"
    arrays = {key: join_parts(np.asarray(var.values), tuple(var.dims))
              for key, var in ds.variables.items() if key not in (name, "part")}
    for key in ("event_state", "occurrence_state"):  # a product token grid back in raster order
        if key in ds.variables:
            arrays[key] = _state_values(ds[key])
    states = None if name is None else _state_values(ds[name])
    times = None if axis is None else np.asarray(ds[axis].values)
    for short, named in (("n", "size_name"), ("h", "step_name")):  # a time study: steps, dt
        other = ds.attrs.get(named)
        if isinstance(other, str) and short in arrays:
            arrays.setdefault(other, arrays[short])
    return SavedResult(kind=kind, times=times, states=states, arrays=arrays,
                       attrs=_decoded_attrs(dict(ds.attrs)), dataset=ds)


def _opened(xr, path: Path):
    """The dataset at ``path`` (lazily), or one line saying why it is not a file of ours."""
    remedy = "give a netCDF file written by to_netcdf or a zarr store written by to_zarr"
    if not path.exists():
        raise FileNotFoundError(f"open_dataset: {str(path)!r} does not exist; {remedy}")
    if path.is_dir():
        if not _is_zarr_store(path):
            raise ValueError(f"open_dataset: {str(path)!r} is a directory but not a zarr store "
                             f"(no zarr.json, .zgroup or .zattrs in it); {remedy}")
        _need("open_dataset of a zarr store", "zarr")
        return xr.open_zarr(path)
    _need("open_dataset of a netCDF file", "h5netcdf", "h5py")
    import h5py
    # h5py's own error for another kind of file is "file signature not found"
    if not h5py.is_hdf5(path):
        raise ValueError(f"open_dataset: {str(path)!r} is not a netCDF-4 (HDF5) file; {remedy}")
    return xr.open_dataset(path, engine="h5netcdf")


def open_dataset(path) -> SavedResult:
    """Read a netCDF file or a zarr store written by :func:`to_netcdf` / :func:`to_zarr`.

    The whole dataset is loaded and the file closed; see :func:`from_xarray`.

    Raises
    ------
    FileNotFoundError
        If ``path`` does not exist.
    ValueError
        If ``path`` is a directory that is not a zarr store, a file that is not netCDF-4
        (HDF5), or a dataset that ctformer did not write (:func:`from_xarray`).
    ImportError
        If xarray is missing, or the package that reads the file: zarr for a store, h5netcdf
        and h5py for a netCDF file (the message names it and ``pip install "ctformer[io]"``).
    """
    xr, path = _xarray(), Path(path)
    with _opened(xr, path) as opened:
        ds = opened.load()
    return from_xarray(ds)

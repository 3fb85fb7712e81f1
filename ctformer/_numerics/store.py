"""This machine's store of measured choices: which BLAS multiplies, which kernel normalizes,
which block sizes attention streams in, up to which size a convolution multiplies by its
dense matrix, which engine runs each FFT.

Each choice is measured once per machine, dtype and set of library versions and kept in a
small JSON file in ``$XDG_CACHE_HOME/ctformer`` (by default ``~/.cache/ctformer``), named after
the CPU model, the BLAS kernel, the versions and the settings that choose the machine code the
libraries run (:data:`KERNEL_SETTINGS`), written atomically; every later process on
the machine reads it, so a machine gives the same bits run after run. Processes that start
together (test workers, a Dask cluster) measure one at a time under a file lock, and the later
ones read the first one's result. Where the file cannot be written (a read-only home, a
full disk) a warning says so once and a choice holds for the whole process that measured it;
a damaged file (truncated, not JSON) is measured again and rewritten, with a warning; the
entries of a newer version (providers this one does not know) are kept, never used.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from .. import fft as _fft
from ..environment import cpu_model
from .threads import blas_controller
from .torch_threads import _torch, _torch_version, installed_version

__all__ = ["KERNEL_SETTINGS", "cache_file", "entry", "fft_engine", "read", "with_fftw_wisdom", "write"]

#: Environment variables that change which machine code the measured libraries run, hence
#: the speeds a choice was measured at: torch's vector kernels, oneDNN's and MKL's instruction
#: sets, MKL's reproducibility branch, Numba's and NumPy's targets (``OPENBLAS_CORETYPE``
#: counts through the BLAS kernel it selects). Choices measured with one of them set, or set
#: otherwise, belong to another store: an AVX2 kernel's choices are not an AVX-512 kernel's.
KERNEL_SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                   "MKL_CBWR", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NPY_DISABLE_CPU_FEATURES",
                   "NPY_ENABLE_CPU_FEATURES")

_LOCK = threading.Lock()
_MEASURING = threading.local()  # .key: the choice this thread is measuring (under _LOCK)


def entry(kind: str, dtype: str, measure, checked: str | None = None, valid=None, needs_torch: bool = True) -> dict:
    """The stored measurement of ``kind`` for ``dtype`` on this machine (a dict with at least
    ``"provider"``), measured by ``measure(dtype)`` and stored when missing; without torch
    (``needs_torch``: not installed or not importable) ``{"provider": "numpy"}``, unmeasured
    and not stored, and a stored entry that chose torch for anything (measured while torch
    imported) is read as ``{"provider": "numpy"}`` too, never handed to callers that would
    call a torch that is not there. A ``measure`` may read
    choices stored already (another thread's plans may have evicted the process's copy of
    one: it is read again) but must not ask for a choice not stored yet (the lock is held: a
    RuntimeError names both). ``checked`` names what the measurement verified
    (the shapes of its bit-for-bit check, the candidates it timed): an entry stored with
    another ``checked`` (an older version's, with other bounds) is measured again, never
    reused for bounds it did not check; so is one that ``valid(entry)`` refuses (a damaged
    file). Not cached: callers keep what they read."""
    if needs_torch and _torch_version() is None:
        return {"provider": "numpy"}
    key = f"{kind} {dtype}"

    def usable(found):  # a provider this version knows, measured for these bounds
        return found is not None and found.get("provider") in _PROVIDERS and found.get("checked") == checked \
            and (valid is None or valid(found))

    if getattr(_MEASURING, "key", None) is not None:  # this thread holds the locks: read, never measure
        found = read(cache_file()).get(key)
        if usable(found):
            return _without_missing_torch(found, needs_torch)
        raise RuntimeError(f"measuring {_MEASURING.key!r} asked for {key!r}, which is not stored yet: "
                           "the measurement's caller must ask for it first")
    with _LOCK, _machine_lock(path := cache_file()):
        stored = read(path)
        entry = stored.get(key)
        if not usable(entry):
            if needs_torch and _torch() is None:  # installed but not importable: NumPy's BLAS
                return {"provider": "numpy"}
            _MEASURING.key = key
            try:
                entry = stored[key] = measure(np.dtype(dtype))
            finally:
                _MEASURING.key = None
            if checked is not None:
                entry["checked"] = checked
            _add_wisdom(stored)  # plans the measurement made (with_fftw_wisdom)
            write(path, stored)
        return _without_missing_torch(entry, needs_torch)


def _without_missing_torch(found: dict, needs_torch: bool) -> dict:
    """``found``, or ``{"provider": "numpy"}`` where it chose torch for something (its
    provider, or one of its products) and torch does not import in this process (installed,
    so the metadata named it, but broken): the store's view and the library's agree."""
    if needs_torch and "torch" in found.values() and _torch() is None:
        return {"provider": "numpy"}
    return found


def fft_engine(signature: str, dtype: str, time_it) -> str:
    """``"fftw"`` or ``"numpy"``: who runs the transform ``signature`` (kind, shape, axis,
    length, FFTW threads, planner effort) of ``dtype`` on this machine
    (:class:`ctformer.fft.PlannedFFT` with the ``auto`` engine), timed once by ``time_it()``
    and stored as ``fft engine <signature> <dtype>``, so that a machine runs each transform on
    the same engine, and gives the same bits, run after run."""
    import pyfftw

    return entry(f"fft engine {signature}", dtype, lambda _: {"provider": time_it()},
                 f"pyfftw {pyfftw.__version__}; {_fft.PlannedFFT.ENGINE_TIMING}", lambda e: e["provider"] in ("fftw", "numpy"),
                 needs_torch=False)["provider"]


_fft.use_engine_store(fft_engine)

_WISDOM_KEY = "fftw wisdom"
_PENDING_WISDOM: list = []  # wisdom lines that plans made inside a measurement added


def with_fftw_wisdom(make):
    """``make()`` (an FFTW plan of the ``auto`` planner, :class:`ctformer.fft.PlannedFFT`)
    planned from this machine's stored FFTW wisdom alone: the process's own wisdom is set
    aside, the stored wisdom imported, so FFTW measures only the transforms it lacks, and the
    wisdom that the plan added is stored as ``fftw wisdom`` (under the store's lock: processes
    that start together measure a transform once, one at a time, and the others plan from the
    first one's wisdom). The process's own wisdom is then merged back. A transform is then
    planned alike, and gives the same bits, in every process on the machine, whatever else
    the process planned first: plans of an explicit ``FFTW_MEASURE`` (timed in their own
    process) neither enter the store nor steer the ``auto`` planner, and the stored wisdom
    alone plans every transform stored. Wisdom of another FFTW build is refused by FFTW and
    replaced. Inside a measurement (which holds the lock) what the plan adds is stored with
    that measurement (:func:`entry`)."""
    import pyfftw

    path = cache_file()
    inside = getattr(_MEASURING, "key", None) is not None
    with nullcontext() if inside else _LOCK, nullcontext() if inside else _machine_lock(path):
        stored = read(path)
        with _fft.PLANNER_LOCK:  # no other plan of the process sees the wisdom set aside
            held = pyfftw.export_wisdom()
            pyfftw.forget_wisdom()
            try:
                texts = _merged_wisdom(stored, _PENDING_WISDOM)  # a measurement's earlier plans too
                if texts is not None:
                    pyfftw.import_wisdom(tuple(text.encode("ascii") for text in texts))
                before = pyfftw.export_wisdom()
                plan = make()
                _PENDING_WISDOM.append(_new_lines(before, pyfftw.export_wisdom()))
            finally:
                pyfftw.import_wisdom(held)
        if not inside and _add_wisdom(stored):
            write(path, stored)
        return plan


def _lines(text: bytes) -> tuple:
    """(header, entries, footer) of one FFTW wisdom text: a header line naming FFTW's version
    and build, one line per solver record, and a closing parenthesis."""
    lines = text.decode("ascii").splitlines()
    if len(lines) < 2:
        return text.decode("ascii"), [], ""
    return lines[0], lines[1:-1], lines[-1]


def _new_lines(before, after) -> list:
    """For each of FFTW's three wisdom texts (double, single, long double): the header,
    footer and records in ``after`` that ``before`` lacked."""
    added = []
    for old, new in zip(before, after):
        header, records, footer = _lines(new)
        known = set(_lines(old)[1])
        added.append([header, [r for r in records if r not in known], footer])
    return added


def _wisdom_checked() -> str | None:
    """What stored wisdom must have been made with (pyFFTW's version), or None where pyFFTW
    is not loaded."""
    pyfftw = sys.modules.get("pyfftw")
    return None if pyfftw is None else f"pyfftw {pyfftw.__version__}"


def _merged_wisdom(stored, pending) -> list | None:
    """FFTW's three wisdom texts: the stored ones (where valid: made with this pyFFTW) with
    the records of ``pending`` (lists of :func:`_new_lines`) added once each; None where
    there is neither. Records of another FFTW build replace the stored ones."""
    kept = stored.get(_WISDOM_KEY) or {}
    valid = kept.get("checked") == _wisdom_checked() and isinstance(kept.get("wisdom"), list) \
        and len(kept["wisdom"]) == 3 and all(isinstance(text, str) and text.isascii() for text in kept["wisdom"])
    if not valid and not pending:
        return None
    texts = []
    for i in range(3):
        header, records, footer = _lines(kept["wisdom"][i].encode("ascii")) if valid else (None, [], None)
        records = list(records)
        for added in pending:
            new_header, new_records, new_footer = added[i]
            if header != new_header:  # another build's records: replaced
                header, footer, records = new_header, new_footer, []
            records += [r for r in new_records if r not in records]
        texts.append("\n".join([header, *records, footer]) + "\n")
    return texts


def _add_wisdom(stored) -> bool:
    """The wisdom records that plans added since the last call (:data:`_PENDING_WISDOM`)
    into ``stored``, with those stored already: True when ``stored`` changed (it is then to
    be written)."""
    pending, _PENDING_WISDOM[:] = list(_PENDING_WISDOM), []
    if not any(records for added in pending for _, records, _ in added):
        return False
    stored[_WISDOM_KEY] = {"provider": "fftw", "wisdom": _merged_wisdom(stored, pending),
                           "checked": _wisdom_checked()}
    return True


_fft.use_wisdom_store(with_fftw_wisdom)


@contextmanager
def _machine_lock(path):
    """Processes that start together (test workers, a Dask cluster) measure one at a time, and
    the later ones read the first one's choice."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_suffix(".lock"), "a")
    except (ImportError, OSError):  # no fcntl (Windows) or no writable directory
        yield
        return
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_file() -> Path | None:
    """This machine's file of measured choices, named by what the choice depends on: the CPU
    model, the BLAS libraries (version and kernel), the versions of NumPy, torch and Numba, the
    :data:`KERNEL_SETTINGS` that are set, and ``CTFORMER_LOOP_ENGINE=numpy`` (the compiled
    loops off: a verdict measured without them, such as the few-row kernel's "off", is not
    one measured with them)."""
    controller = blas_controller()
    blas = sorted({(str(i.get("internal_api")), str(i.get("version")), str(i.get("architecture")))
                   for i in (controller.info() if controller is not None else []) if i.get("user_api") == "blas"})
    settings = {name: os.environ[name] for name in KERNEL_SETTINGS if os.environ.get(name)}
    if _loops_off():  # the "numpy" kernels timed are then NumPy passes, not the compiled loops
        settings["CTFORMER_LOOP_ENGINE"] = "numpy"
    key = json.dumps([cpu_model(), np.__version__, _torch_version(), blas, _numba_version(), settings],
                     sort_keys=True)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ctformer" / f"gemm-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _loops_off() -> bool:
    """Whether ``CTFORMER_LOOP_ENGINE=numpy`` turns the compiled loops off (Numba missing
    counts through :func:`_numba_version`; a bad value is reported where the loops run)."""
    from ..environment import choice
    from .compiled import _ENGINES

    try:
        return choice("CTFORMER_LOOP_ENGINE", _ENGINES) == "numpy"
    except ValueError:
        return False


def _numba_version() -> str | None:
    """Numba's installed version, or None: it compiles the loops whose speed is measured."""
    return installed_version("numba")


_PROVIDERS = ("numpy", "torch", "compiled", "fftw")
_KEPT: dict = {}  # path -> the choices this process measured that it could not write there
_WARNED: set = set()  # (path, what) warned about once per process


def read(path) -> dict:
    """The choices stored in ``path`` (a dict of dicts), with those this process measured but
    could not write there (:func:`write`). A file that is not such a dict (truncated,
    overwritten) reads as empty, with a warning: its choices are measured again and it is
    rewritten. Entries of providers this version does not know (a newer version's) are kept,
    so that writing back does not drop them, and never used (:func:`entry`)."""
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):  # none yet (an unwritable one: write warns)
        stored = {}
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        _warn_once(path, "read", f"cannot read the store of measured choices {str(path)!r} ({exc}): its "
                   "choices are measured again and the file is rewritten")
        stored = {}
    if not isinstance(stored, dict) or not all(isinstance(v, dict) for v in stored.values()):
        _warn_once(path, "read", f"the store of measured choices {str(path)!r} is damaged (not a JSON object "
                   "of entries): its choices are measured again and the file is rewritten")
        stored = {}
    return {**stored, **_KEPT.get(str(path), {})}


def write(path, stored) -> None:
    """Write ``stored`` to ``path`` atomically; where that fails (a read-only home, a full
    disk) keep it for this process (:func:`read` returns it: a choice then holds for the whole
    process, never measured twice) and warn once."""
    from ..atomic import write_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(stored, indent=1, sort_keys=True))
    except OSError as exc:
        _KEPT[str(path)] = dict(stored)
        _warn_once(path, "write", f"cannot write the store of measured choices {str(path)!r} ({exc}): the "
                   "choices measured now hold for this process only, and the next process measures them "
                   "again (and may choose other kernels); set XDG_CACHE_HOME to a writable directory")


def _warn_once(path, what: str, message: str) -> None:
    import warnings

    if (str(path), what) not in _WARNED:
        _WARNED.add((str(path), what))
        warnings.warn(message, UserWarning, stacklevel=3)



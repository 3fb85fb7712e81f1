r"""The on-disk store of a study: one checksummed record per finished case.

With a ``store`` directory every finished case is written to ``<store>/<key>.json`` at once,
atomically (:func:`ctformer.atomic.write_atomic`), so a killed study leaves only complete
records. Re-running the same study loads those records and computes only the missing
cases: nothing is lost and nothing is computed twice. The key is a SHA-256 hash of
everything that determines the case, and of the library's version.

Records are never trusted blindly. Each carries

* ``"schema"``: the record format version (:data:`RECORD_SCHEMA`);
* ``"fields"``: the kind of every result field (a number, an array with its shape, a
  string, ...), written from the task's own output;
* ``"checksum"``: the SHA-256 digest of the record's canonical JSON form without this field.

A record whose checksum does not match, whose fields do not match their declared kinds and
shapes, that holds NaN or inf, that belongs to another key or that is not readable JSON is
reported by a :class:`CorruptRecordWarning` naming its file; its case is recomputed and the
record rewritten. The store is checked for writability before anything is computed, and so is
every record path: a directory where a record is to be written is refused (naming the path)
before the case is computed, not after.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from ..atomic import write_atomic

__all__ = ["CaseStore", "case_key", "check_key", "CorruptRecordWarning", "RECORD_SCHEMA",
           "record_checksum", "record_problem", "seal_record"]

#: Version of the record format written by :meth:`CaseStore.save`.
RECORD_SCHEMA = 2

#: Accepted case keys: letters, digits, ``_`` and ``-`` (e.g. a hex digest), 1 to 128 of them.
#: No separators, no dots: a key is a file name inside the store, never a path.
_KEY_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")

#: The largest integer float64 holds (a larger one in a record reads as inf).
_LARGEST_INTEGER = int(np.finfo(np.float64).max)

#: Fields that :meth:`CaseStore.save` adds to every record (not result fields).
_META = ("schema", "fields", "checksum", "key", "case")

class CorruptRecordWarning(UserWarning):
    """A stored study record failed its checks; it is ignored, recomputed and rewritten."""


def case_key(parameters: dict) -> str:
    """SHA-256 hex digest of the canonical JSON form of ``parameters`` and of the library's
    version: a case computed by another release (one with a fix, or a new default) is another
    computation, so its record is not found, never reused."""
    # read from the package, loaded before any of its modules (no import upward)
    version = sys.modules[__name__.partition(".")[0]].__version__
    text = json.dumps({"ctformer": version, "case": parameters}, sort_keys=True,
                      separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


def check_key(key) -> str:
    """Return ``key`` if it is a valid case key (see :data:`_KEY_PATTERN`), else raise.

    Raises
    ------
    ValueError
        For anything but 1 to 128 letters, digits, ``_`` or ``-`` (e.g. ``"../x"``, an
        absolute path, a separator or a dot), naming the key.
    """
    if not isinstance(key, str) or not _KEY_PATTERN.fullmatch(key):
        raise ValueError(f"invalid case key {key!r}: a key must be 1 to 128 letters, digits, '_' "
                         "or '-' (e.g. a case_key() hex digest), never a path")
    return key


def record_checksum(record: dict) -> str:
    r"""SHA-256 hex digest of the canonical JSON of ``record`` without its ``"checksum"`` field.

    Canonical: keys sorted, no spaces, floats written by :func:`repr` (which round-trips
    exactly), so a record read back from its file has the checksum it was written with.
    """
    body = {k: v for k, v in record.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _field_kind(value):
    """The declared kind of one result field: ``["number", []]``, ``["array", shape]``, ..."""
    if value is None:
        return ["null", None]
    if isinstance(value, bool):
        return ["bool", None]
    if isinstance(value, (int, float)):
        return ["number", []]
    if isinstance(value, str):
        return ["str", None]
    if isinstance(value, list):
        shape = _number_array_shape(value)
        return ["json", None] if shape is None else ["array", list(shape)]
    return ["json", None]


def _number_array_shape(value):
    """The shape of ``value`` when it is a regular nesting of lists of JSON numbers (no
    booleans, strings or nulls), else ``None``. NumPy's float64 conversion is not the test: it
    turns ``null`` into NaN, ``true`` into 1 and the string ``"0.5"`` into 0.5."""
    if not isinstance(value, list):
        return () if type(value) in (int, float) else None
    if not value:
        return (0,)
    if not isinstance(value[0], list):  # the innermost axis: one pass (a bool is not an int here)
        return (len(value),) if all(type(v) in (int, float) for v in value) else None
    inner = _number_array_shape(value[0])
    if inner is None or any(_number_array_shape(v) != inner for v in value[1:]):
        return None
    return (len(value), *inner)


def _nonfinite(value) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, int):  # an integer beyond float64's range reads as inf
        return abs(value) > _LARGEST_INTEGER
    if isinstance(value, list):
        return any(_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_nonfinite(v) for v in value.values())
    return False


def _check_field(name, value, kind) -> str | None:
    """Why ``value`` does not match its declared ``kind``, or ``None`` when it does."""
    if not (isinstance(kind, list) and len(kind) == 2 and isinstance(kind[0], str)):
        return f"field {name!r} has an invalid declaration {kind!r}"
    tag, shape = kind
    if tag == "array" and not (isinstance(shape, list) and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        return f"field {name!r} has an invalid declaration {kind!r}"
    if tag == "null":
        ok = value is None
    elif tag == "bool":
        ok = isinstance(value, bool)
    elif tag == "str":
        ok = isinstance(value, str)
    elif tag == "number":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif tag == "array":
        if not isinstance(value, list):
            return f"field {name!r} must be an array of shape {tuple(shape)}, got {type(value).__name__}"
        found = _number_array_shape(value)
        if found is None:  # ragged, or a null, boolean or string among the numbers
            return f"field {name!r} must be an array of numbers of shape {tuple(shape)}"
        if list(found) != list(shape):
            return f"field {name!r} has shape {found}, declared {tuple(shape)}"
        ok = True
    elif tag == "json":
        ok = True
    else:
        return f"field {name!r} has an unknown kind {tag!r}"
    if not ok:
        return f"field {name!r} must be of kind {tag}, got {json.dumps(value)[:40]}"
    if _nonfinite(value):
        return f"field {name!r} holds NaN or inf (or an integer beyond float64's range)"
    return None


def record_problem(record, key: str, required=None) -> str | None:
    """Why a parsed record cannot be trusted for case ``key``, or ``None`` when it can.

    Checks, in this order: a JSON object, the schema version, the key, the checksum, that
    every declared field is present with its declared kind and shape, that no number is
    NaN or inf, and that the fields the caller reads (``required``: name to kind, or to
    ``(kind, trailing shape)`` for an array) are declared so.
    """
    if not isinstance(record, dict):
        return f"it is not a JSON object but {type(record).__name__}"
    if record.get("schema") != RECORD_SCHEMA:
        return (f"schema version {record.get('schema')!r} is not {RECORD_SCHEMA} "
                "(missing or written by another version)")
    if record.get("key") != key:
        return f"it belongs to another case (key {str(record.get('key'))[:16]!r})"
    checksum = record.get("checksum")
    if not isinstance(checksum, str) or checksum != record_checksum(record):
        return "checksum mismatch: the file was changed after it was written"
    fields = record.get("fields")
    if not isinstance(fields, dict):
        return "it has no field declarations"
    for name, kind in fields.items():
        if name not in record:
            return f"field {name!r} is missing"
        problem = _check_field(name, record[name], kind)
        if problem:
            return problem
    undeclared = sorted(set(record) - set(fields) - set(_META))
    if undeclared:
        return f"undeclared fields {undeclared}"
    return _required_problem(fields, required or {})


def _required_problem(fields: dict, required: dict) -> str | None:
    """Why the declared ``fields`` lack what the caller reads (a record consistent in itself,
    checksum included, can still miss a field or hold another shape: it is not this case's)."""
    for name, need in required.items():
        tag, tail = need if isinstance(need, tuple) else (need, None)
        if name not in fields:
            return f"field {name!r} is missing"
        kind = fields[name]
        if kind[0] != tag:
            return f"field {name!r} must be of kind {tag}, declared {kind[0]}"
        shape = list(kind[1] or [])
        if tail is not None and shape[max(0, len(shape) - len(tail)):] != list(tail):
            return f"field {name!r} has shape {tuple(shape)}, this case needs (..., {', '.join(map(str, tail))})"
    return None


class CaseStore:
    """A directory holding one JSON record per finished case.

    Parameters
    ----------
    directory : str or os.PathLike
        Created if missing.

    Raises
    ------
    TypeError
        If ``directory`` is not a path.
    ValueError
        If ``directory`` exists and is not a directory.
    PermissionError
        If ``directory`` cannot be created.
    """

    def __init__(self, directory):
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"store must be a directory path, got {type(directory).__name__}")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"store {str(self.directory)!r} exists and is not a directory")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PermissionError(
                f"cannot create the study store {str(self.directory)!r} ({exc.strerror or exc}); "
                "choose a writable directory for store=") from None

    def path(self, key: str) -> Path:
        """Where the record of case ``key`` lives (``key`` is validated: never a path)."""
        return self.directory / f"{check_key(key)}.json"

    def check_record_path(self, key: str) -> Path:
        """The path of case ``key``'s record, checked to be a file or absent (never computed on
        a path that cannot take the record).

        Raises
        ------
        PermissionError
            Naming the record path, when something other than a regular file (a directory,
            a socket, ...) is there: the record could not be written after computing.
        """
        path = self.path(key)
        if path.exists() and not path.is_file():
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise PermissionError(
                f"the study record {str(path)!r} is {kind}, so case {key[:16]}... could not be "
                "stored; nothing was computed. Remove or rename it, or choose another directory "
                "for store=")
        return path

    def check_writable(self) -> None:
        """Create and remove a probe file in the store; raise if that fails.

        Raises
        ------
        PermissionError
            Naming the directory, when a file cannot be created there (permissions, an
            immutable or read-only file system, ...).
        """
        try:
            fd, probe = tempfile.mkstemp(prefix=".probe.", suffix=".tmp", dir=self.directory)
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise PermissionError(
                f"the study store {str(self.directory)!r} is not writable "
                f"({exc.strerror or exc}); nothing was computed. Choose a writable directory "
                "for store= (or fix its permissions)") from None

    def load(self, key: str, required=None) -> dict | None:
        """The stored record of ``key``, or ``None`` when absent or not trustworthy
        (``required``: the fields the caller reads, see :func:`record_problem`).

        A record that cannot be trusted (see :func:`record_problem`) is reported with a
        :class:`CorruptRecordWarning` naming its file, and ``None`` is returned so that the
        case is recomputed.

        Raises
        ------
        PermissionError
            When the record path is not a regular file (:meth:`check_record_path`).
        """
        path = self.check_record_path(key)
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, RecursionError) as exc:  # nested too deeply: RecursionError
            problem = f"unreadable JSON ({type(exc).__name__}: {exc})"
        else:
            try:
                problem = record_problem(record, key, required)
            except RecursionError:
                problem = "its fields are nested too deeply to be checked"
        if problem is not None:
            warnings.warn(f"study record {path} is corrupt: {problem}; the case is recomputed "
                          "and the record rewritten", CorruptRecordWarning, stacklevel=3)
            return None
        return record

    def save(self, key: str, record: dict) -> dict:
        """Write ``record`` atomically (:func:`ctformer.atomic.write_atomic`); return it sealed.

        The written record is ``record`` plus ``"schema"``, ``"fields"`` (the declared kind
        of every result field) and ``"checksum"``; ``record`` is not modified.

        Raises
        ------
        ValueError
            If a result field holds NaN or inf (such a record would never be trusted).
        """
        sealed = seal_record(key, record)
        bad = [name for name in sealed["fields"] if _nonfinite(sealed[name])]
        if bad:
            raise ValueError(f"case {key}: fields {bad} hold NaN or inf; not stored")
        text = json.dumps(sealed, allow_nan=False)
        write_atomic(self.path(key), text)
        return sealed

    def __repr__(self) -> str:
        return f"CaseStore({str(self.directory)!r})"


def seal_record(key: str, record: dict) -> dict:
    """``record`` with ``key``, ``schema``, ``fields`` and ``checksum`` (JSON-ready copy).

    Raises
    ------
    TypeError
        If a key of ``record`` or of a dictionary inside it is not a string: JSON would store
        ``1`` as ``"1"``, and a resumed study would read back another record.
    """
    bad = _non_string_key(record)
    if bad is not None:
        raise TypeError(f"case {key}: the task's output has the key {bad!r}; a record is stored as "
                        "JSON, whose keys are strings: use string keys")
    body = _jsonable({k: v for k, v in record.items() if k not in ("schema", "fields", "checksum")})
    body["key"] = key
    body["schema"] = RECORD_SCHEMA
    body["fields"] = {name: _field_kind(value) for name, value in body.items() if name not in _META}
    body["checksum"] = record_checksum(body)
    return body


def _non_string_key(value):
    """The first key of a dictionary in ``value`` (nested in dictionaries, lists, tuples) that
    is not a string, else None."""
    if isinstance(value, dict):
        for k, v in value.items():
            found = k if not isinstance(k, str) else _non_string_key(v)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for v in value:
            found = _non_string_key(v)
            if found is not None:
                return found
    return None


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value

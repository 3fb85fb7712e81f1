"""Atomic file writes: a reader sees the old file or the new one, never a part of either.

:func:`write_atomic` writes to a temporary file in the target's directory, flushes it to disk
(``fsync``) and renames it over the target (:func:`os.replace`, atomic on POSIX and Windows).
An interrupted write leaves the old file in place and no temporary file behind.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["write_atomic", "check_directory"]


def check_directory(path, what: str = "write_atomic") -> Path:
    """``path`` as a :class:`~pathlib.Path`, once its directory is known to exist.

    Raises
    ------
    FileNotFoundError
        If the directory that would hold ``path`` does not exist (naming it, not the
        temporary file an atomic write would have made there).
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{what}: the directory {str(path.parent)!r} of {str(path)!r} does "
                                "not exist; create it first (nothing was written)")
    return path


def write_atomic(path, data) -> Path:
    """Write ``data`` (bytes or str, UTF-8) to ``path`` atomically; return the path.

    Raises
    ------
    TypeError
        If ``data`` is neither bytes nor str.
    FileNotFoundError
        If the directory does not exist (:func:`check_directory`; nothing is changed then).
    OSError
        If the directory is not writable (nothing is changed then).
    """
    path = check_directory(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes private files; these are plain results
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path

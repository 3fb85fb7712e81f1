"""Atomic file writes: a reader sees the old file or the new one, never a part of either.

:func:`write_atomic` writes to a temporary file in the target's directory, flushes it to disk
(``fsync``) and renames it over the target (:func:`os.replace`, atomic on POSIX and Windows).
An interrupted write leaves the old file in place and no temporary file behind. The new file
keeps the permissions of the file it replaces; a new one gets those :func:`open` gives (0o666
less the umask).
"""
from __future__ import annotations

import os
import secrets
import stat
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
    IsADirectoryError
        If ``path`` is a directory (nothing is changed then).
    OSError
        If the directory is not writable (nothing is changed then).
    """
    path = check_directory(path)
    if path.is_dir():  # named here: the rename would name the temporary file
        raise IsADirectoryError(f"write_atomic: {str(path)!r} is a directory; give the path of a file "
                                "(nothing was written)")
    if isinstance(data, str):
        data = data.encode("utf-8")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    try:
        kept = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        kept = None
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if kept is not None:  # a private file stays private, an executable one executable
            os.chmod(tmp, kept)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def _temporary(path: Path):
    """``(descriptor, name)`` of a new empty file beside ``path``, with the permissions a new
    file gets from :func:`open` (0o666 less the umask, which the system applies)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:  # a chance of 2**-48 a try: another name
            continue
    raise FileExistsError(f"write_atomic: no free temporary name beside {str(path)!r} in 100 tries")

r"""The memory budget: sizes refused before anything is allocated.

One array (or one dense matrix) of ctformer may take at most :func:`memory_budget` bytes:
``CTFORMER_MEMORY_BUDGET`` when set, else half the memory available now. An allocation of
:math:`N` bytes is refused with :class:`SizeTooLargeError` when :math:`N` exceeds the budget;
a dense float64 ``(rows, cols)`` matrix needs :math:`N = 8 \cdot \mathrm{rows} \cdot
\mathrm{cols}` bytes (:func:`check_dense`).
"""
from __future__ import annotations

import math
import os
import sys

__all__ = ["SizeTooLargeError", "MEMORY_BUDGET_ENV", "memory_budget", "available_memory", "check_allocation",
           "check_dense", "surely_within"]


class SizeTooLargeError(ValueError, MemoryError):
    """A requested size would need more memory than :func:`memory_budget` allows.

    Raised *before* anything is allocated. It is both a :class:`ValueError` (a bad argument)
    and a :class:`MemoryError`.
    """


#: Environment variable overriding :func:`memory_budget` (bytes, e.g. ``"2e9"``).
MEMORY_BUDGET_ENV = "CTFORMER_MEMORY_BUDGET"
# Allocations this small are never refused when no budget is set: a machine with less than
# twice this available would fail elsewhere first (and raise MemoryError, not compute wrong).
_ALWAYS_WITHIN_BUDGET = 64 << 20


def memory_budget() -> int:
    r"""Bytes one array (or one dense matrix) of ctformer may take.

    ``CTFORMER_MEMORY_BUDGET`` (bytes) when set; else :math:`\lfloor A / 2 \rfloor` for the
    host memory :math:`A` available now (:func:`available_memory`: the kernel's estimate of what
    can be allocated without swapping, page cache included), else 8 GiB where :math:`A` is
    unknown.

    Raises
    ------
    ValueError
        If ``CTFORMER_MEMORY_BUDGET`` is not a number of bytes of at least 1.
    """
    text = os.environ.get(MEMORY_BUDGET_ENV)
    if text:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (math.isfinite(value) and value >= 1):  # 0.5 would be a budget of 0 bytes
            raise ValueError(f"{MEMORY_BUDGET_ENV} must be a positive number of bytes (at least 1), got {text!r}")
        return int(value)
    available = available_memory()
    return int((available if available is not None else _UNKNOWN_AVAILABLE) // 2)


_MEMINFO = "/proc/meminfo"
_UNKNOWN_AVAILABLE = 16 * 2**30  # a budget of 8 GiB where nothing says what is available


def available_memory() -> int | None:
    """Host memory available now, in bytes, or None where it cannot be read.

    The same number whether or not :mod:`psutil` is installed (it comes with Dask, not with
    ctformer): on Linux ``MemAvailable`` of ``/proc/meminfo`` (what :mod:`psutil` reports
    too), elsewhere ``psutil.virtual_memory().available``, else on Windows
    ``GlobalMemoryStatusEx``'s available physical memory, else the free pages of
    ``os.sysconf`` (free memory only, without the reclaimable page cache: a smaller number,
    hence a stricter budget).
    """
    try:
        with open(_MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):  # not Linux, or a kernel without MemAvailable
        pass
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - psutil missing or unsupported platform
        pass
    if sys.platform == "win32":
        return _windows_available()
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):  # macOS has no SC_AVPHYS_PAGES
        return None


def _windows_available() -> int | None:
    """``ullAvailPhys`` of Windows' ``GlobalMemoryStatusEx``, or None."""
    import ctypes

    class _Status(ctypes.Structure):
        _fields_ = [("dwLength", ctypes.c_ulong), ("dwMemoryLoad", ctypes.c_ulong),
                    *((name, ctypes.c_ulonglong) for name in ("ullTotalPhys", "ullAvailPhys", "ullTotalPageFile",
                      "ullAvailPageFile", "ullTotalVirtual", "ullAvailVirtual", "ullAvailExtendedVirtual"))]

    status = _Status()
    status.dwLength = ctypes.sizeof(_Status)
    try:
        ok = ctypes.windll.kernel32.GlobalMemoryStatusEx(ctypes.byref(status))
    except (AttributeError, OSError):
        return None
    return int(status.ullAvailPhys) if ok else None


def _format_bytes(nbytes: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.3g} {unit}"
    return f"{int(nbytes)} B"


def check_allocation(nbytes: float, what: str, remedy: str) -> None:
    """Raise :class:`SizeTooLargeError` if ``nbytes`` exceed :func:`memory_budget`.

    The one-line message names ``what`` would be allocated, the sizes, and the ``remedy``.
    Without ``CTFORMER_MEMORY_BUDGET``, sizes up to 64 MiB pass without reading the available
    memory (a tenth of a millisecond, which every solve paid).
    """
    if surely_within(nbytes):
        return
    budget = memory_budget()
    if nbytes > budget:
        raise SizeTooLargeError(
            f"{what} would need {_format_bytes(nbytes)}, more than the memory budget of "
            f"{_format_bytes(budget)} (half the available memory, or {MEMORY_BUDGET_ENV}); {remedy}")


def surely_within(nbytes: float) -> bool:
    """Whether ``nbytes`` pass :func:`check_allocation` without reading the available memory:
    at most 64 MiB and no ``CTFORMER_MEMORY_BUDGET`` (callers on hot paths then skip
    composing their message)."""
    return nbytes <= _ALWAYS_WITHIN_BUDGET and not os.environ.get(MEMORY_BUDGET_ENV)


def check_dense(rows: int, cols: int, what: str, remedy: str = "use fewer points or a smaller n") -> None:
    """:func:`check_allocation` for a dense float64 ``(rows, cols)`` matrix."""
    check_allocation(8.0 * float(rows) * float(cols), f"{what} ({rows} x {cols}, dense)", remedy)

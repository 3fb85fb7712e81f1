"""Settings read from the environment: validated once, with one message for every variable."""
from __future__ import annotations

import os

__all__ = ["choice", "cpu_model", "positive_int", "setting"]


# CPython's os.environ keeps the encoded variables in a dict (``_data``, bytes keys on POSIX);
# os.environ.get raises and catches a KeyError for every unset variable (about 2 us), and the
# library's engine settings are read several times per solver step.
_ENCODED = getattr(os.environ, "_data", None) if os.name == "posix" else None
if not isinstance(_ENCODED, dict):
    _ENCODED = None


def setting(name: str, default: str = "") -> str:
    """The value of the environment variable ``name`` (``default`` when unset), as
    ``os.environ.get(name, default)`` but cheap enough to read in every step."""
    if _ENCODED is None:
        return os.environ.get(name, default)
    value = _ENCODED.get(name.encode())
    return default if value is None else os.fsdecode(value)


_CHOSEN: dict = {}  # (name, raw value) -> the normalized choice (valid values only)


def choice(name: str, allowed: tuple, default: str = "auto") -> str:
    """The environment variable ``name`` as one of ``allowed`` (stripped, lower case; unset or
    empty: ``default``), cheap enough to read for every product or step.

    Raises
    ------
    ValueError
        If the value is none of ``allowed`` (the message lists them).
    """
    raw = setting(name, default)
    chosen = _CHOSEN.get((name, raw))
    if chosen is None:
        chosen = raw.strip().lower() or default
        if chosen not in allowed:
            raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {chosen!r}")
        _CHOSEN[(name, raw)] = chosen
    return chosen


def positive_int(name: str, default: int | None = None, maximum: int | None = None) -> int | None:
    """The positive integer in the environment variable ``name`` (``default`` when unset or
    empty), at most ``maximum`` where one is given (e.g. a thread count, a C ``int``).

    Raises
    ------
    ValueError
        If the variable is set to anything but a positive integer up to ``maximum`` (naming
        it, the accepted range and the value).
    """
    value = setting(name).strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1 or (maximum is not None and number > maximum):
        limit = "" if maximum is None else f" at most {maximum}"
        raise ValueError(f"{name} must be a positive integer{limit}, got {value!r}")
    return number


def cpu_model() -> str:
    """The CPU's model name with its family and model numbers (``/proc/cpuinfo``; else the
    platform's processor or machine name). Virtual machines often report a bare name ("AMD
    EPYC") for CPUs of different generations, whose measured choices differ."""
    try:
        with open("/proc/cpuinfo") as f:
            fields = {}
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip() and fields:  # the first processor's block is enough
                    break
        if "model name" in fields:
            if "cpu family" in fields and "model" in fields:
                return f"{fields['model name']} (cpu family {fields['cpu family']}, model {fields['model']})"
            return fields["model name"]
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"

"""Settings read from the environment: validated once, with one message for every variable."""
from __future__ import annotations

import os

__all__ = ["cpu_model", "positive_int"]


def positive_int(name: str, default: int | None = None) -> int | None:
    """The positive integer in the environment variable ``name`` (``default`` when unset or empty).

    Raises
    ------
    ValueError
        If the variable is set to anything but a positive integer (naming it and the value).
    """
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; else the platform's processor or machine name)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"

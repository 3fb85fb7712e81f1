"""Settings read from the environment: validated once, with one message for every variable."""
from __future__ import annotations

import os

__all__ = ["positive_int"]


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

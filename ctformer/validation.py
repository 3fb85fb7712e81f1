"""Checks of scalar arguments: one function a rule, one message a rule.

Every public entry point validates its scalar arguments with these functions, so the same
mistake reads the same everywhere: the message names the argument, says what was expected
and shows what was given. ``bool`` is never accepted as a number (``True`` is an ``int`` in
Python, and ``steps=True`` is always a mistake).

- :func:`integer`: an integer, ``>= minimum`` (``minimum=1``: a positive integer);
- :func:`real`: a finite real number, optionally ``> 0`` or ``>= 0``;
- :func:`boolean`: ``True`` or ``False`` (NumPy booleans included);
- :func:`one_of`: one of a set of choices (a string option);
- :func:`renamed`: a decorator refusing the keywords renamed in 0.2 with their new names.
"""
from __future__ import annotations

import functools
import math
from numbers import Integral, Real
from typing import Iterable

import numpy as np

__all__ = ["integer", "real", "boolean", "one_of", "is_integer", "is_real", "renamed"]


def is_integer(value) -> bool:
    """Whether ``value`` is an integer (Python or NumPy) and not a ``bool``."""
    return isinstance(value, Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
    """Whether ``value`` is a real number (integers included) and not a ``bool``."""
    return isinstance(value, Real) and not isinstance(value, (bool, np.bool_))


def integer(value, name: str, minimum: int | None = 1, maximum: int | None = None) -> int:
    """``value`` as an ``int``, checked to be an integer in ``[minimum, maximum]``.

    ``minimum=1`` (the default) asks for a positive integer, ``minimum=0`` for a non-negative
    one, ``minimum=None`` for any integer.

    Raises
    ------
    TypeError
        If ``value`` is not an integer (``bool`` included), naming ``name``.
    ValueError
        If it is out of range, naming ``name`` and the range.
    """
    if not is_integer(value):
        raise TypeError(f"{name} must be {_integer_words(minimum, maximum)}, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {_integer_words(minimum, maximum)}, got {value!r}")
    return int(value)


def _integer_words(minimum, maximum) -> str:
    if maximum is not None:
        low = "" if minimum is None else f" >= {minimum}"
        return f"an integer{low} and <= {maximum}"
    return {1: "a positive integer", 0: "a non-negative integer", None: "an integer"}.get(
        minimum, f"an integer >= {minimum}")


def real(value, name: str, *, positive: bool = False, nonnegative: bool = False) -> float:
    """``value`` as a ``float``, checked to be a finite real (``> 0`` or ``>= 0`` on request).

    Raises
    ------
    TypeError
        If ``value`` is not a real number (``bool`` included), naming ``name``.
    ValueError
        If it is not finite or not in the requested range, naming ``name``.
    """
    words = ("a finite positive number" if positive else
             "a finite non-negative number" if nonnegative else "a finite real number")
    if not is_real(value):
        raise TypeError(f"{name} must be {words}, got {value!r}")
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64 (10**400): not finite as a float
        number = math.inf
    if not math.isfinite(number) or (positive and number <= 0) or (nonnegative and number < 0):
        raise ValueError(f"{name} must be {words}, got {value!r}")
    return number


def boolean(value, name: str) -> bool:
    """``value`` checked to be ``True`` or ``False`` (a NumPy boolean is accepted).

    Raises
    ------
    TypeError
        If ``value`` is anything else (``1``, ``"yes"``, ``None``), naming ``name``.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


def one_of(value, name: str, choices: Iterable):
    """``value`` checked to be one of ``choices`` (compared with ``==``, hashable or not).

    Raises
    ------
    ValueError
        Naming ``name``, the choices and ``value``.
    """
    choices = tuple(choices)
    if not any(_same(value, choice) for choice in choices):
        listed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {listed}; got {value!r}")
    return value


def _same(value, choice) -> bool:
    if isinstance(choice, str):
        return isinstance(value, str) and value == choice
    try:
        return bool(value is choice or (type(value) is type(choice) and value == choice))
    except (TypeError, ValueError):  # an array compared elementwise is not a choice
        return False


def renamed(**names: str):
    """Refuse the keywords ``old=new`` that 0.2 renamed, naming the new keyword.

    Without it a removed keyword meets Python's own "unexpected keyword argument", which
    never says what replaced it. The wrapped function keeps its signature and behaviour.
    """
    def decorate(function):
        @functools.wraps(function)
        def checked(*args, **kwargs):
            if kwargs:
                for old, new in names.items():
                    if old in kwargs:
                        where = function.__qualname__.replace(".__init__", "")
                        raise TypeError(f"{where}({old}=) was renamed {new}= in 0.2; "
                                        f"pass {new}=... instead")
            return function(*args, **kwargs)
        return checked
    return decorate

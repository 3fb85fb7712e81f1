r"""One-step methods for a single sub-flow :math:`u' = f(u)`, used inside splitting schemes.

A splitting scheme advances each sub-flow :math:`f_k` over a (fractional) step with a
one-step method. Three are offered:

==========  ==============================================================  =====
name        step :math:`u \mapsto u_{\text{new}}`                           order
==========  ==============================================================  =====
``euler``   :math:`u + h f(u)`                                              1
``heun``    :math:`u + \tfrac{h}{2}\big(f(u) + f(u + h f(u))\big)`          2
``rk4``     classical four-stage Runge-Kutta                                4
==========  ==============================================================  =====
"""
from __future__ import annotations

from typing import Callable

__all__ = ["SUBSTEPS", "substep_order", "check_substep", "advance"]


def _euler(f: Callable, u, h: float):
    return u + h * f(u)


def _heun(f: Callable, u, h: float):
    k1 = f(u)
    k2 = f(u + h * k1)
    return u + (0.5 * h) * (k1 + k2)


def _rk4(f: Callable, u, h: float):
    k1 = f(u)
    k2 = f(u + (0.5 * h) * k1)
    k3 = f(u + (0.5 * h) * k2)
    k4 = f(u + h * k3)
    return u + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)


SUBSTEPS: dict[str, tuple[Callable, float]] = {
    "euler": (_euler, 1.0),
    "heun": (_heun, 2.0),
    "rk4": (_rk4, 4.0),
}


def check_substep(name) -> str:
    """Validate a sub-step method name; raise ``ValueError`` listing the known ones."""
    if not isinstance(name, str) or name not in SUBSTEPS:
        raise ValueError(f"substep must be one of {', '.join(map(repr, SUBSTEPS))}, got {name!r}")
    return name


def substep_order(name: str) -> float:
    """Order of the one-step method ``name``."""
    return SUBSTEPS[check_substep(name)][1]


def advance(name: str, f: Callable, u, h: float):
    """Advance :math:`u' = f(u)` by ``h`` with the one-step method ``name``."""
    return SUBSTEPS[name][0](f, u, h)

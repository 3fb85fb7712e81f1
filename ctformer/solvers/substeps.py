r"""Sub-step methods: how a splitting scheme advances one sub-flow :math:`u' = f(u)`.

A sub-step method is a Butcher tableau of :mod:`ctformer.solvers.runge_kutta`:

==========  ==============================================================  =====
name        step :math:`u \mapsto u_{\text{new}}`                           order
==========  ==============================================================  =====
``euler``   :math:`u + h f(u)`                                              1
``heun``    :math:`u + \tfrac{h}{2}\big(f(u) + f(u + h f(u))\big)`          2
``rk4``     classical four-stage Runge-Kutta                                4
``bosh3``   Bogacki-Shampine 3(2), four stages (FSAL)                       3
``dopri5``  Dormand-Prince 5(4), seven stages (FSAL)                        5
``tsit5``   Tsitouras 5(4), seven stages (FSAL)                             5
==========  ==============================================================  =====

and any tableau added by :func:`ctformer.solvers.runge_kutta.register_tableau`.
"""
from __future__ import annotations

from typing import Callable

from ..validation import one_of
from .runge_kutta import TABLEAUS

__all__ = ["SUBSTEPS", "substep_order", "check_substep", "advance"]

#: Sub-step methods by name: the registry of Butcher tableaus itself (not a copy), so a
#: registered tableau is a sub-step method at once.
SUBSTEPS = TABLEAUS


def check_substep(name) -> str:
    """Validate a sub-step method name; raise ``ValueError`` listing the known ones."""
    return one_of(name, "substep", SUBSTEPS)


def substep_order(name: str) -> float:
    """Order of the sub-step method ``name``."""
    return SUBSTEPS[check_substep(name)].order


def advance(name: str, f: Callable, u, h: float):
    """Advance :math:`u' = f(u)` by ``h`` with the sub-step method ``name``."""
    return SUBSTEPS[name].step(f, u, h)

r"""Orders of a convergence study: the observed ones, fitted, and the one to expect.

For levels :math:`i` with mesh widths (or time steps) :math:`h_i` and errors :math:`e_i`, the
order observed between neighbours is

.. math::  p_i = \frac{\log(e_{i-1} / e_i)}{\log(h_{i-1} / h_i)}

(:func:`neighbour_orders`), and the fitted order is the least-squares slope of
:math:`\log e_i` against :math:`\log h_i` over the levels above a rounding floor
(:func:`fit_order`). These two functions are the library's one order fitter: studies, the
discretization error tables (:func:`ctformer.discretizations.error_table`) and the bridge
reports use them. They are defined with the error tables, in the lowest layer that needs them
(:mod:`ctformer.discretizations.report`), and are imported from here.

The expected order of a study is its refined method's, carried on the result
(``expected_order``), except for Galerkin elements refined in the FFN hidden variable
:math:`r`: they only ever evaluate the integral :math:`\int W_2(y, r)\, \phi(\dots)\, dr` at
their :math:`q` Gauss points per element (``gauss_points``), a composite Gauss rule of order
:math:`2q` (6 for P1, 8 for P2), not the element's :math:`L^2` order. A study without a
consistent limit has no expected order (NaN). Both :mod:`ctformer.studies.results` (the
summary) and :mod:`ctformer.studies.plotting` (the reference slopes) use
:func:`effective_order`.
"""
from __future__ import annotations

from ..discretizations.report import fit_order, neighbour_orders

__all__ = ["neighbour_orders", "fit_order", "effective_order"]


def effective_order(result) -> float:
    r"""The order a study should show: the refined method's, or :math:`2q` for a composite rule.

    Parameters
    ----------
    result : ConvergenceResult

    Returns
    -------
    float
        ``2 q`` when ``result.gauss_points`` is ``q`` (Galerkin elements refined in the hidden
        variable) and no ``result.limitation`` lowers it, else ``result.expected_order`` (``inf`` for spectral rules); NaN when the
        study has no consistent limit.
    """
    if not result.consistent_limit:
        return float("nan")
    q = result.gauss_points
    # a limitation (piecewise-constant kernels) caps the composite rule too: its expected_order
    return float(2 * q) if q and not result.limitation else float(result.expected_order)

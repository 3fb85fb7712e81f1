r"""The order a convergence study should show, for its summary and its plot.

A study refines one variable with one method; its expected order is the method's, except for
Galerkin elements refined in the FFN hidden variable :math:`r`: they only ever evaluate the
integral :math:`\int W_2(y, r)\, \phi(\dots)\, dr` at their :math:`q` Gauss points per
element, a composite Gauss rule of order :math:`2q` (6 for P1, 8 for P2), not the element's
:math:`L^2` order. A study without a consistent limit has no expected order (NaN).

Both :mod:`ctformer.studies.results` (the summary) and :mod:`ctformer.studies.plotting` (the
reference slopes) use these functions; they live here, below both, so that neither module
imports the other for them.
"""
from __future__ import annotations

__all__ = ["composite_gauss_points", "effective_order"]


def composite_gauss_points(refine: str, method: str):
    """Gauss points per element when Galerkin elements are refined in the hidden variable.

    Parameters
    ----------
    refine : str
        The refined variable (``"hidden"`` for the FFN hidden variable).
    method : str
        The study's method; its first word names the discretization.

    Returns
    -------
    int or None
        :math:`q`, or None when the study is not such a refinement.
    """
    if refine != "hidden":
        return None
    from ..discretizations import available, get

    name = method.split()[0]
    if name not in available():
        return None
    disc = get(name, 5)
    if disc.kind != "galerkin":
        return None
    return getattr(disc, "gauss_points", None)


def effective_order(result) -> float:
    r"""The order a study should show: the refined method's, or :math:`2q` for a composite rule.

    Galerkin elements refined in the FFN hidden variable :math:`r` only ever evaluate the
    integral :math:`\int W_2(y, r) \phi(\dots) dr` at their :math:`q` Gauss points per element,
    which is a composite Gauss rule of order :math:`2q` (6 for P1, 8 for P2), not the element's
    :math:`L^2` order.

    Parameters
    ----------
    result : ConvergenceResult

    Returns
    -------
    float
        ``2 q`` in that case, else ``result.expected_order`` (``inf`` for spectral rules);
        NaN when the study has no consistent limit.
    """
    if not getattr(result, "consistent_limit", True):
        return float("nan")
    q = composite_gauss_points(result.refine, result.method)
    return float(2 * q) if q else float(result.expected_order)

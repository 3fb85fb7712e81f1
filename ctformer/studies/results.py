r"""The result of a convergence study: the error table, observed orders, export and plots.

For levels :math:`i` with mesh widths (or time steps) :math:`h_i` and errors :math:`e_i`, the
order observed between neighbours is

.. math::  p_i = \frac{\log(e_{i-1} / e_i)}{\log(h_{i-1} / h_i)},

and :attr:`ConvergenceResult.observed_order` is the least-squares slope of
:math:`\log e_i` against :math:`\log h_i` over the *asymptotic levels*: the levels whose error
lies above the rounding floor :math:`10^{-12} \max(1, \|u_{\text{ref}}\|)` (below it the
error is rounding noise, e.g. a spectral method that has converged), optionally restricted to
the ``fit_levels`` finest of them. For states of a lower precision than float64 the floor is
:math:`100\,\epsilon \max(1, \|u_{\text{ref}}\|)` (:math:`1.2 \cdot 10^{-5}` in float32).

With ``reference="finest"`` the measured error is :math:`e_h - e_{\text{ref}}`; a reference only
one refinement (ratio :math:`r`) finer than the last measured level biases the last
neighbour order up to :math:`\log_r(r^p + 1)`, so make the reference several refinements finer.

What a result prints, its headline and the side-by-side :func:`comparison_table` are in
:mod:`ctformer.studies.verdicts`; the contracts that lower the expected order
(:func:`order_limits`, :func:`limited_order`) in :mod:`ctformer.studies.contracts`. Both are
importable from here too.
"""
from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .contracts import NonPeriodicDataWarning, limited_order, order_limits
from .orders import effective_order, fit_order, neighbour_orders
from .verdicts import comparison_table, headline, table_text
from ..labelled_methods import LabelledResult

__all__ = ["Row", "ConvergenceResult", "fit_order", "neighbour_orders", "comparison_table",
           "effective_order", "order_limits", "limited_order", "NonPeriodicDataWarning"]

COLUMNS = ("level", "n", "h", "error", "order", "seconds")


@dataclass(frozen=True)
class Row:
    """One level of a study.

    Attributes
    ----------
    level : int
        Index of the level, 0 for the coarsest.
    n : int
        Number of values of the refined variable, or steps per layer when refining time
        (written ``steps`` then by :meth:`ConvergenceResult.to_csv` and ``to_json``).
    h : float
        Mesh width ``length / n`` of the refined variable, or the time step ``1 / n``
        (written ``dt`` when refining time).
    error : float or None
        Error against the reference; ``None`` for the level that *is* the reference.
    order : float or None
        Order observed between this level and the previous one (``None`` on the first).
    seconds : float
        Wall time of the solve.
    """

    level: int
    n: int
    h: float
    error: float | None
    order: float | None
    seconds: float


def _write_atomic(path, data):
    """Write ``data`` (str or bytes) to ``path`` through :func:`ctformer.atomic.write_atomic`."""
    from ..atomic import write_atomic

    write_atomic(path, data)


@dataclass
class ConvergenceResult(LabelledResult):
    """Error table and observed order of a convergence study (see :func:`convergence`).

    Attributes
    ----------
    table : list of Row
        One row per level, coarsest first.
    observed_order : float
        Least-squares order over the asymptotic levels (module notes).
    expected_order : float
        The theoretical order of the refined discretization or scheme (``inf`` if spectral).
    refine : str
        ``"tokens"``, ``"features"``, ``"hidden"`` or ``"time"``.
    method : str
        The refined discretization's name, or the scheme when refining time.
    reference : str
        ``"finest"``, ``"richardson"`` or ``"exact"``.
    norm : str
        ``"l2"`` or ``"max"``.
    min_feature_std : float
        Smallest feature standard deviation :math:`\\min_x \\mathrm{std}_y\\, u(t, x, \\cdot)`
        met at the layer boundaries of all cases (LayerNorm is singular where it is small).
    wall_seconds : float
        Wall time of the whole study.
    parameters : dict
        Everything else that defines the study (discretizations, scheme, model fingerprint).
    consistent_limit : bool
        False when the refined model has no consistent limit (refining depth in a post-norm
        model whose LayerNorm has per-feature affine parameters): no expected order is
        reported then.
    gauss_points : int or None
        :math:`q` when the levels act as composite Gauss rules of order :math:`2q` (Galerkin
        elements refined in the FFN hidden variable), else None; computed once by the study
        from the refined discretization.
    limitation : str or None
        Why ``expected_order`` is below the refined rule's own order (:func:`order_limits`),
        else None.
    floor : float or None
        The rounding floor: errors at or below it are left out of ``observed_order``.
    rounding : float or None
        The unit roundoff of the solved states (``2**-23`` for float32); the summary names
        the floor when it is above float64's.
    """

    table: list
    observed_order: float
    expected_order: float
    refine: str
    method: str
    reference: str
    norm: str
    min_feature_std: float
    wall_seconds: float
    parameters: dict = field(default_factory=dict)
    consistent_limit: bool = True
    gauss_points: int | None = None
    limitation: str | None = None
    floor: float | None = None
    rounding: float | None = None

    # -- views ------------------------------------------------------------------------
    @property
    def h(self) -> np.ndarray:
        """Mesh widths (or time steps) of the levels that have an error."""
        return np.array([r.h for r in self.table if r.error is not None])

    @property
    def errors(self) -> np.ndarray:
        """Errors of the levels that have one (the reference level has none)."""
        return np.array([r.error for r in self.table if r.error is not None])

    @property
    def n(self) -> np.ndarray:
        """Sizes (or steps per layer) of the levels that have an error."""
        return np.array([r.n for r in self.table if r.error is not None])

    def reductions(self) -> list:
        """Error reduction factors :math:`e_{i-1} / e_i` between neighbouring levels.

        Returns
        -------
        list of float
            One factor per pair of neighbouring levels that both have a positive error.
        """
        e = [r.error for r in self.table]
        return [a / b for a, b in zip(e, e[1:]) if a is not None and b is not None and b > 0]

    @property
    def error_norm(self) -> str:
        """The norm of the error, ``"l2"`` or ``"max"`` (the same as :attr:`norm`)."""
        return self.norm

    @property
    def refinement(self):
        """The refined variable as a :class:`ctformer.studies.Refinement`."""
        from .refinement import as_refinement

        return as_refinement(self.refine)

    @property
    def label(self) -> str:
        """A short legend entry, e.g. ``"tokens: gauss-legendre"``."""
        return f"{self.refine}: {self.method}"

    # -- export -----------------------------------------------------------------------
    def to_dict(self) -> dict:
        """Plain-Python form (what :meth:`to_json` writes); each row's size and step are
        named as in the printed table and the CSV: ``steps``, ``dt`` when refining time,
        ``n``, ``h`` otherwise (:meth:`from_dict` reads both)."""
        def clean(x):
            return None if isinstance(x, float) and not math.isfinite(x) else x

        return {
            "refine": self.refine, "method": self.method, "reference": self.reference,
            "norm": self.norm, "observed_order": clean(self.observed_order),
            "expected_order": clean(self.expected_order),
            "consistent_limit": self.consistent_limit, "gauss_points": self.gauss_points,
            "limitation": self.limitation,
            "min_feature_std": clean(self.min_feature_std), "wall_seconds": self.wall_seconds,
            "parameters": self.parameters, "table": [self._row_dict(r) for r in self.table],
            # the floor the fit left errors out at: a float32 study read back keeps it
            "floor": clean(self.floor), "rounding": clean(self.rounding),
        }

    def _row_dict(self, row) -> dict:
        """A row as written: its size and step named as the printed table and the CSV name
        them (``steps``, ``dt`` when refining time; ``n``, ``h`` otherwise)."""
        names = {"n": self.refinement.size_name, "h": self.refinement.step_name}
        return {names.get(k, k): v for k, v in asdict(row).items()}

    @classmethod
    def from_dict(cls, data: dict) -> "ConvergenceResult":
        """The result :meth:`to_dict` wrote (or :meth:`to_json`, once parsed).

        Rows may name a level's size and step ``steps, dt`` or ``n, h`` (what files written
        before the columns followed the printed table hold, for every refined variable). An
        order written as ``null`` reads back as NaN, an expected order as infinity (JSON has
        neither; a study's expected order is missing only when it is infinite, spectral).

        Raises
        ------
        ValueError
            If a row has neither ``steps`` nor ``n``, or neither ``dt`` nor ``h``.
        """
        def number(value, missing):
            return missing if value is None else float(value)

        rows = []
        for i, row in enumerate(data["table"]):
            size = next((k for k in ("steps", "n") if k in row), None)
            step = next((k for k in ("dt", "h") if k in row), None)
            if size is None or step is None:
                raise ValueError(f"table row {i} of the study has keys {sorted(row)}; expected "
                                 "'steps' and 'dt' (or 'n' and 'h'): pass what to_dict wrote")
            rows.append(Row(level=row["level"], n=row[size], h=row[step], error=row["error"],
                            order=row["order"], seconds=row["seconds"]))
        return cls(table=rows, observed_order=number(data["observed_order"], math.nan),
                   expected_order=number(data["expected_order"], math.inf),
                   refine=data["refine"], method=data["method"], reference=data["reference"],
                   norm=data["norm"], min_feature_std=number(data["min_feature_std"], math.nan),
                   wall_seconds=data["wall_seconds"], parameters=data.get("parameters", {}),
                   consistent_limit=data.get("consistent_limit", True),
                   gauss_points=data.get("gauss_points"), limitation=data.get("limitation"),
                   floor=data.get("floor"), rounding=data.get("rounding"))

    @classmethod
    def from_json(cls, path) -> "ConvergenceResult":
        """The result :meth:`to_json` wrote to ``path`` (see :meth:`from_dict`)."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def to_json(self, path) -> Path:
        """Write :meth:`to_dict` as JSON to ``path``; returns the path."""
        path = Path(path)
        _write_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def to_csv(self, path) -> Path:
        """Write the table to ``path``: columns ``level, n, h, error, order, seconds``, named
        as the printed table names them (``level, steps, dt, ...`` when refining time)."""
        path = Path(path)
        handle = io.StringIO(newline="")
        writer = csv.writer(handle)
        writer.writerow(("level", self.refinement.size_name, self.refinement.step_name)
                        + COLUMNS[3:])
        for r in self.table:
            writer.writerow(["" if getattr(r, c) is None else repr(getattr(r, c)) if
                             isinstance(getattr(r, c), float) else getattr(r, c)
                             for c in COLUMNS])
        _write_atomic(path, handle.getvalue())
        return path

    def plot(self, path=None, *, ax=None):
        """Log-log plot of error against h with reference slopes; see :func:`plot_convergence`."""
        from .plotting import plot_convergence

        return plot_convergence([self], path=path, ax=ax)

    # -- printing ---------------------------------------------------------------------
    def __str__(self) -> str:
        return table_text(self)

    def headline(self) -> str:
        """The summary line: observed against expected order, in words where needed.

        Returns
        -------
        str
            ``"observed order 2.01 (expected 2)"``; for a spectral rule the error reduction
            per refinement instead; for Galerkin elements in the hidden variable the order of
            the composite Gauss rule they act as; without a consistent limit no expected order
            (:func:`ctformer.studies.verdicts.headline`).
        """
        return headline(self)

    def __repr__(self) -> str:
        return (f"ConvergenceResult(refine={self.refine!r}, method={self.method!r}, "
                f"levels={[r.n for r in self.table]}, observed_order={self.observed_order:.3g})")

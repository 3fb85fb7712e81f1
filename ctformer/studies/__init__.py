"""Convergence studies: refine one variable, measure errors and observed orders.

See :func:`convergence` and the user guide (``docs/studies.rst``).
"""
from .identity import model_identity
from .convergence import VARIABLES, convergence, smooth_initial_state
from .execution import CaseStore, CorruptRecordWarning, StudyInterrupted, WorkerLost, case_key, run_cases
from .plotting import plot_convergence
from .results import ConvergenceResult, Row, comparison_table, fit_order

__all__ = ["convergence", "smooth_initial_state", "model_identity", "VARIABLES",
           "ConvergenceResult", "Row", "comparison_table", "fit_order", "CaseStore", "case_key", "run_cases",
           "CorruptRecordWarning", "StudyInterrupted", "WorkerLost",
           "plot_convergence"]

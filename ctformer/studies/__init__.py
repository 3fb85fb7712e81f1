"""Convergence studies: refine one variable, measure errors and observed orders.

See :func:`convergence` and the user guide (``docs/studies.rst``).
"""
from .arguments import UnderResolvedErrorWarning
from .identity import model_identity
from .convergence import VARIABLES, convergence, smooth_initial_state
from .execution import CaseStore, CorruptRecordWarning, StudyInterrupted, WorkerLost, case_key, run_cases
from .orders import fit_order, neighbour_orders
from .plotting import plot_convergence
from .refinement import Refinement, SpaceRefinement, TimeRefinement, as_refinement
from .results import ConvergenceResult, Row, comparison_table
from .spec import StudySpec
from .tolerance import ToleranceLevel, WorkPrecision, work_precision

__all__ = ["convergence", "smooth_initial_state", "model_identity", "VARIABLES",
           "ConvergenceResult", "Row", "comparison_table", "fit_order", "neighbour_orders",
           "Refinement", "TimeRefinement", "SpaceRefinement", "as_refinement", "StudySpec",
           "CaseStore", "case_key", "run_cases", "CorruptRecordWarning", "StudyInterrupted",
           "WorkerLost", "plot_convergence", "work_precision", "WorkPrecision", "ToleranceLevel",
           "UnderResolvedErrorWarning"]

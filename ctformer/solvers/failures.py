"""How a solve ends early: Ctrl-C, the step budget, a vanishing step (each keeps what was computed)."""
from __future__ import annotations

__all__ = ["SolveInterrupted", "SolveFailed", "MaxStepsReached", "StepSizeTooSmall"]


class SolveInterrupted(KeyboardInterrupt):
    """Ctrl-C during a long solve: a :class:`KeyboardInterrupt` that keeps what was computed.

    ``str(exc)`` is one line saying when the solve stopped and what was kept; ``exc.result``
    holds it (a :class:`~ctformer.Solution`, or the caller's result type, e.g. a particle
    :class:`~ctformer.particles.Trajectory`): the saved states so far and, last, the state after
    the last completed step. Being a ``KeyboardInterrupt``, it still stops a script (and the
    ``ctformer`` command with status 130) unless caught.
    """

    def __init__(self, message: str, result):
        super().__init__(message)
        self.result = result

    def __reduce__(self):
        # the default rebuilds from ``args`` (the message) alone, and __init__ needs the result:
        # a process pool or Dask worker sends the exception back pickled
        return type(self), (str(self), self.result), self.__dict__


class SolveFailed(RuntimeError):
    """An error-controlled solve that cannot go on; ``exc.solution`` is the :class:`Solution` so far."""

    def __init__(self, message: str, solution):
        super().__init__(message)
        self.solution = solution

    def __reduce__(self):
        # as SolveInterrupted: the message and the solution so far both cross the process boundary
        return type(self), (str(self), self.solution), self.__dict__


class MaxStepsReached(SolveFailed):
    """The controller's ``max_steps`` (accepted and rejected) were spent before the end."""


class StepSizeTooSmall(SolveFailed):
    """The controller asked for a step below ``dt_min`` (default :math:`10^{-14} T`)."""

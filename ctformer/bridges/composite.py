r"""Two pieces that some converted networks need beyond :class:`~ctformer.model.Block`.

- :class:`OutputNormalized`: a sub-flow whose output is normalized before it is added,
  :math:`u \mapsto P(\mathrm{Op}(u))` (Gemma 2's ``post_attention_layernorm`` and
  ``post_feedforward_layernorm``: "sandwich" norms). With the block's pre-norm the flow is
  :math:`P(\mathrm{Op}(N u))`.
- :class:`EulerNetwork`: a network whose layer adds both sub-flows evaluated at the same
  state, :math:`u \leftarrow u + \mathrm{Attn}(N_1 u) + F(N_2 u)` (GPT-NeoX's parallel
  residual). That is the same continuous equation as the sequential pre-norm block,
  :math:`\partial_t u = \mathrm{Attn}(N_1 u) + F(N_2 u)`; the discrete network is its
  explicit Euler step (``scheme="euler"``, one step per layer), where the sequential network
  is its Lie splitting. :meth:`EulerNetwork.run` therefore solves with ``euler``.
"""
from __future__ import annotations

from ..discretizations import Midpoint
from ..model import ContinuousTransformer
from ..operators.base import Operator, check_normalization
from ..operators.functions import named_parameters
from ..validation import renamed

__all__ = ["OutputNormalized", "EulerNetwork"]


class OutputNormalized(Operator):
    r"""The operator :math:`u \mapsto P(\mathrm{Op}(u))`.

    Parameters
    ----------
    operator : Operator
        The attention or feed-forward operator.
    normalization : Normalization
        :math:`P`, applied per token to the operator's output.
    """

    def __init__(self, operator, normalization):
        self.operator = operator
        self.normalization = check_normalization(normalization, "normalization")

    def __repr__(self) -> str:
        return f"OutputNormalized({self.operator!r}, {self.normalization!r})"

    def parameters(self) -> dict:
        """The operator's parameters (``operator.*``) and the normalization's (``normalization.*``)."""
        return named_parameters(operator=self.operator, normalization=self.normalization)

    def _discretize(self, grids):
        return self._compose(self.operator.discretize(grids), grids)

    def _compose(self, flow, grids):
        project = self.normalization.discretize(grids)

        def normalized(u, **kwargs):
            return project(flow(u, **kwargs))

        return normalized

    def discretize(self, grids, padding_mask=None):
        """As the inner operator's ``discretize`` (a padding mask is passed on to it)."""
        if padding_mask is None:
            return super().discretize(grids)
        return self._compose(self.operator.discretize(grids, padding_mask=padding_mask), grids)


class EulerNetwork(ContinuousTransformer):
    """A :class:`~ctformer.ContinuousTransformer` whose discrete network is one explicit Euler
    step per layer (parallel residual): :meth:`run` solves with ``scheme="euler"``."""

    @renamed(mask="padding_mask")
    def run(self, x, padding_mask=None):
        """The discrete network: midpoint grids, ``euler``, one step per layer (see
        :meth:`ContinuousTransformer.run` for the arguments)."""
        x = self._run_input(x)
        return self.solve(x, tokens=Midpoint(x.shape[-2]), features=Midpoint(x.shape[-1]), scheme="euler",
                          steps_per_layer=1, padding_mask=padding_mask, context_length=x.shape[-2])

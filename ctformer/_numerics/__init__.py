"""The fast kernels behind the operators: how things are computed, not what.

Nothing here is public API. :mod:`ctformer.operators` holds the mathematical objects
(attention as an integral operator, feature maps, normalizations) with their docstrings and
validation; this package holds the engines they call once their inputs are known to be valid:

- :mod:`.dense`: every path of a validated quadrature-attention call (batched, streamed,
  array-API chunks), the power-of-two rescaling that keeps scores finite, zero rows for
  queries without keys;
- :mod:`.streamed`: the threaded NumPy engine of large attention problems;
- :mod:`.banded`: attention over the columns a sparse pattern reaches (sliding windows, ALiBi);
- :mod:`.compiled` and :mod:`.loops`: fused loops compiled by Numba (optional), with
  :mod:`.normal_tail`, the coefficients of the normal tail they share with the NumPy path;
- :mod:`.threads`: the worker pool, BLAS thread limits and ``CTFORMER_NUM_THREADS``;
- :mod:`.sequence_groups`: fixed-step solves of a batch, groups of whole sequences a task.

Every engine gives results that do not depend on the number of threads.
"""

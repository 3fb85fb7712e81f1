r"""Sums and products of large NumPy arrays on torch's threads, with NumPy's bits.

:math:`a + b` and :math:`a \cdot b` of floats are correctly rounded (IEEE 754) wherever they
are computed, so torch's ``add`` and ``mul`` give NumPy's bits on any number of threads.
Where torch does this machine's products (:func:`ctformer._numerics.gemm.threaded_rows`), a
network's residual sums and gated products run there: after each product torch's OpenMP
worker keeps spinning on the other core for a while (libgomp's wait policy), and a pass on
the calling thread meanwhile runs at about half its speed; torch's own team does the pass on
both cores instead. Measured on the Intel Xeon (2 vCPUs): the residual sums of a 4 x 512
float64 Llama forward took 12.7 ms instead of 25.7 ms. Smaller arrays (below
``_TORCH_MIN`` entries), other layouts or dtypes, calls inside the library's worker tasks
and machines where NumPy multiplies are computed by NumPy as before.
"""
from __future__ import annotations

import numpy as np

from .gemm import threaded_rows
from .threads import _INSIDE, num_threads
from .torch_threads import _tensor, _torch, _torch_threads

__all__ = ["add", "multiply_into"]

_TORCH_MIN = 1 << 16  # entries from which torch's call (~10 us) pays for itself


def _on_torch(a, b) -> bool:
    """Whether ``a`` and ``b`` go to torch: C-contiguous float32 / float64 NumPy arrays of
    one shape and dtype, at least ``_TORCH_MIN`` entries, outside worker tasks, torch doing
    this machine's products on its threads."""
    return (type(a) is np.ndarray and type(b) is np.ndarray and a.size >= _TORCH_MIN
            and a.shape == b.shape and a.dtype == b.dtype and a.dtype in (np.float32, np.float64)
            and a.flags.c_contiguous and b.flags.c_contiguous
            and not getattr(_INSIDE, "worker", False) and threaded_rows(a.dtype))


def add(a, b):
    """``a + b`` as a new array (NumPy's bits; torch's threads for large NumPy arrays, see the
    module); any other arrays as ``a + b``."""
    if not _on_torch(a, b):
        return a + b
    torch, out = _torch(), np.empty_like(a)
    with _torch_threads(torch, num_threads()):
        torch.add(_tensor(torch, a), _tensor(torch, b), out=_tensor(torch, out))
    return out


def multiply_into(a, b):
    """``a *= b`` for a writeable ``a`` (NumPy's bits; torch's threads for large NumPy arrays,
    see the module); returns ``a``."""
    if not (_on_torch(a, b) and a.flags.writeable):
        np.multiply(a, b, out=a)
        return a
    torch = _torch()
    with _torch_threads(torch, num_threads()):
        _tensor(torch, a).mul_(_tensor(torch, b))
    return a

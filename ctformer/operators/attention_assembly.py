r"""Assembly of the discretized constants of :class:`~ctformer.operators.attention.Attention`:
the output matrix of all heads and the namespace the constants are built in.

The output kernels :math:`W_O^h`, discretized as matrices :math:`(n_y, n_h)`, are applied as
one product with the matrix :math:`(H n_h, n_y)` whose row :math:`h n_h + s` is column
:math:`s` of head :math:`h`'s matrix,

.. math::  O_{h n_h + s,\, j} = (W_O^h)_{j s},

which is the transposed view of the heads' array when their matrices are consecutive column
blocks of one array (a converted output projection: no copy), and a new array otherwise
(``_output_matrix``). Host parameters are assembled with NumPy; tensors handed in by
``with_parameters`` in their own namespace, dtype and device, so that autograd sees the
assembly (``_assembly``).
"""
from __future__ import annotations

import array_api_compat
import numpy as np

from ..kernels import is_host

_NUMPY = array_api_compat.array_namespace(np.zeros(1))


def _root(array):
    """The array that owns the memory of the view ``array``."""
    while isinstance(getattr(array, "base", None), np.ndarray):
        array = array.base
    return array


def _output_matrix(mats) -> np.ndarray:
    """``(H n_h, n_y)``, row ``h n_h + s`` = column ``s`` of head ``h``'s ``(n_y, n_h)`` matrix.

    When the heads' matrices are consecutive column blocks of one array (the columns of a
    converted output projection), this is that array's transposed view; otherwise a copy.
    """
    first = mats[0]
    n_y, n_h = first.shape
    start, step = first.__array_interface__["data"][0], n_h * first.strides[1]
    if first.base is not None and all(
            m.shape == first.shape and m.strides == first.strides and _root(m) is _root(first)
            and m.__array_interface__["data"][0] == start + h * step for h, m in enumerate(mats)):
        full = np.lib.stride_tricks.as_strided(first, shape=(n_y, len(mats) * n_h), strides=first.strides,
                                               writeable=False)
        return full.T
    out = np.empty((len(mats) * n_h, n_y))
    for h, m in enumerate(mats):
        out[h * n_h:(h + 1) * n_h] = m.T
    return out


def _assembly(parameters: dict):
    """``(xp, on)`` for assembling the discretized constants: NumPy and the identity for host
    parameters; for tensors handed in by ``with_parameters``, their namespace and the
    conversion of a host array into it (same dtype and device), so autograd sees the
    assembly."""
    tensors = [v for v in parameters.values() if not is_host(v)]
    if not tensors:
        return _NUMPY, lambda a: a
    like = tensors[0]
    xp = array_api_compat.array_namespace(*tensors)
    device = array_api_compat.device(like)

    def on(a):
        return xp.asarray(np.asarray(a), dtype=like.dtype, device=device) if is_host(a) else a

    return xp, on

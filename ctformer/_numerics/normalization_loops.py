r"""The Numba kernel of :func:`ctformer._numerics.normalize.normalized_rows` (imported when used).

``normalize_rows`` normalizes every row of a 2-d array in one pass, with the feature
quadrature weights :math:`w_j` (summing to 1):

.. math::

    \mu = \sum_j w_j u_j \ (\text{or } 0), \qquad \sigma^2 = \sum_j w_j (u_j - \mu)^2, \qquad
    \mathrm{out}_j = \frac{u_j - \mu}{\sqrt{\sigma^2 + \varepsilon}}\, g_j + c_j,

LayerNorm with ``centre`` and RMSNorm / the sphere projection without it. Sums accumulate in
float64 (for float32 rows too). With ``centre``, a row whose :math:`\sigma^2` is at most
:math:`(\mathrm{noise} \cdot \mu)^2` (where the rounding of :math:`\mu` may be all of it)
has its mean corrected once, :math:`\mu \leftarrow \mu + \sum_j w_j (u_j - \mu)`, and
:math:`\sigma^2` summed again: the rounding of :math:`\mu` alone made a constant row of
:math:`10^{30}` normalize to :math:`\pm 1` with :math:`\varepsilon > 0`; now to exactly
:math:`c_j`. Other rows pay one comparison. The kernel refuses (returns False) a row it
cannot do without rescaling, and the caller then takes the scale-safe path, which also names a
degenerate token:

* with :math:`\varepsilon = 0`, a row whose largest entry is too large to square or too small
  to keep its variance, or whose variance is not clearly above rounding noise (relative to
  that largest entry);
* with :math:`\varepsilon > 0` the largest entry is not needed (one pass over the row less:
  about 30% of the kernel's time), and the test comes after the sums: a row is refused when
  :math:`\sigma^2` is not finite (an entry so large that its square overflows, an inf or a
  NaN) or :math:`\sigma^2 + \varepsilon` is below ``smallest`` (:math:`2^{-800}` for
  float64 rows, where squares may have underflowed; 0 for float32 rows, whose squares are
  always normal float64 numbers). Above that bound the float64 sums are accurate: an
  underflowed term is off by at most :math:`2^{-1074}`, negligible against
  :math:`\sigma^2 + \varepsilon \ge 2^{-800}`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .loops import jit, row_max

# sums of products: LLVM may reorder them ('reassoc') to vectorize; fixed when compiled
_sum_jit = njit(nogil=True, cache=True, fastmath={"contract", "reassoc"}, error_model="numpy")


@_sum_jit
def _weighted_sum(row, w):
    total = 0.0
    for j in range(row.size):
        total += np.float64(row[j]) * w[j]
    return total


@_sum_jit
def _weighted_square_sum(row, w, mean):
    total = 0.0
    for j in range(row.size):
        c = np.float64(row[j]) - mean
        total += c * c * w[j]
    return total


@_sum_jit
def _weighted_centred_sum(row, w, mean):
    total = 0.0
    for j in range(row.size):
        total += (np.float64(row[j]) - mean) * w[j]
    return total


@jit
def normalize_rows(u, w, eps, centre, gain, shift, largest, noise, smallest, out):
    """out[r] = the normalized row u[r] (``gain`` / ``shift`` of size 0: none); False, with
    ``out`` partly written, where a row needs the scale-safe path (see the module)."""
    rows, d = u.shape
    exact = eps == 0.0
    magnitude = np.empty(d if exact else 0, dtype=u.dtype)
    for r in range(rows):
        row = u[r]
        peak = 0.0
        if exact:  # the rounding-noise test needs the largest entry; so do the range tests
            for j in range(d):
                magnitude[j] = abs(row[j])
            peak = np.float64(row_max(magnitude, d)) if d else 0.0
            if peak > largest or (peak != 0.0 and peak * largest < 1.0):
                return False
        mean = _weighted_sum(row, w) if centre else 0.0
        var = _weighted_square_sum(row, w, mean)
        if centre and var <= (noise * mean) ** 2:  # the mean's rounding may be all of var: corrected once
            mean += _weighted_centred_sum(row, w, mean)
            var = _weighted_square_sum(row, w, mean)
        if exact:
            if not var > (noise * peak) ** 2:
                return False
        elif not (var < np.inf and var + eps >= smallest):  # overflow, inf or NaN; underflow
            return False
        inverse = 1.0 / np.sqrt(var + eps)
        target = out[r]
        if gain.size and shift.size:
            for j in range(d):
                target[j] = (np.float64(row[j]) - mean) * inverse * gain[j] + shift[j]
        elif gain.size:
            for j in range(d):
                target[j] = (np.float64(row[j]) - mean) * inverse * gain[j]
        elif shift.size:
            for j in range(d):
                target[j] = (np.float64(row[j]) - mean) * inverse + shift[j]
        else:
            for j in range(d):
                target[j] = (np.float64(row[j]) - mean) * inverse
    return True

r"""Checks where data enters the particle dynamics: constructor arguments and particle states.

* ``_check_beta``: a finite real :math:`\beta` (``True``, strings and complex numbers refused);
  ``_as_heads``: Q, K, V as equal-length lists of host float64 matrices, one per head (``None``
  the identity); ``_host_real``, ``_as_real_floating``: real numeric arrays.
* ``_FixedSystem``: particle systems and mean fields are values fixed at construction: what
  they compute from their parameters (multipliers, converted matrices) is cached, so setting
  an attribute afterwards is refused, and the arrays they take are copied.
* ``_ParticleChecks``: the checks of :class:`~ctformer.particles.SelfAttentionDynamics` on the
  particles :math:`x \in \mathbb{R}^{(\text{batch},)\, n \times d}`, shapes against the heads,
  weights and mask, finite entries, and at the start of a solve
  :math:`\max_i |\|x_i\| - 1| \le \sqrt{\varepsilon}` (:func:`sphere_tolerance`).
* The USA bound: on the sphere
  :math:`\log Z^h_i \le b_h = |\beta|\, \|Q_h\|_2 \|K_h\|_2 + \log\sum_j w_j` and the
  velocity is at most :math:`\sum_h e^{b_h} \|V_h\|_2`
  (``_spectral_norm``: :math:`\|A\|_2`, one for the identity); the log of the larger of
  :math:`\max_h e^{b_h}` and that sum is accepted up to 700 in float64,
  80 in float32 and 9 in float16 (``_USA_LOG_MAX``), so that :math:`Z_i = \exp(\log Z_i)`, the
  velocity and the sums of Runge-Kutta stages stay finite; beyond it, :class:`OverflowError`.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from ..backend import floating_info, to_host
from ..discretizations.base import _Fixed
from ..validation import is_real
from .sphere_geometry import _as_real_floating, _row_norms, _unit_rows, sphere_tolerance  # noqa: F401

# Largest log Z accepted for USA, by dtype size in bytes: exp(log Z) and the sums of RK stages
# stay finite (log of the largest number: 709.8, 88.7, 11.1).
_USA_LOG_MAX = {8: 700.0, 4: 80.0, 2: 9.0}


def _usa_log_max(dtype) -> float:
    """The USA bound of ``dtype``; other sizes keep the same headroom below log(max)."""
    info = floating_info(dtype)
    size = info.bits // 8
    return _USA_LOG_MAX[size] if size in _USA_LOG_MAX else 0.8 * math.log(float(info.max))


def _check_beta(beta) -> float:
    """A finite real beta; refuses bool, strings, complex and other non-reals with a TypeError."""
    if not is_real(beta):
        raise TypeError(f"beta must be a real number, got {type(beta).__name__} {beta!r}")
    if not math.isfinite(float(beta)):
        raise ValueError(f"beta must be finite, got {beta!r}")
    return float(beta)


class _FixedSystem(_Fixed):
    """A particle system or mean field: no attribute is set once ``__init__`` has returned."""

    def _refusal(self, name: str) -> str:
        kind = type(self).__name__
        return (f"{kind}.{name} cannot be set: a {kind} is fixed at construction (what it computes "
                f"from its parameters is kept, and would no longer match); build a new {kind} with "
                f"the {name} you want")


def _host_real(a, what: str) -> np.ndarray:
    """A host float64 copy of a matrix or vector argument, read-only (a later edit of the
    caller's array must not reach a system that caches what it computed from it); complex or
    non-numeric is refused."""
    host = to_host(a) if array_api_compat.is_array_api_obj(a) else np.asarray(a)
    if np.iscomplexobj(host):
        raise TypeError(f"{what} must be real, got a complex array")
    if host.dtype == bool or not (np.issubdtype(host.dtype, np.floating) or np.issubdtype(host.dtype, np.integer)):
        raise TypeError(f"{what} must be a real numeric array, got dtype {host.dtype}")
    copy = np.array(host, dtype=np.float64)
    copy.setflags(write=False)
    return copy


def _as_heads(Q, K, V):
    """Normalize Q, K, V to equal-length lists of host float64 matrices (None = identity)."""
    given = [m for m in (Q, K, V) if isinstance(m, (list, tuple))]
    heads = len(given[0]) if given else 1
    if any(len(m) != heads for m in given) or heads == 0:
        raise ValueError(
            "Q, K, V given as lists must all have the same positive length (one matrix per head), "
            f"got lengths {[len(m) for m in given]}"
        )
    out = []
    for name, mats in (("Q", Q), ("K", K), ("V", V)):
        mats = list(mats) if isinstance(mats, (list, tuple)) else [mats] * heads
        checked = []
        for h, a in enumerate(mats):
            if a is None:
                checked.append(None)
                continue
            a = _host_real(a, f"{name}[{h}]")
            if a.ndim != 2 or not np.all(np.isfinite(a)):
                raise ValueError(f"{name}[{h}] must be a finite 2-D matrix, got shape {a.shape}")
            checked.append(a)
        out.append(checked)
    for h, (q, k, v) in enumerate(zip(*out)):
        rows_q = None if q is None else q.shape[0]
        rows_k = None if k is None else k.shape[0]
        if rows_q is not None and rows_k is not None and rows_q != rows_k:
            raise ValueError(f"Q[{h}] and K[{h}] must have the same number of rows, got {q.shape} and {k.shape}")
        if v is not None and v.shape[0] != v.shape[1]:
            raise ValueError(f"V[{h}] must be square (d, d), got shape {v.shape}")
    return out


def _spectral_norm(a) -> float:
    return 1.0 if a is None else float(np.linalg.norm(a, 2))


class _ParticleChecks:
    """The checks of :class:`SelfAttentionDynamics` on particle states (reads its ``beta``, ``Q``,
    ``K``, ``V``, ``heads``, ``normalized``, ``weights`` and ``_mask_host``)."""

    # -- checks (where data enters: velocity, step, solve) ------------------------------------
    def _check_particles(self, x, what="x"):
        xp = array_api_compat.array_namespace(x)
        if x.ndim not in (2, 3):
            raise ValueError(f"{what} must have shape (n, d) or (batch, n, d), got shape {tuple(x.shape)}")
        n, d = x.shape[-2], x.shape[-1]
        if d < 2 or n < 1:
            raise ValueError(f"need at least one particle in dimension d >= 2, got n={n}, d={d}")
        if x.ndim == 3 and x.shape[0] == 0:
            raise ValueError(f"{what} of shape (batch, n, d) needs batch >= 1 systems, got shape "
                             f"{tuple(x.shape)}")
        for h in range(self.heads):
            for name, a in (("Q", self.Q[h]), ("K", self.K[h]), ("V", self.V[h])):
                if a is not None and a.shape[1] != d:
                    raise ValueError(f"{name}[{h}] has shape {a.shape}; it must have {d} columns (particle dimension d={d})")
            if (self.Q[h] is None) != (self.K[h] is None):
                a = self.Q[h] if self.Q[h] is not None else self.K[h]
                if a.shape[0] != d:
                    raise ValueError(f"Q[{h}] and K[{h}] must have the same number of rows; one is the identity (d={d}), the other has shape {a.shape}")
        if self.weights is not None and self.weights.shape[0] != n:
            raise ValueError(f"weights has length {self.weights.shape[0]}, but there are n={n} particles")
        if self.weights is not None and type(x) is not np.ndarray:
            # other namespaces get the weights in x's dtype, divided by the largest (NumPy
            # states keep them in float64): a ratio below the dtype's range would become 0
            spread = float(np.min(self.weights) / np.max(self.weights))
            tiny = float(floating_info(x.dtype).tiny)
            if spread < tiny:
                raise ValueError(
                    f"weights span a ratio min/max = {spread:.3g}, below the smallest normal "
                    f"{x.dtype} number {tiny:.3g}: the smallest would count as zero; pass float64 "
                    "or NumPy states, or drop the negligible tokens")
        if self._mask_host is not None and tuple(self._mask_host.shape) != (n, n):
            raise ValueError(f"mask must have shape ({n}, {n}), got {tuple(self._mask_host.shape)}")
        if self._mask_host is not None and not np.all(np.any(self._mask_host, axis=-1)):
            raise ValueError("the mask removes every token for some particle; each row needs one True")
        if not self.normalized:
            bound, limit = self._usa_log_bound(), _usa_log_max(x.dtype)
            if bound > limit:
                raise OverflowError(
                    f"USA (normalized=False) velocities are of size sum_h Z_h |V_h| with "
                    f"Z_h <= exp(beta <Q_h x, K_h x>): up to exp({bound:.1f}), beyond the {x.dtype} "
                    f"range (log bound {limit}); use the normalized dynamics (SA), a smaller beta "
                    "or smaller V, or rescale time"
                )
        return xp

    def _usa_log_bound(self) -> float:
        r"""The log of a bound on each :math:`Z^h_i` and on the USA velocity,
        :math:`|\dot x_i| \le \sum_h Z^h_i \|V_h\|_2`, with
        :math:`\log Z^h_i \le |\beta|\,\|Q_h\|_2\|K_h\|_2 + \log\sum_j w_j`."""
        total_w = 1.0 if self.weights is None else float(np.sum(self.weights))
        logs = [abs(self.beta) * _spectral_norm(self.Q[h]) * _spectral_norm(self.K[h]) + math.log(total_w)
                for h in range(self.heads)]
        top = max(logs)
        # the velocity: the values scale Z_h, and the heads add up
        size = sum(math.exp(b - top) * _spectral_norm(v) for b, v in zip(logs, self.V))
        return max(top, top + math.log(size)) if size > 0 else top

    def _checked(self, x, what="x"):
        x = _as_real_floating(x, what)
        xp = self._check_particles(x, what)
        if not bool(xp.all(xp.isfinite(x))):
            raise ValueError(f"{what} contains NaN or infinite entries")
        return xp, x

    def _initial(self, x0, normalize):
        """Validate ``x0`` once (shape, dtype, finite, on the sphere) and normalize it if asked."""
        x0 = _as_real_floating(x0, "x0")
        xp = self._check_particles(x0, "x0")
        if not bool(xp.all(xp.isfinite(x0))):
            raise ValueError("x0 contains NaN or infinite entries")
        norm = _row_norms(xp, x0)
        if normalize:
            if not bool(xp.all(norm > 0)):
                flat = to_host(xp.reshape(norm, (-1,)))
                raise ValueError(f"x0 has a zero row (row {int(np.argmin(flat))} of the flattened "
                                 "(..., n) rows is exactly zero); it cannot be normalized onto the sphere")
            return xp, _unit_rows(xp, x0)
        gap = float(xp.max(xp.abs(norm - 1.0)))
        tol = sphere_tolerance(x0.dtype)
        if gap > tol:
            raise ValueError(
                f"x0 is not on the unit sphere (max | |x_i| - 1 | = {gap:.3g} > {tol:.2g}, the "
                f"tolerance sqrt(eps) of {x0.dtype}); normalize it or pass normalize=True"
            )
        return xp, x0

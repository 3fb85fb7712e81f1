r"""Tokens as interacting particles on the unit sphere (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025).

Particles :math:`x_1, \dots, x_n \in S^{d-1}` with token weights :math:`w_j` (default
:math:`1/n`) move with the self-attention velocity projected on the tangent space,

.. math::

    \dot x_i = P^\perp_{x_i}\Big(\sum_{h=1}^{H} A^h_i\Big), \qquad
    P^\perp_x y = y - \langle x, y\rangle x,

where for the normalized dynamics (SA)

.. math::

    A^h_i = \frac{\sum_j w_j m_{ij} e^{\beta \langle Q_h x_i, K_h x_j\rangle} V_h x_j}
                 {\sum_k w_k m_{ik} e^{\beta \langle Q_h x_i, K_h x_k\rangle}}

and for the unnormalized dynamics (USA) the denominator
:math:`Z^h_i = \sum_k w_k m_{ik} e^{\beta \langle Q_h x_i, K_h x_k\rangle}` is dropped,
:math:`A^h_i = Z^h_i \cdot (\text{SA})^h_i`. With :math:`Q = K = V = I` and uniform weights,
USA is the gradient ascent of the interaction energy
:math:`E_\beta = \frac{1}{2\beta}\sum_{ij} w_i w_j e^{\beta\langle x_i, x_j\rangle}`
(for the metric weighted by :math:`w_i`).

The SA term is :func:`ctformer.operators.quadrature_attention` (log-sum-exp, so finite for
any finite :math:`\beta`). The USA factor :math:`Z_i` is computed as
:math:`\exp(\log Z_i)` with :math:`\log Z_i` from :func:`log_partition`, which never overflows;
:math:`Z_i` itself is representable only while :math:`\log Z_i` stays below
:math:`\log(\text{float max}) \approx 709.8` in float64. On the sphere
:math:`\log Z_i \le |\beta| \, \|Q_h\|_2 \|K_h\|_2 + \log\sum_j w_j`, so USA is accepted when this
bound is at most 700 (float64; 80 in float32) and refused with :class:`OverflowError` otherwise.

Time stepping: explicit Euler, Heun or classical RK4 on the ambient ODE (whose exact flow keeps
the sphere invariant), each step followed by the retraction :math:`x \mapsto x / \|x\|`.
A projection method keeps the order of the underlying scheme (1, 2, 4).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import array_api_compat
import numpy as np

from ..backend import backend_of
from ..operators.quadrature_attention import quadrature_attention

__all__ = ["SelfAttentionDynamics", "Trajectory", "log_partition", "tangent_projection", "retract"]

_CHUNK_ELEMENTS = 1 << 20
_SCHEMES = ("euler", "heun", "rk4")
# |norm - 1| accepted for an initial condition "on the sphere" without normalize=True.
_SPHERE_TOL = 1e-8
# Largest log Z accepted for USA, by dtype: exp(log Z) and the sums of RK stages stay finite.
_USA_LOG_MAX = {8: 700.0, 4: 80.0}


@dataclass
class Trajectory:
    r"""Saved states of a particle simulation.

    Attributes
    ----------
    times : numpy.ndarray, shape (T,)
        Saved times, the first 0 and the last ``t1``.
    positions : array, shape (T, n, d) or (T, batch, n, d)
        Positions on the sphere at ``times`` (same array library as the initial condition).
    """

    times: np.ndarray
    positions: object

    @property
    def final(self):
        """Positions at the last saved time."""
        return self.positions[-1]

    def __len__(self) -> int:
        return len(self.times)


def tangent_projection(x, y):
    r"""Project ``y`` on the tangent space of the sphere at ``x``.

    .. math::  P^\perp_x y = y - \langle x, y\rangle x.

    Parameters
    ----------
    x, y : array, shape (..., d)

    Returns
    -------
    array, shape (..., d)
    """
    xp = array_api_compat.array_namespace(x, y)
    return y - xp.sum(x * y, axis=-1, keepdims=True) * x


def retract(x):
    r"""The retraction onto the unit sphere, :math:`x \mapsto x / \|x\|` along the last axis.

    Raises
    ------
    ValueError
        If some vector has zero norm.
    """
    xp = array_api_compat.array_namespace(x)
    norm = xp.sqrt(xp.sum(x * x, axis=-1, keepdims=True))
    if not bool(xp.all(norm > 0)):
        raise ValueError("cannot project a zero vector onto the sphere")
    return x / norm


def log_partition(q, k, *, beta, weights=None, mask=None, chunk=None):
    r"""The log of the attention normalizer, computed stably.

    .. math::

        \log Z_i = \log \sum_j w_j m_{ij} \exp(\beta\, q_i \cdot k_j)
                 = s^\ast_i + \log \sum_j \exp(\beta\, q_i\cdot k_j + \log w_j - s^\ast_i),

    with :math:`s^\ast_i` the row maximum of the exponent (log-sum-exp), in chunks of query rows.

    Parameters
    ----------
    q : array, shape (..., N, m)
    k : array, shape (..., M, m)
    beta : float
        Finite inverse temperature.
    weights : array, shape (M,), optional
        Positive token weights; default :math:`w_j = 1/M`.
    mask : None, "causal" or bool array broadcasting to (..., N, M)
        Entries kept (``"causal"``: :math:`j \le i`).
    chunk : int, optional
        Query rows per block (default: about a million scores per block).

    Returns
    -------
    array, shape (..., N)
        Finite for every finite input (no overflow at large :math:`\beta`).

    Raises
    ------
    ValueError
        For a non-finite ``beta``, bad weights or a bad mask.
    """
    xp = array_api_compat.array_namespace(q, k)
    beta = _check_beta(beta)
    n, m = q.shape[-2], k.shape[-2]
    if weights is None:
        log_w = -math.log(m)
    else:
        w = xp.asarray(weights, dtype=q.dtype)
        if w.ndim != 1 or w.shape[0] != m:
            raise ValueError(f"weights must have shape ({m},), got {tuple(w.shape)}")
        if not bool(xp.all(w > 0)) or not bool(xp.all(xp.isfinite(w))):
            raise ValueError("weights must be positive and finite")
        log_w = xp.log(w)
    keep = None
    causal = isinstance(mask, str)
    if causal:
        if mask != "causal" or n != m:
            raise ValueError(f"mask must be None, 'causal' (square) or a boolean array, got {mask!r}")
    elif mask is not None:
        keep = xp.asarray(mask)
    if chunk is None:
        batch = math.prod(q.shape[:-2]) or 1
        chunk = max(1, min(n, _CHUNK_ELEMENTS // max(1, m * batch)))
    kt = xp.matrix_transpose(k)
    cols = xp.arange(m)
    blocks = []
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        s = (q[..., start:stop, :] @ kt) * beta + log_w
        if causal:
            s = xp.where(cols[None, :] <= xp.arange(start, stop)[:, None], s, -xp.inf)
        elif keep is not None:
            s = xp.where(keep[..., start:stop, :], s, -xp.inf)
        s_max = xp.max(s, axis=-1, keepdims=True)
        blocks.append(s_max[..., 0] + xp.log(xp.sum(xp.exp(s - s_max), axis=-1)))
    return xp.concat(blocks, axis=-1) if len(blocks) > 1 else blocks[0]


def _check_beta(beta) -> float:
    if isinstance(beta, bool) or not isinstance(beta, (int, float, np.integer, np.floating)):
        raise TypeError(f"beta must be a real number, got {type(beta).__name__}")
    if not math.isfinite(float(beta)):
        raise ValueError(f"beta must be finite, got {beta!r}")
    return float(beta)


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
            a = np.asarray(backend_of(a).asnumpy(a) if array_api_compat.is_array_api_obj(a) else a,
                           dtype=np.float64)
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


class SelfAttentionDynamics:
    r"""Self-attention dynamics of tokens on the unit sphere, (SA) or (USA).

    .. math::

        \dot x_i = P^\perp_{x_i}\Big(\sum_h \frac{\sum_j w_j m_{ij} e^{\beta\langle Q_h x_i, K_h x_j\rangle} V_h x_j}
        {\sum_k w_k m_{ik} e^{\beta\langle Q_h x_i, K_h x_k\rangle}}\Big)

    (SA, ``normalized=True``) or the same without the denominator (USA).

    Parameters
    ----------
    beta : float
        Inverse temperature, finite.
    Q, K : None, array (m, d) or list of them, optional
        Query and key matrices, one per head; ``None`` is the identity (then m = d).
    V : None, array (d, d) or list of them, optional
        Value matrices; ``None`` is the identity.
    normalized : bool
        True for SA, False for USA.
    mask : None, "causal" or bool array (n, n)
        Attention mask; ``"causal"``: token i sees tokens j <= i.
    weights : array (n,), optional
        Positive token weights :math:`w_j`; default :math:`1/n`.

    Raises
    ------
    ValueError
        For a non-finite ``beta``, inconsistent Q, K, V shapes, a bad mask or bad weights;
        for a dimension mismatch with the particles at :meth:`velocity` / :meth:`solve`.
    OverflowError
        USA whose normalizer :math:`Z_i` could exceed the floating-point range (see the module
        notes: :math:`|\beta|\,\|Q_h\|_2\|K_h\|_2 + \log\sum_j w_j \le 700` in float64).

    Notes
    -----
    Several heads add up their (projected) velocities. Arrays (NumPy or CuPy) keep the library
    of the initial condition; matrices are moved to the device once and cached.
    """

    def __init__(self, beta, Q=None, K=None, V=None, normalized=True, mask=None, weights=None):
        self.beta = _check_beta(beta)
        self.Q, self.K, self.V = _as_heads(Q, K, V)
        self.heads = len(self.Q)
        self.normalized = bool(normalized)
        if isinstance(mask, str):
            if mask != "causal":
                raise ValueError(f"mask must be None, 'causal' or a boolean (n, n) array, got {mask!r}")
        elif mask is not None:
            if not array_api_compat.is_array_api_obj(mask):
                mask = np.asarray(mask)
            if mask.dtype != array_api_compat.array_namespace(mask).bool or mask.ndim != 2:
                raise ValueError("a mask array must be a boolean (n, n) array")
        self.mask = mask
        if weights is not None:
            w = backend_of(weights).asnumpy(weights) if array_api_compat.is_array_api_obj(weights) else weights
            w = np.asarray(w, dtype=np.float64)
            if w.ndim != 1 or not np.all(np.isfinite(w)) or not np.all(w > 0):
                raise ValueError("weights must be a 1-D array of positive finite numbers")
            weights = w
        self.weights = weights

    def __repr__(self) -> str:
        kind = "SA" if self.normalized else "USA"
        return f"SelfAttentionDynamics({kind}, beta={self.beta}, heads={self.heads}, mask={self.mask!r})"

    # -- checks ------------------------------------------------------------------------------
    def _check_particles(self, x):
        xp = array_api_compat.array_namespace(x)
        if x.ndim not in (2, 3):
            raise ValueError(f"x must have shape (n, d) or (batch, n, d), got shape {tuple(x.shape)}")
        n, d = x.shape[-2], x.shape[-1]
        if d < 2 or n < 1:
            raise ValueError(f"need at least one particle in dimension d >= 2, got n={n}, d={d}")
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
        if self.mask is not None and not isinstance(self.mask, str) and tuple(self.mask.shape) != (n, n):
            raise ValueError(f"mask must have shape ({n}, {n}), got {tuple(self.mask.shape)}")
        if not self.normalized:
            total_w = 1.0 if self.weights is None else float(np.sum(self.weights))
            bound = max(
                abs(self.beta) * _spectral_norm(self.Q[h], d) * _spectral_norm(self.K[h], d) for h in range(self.heads)
            ) + math.log(total_w)
            limit = _USA_LOG_MAX.get(xp.finfo(x.dtype).bits // 8, 700.0)
            if bound > limit:
                raise OverflowError(
                    f"USA (normalized=False) velocities are of size exp(beta <Qx, Kx>) <= exp({bound:.1f}), "
                    f"beyond the {x.dtype} range (log bound {limit}); use the normalized dynamics (SA), "
                    "a smaller beta, or rescale time"
                )
        return xp

    def _device(self, x, which, h):
        """Transposed matrix ``which[h]`` on the device of x (cached), or None for the identity."""
        a = getattr(self, which)[h]
        if a is None:
            return None
        dtype = np.dtype(str(x.dtype).split(".")[-1])
        return backend_of(x).cached(self, (which, h, dtype.str), lambda: np.ascontiguousarray(a.T, dtype=dtype))

    # -- the vector field --------------------------------------------------------------------
    def velocity(self, x):
        r"""The tangent velocity :math:`\dot x_i` at positions ``x``.

        Parameters
        ----------
        x : array, shape (n, d) or (batch, n, d)

        Returns
        -------
        array, same shape as ``x``
        """
        xp = self._check_particles(x)
        return self._velocity(xp, x)

    def _velocity(self, xp, x):
        backend = backend_of(x)
        weights = None
        if self.weights is not None:  # moved to the device once, not at every step
            dtype = np.dtype(str(x.dtype).split(".")[-1])
            weights = backend.cached(self, ("weights", dtype.str), lambda: self.weights.astype(dtype))
        mask = self.mask
        if mask is not None and not isinstance(mask, str):
            mask = backend.cached(self, "mask", lambda: np.asarray(backend_of(self.mask).asnumpy(self.mask)))
        total = None
        for h in range(self.heads):
            qt, kt, vt = (self._device(x, name, h) for name in ("Q", "K", "V"))
            q = x if qt is None else x @ qt
            k = x if kt is None else x @ kt
            v = x if vt is None else x @ vt
            a = quadrature_attention(q, k, v, beta=self.beta, weights=weights, mask=mask)
            if not self.normalized:
                log_z = log_partition(q, k, beta=self.beta, weights=weights, mask=mask)
                a = xp.exp(log_z)[..., None] * a
            total = a if total is None else total + a
        return tangent_projection(x, total)

    # -- time stepping -----------------------------------------------------------------------
    def step(self, x, dt, scheme="rk4"):
        r"""One step of ``scheme`` followed by the retraction onto the sphere.

        Parameters
        ----------
        x : array, shape (n, d) or (batch, n, d)
            Positions on the sphere.
        dt : float
            Time step.
        scheme : {"euler", "heun", "rk4"}

        Returns
        -------
        array
            :math:`x_{k+1} = \Phi_{\Delta t}(x_k) / \|\Phi_{\Delta t}(x_k)\|`.
        """
        xp = self._check_particles(x)
        if scheme not in _SCHEMES:
            raise ValueError(f"scheme must be one of {_SCHEMES}, got {scheme!r}")
        return self._step(xp, x, float(dt), scheme)

    def _step(self, xp, x, dt, scheme):
        f = lambda y: self._velocity(xp, y)  # noqa: E731
        k1 = f(x)
        if scheme == "euler":
            y = x + dt * k1
        elif scheme == "heun":
            k2 = f(x + dt * k1)
            y = x + (dt / 2) * (k1 + k2)
        else:
            k2 = f(x + (dt / 2) * k1)
            k3 = f(x + (dt / 2) * k2)
            k4 = f(x + dt * k3)
            y = x + (dt / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
        norm = xp.sqrt(xp.sum(y * y, axis=-1, keepdims=True))
        return y / norm

    def solve(self, x0, t1, dt, scheme="rk4", save_every=1, normalize=False):
        r"""Integrate from :math:`t = 0` to ``t1``.

        Parameters
        ----------
        x0 : array, shape (n, d) or (batch, n, d)
            Initial positions (NumPy or CuPy); integers and lists become float64, floating
            arrays keep their dtype. Each row must have unit norm (to within 1e-8) unless
            ``normalize=True``, which divides each row by its norm first.
        t1 : float
            Final time, >= 0.
        dt : float
            Largest time step; the step used is ``t1 / ceil(t1 / dt)`` so that the last step
            ends exactly at ``t1``.
        scheme : {"euler", "heun", "rk4"}
            Explicit Euler (order 1), Heun (2) or classical Runge-Kutta (4), each step followed
            by the retraction :math:`x \mapsto x/\|x\|`.
        save_every : int
            Save every ``save_every``-th step (the final state is always saved).
        normalize : bool
            Project ``x0`` onto the sphere instead of rejecting it.

        Returns
        -------
        Trajectory
            ``.times`` (host array) and ``.positions`` (array of shape (T, ...) + x0.shape).

        Raises
        ------
        ValueError
            For ``x0`` off the sphere (without ``normalize``), with NaN or of the wrong shape,
            a bad ``t1``, ``dt``, ``scheme`` or ``save_every``.
        FloatingPointError
            If the solution becomes non-finite.
        """
        if not array_api_compat.is_array_api_obj(x0):
            x0 = np.asarray(x0, dtype=np.float64)
        xp = array_api_compat.array_namespace(x0)
        if not xp.isdtype(x0.dtype, "real floating"):
            x0 = xp.asarray(x0, dtype=xp.float64)
        xp = self._check_particles(x0)
        if not bool(xp.all(xp.isfinite(x0))):
            raise ValueError("x0 contains NaN or infinite entries")
        norm = xp.sqrt(xp.sum(x0 * x0, axis=-1, keepdims=True))
        if normalize:
            if not bool(xp.all(norm > 0)):
                raise ValueError("x0 has a zero row; it cannot be normalized onto the sphere")
            x0 = x0 / norm
        elif float(xp.max(xp.abs(norm - 1.0))) > _SPHERE_TOL:
            raise ValueError(
                f"x0 is not on the unit sphere (max | |x_i| - 1 | = {float(xp.max(xp.abs(norm - 1.0))):.3g}); "
                "normalize it or pass normalize=True"
            )
        if scheme not in _SCHEMES:
            raise ValueError(f"scheme must be one of {_SCHEMES}, got {scheme!r}")
        steps, h = time_steps(t1, dt, save_every)
        times, saved = [0.0], [x0]
        x = x0
        for s in range(1, steps + 1):
            x = self._step(xp, x, h, scheme)
            if s % save_every == 0 or s == steps:
                times.append(s * h)
                saved.append(x)
        positions = xp.stack(saved, axis=0)
        if not bool(xp.all(xp.isfinite(positions[-1]))):
            raise FloatingPointError("the particle solution became non-finite; reduce dt")
        return Trajectory(times=np.asarray(times), positions=positions)


def _spectral_norm(a, d) -> float:
    return 1.0 if a is None else float(np.linalg.norm(a, 2))


def time_steps(t1, dt, save_every) -> tuple[int, float]:
    """Validate a uniform time grid on ``[0, t1]``; return the step count and the exact step.

    The step is ``t1 / ceil(t1 / dt)`` (at most ``dt``) so that the last step lands on ``t1``.
    """
    t1, dt = float(t1), float(dt)
    if not (math.isfinite(t1) and t1 >= 0):
        raise ValueError(f"t1 must be finite and >= 0, got {t1}")
    if not (math.isfinite(dt) and dt > 0):
        raise ValueError(f"dt must be finite and > 0, got {dt}")
    if isinstance(save_every, bool) or not isinstance(save_every, (int, np.integer)) or save_every < 1:
        raise ValueError(f"save_every must be a positive integer, got {save_every!r}")
    steps = math.ceil(t1 / dt * (1 - 1e-12)) if t1 > 0 else 0
    return steps, (t1 / steps if steps else 0.0)

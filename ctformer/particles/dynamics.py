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
:math:`\log Z^h_i \le b_h = |\beta| \, \|Q_h\|_2 \|K_h\|_2 + \log\sum_j w_j` and
:math:`|\dot x_i| \le \sum_h e^{b_h} \|V_h\|_2`, so USA is accepted when the log of the larger
of :math:`\max_h e^{b_h}` and that sum is at most 700 (float64; 80 in float32) and refused with
:class:`OverflowError` otherwise.

Time stepping: the particle system is a :class:`ctformer.solvers.SplitProblem` with one flow
(the tangent velocity) and one projection (the retraction :math:`x \mapsto x / \|x\|` after
each sub-step), run by any scheme of :func:`ctformer.solvers.available` (design notes,
section 5). The exact flow of the ambient ODE keeps the sphere invariant, so the projection
method keeps the order of the scheme: ``euler``, ``lie`` and ``parallel`` 1 (with one flow
``lie`` and ``parallel`` are explicit Euler), ``heun`` and ``strang`` 2 (one flow: Strang is
its Heun sub-step), ``rk4`` 4.

The retraction and every normalization here are scale-safe: each row is divided by its
largest absolute entry before it is squared, so :math:`N(c x) = N(x)` to rounding for every
representable :math:`c > 0` (no overflow at :math:`10^{155}`, no underflow at :math:`10^{-160}`).
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from .. import solvers
from ..backend import constant, floating_info, to_host
from ..validation import boolean
from .timegrid import (SolveInterrupted, Trajectory, check_memory, evolve_on, march,
                       restart_of,
                       saved_count, time_steps)
from ..operators.quadrature_attention import quadrature_attention
from .._numerics import particles as _fused
from .partition import _CHUNK_ELEMENTS, _log_partition, log_partition
from .particle_checks import _FixedSystem, _ParticleChecks, _as_heads, _check_beta, _host_real, _spectral_norm
from .sphere_geometry import _tangent_rows, _unit_rows, retract, sphere_tolerance, tangent_projection
# Moved to partition, particle_checks and sphere_geometry; importable from here as before.
from .particle_checks import _USA_LOG_MAX, _as_real_floating  # noqa: F401
from .sphere_geometry import _row_norms, _row_scale  # noqa: F401
from ..solvers.controller import DEFAULT_ATOL, DEFAULT_MAX_STEPS, DEFAULT_RTOL

__all__ = ["SelfAttentionDynamics", "Trajectory", "SolveInterrupted", "log_partition",
           "tangent_projection", "retract", "sphere_tolerance"]


class SelfAttentionDynamics(_ParticleChecks, _FixedSystem):
    r"""Self-attention dynamics of tokens on the unit sphere, (SA) or (USA).

    .. math::

        \dot x_i = P^\perp_{x_i}\Big(\sum_h \frac{\sum_j w_j m_{ij} e^{\beta\langle Q_h x_i, K_h x_j\rangle} V_h x_j}
        {\sum_k w_k m_{ik} e^{\beta\langle Q_h x_i, K_h x_k\rangle}}\Big)

    (SA, ``normalized=True``) or the same without the denominator (USA).

    Parameters
    ----------
    beta : float
        Inverse temperature, finite (``True``, ``"1"`` or complex numbers are refused).
    Q, K : None, array (m, d) or list of them, optional
        Query and key matrices, one per head; ``None`` is the identity (then m = d).
    V : None, array (d, d) or list of them, optional
        Value matrices; ``None`` is the identity.
    normalized : bool
        True for SA, False for USA.
    mask : None, "causal" or bool array (n, n)
        Attention mask; ``"causal"``: token i sees tokens j <= i.
    weights : array (n,), optional
        Positive token weights :math:`w_j`; default :math:`1/n`. SA depends on their ratios
        only, USA on :math:`\log w_j`: both are taken from the float64 values, so weights
        beyond the state's range (1e-50 or 1e50 with float32 states) count as given.

    Raises
    ------
    TypeError
        For a ``beta`` that is not a real number, complex or non-numeric matrices or weights, or
        a ``normalized`` other than True or False.
    ValueError
        For a non-finite ``beta``, inconsistent Q, K, V shapes, a bad mask or bad weights;
        for a dimension mismatch with the particles at :meth:`velocity` / :meth:`solve`, and
        for states other than NumPy arrays (torch, CuPy) whose dtype cannot hold the ratio
        :math:`\min_j w_j / \max_j w_j` (below its smallest normal number).
    OverflowError
        USA whose normalizer :math:`Z_i` or velocity could exceed the floating-point range (see
        the module notes: :math:`|\beta|\,\|Q_h\|_2\|K_h\|_2 + \log\sum_j w_j`, plus
        :math:`\log\sum_h \|V_h\|_2` where the values enlarge, at most 700 in float64).

    Notes
    -----
    Several heads add up their (projected) velocities. Arrays (NumPy, CuPy, ...) keep the
    library, device and dtype of the initial condition; matrices, weights and the mask reach
    it through :func:`ctformer.backend.constant` (converted once, cached).
    """

    def __init__(self, beta, Q=None, K=None, V=None, normalized=True, mask=None, weights=None):
        self.beta = _check_beta(beta)
        self.Q, self.K, self.V = _as_heads(Q, K, V)
        self.heads = len(self.Q)
        self.normalized = boolean(normalized, "normalized")  # bool("False") would be SA
        self._mask_host = None
        if isinstance(mask, str):
            if mask != "causal":
                raise ValueError(f"mask must be None, 'causal' or a boolean (n, n) array, got {mask!r}")
        elif mask is not None:
            host = np.array(to_host(mask) if array_api_compat.is_array_api_obj(mask) else mask)
            if host.dtype != bool or host.ndim != 2:
                raise ValueError("a mask array must be a boolean (n, n) array")
            host.setflags(write=False)  # a copy: the caller's later edits do not reach it
            self._mask_host = mask = host
        self.mask = mask
        if weights is not None:
            w = _host_real(weights, "weights")
            if w.ndim != 1 or not np.all(np.isfinite(w)) or not np.all(w > 0):
                raise ValueError("weights must be a 1-D array of positive finite numbers")
            weights = w
        self.weights = weights

    def __repr__(self) -> str:
        kind = "SA" if self.normalized else "USA"
        return f"SelfAttentionDynamics({kind}, beta={self.beta}, heads={self.heads}, mask={self.mask!r})"

    # -- the vector field --------------------------------------------------------------------
    def _flow(self, like):
        """The velocity ``x -> dx/dt`` for states like ``like``, without checks.

        Matrices, weights and mask are converted to the namespace, device and dtype of ``like``
        once here (cached per instance by :func:`ctformer.backend.constant`), not per call.
        """
        xp = array_api_compat.array_namespace(like)
        n = like.shape[-2]
        weights, log_w = self._weight_terms(like, n)
        mask = self.mask if isinstance(self.mask, str) or self.mask is None else None
        if self._mask_host is not None:
            flag = xp.zeros((1,), dtype=xp.bool, device=array_api_compat.device(like))
            mask = constant(self, "mask", self._mask_host, flag)
        mats = []
        for h in range(self.heads):
            mats.append(tuple(
                None if a is None else constant(self, (name, h), (lambda a=a: np.ascontiguousarray(a.T)), like)
                for name, a in (("Q", self.Q[h]), ("K", self.K[h]), ("V", self.V[h]))
            ))
        beta = self.beta
        usa = not self.normalized
        # Validated at entry; the unchecked attention path needs scores and sums far from
        # overflow: on the sphere |beta <Q x, K y>| <= |beta| |Q| |K| and |V x| <= |V|.
        big = float(floating_info(like.dtype).max) / (8.0 * n * like.shape[-1])
        check = not all(abs(beta) * _spectral_norm(self.Q[h]) * _spectral_norm(self.K[h]) < big
                        and _spectral_norm(self.V[h]) < big for h in range(self.heads))
        chunk = max(1, min(n, _CHUNK_ELEMENTS // max(1, n * (math.prod(like.shape[:-2]) or 1))))
        if self.heads == 1 and all(a is None for a in mats[0]) and mask is None and not check:
            fused = _fused.fused_velocity(like, beta, -math.log(n) if self.weights is None
                                          else np.log(self.weights), self.normalized)
            if fused is not None:  # many small systems: one compiled pass per particle
                return fused

        def velocity(x):
            total = None
            for qt, kt, vt in mats:
                q = x if qt is None else x @ qt
                k = x if kt is None else x @ kt
                v = x if vt is None else x @ vt
                a = quadrature_attention(q, k, v, beta=beta, weights=weights, mask=mask, check=check)
                if usa:
                    a = xp.exp(_log_partition(xp, q, k, beta, log_w, mask, chunk))[..., None] * a
                total = a if total is None else total + a
            return _tangent_rows(x, total)

        return velocity

    def _weight_terms(self, like, n):
        r"""The weights as the attention takes them and :math:`\log w_j` for :math:`\log Z_i`.

        SA depends on the ratios :math:`w_j / w_k` only: the attention gets the weights divided
        by a power of two near the largest (exact), and NumPy states get them in float64, whose
        logarithm the attention takes in float64. Weights of 1e-50 or 1e50 are 0 or inf in
        float32 and gave rows of NaN. USA takes :math:`\log w_j` from the host float64 values.
        """
        if self.weights is None:
            return None, -math.log(n)
        log_w = constant(self, "log_weights", lambda: np.log(self.weights), like)
        scaled = np.ldexp(self.weights, -int(np.frexp(np.max(self.weights))[1]))  # max in [1/2, 1)
        if type(like) is np.ndarray:
            return scaled, log_w
        return constant(self, "scaled_weights", scaled, like), log_w

    def problem(self, like) -> solvers.SplitProblem:
        """The particle system as a split problem for states like ``like``.

        One flow, the tangent velocity, and one projection, the (scale-safe) retraction onto
        the sphere after the sub-step. No checks: ``like`` must have passed :meth:`solve`'s.
        """
        xp = array_api_compat.array_namespace(like)
        return solvers.SplitProblem(flows=(self._flow(like),), projections=(lambda x: _unit_rows(xp, x),),
                                    retraction=True)

    def velocity(self, x):
        r"""The tangent velocity :math:`\dot x_i` at positions ``x``.

        Parameters
        ----------
        x : array, shape (n, d) or (batch, n, d)

        Returns
        -------
        array, same shape as ``x``
        """
        _, x = self._checked(x)
        return self._flow(x)(x)

    # -- time stepping -----------------------------------------------------------------------
    def step(self, x, dt, scheme="rk4"):
        r"""One step of ``scheme``; the retraction onto the sphere follows each sub-step.

        Parameters
        ----------
        x : array, shape (n, d) or (batch, n, d)
            Positions on the sphere.
        dt : float
            Time step.
        scheme : str or Scheme
            Any name of :func:`ctformer.solvers.available` (``"euler"``, ``"heun"``, ``"rk4"``,
            ``"lie"``, ``"strang"``, ``"parallel"``) or a :class:`ctformer.solvers.Scheme`.

        Returns
        -------
        array
            E.g. for ``"rk4"``: :math:`x_{k+1} = \Phi_{\Delta t}(x_k) / \|\Phi_{\Delta t}(x_k)\|`.
        """
        scheme = solvers.get(scheme)
        dt = solvers.check_dt(dt)
        _, x = self._checked(x)
        return scheme.step(self.problem(x), x, dt)

    def solve(self, x0, t1, dt, scheme="rk4", save_every=1, normalize=False):
        r"""Integrate from :math:`t = 0` to ``t1``.

        Parameters
        ----------
        x0 : array, shape (n, d) or (batch, n, d)
            Initial positions (NumPy, CuPy, ...); integers and lists become float64, floating
            arrays keep their dtype, complex ones are refused. Each row must have unit norm
            to within :func:`sphere_tolerance` of its dtype (:math:`\sqrt{\varepsilon}`)
            unless ``normalize=True``, which divides each row by its norm first (scale-safe:
            ``1e160 * x`` and ``1e-170 * x`` normalize like ``x``).
        t1 : float
            Final time, >= 0.
        dt : float
            Largest time step; the step used is ``t1 / ceil(t1 / dt)`` so that the last step
            ends exactly at ``t1``.
        scheme : str or Scheme
            Any name of :func:`ctformer.solvers.available`; default ``"rk4"``. Observed order
            ``solvers.get(scheme).order()``: euler, lie, parallel 1; heun, strang 2; rk4 4.
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
        TypeError
            For a complex or non-numeric ``x0``, non-real ``t1`` or ``dt``.
        ValueError
            For ``x0`` off the sphere (without ``normalize``), with NaN or of the wrong shape,
            a bad ``t1``, ``dt``, ``scheme`` or ``save_every``; before any step, when
            ``t1 / dt`` exceeds the step limit (10**8 steps, or ``CTFORMER_MAX_STEPS``; the
            message names ``t1`` and ``dt``) or the saved states would not fit in the
            available memory (the message names ``save_every``, the bytes needed and available).
        FloatingPointError
            If the solution becomes non-finite; the message names the time interval where it
            happened (checked at each save).
        SolveInterrupted
            On Ctrl-C: a ``KeyboardInterrupt`` whose ``result`` is the :class:`Trajectory` so
            far (saved states, then the last completed step) and whose message is one line.
        """
        scheme = solvers.get(scheme)
        steps, h = time_steps(t1, dt, save_every)
        xp, x = self._initial(x0, normalize)
        count = saved_count(steps, save_every)
        check_memory(count, x, save_every, steps)
        positions = xp.empty((count, *x.shape), dtype=x.dtype, device=array_api_compat.device(x))
        positions[0, ...] = x
        return march(scheme, self.problem(x), x, steps, h, save_every, positions, what="particle",
                     build=lambda times, kept: Trajectory(times=np.asarray(times), positions=kept, beta=float(self.beta),
                                                          normalized=self.normalized, dt=h))

    def evolve(self, x0, t1, *, scheme="tsit5", rtol=DEFAULT_RTOL, atol=DEFAULT_ATOL, dt=None,
               save_at=None, events=(), max_steps=DEFAULT_MAX_STEPS, controller=None, normalize=False,
               initial=None):
        r"""Integrate from :math:`t = 0` to ``t1`` with error control; return a :class:`ctformer.Solution`.

        The embedded pairs (``bosh3``, ``dopri5``, ``tsit5``) estimate the local error
        themselves, other schemes by step doubling with their nominal order; the retraction onto
        the sphere follows every step (it does not lower the order: the exact flow stays on the
        sphere). The error norm weighs every particle by :math:`1/n` (for a batch, every system
        alike).

        Parameters
        ----------
        x0, normalize
            As for :meth:`solve`.
        t1 : float
            Final time, > 0.
        scheme : str or Scheme
            Default ``"tsit5"``.
        rtol, atol : float
            Tolerances of the :class:`ctformer.solvers.PIController`.
        dt : float, optional
            Fixed steps of at most ``dt`` instead (``t1 / ceil(t1 / dt)``, as :meth:`solve`).
        save_at, events, max_steps, controller
            As for :meth:`ctformer.ContinuousTransformer.evolve`; ``condition(t, x)`` of an
            event receives the positions.
        initial : ctformer.Solution, saved result or xarray.Dataset, optional
            Restart a solve (``x0`` None): error-controlled from its last saved accepted step,
            fixed-step from a saved state on its step grid, with the same scheme; the continued
            states are those of the uninterrupted solve, bit for bit.

        Returns
        -------
        ctformer.Solution
            ``states`` of shape ``(T,) + x0.shape``.
        """
        start = restart_of(initial, t1, dt, scheme)
        if start is not None:
            if x0 is not None:
                raise ValueError("x0 and initial both given: a restart takes its state from "
                                 "initial; pass x0=None")
            x0 = start.u0
        # a restart continues from the saved state as it is: normalizing it again moves its bits
        _, x = self._initial(x0, normalize and start is None)
        solution = evolve_on(self.problem(x), x, t1, scheme=scheme, rtol=rtol, atol=atol, dt=dt,
                             save_at=save_at, events=events, max_steps=max_steps,
                             controller=controller, what="particle", start=start,
                             axes=("particle", "dimension"), system=self, initial=initial)
        return solution

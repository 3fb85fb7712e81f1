r"""Independent references for error-controlled depth (not collected: no ``test_`` prefix).

Nothing here calls ctformer's solvers or operators; ctformer is compared against these.

1. A pre-norm ``torch.nn.TransformerEncoder`` (float64, eval mode, ``batch_first``) read as a
   continuous-depth model: inside layer :math:`l` (depth :math:`t \in [l, l + 1)`)

   .. math::

       \frac{du}{dt} = \mathrm{SA}_l(\mathrm{LN}^1_l(u)) + \mathrm{FFN}_l(\mathrm{LN}^2_l(u)),

   the unsplit pre-norm residual right-hand side, written from the module's own submodules
   (``self_attn``, ``norm1``, ``linear1``/``activation``/``linear2``, ``norm2``) and
   integrated by ``scipy.integrate.solve_ivp(method="DOP853", rtol=1e-13, atol=1e-15)`` on
   each :math:`[l, l + 1]` in turn (:class:`LayerwiseReference`).
2. The self-attention particle velocity with :math:`Q = K = V = I` (Geshkovski, Letrouit,
   Polyanskiy, Rigollet, "A mathematical perspective on Transformers", 2025),

   .. math::

       \dot x_i = P^\perp_{x_i}\Bigl(\frac{\sum_j e^{\beta\langle x_i, x_j\rangle} x_j}
           {\sum_j e^{\beta\langle x_i, x_j\rangle}}\Bigr), \qquad
       P^\perp_x y = y - \langle x, y\rangle x,

   in NumPy (:func:`sa_velocity`), its DOP853 solution (:func:`sa_reference`) and the first
   time the configuration's diameter :math:`\max_{ij}|x_i - x_j|` drops below a threshold,
   located by ``solve_ivp``'s event finder (:func:`cluster_time`).
3. Error measures: the relative error in the controller's norm (:func:`relative_error`) and
   the fitted slope of log error against log rtol (:func:`loglog_slope`).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
from scipy.integrate import solve_ivp

REFERENCE_RTOL, REFERENCE_ATOL = 1e-13, 1e-15


# -- 1. the pre-norm torch encoder as an ODE in depth --------------------------------------------
def make_encoder(layers=2, d_model=16, heads=2, d_ff=32, seed=0):
    """A pre-norm float64 ``nn.TransformerEncoder`` in eval mode, every layer drawn separately.

    ``nn.TransformerEncoder`` deep-copies one layer ``num_layers`` times; here each layer gets
    its own weights (seed ``seed + l``), so the parameters jump at every integer depth. The
    norms' weights and biases and the attention biases are perturbed from their (1, 0, 0)
    initial values so that every parameter matters.
    """
    import torch
    from torch import nn

    def layer(l):
        torch.manual_seed(seed + l)
        block = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=d_ff, dropout=0.0,
                                           activation="gelu", batch_first=True, norm_first=True,
                                           dtype=torch.float64)
        with torch.no_grad():
            for norm in (block.norm1, block.norm2):
                norm.weight.add_(0.2 * torch.randn_like(norm.weight))
                norm.bias.copy_(0.1 * torch.randn_like(norm.bias))
            block.self_attn.in_proj_bias.copy_(0.1 * torch.randn_like(block.self_attn.in_proj_bias))
        return block

    encoder = nn.TransformerEncoder(layer(0), num_layers=1, enable_nested_tensor=False)
    encoder.layers = nn.ModuleList([layer(l) for l in range(layers)])
    encoder.num_layers = layers
    return encoder.eval()


def truncated(encoder, layers):
    """The encoder's first ``layers`` layers (a deep copy)."""
    from torch import nn

    out = copy.deepcopy(encoder)
    out.layers = nn.ModuleList(list(out.layers)[:layers])
    out.num_layers = layers
    return out.eval()


def layer_rhs_torch(layer):
    r"""The pre-norm right-hand side of one ``TransformerEncoderLayer`` on ``(N, d)`` tensors.

    :math:`f(u) = \mathrm{SA}(\mathrm{LN}_1 u) + W_2\,\mathrm{act}(W_1 \mathrm{LN}_2 u + b_1)
    + b_2`, evaluated by the layer's own submodules (``self_attn``, ``norm1``, ``linear1``,
    ``activation``, ``linear2``, ``norm2``); dropout is off in eval mode.
    """
    def rhs(u):
        x = u[None]
        h = layer.norm1(x)
        attention = layer.self_attn(h, h, h, need_weights=False)[0]
        feedforward = layer.linear2(layer.activation(layer.linear1(layer.norm2(x))))
        return (attention + feedforward)[0]

    return rhs


def layer_rhs(layer):
    """:func:`layer_rhs_torch` on NumPy ``(N, d)`` float64 arrays, without gradients."""
    import torch

    rhs = layer_rhs_torch(layer)

    def numpy_rhs(u):
        with torch.no_grad():
            return rhs(torch.from_numpy(np.ascontiguousarray(u))).numpy()

    return numpy_rhs


def depth_rhs(encoder):
    """``f(t, u)`` on all of ``[0, L]``: layer ``min(floor(t), L - 1)``'s right-hand side.

    What a generic solver sees when it does not know where the layers end.
    """
    rhs = [layer_rhs(layer) for layer in encoder.layers]
    last = len(rhs) - 1

    def f(t, u):
        return rhs[min(max(int(math.floor(t)), 0), last)](u)

    return f


class Counted:
    """A right-hand side ``f(t, y)`` on flat vectors that counts its evaluations."""

    def __init__(self, f, shape):
        self.f, self.shape, self.calls = f, tuple(shape), 0

    def __call__(self, t, y):
        self.calls += 1
        return self.f(t, np.reshape(y, self.shape)).ravel()


@dataclass(frozen=True)
class LayerwiseReference:
    """DOP853 solutions of an encoder, one per layer, with their dense outputs.

    Attributes
    ----------
    boundaries : ndarray, shape (L + 1, N, d)
        :math:`u(0), u(1), \\dots, u(L)`.
    pieces : tuple of scipy OdeSolution
        The dense output of layer :math:`l` on :math:`[l, l + 1]`.
    """

    boundaries: np.ndarray
    pieces: tuple

    @property
    def final(self):
        return self.boundaries[-1]

    def at(self, t):
        """:math:`u(t)` for a depth or an array of depths in ``[0, L]``: shape ``t.shape + (N, d)``."""
        t = np.asarray(t, dtype=np.float64)
        shape = self.boundaries.shape[1:]
        out = np.empty(t.shape + shape)
        for index, s in np.ndenumerate(t):
            layer = min(int(math.floor(s)), len(self.pieces) - 1)
            out[index] = self.pieces[layer](s).reshape(shape)
        return out


def layerwise_reference(encoder, u0, rtol=REFERENCE_RTOL, atol=REFERENCE_ATOL):
    """Integrate ``encoder`` from ``u0`` (shape ``(N, d)``), layer by layer, with DOP853."""
    u = np.asarray(u0, dtype=np.float64)
    boundaries, pieces = [u], []
    for l, layer in enumerate(encoder.layers):
        rhs = layer_rhs(layer)
        sol = solve_ivp(lambda _, y: rhs(y.reshape(u.shape)).ravel(), (float(l), float(l + 1)),
                        u.ravel(), method="DOP853", rtol=rtol, atol=atol, dense_output=True)
        if not sol.success:  # pragma: no cover - the reference must not fail silently
            raise RuntimeError(f"reference solve failed in layer {l}: {sol.message}")
        u = sol.y[:, -1].reshape(u.shape)
        boundaries.append(u)
        pieces.append(sol.sol)
    return LayerwiseReference(np.stack(boundaries), tuple(pieces))


def smooth_tokens(n_tokens, d_model, seed=0):
    """A smooth ``(N, d)`` initial state: low-frequency functions of the token position."""
    rng = np.random.default_rng(seed)
    x = (np.arange(n_tokens) + 0.5) / n_tokens
    a, b, c = rng.normal(size=(3, d_model))
    return np.cos(np.pi * np.outer(x, 1 + np.arange(d_model) % 3) + a) + 0.5 * b * x[:, None] ** 2 + 0.2 * c


# -- 2. self-attention particles ----------------------------------------------------------------
def sa_velocity(x, beta):
    r"""The SA velocity with :math:`Q = K = V = I` at positions ``x`` of shape ``(n, d)``."""
    s = beta * (x @ x.T)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    a = (w @ x) / w.sum(axis=1, keepdims=True)
    return a - np.sum(a * x, axis=1, keepdims=True) * x


def sa_velocity_torch(x, beta):
    """:func:`sa_velocity` in torch (for torchdiffeq), the same formula on an ``(n, d)`` tensor."""
    s = beta * (x @ x.T)
    w = (s - s.max(dim=1, keepdim=True).values).exp()
    a = (w @ x) / w.sum(dim=1, keepdim=True)
    return a - (a * x).sum(dim=1, keepdim=True) * x


def sphere_points(n=32, d=3, seed=0):
    """``n`` independent uniform points on :math:`S^{d-1}`."""
    x = np.random.default_rng(seed).normal(size=(n, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def sa_reference(x0, beta, t1, t_eval=None, rtol=REFERENCE_RTOL, atol=REFERENCE_ATOL):
    """DOP853 solution of the SA system on ``[0, t1]``: ``(times, states)`` at ``t_eval``
    (default: ``t1`` only), states of shape ``(len(times), n, d)``."""
    shape = x0.shape
    t_eval = np.array([t1], dtype=np.float64) if t_eval is None else np.asarray(t_eval, float)
    sol = solve_ivp(lambda _, y: sa_velocity(y.reshape(shape), beta).ravel(), (0.0, float(t1)),
                    np.ravel(x0), method="DOP853", rtol=rtol, atol=atol, t_eval=t_eval)
    if not sol.success:  # pragma: no cover
        raise RuntimeError(f"particle reference failed: {sol.message}")
    return sol.t, sol.y.T.reshape((-1,) + shape)


def diameter(x):
    r""":math:`\max_{ij} |x_i - x_j|` of a configuration ``(n, d)``."""
    g = x @ x.T
    sq = np.diag(g)[:, None] + np.diag(g)[None, :] - 2 * g
    return float(np.sqrt(max(float(sq.max()), 0.0)))


def cluster_time(x0, beta, threshold, t1, rtol=1e-12, atol=1e-14):
    """The first time the diameter drops below ``threshold``, by ``solve_ivp``'s event finder.

    Returns ``(t_event, x_event)``; raises if no crossing happens before ``t1``.
    """
    shape = x0.shape

    def event(_, y):
        return diameter(y.reshape(shape)) - threshold

    event.terminal, event.direction = True, -1
    sol = solve_ivp(lambda _, y: sa_velocity(y.reshape(shape), beta).ravel(), (0.0, float(t1)),
                    np.ravel(x0), method="DOP853", rtol=rtol, atol=atol, events=event)
    if sol.status != 1 or not len(sol.t_events[0]):
        raise RuntimeError(f"the diameter stays above {threshold} up to t = {t1}")
    return float(sol.t_events[0][0]), sol.y_events[0][0].reshape(shape)


def cap_points(n=32, d=3, seed=0, spread=1.0):
    """``n`` points in an open hemisphere around the last axis (they cluster: GLPR, Thm 6.1).

    ``spread`` scales the tangent offsets before normalizing (larger: a wider cap)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([spread * rng.normal(size=(n, d - 1)), np.ones((n, 1))], axis=1)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# -- 3. error measures ---------------------------------------------------------------------------
def relative_error(u, ref, rtol, atol, weights=None):
    r"""The error in the controller's relative norm: :math:`\mathrm{rtol}\,\|e\|` with

    .. math::

        \|e\|^2 = \frac{\sum_{b,i,j} w_i^x w_j^y \bigl(e_{bij} / (\mathrm{atol} +
        \mathrm{rtol}\,|u^{ref}_{bij}|)\bigr)^2}{\sum_{b,i,j} w_i^x w_j^y},\qquad e = u - u^{ref},

    written here (not ctformer's): it is the relative error where :math:`|u| \gg
    \mathrm{atol}/\mathrm{rtol}`, so "error <= 10 rtol" means the scaled norm is at most 10.
    ``weights = (w_x, w_y)`` on the last two axes, or ``None`` (plain RMS).
    """
    e = np.asarray(u, dtype=np.float64) - np.asarray(ref, dtype=np.float64)
    s2 = (e / (atol + rtol * np.abs(ref))) ** 2
    if weights is None:
        return float(rtol * np.sqrt(s2.mean()))
    w = np.outer(weights[0], weights[1])
    w = np.broadcast_to(w, s2.shape)
    return float(rtol * np.sqrt((w * s2).sum() / w.sum()))


def loglog_slope(x, y):
    """Least-squares slope of log y against log x."""
    return float(np.polyfit(np.log(np.asarray(x, float)), np.log(np.asarray(y, float)), 1)[0])


def scipy_rejections(sol, method):
    """Rejected steps of a ``solve_ivp`` RK45/DOP853/RK23 run without ``t_eval``, from its counts.

    Each attempted step costs ``n_stages`` evaluations (the last stage is the next step's
    first: FSAL), the start two (``f(t0, y0)`` and the starting-step probe); DOP853 spends
    three more per accepted step on its dense output only when asked (not here).
    """
    stages = {"RK23": 3, "RK45": 6, "DOP853": 12}[method]
    accepted = len(sol.t) - 1
    attempted, rest = divmod(sol.nfev - 2, stages)
    if rest:
        raise ValueError(f"nfev = {sol.nfev} is not 2 + {stages} k for {method}")
    return attempted - accepted

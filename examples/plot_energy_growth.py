r"""
Energy growth along the attention dynamics
==========================================

With :math:`Q = K = V = I`, the unnormalized dynamics (USA) is the gradient ascent of the
interaction energy

.. math::

    E_\beta(x) = \frac{1}{2\beta} \sum_{i,j} w_i w_j\, e^{\beta \langle x_i, x_j\rangle},
    \qquad \frac{d E_\beta}{dt} = \sum_i w_i \,\|\dot x_i\|^2 \ \ge 0,

and the normalized dynamics (SA) increases it too, :math:`dE_\beta/dt = \sum_i w_i Z_i
\|\dot x_i\|^2` (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025). With weights
:math:`1/n` the maximum :math:`e^\beta / (2\beta)` is reached at a single cluster. Near a
cluster USA moves :math:`e^{\beta}` times faster than SA, so it needs a smaller explicit step.
"""
import matplotlib.pyplot as plt
import numpy as np

from ctformer.particles import SelfAttentionDynamics, energy

rng = np.random.default_rng(0)
n, d, draws = 32, 3, 5
x0 = rng.standard_normal((draws, n, d))
x0 /= np.linalg.norm(x0, axis=-1, keepdims=True)

fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
energies = {}  # (dynamics, beta) -> E_beta / (e^beta / 2 beta) at the saved times, per start
for ax, normalized, name in [(axes[0], True, "SA"), (axes[1], False, "USA")]:
    for beta, color in [(1.0, "C0"), (4.0, "C3")]:
        # explicit RK4 is stable for dt * (Lipschitz constant) below about 2.8; near a cluster
        # that constant is about beta for SA but beta e^beta for USA
        dt = 0.05 if normalized else min(0.05, 2.0 / (beta * np.exp(beta)))
        path = SelfAttentionDynamics(beta, normalized=normalized).solve(x0, 15.0, dt, save_every=int(0.2 / dt))
        e = np.stack([energy(p, beta) for p in path.positions]) / (np.exp(beta) / (2 * beta))
        assert np.all(np.diff(e, axis=0) >= -1e-12)  # monotone, as the theorem says
        assert e.max() <= 1 + 1e-9                   # never above the single-cluster maximum
        if beta == 1.0:                              # every start reaches it by t = 15
            np.testing.assert_allclose(e[-1], 1.0, atol=1e-6)
        energies[name, beta] = e
        ax.plot(path.times, e, color=color, lw=1, label=[rf"$\beta={beta:g}$"] + [None] * (draws - 1))
    ax.axhline(1.0, color="k", ls="--", lw=0.8)
    ax.set(title=f"{name}, {draws} random starts, n = {n}, d = {d}",
           xlabel="time $t$")
    ax.legend(loc="lower right")
axes[0].set_ylabel(r"$E_\beta / (e^\beta / 2\beta)$")
fig.tight_layout()
plt.show()

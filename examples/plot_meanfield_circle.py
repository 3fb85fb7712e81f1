r"""
Mean field versus particles on the circle
=========================================

On the circle (:math:`d = 2`, :math:`Q = K = V = I`) the token density :math:`\rho(t, \theta)`
of the self-attention dynamics obeys the continuity equation

.. math::

    \partial_t \rho + \partial_\theta\big(\rho\, X[\rho]\big) = 0, \qquad
    X[\rho](\theta) = \frac{\int e^{\beta\cos(\varphi-\theta)} \sin(\varphi-\theta)\,\rho(\varphi)\,d\varphi}
                           {\int e^{\beta\cos(\varphi-\theta)}\,\rho(\varphi)\,d\varphi},

(Geshkovski, Letrouit, Polyanskiy, Rigollet 2025). :class:`ctformer.particles.CircleMeanField`
solves it with Fourier modes: both integrals are convolutions whose kernel coefficients are
the Bessel values :math:`I_k(\beta)`. Tokens placed at the quantiles of :math:`\rho_0` are the
particle discretization: the attention sum is then a midpoint rule in the quantile variable,
so the particles follow the mean-field characteristics with an error that decays
geometrically in the number of tokens (the rate is set by the width of the strip where the
quantile function is analytic; here about :math:`e^{-0.3 n}`).
"""
import matplotlib.pyplot as plt
import numpy as np
from scipy import optimize

from ctformer.particles import CircleMeanField, SelfAttentionDynamics

beta, a = 5.0, 0.25


def rho0(theta):
    return (1 + a * np.cos(3 * theta) + 0.1 * np.sin(theta)) / (2 * np.pi)


def quantiles(n):
    cdf = lambda th, u: (th + a * np.sin(3 * th) / 3 + 0.1 * (1 - np.cos(th))) / (2 * np.pi) - u  # noqa: E731
    return np.array([optimize.brentq(cdf, 0.0, 2 * np.pi, args=(u,), xtol=1e-14) for u in (np.arange(n) + 0.5) / n])


def particle_angles(theta0, t1, dt):
    x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=1)
    path = SelfAttentionDynamics(beta).solve(x0, t1, dt, save_every=int(round(0.5 / dt)))
    angles = np.unwrap(np.arctan2(path.positions[..., 1], path.positions[..., 0]), axis=0)
    # same branch as the initial angles in [0, 2 pi), like the mean-field tracers
    return path.times, angles + 2 * np.pi * np.round((theta0 - angles[0]) / (2 * np.pi))


t1, dt = 3.0, 0.02
field = CircleMeanField(beta, 257)  # |k| <= 85; the SA velocity is bounded by 1: dt * 85 < 2.8
solution = field.solve(rho0, t1, dt, save_every=25)
times, angles = particle_angles(quantiles(300), t1, dt)

fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
for i, color in zip([0, 2, 4, 6], ["C0", "C1", "C2", "C3"]):
    axes[0].plot(solution.grid, solution.density[i], color=color, label=f"t = {solution.times[i]:g}")
    axes[0].hist(angles[i] % (2 * np.pi), bins=90, range=(0, 2 * np.pi), density=True, color=color, alpha=0.3)
axes[0].set(xlabel=r"$\theta$", ylabel="density", title=r"mean field (lines), 300 tokens (bars), $\beta = 5$")
axes[0].legend()

few = quantiles(12)
tracked = field.solve(rho0, t1, dt, save_every=25, tracers=few)
t_few, a_few = particle_angles(few, t1, dt)
axes[1].plot(tracked.times, tracked.tracers, color="k", lw=2, alpha=0.4)
axes[1].plot(t_few, a_few, "--", color="C3", lw=1)
axes[1].set(xlabel="time $t$", ylabel=r"$\theta$", title="characteristics (grey) vs 12 tokens (red)")

ns = np.arange(6, 40, 3)
errors = []
for n in ns:
    theta0 = quantiles(n)
    end = field.solve(rho0, 1.0, 0.02, tracers=theta0).tracers[-1]
    gap = np.angle(np.exp(1j * (particle_angles(theta0, 1.0, 0.02)[1][-1] - end)))
    errors.append(np.abs(gap).max())
rate = -np.polyfit(ns, np.log(errors), 1)[0]
print(f"particles vs characteristics at t = 1: error {errors[0]:.1e} (n = {ns[0]}) to "
      f"{errors[-1]:.1e} (n = {ns[-1]}), fitted rate {rate:.2f} per token")
assert 0.2 < rate < 0.4 and errors[-1] < 2e-5     # geometric, about e^{-0.3 n}
axes[2].semilogy(ns, errors, "o-", label=rf"fit: error $\propto e^{{-{rate:.2f}\,n}}$")
axes[2].set(xlabel="tokens n", ylabel="max angle error at t = 1", title="particles -> mean field")
axes[2].legend()
fig.tight_layout()
plt.show()

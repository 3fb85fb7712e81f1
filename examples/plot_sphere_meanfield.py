r"""
From tokens to a density on the sphere
======================================

Tokens on :math:`S^2` moved by self-attention (:math:`Q = K = V = I`, SA) have, as their
number grows, a density :math:`\rho(t, x)` that solves the continuity equation
:math:`\partial_t\rho + \operatorname{div}_S(\rho X[\rho]) = 0`,
:math:`X = \nabla_S G / (\beta G)`, :math:`G = \int e^{\beta\langle\cdot, y\rangle}\rho(y)\,d\sigma(y)`
(Geshkovski, Letrouit, Polyanskiy, Rigollet 2025). A density depending only on
:math:`s = \langle x, e\rangle` stays so, and :class:`ctformer.particles.ZonalMeanField` solves
it with Gegenbauer polynomials in :math:`s` (here Legendre, :math:`d = 3`).

* Left: i.i.d. tokens from :math:`\rho_0 \propto e^{s}` (bars: histograms of :math:`s`)
  against the mean field (lines), :math:`\beta = 2`.
* Middle: the Kolmogorov distance between the :math:`s`-distributions of the tokens and of the
  mean field at :math:`t = 1` decays like :math:`n^{-1/2}` (propagation of chaos, plus the
  sampling error of the initial tokens).
* Right: from the uniform density plus :math:`10^{-6}` in every degree, at :math:`\beta = 20`
  the degree :math:`l^* = 6` of largest linear growth rate
  :math:`\sigma_l = l(l+1) I_{l+1/2}(\beta)/(\beta I_{1/2}(\beta))` takes over: the pattern of
  the metastable clusters (Bruno, Pasqualotto, Agazzi 2025).
"""
import math

import matplotlib.pyplot as plt
import numpy as np
from scipy.special import iv

from ctformer.particles import SelfAttentionDynamics, ZonalMeanField
from ctformer.particles.sphere_particles import s_distance, sample_zonal
from ctformer.particles.zonal import linear_growth_rate

beta = 2.0
field = ZonalMeanField(beta, 3, 24)
c0 = field.coefficients_of(np.exp)
c0 = c0 / (c0[0] * math.sqrt(4 * math.pi))  # mass one
solution = field.solve(c0 @ field.basis.values.T, 1.0, 0.05, save_every=10)  # t = 0, 0.5, 1
tokens = SelfAttentionDynamics(beta)

fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
x0 = sample_zonal(field, c0, 1000, np.random.default_rng(0))
path = tokens.solve(x0, 1.0, 0.25, save_every=2)
s_plot = np.linspace(-1, 1, 201)
for i, color in enumerate(["C0", "C1", "C2"]):
    density_in_s = 2 * np.pi * field.basis.evaluate(solution.coefficients[i], s_plot)
    axes[0].plot(s_plot, density_in_s, color=color, label=f"t = {solution.times[i]:g}")
    axes[0].hist(path.positions[i][:, 2], bins=40, range=(-1, 1), density=True, color=color, alpha=0.3)
axes[0].set(xlabel=r"$s = \langle x, e\rangle$", ylabel="density of s",
            title=r"mean field (lines), 1000 tokens (bars), $\beta = 2$")
axes[0].legend()

ns, seeds = np.array([125, 250, 500, 1000]), [32, 16, 8, 4]
pool = iter(sample_zonal(field, c0, int(ns @ seeds), np.random.default_rng(1)))  # i.i.d.: slice one sample
distances = []
for n, count in zip(ns, seeds):
    runs = []
    for _ in range(count):
        x = np.array([next(pool) for _ in range(n)])
        runs.append(s_distance(tokens.solve(x, 1.0, 0.25).positions[-1], field, solution.coefficients[-1]))
    distances.append(np.mean(runs))
slope = np.polyfit(np.log(ns), np.log(distances), 1)[0]
axes[1].loglog(ns, distances, "o-", label=f"slope {slope:.2f}")
axes[1].loglog(ns, distances[0] * np.sqrt(ns[0] / ns), "k--", lw=1, label=r"$n^{-1/2}$")
axes[1].set(xlabel="tokens n", ylabel="Kolmogorov distance at t = 1", title="tokens -> mean field")
axes[1].legend()
assert abs(slope + 0.5) < 0.1, slope
assert np.max(np.abs(solution.mass - 1)) < 1e-13   # the mean field conserves mass

selection = ZonalMeanField(20.0, 3, 16)
c = np.zeros(17)
c[0], c[1:13] = 1 / math.sqrt(4 * math.pi), 1e-6
degrees = np.arange(1, 17)
rates = linear_growth_rate(degrees, 20.0, dimension=3)
np.testing.assert_allclose(rates, degrees * (degrees + 1) * iv(degrees + 0.5, 20.0) / (20.0 * iv(0.5, 20.0)),
                           rtol=1e-12)  # the closed form above
l_star = 1 + int(np.argmax(rates))
t_grown = math.log(100) / rates[l_star - 1]  # the fastest degree grows 100-fold
grown = selection.solve(c @ selection.basis.values.T, t_grown, selection.stable_step(t_grown) / 2, save_every=5)
for l in range(1, 13):
    axes[2].semilogy(grown.times, np.abs(grown.coefficients[:, l]), color="C3" if l == l_star else "0.7",
                     lw=2 if l == l_star else 1)
axes[2].set(xlabel="time t", ylabel=r"$|c_l(t)|$", title=rf"$\beta = 20$: degree $l^* = {l_star}$ takes over")
dominant = int(selection.dominant_mode(grown.coefficients[-1]))
assert l_star == 6 and dominant == 6, (l_star, dominant)
fig.tight_layout()
plt.show()

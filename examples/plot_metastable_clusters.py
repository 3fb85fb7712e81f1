r"""
Metastable clusters on the circle
=================================

Near the uniform distribution, the linearized self-attention dynamics (SA) on the circle
amplifies the mode :math:`\cos(k\theta)` at the rate

.. math::

    \lambda_k(\beta) = \frac{k^2 I_k(\beta)}{\beta\, I_0(\beta)},

largest near :math:`k \approx \sqrt{2\beta}` (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025).
Starting from equally spaced tokens with a tiny perturbation, the fastest mode wins and
the tokens gather into :math:`k^\ast` clusters: 3 for :math:`\beta = 5`, 4 for
:math:`\beta = 9`. These clusters are only metastable: they merge, one pair at a time, over
much longer times (the separation is of order :math:`\beta^{-1/2}` and the lifetimes grow
like :math:`e^{c\beta}`), before the final collapse to a single point.
"""
import matplotlib.pyplot as plt
import numpy as np
from scipy.special import iv

from ctformer.particles import SelfAttentionDynamics, cluster_count, linear_growth_rate

n, draws, t1, dt = 64, 4, 300.0, 0.2
rng = np.random.default_rng(3)
theta0 = 2 * np.pi * np.arange(n) / n + 1e-3 * rng.standard_normal((draws, n))
x0 = np.stack([np.cos(theta0), np.sin(theta0)], axis=-1)  # (draws, n, 2): one batch

fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
k = np.arange(1, 11)
late = 30.0  # by this time the fastest mode has formed its clusters
paths, fastest_mode, cluster_counts = {}, {}, {}
for beta, color in [(5.0, "C0"), (9.0, "C1")]:
    rates = linear_growth_rate(k, beta)
    np.testing.assert_allclose(rates, k**2 * iv(k, beta) / (beta * iv(0, beta)), rtol=1e-12)  # closed form
    fastest_mode[beta] = int(k[np.argmax(rates)])
    axes[0].plot(k, rates, "o-", color=color, label=rf"$\beta={beta:g}$, $k^*={k[np.argmax(rates)]}$")
    path = SelfAttentionDynamics(beta).solve(x0, t1, dt, save_every=10)
    paths[beta] = path
    counts = np.array([cluster_count(p, 0.05) for p in path.positions])  # (T, draws)
    cluster_counts[beta] = counts
    for d in range(draws):
        axes[1].step(path.times, counts[:, d] + 0.04 * d, where="post", color=color, alpha=0.8,
                     label=rf"$\beta={beta:g}$" if d == 0 else None)

# What the text says, checked: k* clusters form first (3 for beta = 5, 4 for beta = 9, in
# every draw at t = 30), and after that clusters only merge, one pair at a time.
for beta, expected in ((5.0, 3), (9.0, 4)):
    counts = cluster_counts[beta]
    assert fastest_mode[beta] == expected
    assert np.all(counts[np.argmin(np.abs(paths[beta].times - late))] == expected), counts
    after = counts[paths[beta].times >= late]
    assert np.all(np.diff(after, axis=0) <= 0) and np.all(np.diff(after, axis=0) >= -1)
    assert np.all(after[-1] < expected)                  # every draw has merged by t = 300
axes[0].set(xlabel="wavenumber $k$", ylabel=r"growth rate $\lambda_k$", title="linearized growth rates")
axes[0].legend()
axes[1].set(xlabel="time $t$", ylabel="clusters (distance < 0.05)", ylim=(1.5, 6.5),
            title=f"{draws} perturbed starts, n = {n}")
axes[1].legend()

path = paths[9.0]
raw = np.arctan2(path.positions[:, 0, :, 1], path.positions[:, 0, :, 0])
# cut the circle in the middle of the widest gap between the final clusters, then unwrap in time
final = np.sort(raw[-1])
gaps = np.diff(np.concatenate([final, final[:1] + 2 * np.pi]))
cut = final[np.argmax(gaps)] + gaps.max() / 2
angles = np.unwrap((raw - cut) % (2 * np.pi), axis=0)
axes[2].plot(path.times, angles, color="C1", lw=0.6)
axes[2].set(xlabel="time $t$", ylabel=r"angle $\theta_i(t)$ (shifted)", title=r"$\beta = 9$: four clusters, then merges")
fig.tight_layout()
plt.show()

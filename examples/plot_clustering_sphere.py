r"""
Tokens cluster on the sphere
============================

Tokens are particles :math:`x_i \in S^{d-1}` moved by self-attention projected on the
tangent space (LayerNorm reduced to the sphere),

.. math::

    \dot x_i = P^\perp_{x_i}\Big(\frac{\sum_j e^{\beta\langle x_i, x_j\rangle} x_j}
                                      {\sum_k e^{\beta\langle x_i, x_k\rangle}}\Big),
    \qquad P^\perp_x y = y - \langle x, y\rangle x

(SA with :math:`Q = K = V = I`). For :math:`d \ge 3` almost every initial configuration
converges to a single point (Geshkovski, Letrouit, Polyanskiy, Rigollet 2025); at moderate
:math:`\beta` it first lingers near a few clusters (here two, until t = 25). We follow 128 tokens on
:math:`S^2` with RK4 and the retraction :math:`x \mapsto x/\|x\|`, and track the number of
clusters and the distance to the nearest single-cluster state.
"""
import matplotlib.pyplot as plt
import numpy as np

from ctformer.particles import SelfAttentionDynamics, cluster_count, single_cluster_distance

rng = np.random.default_rng(7)
x0 = rng.standard_normal((128, 3))
x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
beta = 3.0
path = SelfAttentionDynamics(beta).solve(x0, 40.0, 0.1, save_every=5)

# What the text says, checked: two clusters for a long stretch (here from t = 7.5) until
# t = 25, then one, which every token reaches (distance to one cluster at rounding level).
counts = np.array([cluster_count(x, 0.1) for x in path.positions])
assert np.all(counts[(path.times >= 7.5) & (path.times < 25.0)] == 2), counts
assert np.all(counts[path.times >= 25.0] == 1), counts
assert single_cluster_distance(path.positions[-1]) < 1e-6

snapshots = [0.0, 4.0, 15.0, 40.0]
fig = plt.figure(figsize=(13, 6))
u, v = np.mgrid[0:2 * np.pi:40j, 0:np.pi:20j]
for col, t in enumerate(snapshots):
    ax = fig.add_subplot(2, 4, col + 1, projection="3d")
    ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.3)
    x = path.positions[np.argmin(np.abs(path.times - t))]
    ax.scatter(x[:, 0], x[:, 1], x[:, 2], s=8, c="C3", depthshade=False)
    count = cluster_count(x, 0.1)
    ax.set_title(f"t = {t:g}: {count} cluster{'' if count == 1 else 's'}")
    ax.set_axis_off()
    ax.set_box_aspect((1, 1, 1))

ax = fig.add_subplot(2, 2, 3)
ax.step(path.times, counts, where="post")
ax.set(xlabel="time $t$", ylabel="clusters (distance < 0.1)", yscale="log")
ax = fig.add_subplot(2, 2, 4)
ax.semilogy(path.times, [single_cluster_distance(x) for x in path.positions])
ax.set(xlabel="time $t$", ylabel="distance to one cluster")
fig.suptitle(rf"SA on $S^2$, n = 128, $\beta = {beta:g}$")
fig.tight_layout()
plt.show()

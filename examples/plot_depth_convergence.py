r"""
Convergence in depth: Lie, Strang, RK4
======================================

Depth is time. A ``T``-layer network is the evolution :math:`\partial_t u = \mathrm{Attn}(N_1 u)
+ F(N_2 u)` on :math:`[0, T]` (pre-norm, :doc:`design notes </design>`, section 1), and one Transformer block is one
Lie-splitting step of size 1 (Tai, Liu, Li, Chan 2025). Taking ``k`` steps per layer refines
time with :math:`\Delta t = 1/k`; the error against a much finer solution shows each scheme's
order:

- ``lie``: attention step, then FFN step, explicit Euler sub-steps, order 1;
- ``strang``: half FFN, attention, half FFN (the Macaron layout) with Heun sub-steps, order 2;
- ``rk4``: classical Runge-Kutta on the unsplit right-hand side, order 4.

The model is :meth:`ctformer.model.ContinuousTransformer.random_smooth` (two pre-norm layers,
smooth random kernels) on a 16 x 12 Gauss-Legendre grid, so the spatial error is the same for
every level and cancels.
"""
import matplotlib.pyplot as plt

from ctformer.model import ContinuousTransformer
from ctformer.studies import comparison_table, convergence, plot_convergence

model = ContinuousTransformer.random_smooth(seed=0, layers=2, placement="pre")

# The last level (64 steps per layer) is each scheme's reference, 8x finer than the others.
results = [
    convergence(model, refine="time", levels=[1, 2, 4, 8, 64], scheme=scheme,
                tokens="gauss-legendre:16", features="gauss-legendre:12", progress=False)
    for scheme in ("lie", "strang", "rk4")
]
print(comparison_table(results, "steps per layer vs L2 error against 64 steps per layer"))
for result, order in zip(results, (1, 2, 4)):
    assert abs(result.observed_order - order) < 0.15, (result.method, result.observed_order)
assert 1e-3 < results[0].errors[0] < 1e-2, results[0].errors[0]   # Lie, one step per layer

# %%
# Each curve runs parallel to its dashed reference slope. With one step per layer Lie is the
# discrete Transformer itself; its error here, a few times :math:`10^{-3}`, is how far a real
# network is from the continuous-depth model it discretizes.
fig, ax = plt.subplots(figsize=(5.5, 4))
plot_convergence(results, ax=ax, title="depth: Lie 1, Strang 2, RK4 4")
plt.show()

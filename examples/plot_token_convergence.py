r"""
Convergence in tokens: quadrature, spectral and Galerkin
========================================================

The token index :math:`x \in [0, 1]` is a continuous variable, and attention is the integral
operator

.. math::  \mathrm{Attn}(u)(x) = \int_0^1 \gamma(x, x')\, v(x')\, dx', \qquad
           \gamma(x, x') = \frac{e^{s(x, x')}}{\int_0^1 e^{s(x, x'')} dx''} .

A sequence of ``n`` tokens is one quadrature rule for these integrals. Refining ``n`` with
the other variables fixed measures how fast each rule converges on a smooth two-layer model:

- quadrature rules: midpoint and trapezoid (order 2), Gauss-Legendre (spectral);
- spectral: Chebyshev points with DCT interpolation (spectral);
- Galerkin finite elements: P1 (order 2) and P2 (order 3 in :math:`L^2`).

Each family is refined by doubling (P1, P2, trapezoid and Chebyshev use :math:`n = 2^j + 1`
values) and compared with its own solution at 256 tokens.
"""
import matplotlib.pyplot as plt
import numpy as np

from ctformer.model import ContinuousTransformer
from ctformer.studies import convergence, plot_convergence

model = ContinuousTransformer.random_smooth(seed=0, layers=2, placement="pre")
families = {
    "midpoint": [4, 8, 16, 32, 64, 256],
    "trapezoid": [5, 9, 17, 33, 65, 257],
    "gauss-legendre": [4, 8, 16, 32, 64, 256],
    "chebyshev": [5, 9, 17, 33, 65, 257],
    "p1": [5, 9, 17, 33, 65, 257],
    "p2": [5, 9, 17, 33, 65, 257],
}
results = {
    name: convergence(model, refine="tokens", levels=levels, tokens=name,
                      features="gauss-legendre:12", progress=False)
    for name, levels in families.items()
}
for res in results.values():
    print(res, end="\n\n")
for name in ("midpoint", "trapezoid", "p1"):
    assert abs(results[name].observed_order - 2) < 0.15, (name, results[name].observed_order)
p2_orders = [row.order for row in results["p2"].table if row.order is not None]
assert np.all(np.diff(p2_orders) > 0) and 2.4 < p2_orders[1] and 2.6 < p2_orders[-1] < 2.8, p2_orders
for name in ("gauss-legendre", "chebyshev"):
    factors = results[name].reductions()
    assert np.all(np.diff(factors) > 0) and factors[-1] > 100, (name, factors)

# %%
# The algebraic rules settle on their slopes; P2 approaches its order 3 from below (its
# neighbour orders rise from about 2.5 to 2.7 over these levels, as the elements begin to
# resolve the solution), so its fitted slope over all levels reads lower. The spectral rules bend down: their error falls
# by a growing factor per doubling. It does so more slowly than for a one-dimensional integral
# because LayerNorm divides by the feature standard deviation of each token, whose
# continuation to complex :math:`x` comes close to zero for this initial state: the solution
# is analytic only in a thin strip around :math:`[0, 1]`.
fig, ax = plt.subplots(figsize=(6, 4.5))
plot_convergence(list(results.values()), ax=ax, title="tokens", slopes=False)
plt.show()

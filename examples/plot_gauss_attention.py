r"""
Attention with Gauss weights
============================

Self-attention is a quadrature of the nonlocal integral operator

.. math::

    \mathrm{out}(x) = \frac{\int_0^1 e^{\beta\, q(x) \cdot k(x')}\, v(x')\, dx'}
                           {\int_0^1 e^{\beta\, q(x) \cdot k(x')}\, dx'}

(:doc:`design notes </design>`, section 1). A Transformer uses the midpoint rule: all weights equal, so they
cancel and the quadrature is the ordinary softmax. With Gauss-Legendre nodes :math:`x_j` and
weights :math:`w_j` the quadrature is

.. math::

    \mathrm{out}_i = \sum_j \mathrm{softmax}_j\big(\beta\, q_i \cdot k_j + \log w_j\big)\, v_j ,

softmax attention with a log-weight bias. On smooth queries, keys and values it converges
spectrally in the number of tokens, while the midpoint rule is second order.
"""
import matplotlib.pyplot as plt
import numpy as np
from scipy import integrate, special

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.operators import quadrature_attention

beta = 4.0


def queries(x):
    return np.stack([np.cos(np.pi * x), np.sin(2 * x)], axis=-1)


def keys(x):
    return np.stack([x, np.cos(3 * x)], axis=-1)


def values(x):
    return np.stack([np.exp(-x), x**2, np.sin(5 * x)], axis=-1)


# %%
# Gauss weights are a log-weight bias
# -----------------------------------
# The quadrature attention with Gauss-Legendre weights and plain softmax attention with the
# bias :math:`\log w_j` added to the scores agree to rounding.
gauss = GaussLegendre(12)
x, w = gauss.nodes, gauss.weights
out = quadrature_attention(queries(x), keys(x), values(x), beta=beta, weights=w)
biased = special.softmax(beta * queries(x) @ keys(x).T + np.log(w), axis=-1) @ values(x)
print(f"max |quadrature attention - softmax with log-weight bias| = {np.abs(out - biased).max():.2e}")
assert np.abs(out - biased).max() < 1e-14

# %%
# Convergence in the number of tokens
# -----------------------------------
# Fix a few query points and integrate the keys and values exactly (``scipy.integrate.quad_vec``),
# then compare with the quadrature over :math:`N` key tokens.
x_query = np.array([0.05, 0.3, 0.55, 0.9])
q = queries(x_query)


def integrand(xp):
    weight = np.exp(beta * q @ keys(np.array(xp)))  # one weight per query point
    return np.concatenate([weight[:, None] * values(np.array(xp)), weight[:, None]], axis=1)


total = integrate.quad_vec(integrand, 0.0, 1.0, epsabs=1e-15, epsrel=1e-14)[0]
exact = total[:, :-1] / total[:, -1:]

ns = np.array([2, 4, 6, 8, 12, 16, 24, 32, 48, 64])
errors = {}
for rule in (Midpoint, GaussLegendre):
    errors[rule.name] = []
    for n in ns:
        grid = rule(int(n))
        weights = None if rule is Midpoint else grid.weights  # uniform weights cancel
        approx = quadrature_attention(q, keys(grid.nodes), values(grid.nodes), beta=beta, weights=weights)
        errors[rule.name].append(max(np.abs(approx - exact).max(), 1e-17))

print(f"{'N':>4} {'midpoint':>10} {'gauss-legendre':>15}")
for n, e_mid, e_gauss in zip(ns, errors["midpoint"], errors["gauss-legendre"]):
    print(f"{n:4d} {e_mid:10.2e} {e_gauss:15.2e}")
slope = np.polyfit(np.log(1.0 / ns[3:]), np.log(errors["midpoint"][3:]), 1)[0]
print(f"midpoint observed order: {slope:.2f}")
assert abs(slope - 2.0) < 0.1                                 # midpoint: second order
gauss_errors = dict(zip(ns, errors["gauss-legendre"]))
assert gauss_errors[16] < 1e-10 and gauss_errors[24] < 1e-14  # spectral: rounding by N = 24

fig, ax = plt.subplots(figsize=(6, 4))
ax.loglog(ns, errors["midpoint"], "o-", label=f"midpoint (order {slope:.2f})")
ax.loglog(ns, errors["gauss-legendre"], "s-", label="Gauss-Legendre (spectral)")
ax.loglog(ns, 0.5 * errors["midpoint"][0] * (ns / ns[0]) ** -2.0, "k:", label=r"$N^{-2}$")
ax.set_xlabel("number of tokens $N$")
ax.set_ylabel("max error of attention output")
ax.set_title(r"Quadrature attention, $\beta = 4$")
ax.legend()
fig.tight_layout()
plt.show()

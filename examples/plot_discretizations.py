r"""
Nine discretizations of an interval
===================================

Every continuous variable of ctformer (tokens :math:`x`, features :math:`y`, head features,
FFN hidden variable) is discretized by one of nine rules: quadrature rules (midpoint,
trapezoid, Gauss-Legendre, Clenshaw-Curtis), spectral methods (Fourier, Chebyshev,
Legendre) and Galerkin finite elements (P1, P2). Each turns a function into ``n`` numbers
(``sample``), integrates them (``integrate``) and reconstructs the function between the
nodes (``interpolate``).

We measure both errors for the smooth, non-periodic function

.. math::  f(x) = e^{x} \cos(3x + 1), \qquad
           \int_0^1 f = \Big[\tfrac{e^x}{10} \big(\cos(3x + 1) + 3 \sin(3x + 1)\big)\Big]_0^1 ,

and for the periodic :math:`g(x) = e^{\sin 2\pi x}` with :math:`\int_0^1 g = I_0(1)`.
"""
import matplotlib.pyplot as plt
import numpy as np
from scipy import special

import ctformer.discretizations as d


def f(x):
    return np.exp(x) * np.cos(3 * x + 1)


def antiderivative(x):
    return np.exp(x) * (np.cos(3 * x + 1) + 3 * np.sin(3 * x + 1)) / 10


ns = (4, 8, 16, 32, 64)
rows = d.error_table(f, antiderivative(1.0) - antiderivative(0.0), ns=ns)
print(d.format_error_table(rows))



def fitted_order(table, name, key, levels=slice(-3, None)):
    """Least-squares slope of log(error) against log(h) over ``levels`` of one rule."""
    mine = [r for r in table if r["name"] == name][levels]
    h = [d.get(name, r["n"]).h for r in mine]
    return float(np.polyfit(np.log(h), np.log([r[key] for r in mine]), 1)[0])


def finest(table, name, n):
    return next(r for r in table if r["name"] == name and r["n"] == n)


for name, order in (("midpoint", 2), ("trapezoid", 2), ("p1", 2), ("p2", 3)):
    assert abs(fitted_order(rows, name, "interpolation_error") - order) < 0.1, name
for name in ("gauss-legendre", "clenshaw-curtis", "chebyshev", "legendre"):
    assert finest(rows, name, 16)["integration_error"] < 1e-14, name
    assert finest(rows, name, 16)["interpolation_error"] < 1e-13, name
assert abs(fitted_order(rows, "fourier", "integration_error") - 1) < 0.1     # a Riemann sum
assert min(r["interpolation_error"] for r in rows if r["name"] == "fourier") > 1   # Gibbs
assert abs(fitted_order(rows, "p1", "integration_error", slice(None)) - 6) < 0.1
assert abs(fitted_order(rows, "p2", "integration_error", slice(0, 3)) - 8) < 0.1   # then rounding

# %%
# The low-order rules show their table orders (2 for midpoint, trapezoid and P1, 3 for P2
# interpolation); the spectral rules reach rounding error near ``n = 16``. Fourier is made
# for periodic data: on :math:`f` it sees a jump at the period boundary, its interpolant
# oscillates (Gibbs) and its quadrature is a first-order Riemann sum. The integral of the
# Galerkin :math:`L^2` projection is as accurate as the element Gauss rule (order 6 for P1
# and 8 for P2), since constants belong to the finite-element space.

styles = {"quadrature": "-o", "spectral": "--s", "galerkin": ":^"}
fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
for name in d.available():
    mine = [r for r in rows if r["name"] == name]
    n = [r["n"] for r in mine]
    style = styles[d.get(name, 5).kind]
    floor = 1e-17  # exact zeros would vanish from a log plot
    axes[0].loglog(n, [max(r["integration_error"], floor) for r in mine], style, label=name)
    axes[1].loglog(n, [max(r["interpolation_error"], floor) for r in mine], style)
n_ref = np.array(ns, dtype=float)
axes[1].loglog(n_ref, 2.0 * n_ref**-2.0, "k-", lw=0.8, label=r"$n^{-2}$")
axes[1].loglog(n_ref, 2.0 * n_ref**-3.0, "k--", lw=0.8, label=r"$n^{-3}$")
for ax, title in zip(axes, ["integration error", "max interpolation error"]):
    ax.set_xlabel("n")
    ax.set_title(title)
    ax.set_xticks(ns, [str(n) for n in ns])  # one label per level, no crowded minor labels
    ax.minorticks_off()
    ax.grid(True, which="major", alpha=0.3)
axes[0].set_ylabel("error")
fig.suptitle(r"$f(x) = e^x \cos(3x + 1)$ on $[0, 1]$")
# the legend goes below the axes, where it cannot hide a curve
fig.legend(loc="lower center", ncol=6, fontsize=8, frameon=False)
fig.tight_layout(rect=(0, 0.12, 1, 1))

# %%
# On the periodic :math:`g` the trapezoidal and midpoint rules (and the Galerkin integrals)
# converge geometrically, like Fourier: only aliased Fourier modes of :math:`g` remain
# (Euler-Maclaurin). Interpolation by piecewise polynomials keeps its algebraic order.


def g(x):
    return np.exp(np.sin(2 * np.pi * x))


periodic_rules = ["midpoint", "trapezoid", "fourier", "chebyshev", "p2"]
periodic = d.error_table(g, float(special.i0(1.0)), ns=ns, names=periodic_rules)
print(d.format_error_table(periodic))
for name in ("midpoint", "trapezoid", "fourier"):     # geometric: rounding level by n = 16
    assert finest(periodic, name, 16)["integration_error"] < 1e-14, name
assert finest(periodic, "p2", 33)["integration_error"] < 1e-14
for name, order in (("trapezoid", 2), ("p2", 3)):    # interpolation stays algebraic
    assert abs(fitted_order(periodic, name, "interpolation_error") - order) < 0.3, name

fig, ax = plt.subplots(figsize=(5, 4))
for name in periodic_rules:
    mine = [r for r in periodic if r["name"] == name]
    ax.semilogy([r["n"] for r in mine], [max(r["integration_error"], 1e-17) for r in mine], "-o", label=name)
ax.set_xlabel("n")
ax.set_ylabel("integration error")
ax.set_title(r"$g(x) = e^{\sin 2\pi x}$")
ax.set_xticks(ns, [str(n) for n in ns])
ax.minorticks_off()
ax.legend(loc="upper right")
fig.tight_layout()
plt.show()

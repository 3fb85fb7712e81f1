r"""
Work and precision: error against wall time for every token discretization
===========================================================================

An order says how fast the error falls with ``n``; a user pays in seconds. This example
solves one smooth two-layer model with each token discretization at several ``n`` and plots
the error against the wall time of the solve. Quadrature and spectral rules cost one dense
attention matrix per head on ``n`` nodes; Galerkin elements evaluate at their per-element
Gauss points and project back with the mass matrix.

Every family is compared with one converged solution (a callable ``reference``). Timings
come from the study tables (``seconds``, the best of two runs to smooth out noise) and
depend on the machine.
"""
import matplotlib.pyplot as plt
import numpy as np

from ctformer.discretizations import GaussLegendre
from ctformer.model import ContinuousTransformer
from ctformer.studies import convergence, smooth_initial_state

model = ContinuousTransformer.random_smooth(seed=0, layers=2, norm="pre")
features = GaussLegendre(12)

# One converged solution is the reference of every family: 160 Gauss-Legendre tokens,
# evaluated anywhere through its polynomial interpolant (its own error is below 1e-11).
fine = GaussLegendre(160)
u_fine = model.solve(smooth_initial_state, tokens=fine, features=features)


def reference(x, y):
    along_x = fine.interpolate(u_fine, np.ravel(x), axis=-2)
    return features.interpolate(along_x, np.ravel(y), axis=-1)


families = {
    "midpoint": [16, 32, 64, 128, 256, 512],
    "trapezoid": [17, 33, 65, 129, 257, 513],
    "p1": [17, 33, 65, 129, 257, 513],
    "p2": [17, 33, 65, 129, 257],
    "gauss-legendre": [16, 24, 32, 48, 64, 96],
    "clenshaw-curtis": [17, 25, 33, 49, 65, 97],
    "legendre": [16, 24, 32, 48, 64, 96],
}
fig, ax = plt.subplots(figsize=(6, 4.5))
for name, levels in families.items():
    runs = [convergence(model, refine="tokens", levels=levels, tokens=name, features=features,
                        reference=reference, progress=False) for _ in range(2)]
    seconds = np.min([[row.seconds for row in r.table] for r in runs], axis=0)
    errors = runs[0].errors
    ax.loglog(seconds, errors, "o-", label=name)
    print(f"{name:16s}" + "  ".join(f"n={n}: {e:.1e} in {s * 1e3:.0f} ms"
                                    for n, e, s in zip(levels, errors, seconds)))
ax.set_xlabel("wall time of one solve (s)")
ax.set_ylabel("L2 error")
ax.set_title("work-precision, tokens")
ax.grid(True, which="both", alpha=0.3)
ax.legend(fontsize="small")

# %%
# At equal time the spectral rules are orders of magnitude more accurate once ``n`` resolves
# the solution; midpoint, the discretization every real Transformer uses, is the cheapest
# per node but needs many more nodes for the same error.
plt.show()

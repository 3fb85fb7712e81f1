r"""
An image is a function on the square
====================================

A vision transformer cuts an image into :math:`n_1 \times n_2` patches and reads them as a
sequence of tokens in raster order. In the continuum the token variable lives on the image,
:math:`x = (x_1, x_2) \in [0, 1]^2`, and a patch grid is a tensor-product quadrature rule:
running the network at a higher resolution than it was trained at (what practitioners do by
interpolating position embeddings) is refining that rule.

:class:`ctformer.discretizations.Product` is the tensor product of two interval rules. The
token axis of the state stays one axis of length :math:`n_1 n_2`, so attention and every
other operator are unchanged. We refine a smooth synthetic image from 4 x 4 to 64 x 64
patches with three rules:

- midpoint x midpoint (the patch grid itself): order 2 in :math:`h = 1/n_1`;
- Gauss-Legendre x Gauss-Legendre: spectral;
- Q1 elements (P1 x P1, Kronecker mass matrices): order 2.
"""
import matplotlib.pyplot as plt
import numpy as np

from ctformer import ContinuousTransformer
from ctformer.discretizations import P1, GaussLegendre, Midpoint, Product, WithAtoms
from ctformer.studies import convergence, plot_convergence


def image(x1, x2, y):
    """A smooth 'image' with a feature profile per pixel: u0(x1, x2, y)."""
    brightness = 0.5 * np.sin(np.pi * x1 + 0.5) * np.cos(np.pi * x2)
    return np.cos(4.0 * y + brightness) + 0.3 * np.sin(np.pi * x1 * y) * x2


model = ContinuousTransformer.random_smooth(seed=0, layers=1, placement="pre")
common = dict(refine="tokens", features="gauss-legendre:8", u0=image, progress=False, fine=144)
results = {
    "midpoint": convergence(model, levels=[4, 8, 16, 32, 64],
                            tokens=Product(Midpoint(2), Midpoint(2)), **common),
    "gauss-legendre": convergence(model, levels=[4, 8, 16, 32],
                                  tokens=Product(GaussLegendre(2), GaussLegendre(2)), **common),
    "q1": convergence(model, levels=[5, 9, 17, 33], tokens=Product(P1(3), P1(3)), **common),
}
orders = {name: res.observed_order for name, res in results.items()}
for res in results.values():
    print(res, end="\n\n")
assert abs(orders["midpoint"] - 2.0) < 0.3 and abs(orders["q1"] - 2.0) < 0.3
factors = results["gauss-legendre"].reductions()
assert factors[-1] > factors[0] > 10, factors     # spectral: a growing reduction per doubling

fig, ax = plt.subplots(figsize=(6, 4.5))
plot_convergence(list(results.values()), ax=ax, title="patch tokens on [0, 1]^2", slopes=False)
plt.show()

# %%
# The class token as an atom
# --------------------------
# A ViT also has a class token: a token of its own, first in the sequence, that every patch
# attends to. In the token measure it is a point mass. With
# :class:`~ctformer.discretizations.WithAtoms` and ``weight=None`` it weighs as much as one
# patch, :math:`1/(n_1 n_2 + 1)` (the discrete network); under refinement its mass vanishes
# and it becomes a passive particle that reads the patch field. With ``weight=0.2`` it keeps a
# fixed mass, the other consistent limit. Its output converges in both conventions, at the
# order of the patch rule, to two different limits (compared here with 64 x 64 patches).
features = GaussLegendre(8)
levels = [4, 8, 16, 32]
class_token = {}
for weight in (None, 0.2):
    outputs = []
    for n in levels + [64]:
        tokens = WithAtoms(Product(Midpoint(n), Midpoint(n)), weight=weight)
        outputs.append(model.solve(image, tokens=tokens, features=features)[0])  # the atom's row
    limit = outputs[-1]
    class_token[weight] = [float(np.sqrt(features.integrate((u - limit) ** 2))) for u in outputs[:-1]]
h = [1.0 / n for n in levels]
# the fitted slope leaves out the level next to the reference (its error is biased)
atom_orders = {w: float(np.polyfit(np.log(h[:-1]), np.log(e[:-1]), 1)[0]) for w, e in class_token.items()}
finest = {w: model.solve(image, tokens=WithAtoms(Product(Midpoint(64), Midpoint(64)), weight=w),
                         features=features)[0] for w in (None, 0.2)}
gap = float(np.sqrt(features.integrate((finest[None] - finest[0.2]) ** 2)))
print("class token error, weight 1/(n+1):", " ".join(f"{e:.2e}" for e in class_token[None]),
      f"(order {atom_orders[None]:.2f})")
print("class token error, mass 0.2:      ", " ".join(f"{e:.2e}" for e in class_token[0.2]),
      f"(order {atom_orders[0.2]:.2f})")
print(f"distance between the two limits: {gap:.3f}")
assert all(abs(order - 2.0) < 0.2 for order in atom_orders.values()), atom_orders
assert gap > 10 * max(class_token[None][-1], class_token[0.2][-1])   # two different limits

fig, ax = plt.subplots(figsize=(6, 4.5))
for weight, errors in class_token.items():
    label = "weight 1/(n1 n2 + 1)" if weight is None else f"fixed mass {weight}"
    ax.loglog(h, errors, "o-", label=label)
ax.loglog(h, [0.5 * class_token[None][0] * (x / h[0]) ** 2 for x in h], "k--", lw=0.8, label="slope 2")
ax.set_xlabel("h = 1 / n1")
ax.set_ylabel("class-token error (L2 over features)")
ax.set_title("the class token under refinement")
ax.legend()
plt.show()

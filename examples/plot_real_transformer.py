"""
A real Transformer is a discretization
======================================

The sentence encoder all-MiniLM-L6-v2 (BERT: 6 post-LayerNorm layers, 12 heads, d = 384) is
read into a :class:`ctformer.model.ContinuousTransformer` by
:func:`ctformer.bridges.from_hf_bert`. Discretizing that continuous model with the midpoint rule
in tokens and features and one Lie-splitting Euler step per layer gives back the network
itself (:doc:`design notes </design>`, section 2): the hidden states agree with HuggingFace's to rounding error,
layer by layer.

The same continuous model can be discretized differently. On a smooth random model,
refining the token grid shows the midpoint rule converging with order 2 and Gauss-Legendre
nodes (attention with a log-weight bias) converging spectrally.
"""

# %%
# MiniLM, layer by layer
# ----------------------
# The embedding output of a padded batch of real sentences is the initial state
# :math:`u_0`; the attention mask becomes the padding mask of the token integral (True for a
# real token).
import matplotlib.pyplot as plt
import numpy as np
from transformers.utils import logging as hf_logging

from ctformer.bridges import minilm
from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.model import ContinuousTransformer

hf_logging.disable_progress_bar()  # no weight-loading bar in the page
x, mask, hidden, tokens = minilm.encode()
model = minilm.continuous_model()
states = model.solve(x, tokens=Midpoint(x.shape[1]), features=Midpoint(x.shape[2]),
                     scheme="lie", steps_per_layer=1, trajectory=True, padding_mask=mask)
layer_errors = np.array([minilm.relative_error(s, h, mask) for s, h in zip(states, hidden)])
for layer, err in enumerate(layer_errors):
    print(f"after layer {layer}: max relative error {err:.2e}")
assert layer_errors.max() < 1e-14     # the network itself, to rounding

fig, ax = plt.subplots(figsize=(6, 3.8))
ax.semilogy(range(len(layer_errors)), np.maximum(layer_errors, 1e-17), "o-", label="ctformer")
ax.axhline(np.finfo(np.float64).eps, color="gray", ls=":", label="float64 eps")
ax.set_ylim(1e-17, 1e-13)
ax.set_xlabel("layer (time t)")
ax.set_ylabel("max relative error vs HuggingFace")
ax.set_title("MiniLM = midpoint tokens and features, Lie, dt = 1")
ax.legend(loc="upper left")
fig.tight_layout()

# %%
# Token refinement on a smooth model
# ----------------------------------
# A smooth random pre-norm model, features fixed to ``GaussLegendre(16)``, initial data whose
# feature variance stays away from zero (LayerNorm is singular at feature-constant states).
# The error at the nodes is measured against a ``GaussLegendre(96)`` solution interpolated there.


def u0(x, y):
    return np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


smooth = ContinuousTransformer.random_smooth(seed=1)
features = GaussLegendre(16)
fine = GaussLegendre(96)
reference = smooth.solve(u0, tokens=fine, features=features)
levels = np.array([4, 8, 16, 32, 64])
token_errors = {}
for rule in (Midpoint, GaussLegendre):
    token_errors[rule.name] = np.array([
        np.abs(smooth.solve(u0, tokens=rule(int(n)), features=features)
               - fine.interpolate(reference, rule(int(n)).nodes, axis=-2)).max()
        for n in levels])
midpoint_order = np.polyfit(np.log(1.0 / levels[1:]), np.log(token_errors["midpoint"][1:]), 1)[0]

print(f"{'N':>4} {'midpoint':>10} {'order':>6} {'gauss-legendre':>15}")
for i, n in enumerate(levels):
    mid = token_errors["midpoint"][i]
    order = "" if i == 0 else f"{np.log2(token_errors['midpoint'][i - 1] / mid):6.2f}"
    print(f"{n:>4} {mid:10.2e} {order:>6} {token_errors['gauss-legendre'][i]:15.2e}")
print(f"midpoint observed order {midpoint_order:.2f}")
assert abs(midpoint_order - 2.0) < 0.1 and token_errors["gauss-legendre"][-1] < 1e-11

fig, ax = plt.subplots(figsize=(6, 3.8))
for name, errs in token_errors.items():
    ax.loglog(levels, np.maximum(errs, 1e-16), "o-", label=name)
ax.loglog(levels, 0.05 * levels.astype(float) ** -2, "k--", label="slope -2")
ax.set_xticks(levels, [str(n) for n in levels])
ax.minorticks_off()
ax.set_xlabel("tokens N")
ax.set_ylabel("max error at the nodes")
ax.set_title("token refinement: midpoint order 2, Gauss-Legendre spectral")
ax.legend(loc="lower left")
fig.tight_layout()
plt.show()

r"""
Train coarse, evaluate fine
===========================

Training a Transformer is an optimal-control problem for its evolution equation: the
parameters are the controls and depth is time. Because ctformer's model is continuous in the
token variable and in depth, what is learned at one resolution is a statement about the
continuous model, and it can be evaluated at another.

Here a small continuous model (the *student*) learns the map :math:`u_0 \mapsto u(T)` of
another one (the *teacher*) from four initial states. It is trained with torch autograd
through ``model.with_parameters(params).solve(...)`` on a coarse discretization, midpoint
with 16 tokens and 2 steps per layer, and then evaluated, unchanged, on Gauss-Legendre with
64 tokens and 16 steps per layer.
"""
import matplotlib.pyplot as plt
import numpy as np
import torch

from ctformer import ContinuousTransformer, Grids
from ctformer.discretizations import GaussLegendre, Midpoint

torch.manual_seed(0)
teacher = ContinuousTransformer.random_smooth(seed=7, layers=1)
student = ContinuousTransformer.random_smooth(seed=1, layers=1)
features = GaussLegendre(8)
coarse = dict(tokens=Midpoint(16), features=features, scheme="strang", steps_per_layer=2)
fine = dict(tokens=GaussLegendre(64), features=features, scheme="strang", steps_per_layer=16)


def initial_states(tokens):
    """Four smooth initial states on ``tokens`` x features (a batch)."""
    grids = Grids(tokens, features)
    return torch.tensor(np.stack([
        grids.sample(lambda x, y, a=a: np.cos(4 * y + a * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y))
        for a in (0.2, 0.6, 1.0, 1.4)]))


def error(model, setting):
    """L2(X x Y) distance to the teacher at one resolution, over the batch (quadrature weights)."""
    u0 = initial_states(setting["tokens"])
    with torch.no_grad():
        diff = model.solve(u0, **setting) - teacher.solve(u0, **setting)
    w = torch.tensor(np.outer(setting["tokens"].weights, features.weights))
    return float(torch.sqrt((diff ** 2 * w).sum() / len(u0)))


params = {k: torch.tensor(v, requires_grad=True) for k, v in student.parameters().items()}
optimizer = torch.optim.Adam(params.values(), lr=0.02)
u0 = initial_states(coarse["tokens"])
with torch.no_grad():
    target = teacher.solve(u0, **coarse)
weights = torch.tensor(np.outer(coarse["tokens"].weights, features.weights))
initial_fine_error = error(student, fine)
losses = []
for step in range(120):
    optimizer.zero_grad()
    loss = ((student.with_parameters(params).solve(u0, **coarse) - target) ** 2 * weights).sum() / len(u0)
    loss.backward()
    optimizer.step()
    losses.append(loss.detach().item())

trained = student.with_parameters({k: v.detach() for k, v in params.items()})
coarse_error, fine_error = error(trained, coarse), error(trained, fine)
print(f"loss: {losses[0]:.3e} -> {losses[-1]:.3e} after {len(losses)} Adam steps")
print("distance to the teacher, trained at midpoint 16 tokens / 2 steps per layer:")
print(f"  at the training resolution:            {coarse_error:.3e}")
print(f"  at Gauss-Legendre 64 / 16 steps:       {fine_error:.3e}  (untrained: {initial_fine_error:.3e})")
assert losses[-1] < 0.01 * losses[0]                           # training converges
assert fine_error < 0.1 * initial_fine_error                   # what was learned holds fine
assert abs(fine_error - coarse_error) < 0.05 * coarse_error    # at the same distance

fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
left.semilogy(losses)
left.set_xlabel("Adam step")
left.set_ylabel("training loss (coarse)")
left.set_title("training at midpoint 16 tokens, 2 steps/layer")
right.bar(["untrained,\nfine", "trained,\ncoarse", "trained,\nfine"],
          [initial_fine_error, coarse_error, fine_error], color=["0.7", "C0", "C1"])
right.set_yscale("log")
right.set_ylabel("L2 distance to the teacher")
right.set_title("what was learned holds at the fine resolution")
fig.tight_layout()
plt.show()

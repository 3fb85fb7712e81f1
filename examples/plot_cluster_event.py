r"""
When do the tokens form one cluster? An event on the particle system
====================================================================

Tokens of a self-attention layer with :math:`Q = K = V = I` move on the sphere
:math:`S^{d-1}` by

.. math::  \dot x_i = P^\perp_{x_i}\Bigl(\frac{\sum_j e^{\beta \langle x_i, x_j\rangle} x_j}
           {\sum_j e^{\beta \langle x_i, x_j\rangle}}\Bigr),

and for small :math:`\beta` they collapse to a single point (Geshkovski, Letrouit, Polyanskiy,
Rigollet 2025). The *cluster-formation time* is the first time the diameter
:math:`\max_{ij} |x_i - x_j|` drops below a threshold. An :class:`ctformer.Event` finds it
during an error-controlled solve: the condition changes sign inside one accepted step, and the
crossing is located on that step's dense output, so no step is spent hunting for it.

The check: the same time from ``scipy.integrate.solve_ivp`` (DOP853 at ``rtol=1e-12``) with its
own event location, on a velocity written here with NumPy alone.
"""
import matplotlib.pyplot as plt
import numpy as np
from scipy.integrate import solve_ivp

from ctformer import Event, SaveAt
from ctformer.particles import SelfAttentionDynamics

n, d, beta, threshold = 32, 3, 1.0, 0.1
rng = np.random.default_rng(0)
x0 = rng.standard_normal((n, d))
x0 /= np.linalg.norm(x0, axis=1, keepdims=True)


def diameter(x):
    return float(np.max(np.linalg.norm(x[:, None, :] - x[None, :, :], axis=-1)))


formed = Event(lambda t, x: diameter(x) - threshold, terminal=True, direction=-1)
solution = SelfAttentionDynamics(beta=beta).evolve(x0, 30.0, rtol=1e-10, atol=1e-13,
                                                   events=[formed], save_at=SaveAt(dense=True))


# %%
# The independent reference: the velocity in NumPy, the event located by SciPy.
def velocity(t, flat):
    x = flat.reshape(n, d)
    scores = beta * x @ x.T
    weights = np.exp(scores - scores.max(axis=1, keepdims=True))
    mean = (weights @ x) / weights.sum(axis=1, keepdims=True)
    return (mean - np.sum(mean * x, axis=1, keepdims=True) * x).ravel()


def below(t, flat):
    return diameter(flat.reshape(n, d)) - threshold


below.terminal, below.direction = True, -1
scipy_run = solve_ivp(velocity, (0.0, 30.0), x0.ravel(), method="DOP853", rtol=1e-12,
                      atol=1e-14, events=below)
t_scipy = float(scipy_run.t_events[0][0])
print(f"cluster formed at t = {solution.event_time:.10f} (ctformer tsit5, rtol 1e-10, "
      f"{solution.stats['accepted']} steps)")
print(f"                 t = {t_scipy:.10f} (solve_ivp DOP853, rtol 1e-12)")
assert abs(solution.event_time - t_scipy) <= 1e-8
assert abs(diameter(solution.final) - threshold) <= 1e-9

# %%
# The diameter along the dense output, with the accepted steps and the event.
ts = np.linspace(0.0, solution.event_time, 300)
plt.semilogy(ts, [diameter(x) for x in solution.evaluate(ts)], label="diameter (dense output)")
steps = solution.stats["step_times"]
steps = steps[steps <= solution.event_time]  # the last step ends past the event, where the solve stopped
plt.semilogy(steps, [diameter(x) for x in solution.evaluate(steps)], "o", ms=3,
             label=f"accepted steps ({len(steps)})")
plt.axhline(threshold, color="gray", lw=0.8)
plt.axvline(solution.event_time, color="k", ls="--", lw=0.8, label="event")
plt.xlabel("t")
plt.ylabel(r"$\max_{ij} |x_i - x_j|$")
plt.legend()
plt.title(rf"one cluster at t = {solution.event_time:.4f} ($n = {n}$, $d = {d}$, $\beta = {beta:g}$)")
plt.show()

r"""Refinement versus extension: what each HuggingFace RoPE scaling does to the continuous model.

A causal RoPE network at context length :math:`L` is, in the continuum, an operator on token
functions of :math:`x \in [0, 1]` with positions :math:`p(x) = L x - 1/2`; its scores depend on
:math:`\omega(\tau)\,(p(x) - p(x'))`. Run on :math:`n = sL` tokens with *linear* scaling by
:math:`s` (position interpolation, :math:`\omega \mapsto \omega/s`), the discrete network
samples the angles :math:`\omega (i - j)/s = \omega L (x_i - x_j)` of the midpoint nodes
:math:`x_i = (i + 1/2)/n`: it is the *unscaled* operator at the fixed length :math:`L`
discretized on :math:`n` midpoint tokens. Refining :math:`n = L, 2L, \dots` then converges to
that operator at the order of the quadrature (first order: HuggingFace's causal mask gives the
diagonal cell its full weight).

The other scalings are not refinements. ``dynamic`` (NTK) raises the base :math:`\Theta`,
``yarn`` and ``llama3`` interpolate only the low frequencies (the ramp between ``beta_fast`` and
``beta_slow``, the wavelength bands) and keep the high ones, ``longrope`` divides each frequency
by its own factor; ``yarn`` and ``longrope`` also multiply every score by :math:`a^2`. At
:math:`n = sL` they discretize another operator, whose frequencies differ from :math:`\omega/s`
by the ratio :math:`\rho(\tau) = s\,\omega_{\mathrm{scaled}}(\tau)/\omega(\tau)` (1 for linear
scaling): against the unscaled operator their error stops at a floor.

:func:`refinement_versus_extension` measures this on a random Llama-type HuggingFace network:
one set of weights, each ``rope_type`` with factor :math:`s = n/L`, run on :math:`n` tokens
(``from_hf(model).run``, the discrete network), compared with the unscaled operator at :math:`L`
(a Richardson extrapolation of two fine midpoint solves), at the same points.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import validation
from ..discretizations import Midpoint
from .common import optional_import

__all__ = ["RefinementStudy", "refinement_versus_extension", "rope_parameters_for", "STUDY_ROPE_TYPES"]

#: The scalings compared (``linear`` first: the refinement).
STUDY_ROPE_TYPES = ("linear", "dynamic", "yarn", "llama3", "longrope")


@dataclass(frozen=True)
class RefinementStudy:
    r"""Errors of each scaled network against the unscaled operator at fixed context length.

    Attributes
    ----------
    context_length : int
        :math:`L`, the fixed context length (and HuggingFace's original length :math:`L_0`).
    tokens : tuple of int
        The token counts :math:`n = sL`.
    errors : dict
        ``rope_type -> tuple``: :math:`\max |u_n - u| / \max |u|` at ``points`` for each
        :math:`n`, :math:`u_n` the network with factor :math:`s = n/L` run on :math:`n` tokens
        (interpolated by the midpoint grid), :math:`u` the unscaled operator at :math:`L`.
    refinement_identity : float
        :math:`\max |u^{\mathrm{linear}}_n - u^{\mathrm{solve}}_n| / \max |u|` over the levels:
        the linear-scaled run against ``solve`` of the unscaled model on ``Midpoint(n)`` at
        ``context_length=L`` (zero up to rounding: the same discrete operator).
    frequency_ratios : dict
        ``rope_type -> ndarray``: :math:`\rho(\tau_i) = s\, \omega_{\mathrm{scaled}}(\tau_i) /
        \omega(\tau_i)` at the largest :math:`s`, :math:`\tau_i = 2i/d_h` (1 for refinement).
    temperatures : dict
        ``rope_type -> float``: the score factor :math:`a^2` at the largest :math:`s`.
    reference_error : float
        The reference's error estimate: its change from the extrapolation of the solves on
        :math:`m/2` and :math:`m` tokens (relative, like ``errors``).
    """

    context_length: int
    tokens: tuple
    errors: dict
    refinement_identity: float
    frequency_ratios: dict
    temperatures: dict
    reference_error: float

    def order(self, kind: str = "linear", last: int = 3) -> float:
        r"""Observed order :math:`-\mathrm{d} \log e / \mathrm{d} \log n` over the ``last`` levels
        (:func:`ctformer.studies.fit_order` with the mesh widths :math:`1/n`)."""
        from ..studies import fit_order

        return fit_order([1.0 / n for n in self.tokens], self.errors[kind], fit_levels=last)

    def floor(self, kind: str) -> float:
        """The error at the finest level: the distance of the scaled operator from the unscaled one."""
        return float(self.errors[kind][-1])

    def table(self) -> str:
        """The errors as a plain-text table (one row per ``rope_type``, one column per ``n``)."""
        head = f"{'rope_type':<10}" + "".join(f"{f'n={n}':>11}" for n in self.tokens) + f"{'a^2':>8}"
        rows = [head] + [f"{kind:<10}" + "".join(f"{e:>11.2e}" for e in errs) + f"{self.temperatures[kind]:>8.3f}"
                         for kind, errs in self.errors.items()]
        return "\n".join(rows)


def rope_parameters_for(kind: str, factor: float, theta: float, original_length: int, pairs: int) -> dict:
    r"""The ``rope_parameters`` of a scaling with factor :math:`s`; ``factor=1`` is the unscaled RoPE.

    ``llama3`` uses ``low_freq_factor=1``, ``high_freq_factor=4``; ``longrope`` the short factors 1
    and the long factors :math:`s^{i/(m - 1)}`, :math:`i = 0, \dots, m - 1` (:math:`m` = ``pairs``):
    the highest frequency kept, the lowest interpolated.
    """
    kind = validation.one_of(kind, "kind", STUDY_ROPE_TYPES + ("default",))
    params = {"rope_type": kind, "rope_theta": float(theta)}
    if kind == "default" or factor == 1.0:
        return {"rope_type": "default", "rope_theta": float(theta)}
    params["factor"] = float(factor)
    if kind in ("yarn", "llama3", "longrope"):
        params["original_max_position_embeddings"] = int(original_length)
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    if kind == "longrope":
        params.update(short_factor=[1.0] * pairs,
                      long_factor=[float(factor) ** (i / max(pairs - 1, 1)) for i in range(pairs)])
    return params


def _network(transformers, torch, state, sizes, rope):
    d, heads, kv_heads, head_dim, layers, length = sizes
    if "original_max_position_embeddings" in rope:  # the extended length, HuggingFace's convention
        length = int(round(rope["factor"] * rope["original_max_position_embeddings"]))
    cfg = transformers.LlamaConfig(hidden_size=d, intermediate_size=2 * d, num_attention_heads=heads,
                                   num_key_value_heads=kv_heads, head_dim=head_dim, num_hidden_layers=layers,
                                   vocab_size=8, max_position_embeddings=length, rope_parameters=rope,
                                   initializer_range=0.3, bos_token_id=0, eos_token_id=1)
    model = transformers.LlamaModel(cfg).to(torch.float64).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def refinement_versus_extension(kinds=STUDY_ROPE_TYPES, *, context_length: int = 16, levels=(1, 2, 4, 8),
                                features: int = 32, heads: int = 4, kv_heads: int = 2, layers: int = 2,
                                theta: float = 100.0, reference_tokens: int = 1024, points: int = 64,
                                seed: int = 0) -> RefinementStudy:
    r"""Token refinement at fixed context length against each RoPE scaling (module docstring).

    Parameters
    ----------
    kinds : sequence of str
        ``rope_type`` values from :data:`STUDY_ROPE_TYPES`.
    context_length : int
        :math:`L = L_0` (``max_position_embeddings`` and ``original_max_position_embeddings``).
    levels : sequence of int
        The factors :math:`s`; the networks run on :math:`n = sL` tokens (``1``: the unscaled one).
    features, heads, kv_heads, layers : int
        The random ``LlamaModel`` (head dimension ``features / heads``, feed-forward width
        ``2 features``, weights :math:`\mathcal{N}(0, 0.3^2)`: attention far from uniform).
    theta : float
        ``rope_theta``: 100 makes every pair rotate over a context of 16 tokens.
    reference_tokens : int
        :math:`m` (even): the unscaled operator is :math:`2 u_{2m} - u_m` from midpoint solves on
        :math:`m` and :math:`2m` tokens (first-order error removed).
    points : int
        The comparison points :math:`(k + 1/2)/` ``points``.
    seed : int
        Seeds the weights (torch) and the initial state (NumPy).

    Returns
    -------
    RefinementStudy
    """
    torch = optional_import("torch", "refinement_versus_extension")
    transformers = optional_import("transformers", "refinement_versus_extension")
    from .hf import from_hf
    from .rope_scaling import scaled_frequencies

    length = validation.integer(context_length, "context_length", minimum=2)
    levels = tuple(validation.integer(s, "levels", minimum=1) for s in levels)
    head_dim = validation.integer(features, "features") // validation.integer(heads, "heads")
    sizes = (features, heads, kv_heads, head_dim, layers, length)
    torch.manual_seed(validation.integer(seed, "seed", minimum=0))
    base = _network(transformers, torch, None, sizes, rope_parameters_for("default", 1.0, theta, length, 1))
    state, unscaled = base.state_dict(), from_hf(base)
    u0, nodes = _initial_state(seed, features), (np.arange(points) + 0.5) / points

    def at_points(u, n):
        return unscaled.grids(Midpoint(n), Midpoint(features), context_length=length).evaluate(u, tokens=nodes)

    def solved(n):
        n = int(n)
        return at_points(unscaled.solve(u0, tokens=Midpoint(n), features=Midpoint(features), context_length=length), n)

    coarser, coarse, fine = (solved(m * reference_tokens) for m in (0.5, 1, 2))
    reference = 2.0 * fine - coarse
    scale = float(np.max(np.abs(reference)))
    reference_error = float(np.max(np.abs(reference - (2.0 * coarse - coarser)))) / scale
    errors, ratios, temperatures, identity = {}, {}, {}, 0.0
    for kind in kinds:
        errs = []
        for s in levels:
            n = s * length
            model = _network(transformers, torch, state, sizes, rope_parameters_for(kind, s, theta, length, head_dim // 2))
            x = u0(((np.arange(n) + 0.5) / n)[:, None], ((np.arange(features) + 0.5) / features)[None, :])
            u = at_points(from_hf(model).run(x), n)
            errs.append(float(np.max(np.abs(u - reference))) / scale)
            if kind == "linear":
                identity = max(identity, float(np.max(np.abs(u - solved(n)))) / scale)
        errors[kind] = tuple(errs)
        omega, a = scaled_frequencies(model.config, levels[-1] * length)
        plain, _ = scaled_frequencies(base.config)
        ratios[kind], temperatures[kind] = levels[-1] * omega / plain, float(a) ** 2
    return RefinementStudy(length, tuple(s * length for s in levels), errors, identity, ratios, temperatures,
                           reference_error)


def _initial_state(seed, features):
    r""":math:`u_0(x, y) = c_0(y) + c_1(y)\cos \pi x + c_2(y) \sin 2\pi x`, piecewise constant in :math:`y`."""
    c = np.random.default_rng(seed).standard_normal((3, features))

    def u0(x, y):
        j = np.minimum((np.asarray(y) * features).astype(int), features - 1)
        return c[0][j] + c[1][j] * np.cos(np.pi * x) + c[2][j] * np.sin(2 * np.pi * x)

    return u0

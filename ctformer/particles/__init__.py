r"""Tokens as particles on the sphere and their mean-field limit (Geshkovski et al. 2025).

* :class:`SelfAttentionDynamics`: the (SA) and (USA) particle systems, split problems run by
  any scheme of :mod:`ctformer.solvers` with the retraction onto the sphere as projection;
  :class:`Trajectory`, :class:`SolveInterrupted` (Ctrl-C keeps the trajectory so far).
* :class:`CircleMeanField`: the continuity equation for the token density on the circle,
  Fourier spectral with exact Bessel kernel coefficients, any scheme of :mod:`ctformer.solvers`,
  a stable-step bound checked before each solve (:func:`stability_function`).
* Diagnostics: :func:`gram`, :func:`inner_product_histogram`, :func:`cluster_count`,
  :func:`energy`, :func:`single_cluster_distance`, :func:`in_open_hemisphere`,
  :func:`attention_matrix`, :func:`attention_rank`, :func:`row_entropy`.
* :mod:`ctformer.particles.minilm`: clustering of the hidden states of a real model
  (imported on demand; needs torch and transformers).
"""
from .diagnostics import (
    attention_matrix,
    attention_rank,
    cluster_count,
    energy,
    gram,
    in_open_hemisphere,
    inner_product_histogram,
    row_entropy,
    single_cluster_distance,
)
from .dynamics import (SelfAttentionDynamics, SolveInterrupted, Trajectory, log_partition, retract, sphere_tolerance,
                       tangent_projection)
from .meanfield import CircleMeanField, MeanFieldSolution, ResolutionWarning, linear_growth_rate, stability_function
from .zonal import ZonalMeanField, ZonalSolution
from .spherical import SphericalMeanField, SphericalSolution
from .sphere_particles import empirical_density

__all__ = [
    "SelfAttentionDynamics",
    "Trajectory",
    "CircleMeanField",
    "MeanFieldSolution",
    "ZonalMeanField",
    "ZonalSolution",
    "SphericalMeanField",
    "SphericalSolution",
    "empirical_density",
    "SolveInterrupted",
    "ResolutionWarning",
    "linear_growth_rate",
    "stability_function",
    "sphere_tolerance",
    "log_partition",
    "retract",
    "tangent_projection",
    "gram",
    "inner_product_histogram",
    "cluster_count",
    "energy",
    "single_cluster_distance",
    "in_open_hemisphere",
    "attention_matrix",
    "attention_rank",
    "row_entropy",
]

"""Acceptance of "One core": the state space `Grids` owns the change between stored values and
point values, and the lift of a flow; renamed keywords name their new names. Each test quotes
the issue. (One integrator, scheme names and orders of particles and mean field, pickling,
parameters(), the per-layer NaN report are asserted in test_particles_core.py,
test_parameters_readonly.py, test_shared_tensors.py and test_sequence_groups.py.)"""
from __future__ import annotations

import numpy as np
import pytest

from ctformer import ContinuousTransformer, Grids
from ctformer.discretizations import P2, GaussLegendre, Midpoint


def _linear(x, y):
    return 1.0 + x - 2.0 * y


def test_lift_of_a_flow_is_the_projection_of_the_flow_on_point_values():
    """"one `Grids` ... that owns ... lifting a flow to stored values": on P2 x P2 elements
    c -> Pi f(E c) with f(g) = g^2 maps the coefficients of u = 1 + x - 2y to those of u^2
    (biquadratic, so the L2 projection reproduces it: equal to Grids.sample(u^2))."""
    grids = Grids(P2(5), P2(3))
    c = grids.sample(_linear)
    lifted = grids.lift(lambda g: g * g)
    np.testing.assert_allclose(lifted(c), grids.sample(lambda x, y: _linear(x, y) ** 2),
                               rtol=1e-13, atol=1e-13)
    nodal = Grids(GaussLegendre(4), Midpoint(3))
    assert nodal.lift(np.tanh) is np.tanh and grids.lift(None) is None


def test_stored_and_point_values_on_every_axis():
    """"the change between stored values and point values on every axis": to_points is the
    evaluation of the reconstruction at each axis' quadrature points (the interpolation
    matrices, an independent route), and from_points(to_points(c)) = c."""
    grids = Grids(P2(5), P2(3))
    c = np.random.default_rng(1).standard_normal(grids.stored_shape)
    ex = grids.tokens.interpolation_matrix(grids.tokens.quadrature_nodes)
    ey = grids.features.interpolation_matrix(grids.features.quadrature_nodes)
    g = grids.to_points(c)
    assert g.shape == grids.shape
    np.testing.assert_allclose(g, ex @ c @ ey.T, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(grids.from_points(g), c, rtol=1e-12, atol=1e-12)


def test_min_feature_std_is_the_quadrature_standard_deviation():
    """"the feature-variance diagnostic": for u = a(x) cos(2 pi y) the feature standard
    deviation is |a(x)| / sqrt(2) (the midpoint rule is exact for cos^2 on 8 points); the
    smallest over tokens is min |a| / sqrt(2)."""
    grids = Grids(Midpoint(5), Midpoint(8))
    u = grids.sample(lambda x, y: (0.5 + x) * np.cos(2 * np.pi * y))
    assert abs(grids.min_feature_std(u) - (0.5 + 0.1) / np.sqrt(2)) < 1e-14


def test_a_renamed_placement_keyword_is_refused_naming_the_new_one():
    """"Every name that an earlier issue gave (e.g. `random_smooth(norm="pre")` ...) keeps
    working": 0.2.0 removed the alias (CHANGELOG "Renamed"); the refusal names `placement=`."""
    with pytest.raises(TypeError, match=r"'norm' \(placement= says where the norms sit"):
        ContinuousTransformer.random_smooth(seed=2, norm="pre")

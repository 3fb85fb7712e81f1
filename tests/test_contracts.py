"""The contracts declared on the base classes: what the rest of ctformer reads from a
discretization, an operator and a normalization, checked against closed forms."""
import numpy as np
import pytest

from ctformer.discretizations import (Discretization, Midpoint, P1, P2, Product, WithAtoms,
                                      available, get)
from ctformer.state import Grids

# Closed form: the Galerkin rules store element coefficients, every other rule point values.
GALERKIN = {"p1", "p2"}


def _size(name):
    return 9 if name in GALERKIN else 8   # P1/P2 need an odd n


@pytest.mark.parametrize("name", available())
def test_interval_rules_declare_dimension_one_and_nodality(name):
    disc = get(name, _size(name))
    assert disc.dimension == 1 and disc.atoms == 0
    assert disc.nodal is (name not in GALERKIN)
    # what the declaration means: nodes of shape (n,), and for a nodal rule the stored values
    # of f are f(nodes) while a Galerkin rule stores L2-projection coefficients (x^2 is not in
    # the P1 space; the P2 projection of x^3 neither)
    assert np.shape(disc.nodes) == (disc.n,)
    a, b = disc.domain
    f = (lambda x: np.cos(3.0 * (x - a) / (b - a))) if disc.periodic else (lambda x: x ** 3)
    stored = disc.sample(f)
    assert np.allclose(stored, f(disc.nodes), rtol=0, atol=1e-14) is disc.nodal


@pytest.mark.parametrize("first, second, nodal", [
    (Midpoint(3), Midpoint(4), True), (Midpoint(3), P1(5), False), (P2(5), Midpoint(4), False),
    (P1(3), P1(5), False)])
def test_products_declare_dimension_two_and_nodal_only_with_nodal_factors(first, second, nodal):
    disc = Product(first, second)
    assert disc.dimension == 2 and disc.nodal is nodal and disc.atoms == 0
    assert np.shape(disc.nodes) == (first.n * second.n, 2)
    assert Grids(disc, Midpoint(4)).is_nodal is nodal


@pytest.mark.parametrize("base, dimension", [(Midpoint(6), 1), (Product(Midpoint(2), Midpoint(3)), 2)])
def test_atoms_keep_the_base_dimension_and_count_their_atoms(base, dimension):
    disc = WithAtoms(base, count=2)
    assert disc.dimension == dimension and disc.nodal is True and disc.atoms == 2
    assert disc.n == base.n + 2


def test_a_galerkin_base_is_refused_by_atoms_through_the_declared_nodality():
    with pytest.raises(TypeError, match="nodal base"):
        WithAtoms(P1(5))


def test_a_user_discretization_inherits_the_interval_defaults():
    class Left(Discretization):
        """The left-endpoint rule: nodes a + j h, weights h (first order)."""
        name, order = "left", 1

        def _nodes(self):
            a, _ = self.domain
            return a + self.h * np.arange(self.n)

        def _weights(self):
            return np.full(self.n, self.h)

        def interpolation_matrix(self, points):
            return np.eye(self.n)[np.minimum((np.asarray(points) / self.h).astype(int), self.n - 1)]

    disc = Left(4)
    assert (disc.dimension, disc.nodal, disc.atoms, disc.label) == (1, True, 0, "left")
    grids = Grids(disc, Midpoint(2))
    assert grids.is_nodal
    # the left rule integrates x exactly to (n - 1) n h^2 / 2 = 3/8 on 4 cells
    assert disc.integrate(disc.sample(lambda x: x)) == pytest.approx(3.0 / 8.0, abs=1e-15)


def test_grids_refuse_an_object_that_is_not_a_discretization():
    class Duck:
        quadrature_nodes = np.array([0.5])
        quadrature_weights = np.array([1.0])

    with pytest.raises(TypeError, match="Grids.tokens must be a Discretization"):
        Grids(Duck(), Midpoint(2))

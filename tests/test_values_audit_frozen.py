"""Value objects: discretizations are frozen, schemes and solutions compare by value and pickle.

References: NumPy's Gauss-Legendre rule (``numpy.polynomial.legendre.leggauss``) for the nodes
a discretization keeps, the standard library's ``pickle``/``copy`` round trips, and a second
Python process that unpickles and computes the same bits.
"""
import copy
import pickle
import subprocess
import sys

import numpy as np
import pytest

import ctformer
import ctformer.discretizations as d
import ctformer.solvers as S


def _gauss(n, a, b):
    x, w = np.polynomial.legendre.leggauss(n)
    return a + (b - a) * (x + 1) / 2, (b - a) * w / 2


@pytest.mark.parametrize("disc", [d.GaussLegendre(8), d.P1(9), d.Product(d.Midpoint(2), d.Midpoint(3)),
                                  d.WithAtoms(d.Midpoint(4))])
def test_discretizations_refuse_setattr_and_delattr(disc):
    key, nodes = hash(disc), np.array(disc.nodes)
    with pytest.raises(AttributeError, match=r"immutable.*'n'.*build a new one"):
        disc.n = 3
    with pytest.raises(AttributeError, match=r"immutable.*'domain'"):
        del disc.domain
    for same in (disc, pickle.loads(pickle.dumps(disc)), copy.deepcopy(disc)):
        assert hash(same) == key and same == disc
        assert np.array_equal(same.nodes, nodes)
        with pytest.raises(AttributeError, match="immutable"):
            same.n = 3   # the copies are frozen as well


def test_frozen_gauss_legendre_keeps_its_nodes_and_cache_key():
    g = d.GaussLegendre(8)
    cache = {g: "eight nodes"}
    with pytest.raises(AttributeError):
        g.n = 4   # before: accepted; the hash moved (the dict lost the key), nodes stayed 8
    assert cache[d.GaussLegendre(8)] == "eight nodes" and g in cache
    x, w = _gauss(8, 0.0, 1.0)
    np.testing.assert_allclose(g.nodes, x, rtol=0, atol=1e-15)
    np.testing.assert_allclose(g.weights, w, rtol=0, atol=1e-15)


def test_repr_round_trips_the_domain_exactly():
    g = d.GaussLegendre(8, domain=(0.1, 0.1234567891))
    # before: "GaussLegendre(8, domain=(0.1, 0.123457))", another domain
    assert repr(g) == "GaussLegendre(8, domain=(0.1, 0.1234567891))"
    back = eval(repr(g), vars(d))
    assert back == g and np.array_equal(back.nodes, g.nodes)
    np.testing.assert_allclose(g.nodes, _gauss(8, 0.1, 0.1234567891)[0], rtol=1e-15, atol=0)
    p = d.Product(d.Midpoint(3, domain=(-1.0, 1.0 / 3.0)), d.Chebyshev(5))
    assert eval(repr(p), vars(d)) == p


def test_with_atoms_repr_shows_locations():
    moved, corner = d.WithAtoms(d.Midpoint(4), locations=[0.5]), d.WithAtoms(d.Midpoint(4))
    assert moved != corner
    assert repr(moved) == "WithAtoms(Midpoint(4), count=1, weight=None, locations=[0.5])"
    assert repr(corner) == "WithAtoms(Midpoint(4), count=1, weight=None)"
    for w in (moved, corner):
        assert eval(repr(w), vars(d)) == w


@pytest.mark.parametrize("name", ["euler", "heun", "rk4", "bosh3", "dopri5", "tsit5"])
def test_runge_kutta_schemes_are_values(name):
    a, b = S.get(name), S.get(name)
    assert a == b and hash(a) == hash(b)   # before: compared by identity (False)
    assert a != S.get("lie") and S.get("euler") != S.get("heun")
    # before: bosh3, dopri5 and tsit5 could not be pickled ("attribute lookup Tsit5 ... failed")
    for back in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a)):
        assert back == a and type(back) is type(a)


def _solve(model, u0, scheme):
    return model.evolve(u0, tokens=d.GaussLegendre(4), features=d.GaussLegendre(6), scheme=scheme,
                        rtol=1e-7, atol=1e-9, save_at=S.SaveAt(steps=True))


def test_scheme_after_a_solve_pickles_without_its_last_stage():
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=1)
    u0 = np.random.default_rng(0).standard_normal((4, 6))
    scheme = S.get("dopri5")

    def solve(s):
        return model.solve(u0, tokens=d.GaussLegendre(4), features=d.GaussLegendre(6), scheme=s,
                           steps_per_layer=2)

    first = solve(scheme)
    assert scheme._last is not None   # the FSAL stage of the last step, a per-solve cache
    # before: PicklingError (the class, and then the step's problem of closures in _last)
    back = pickle.loads(pickle.dumps(scheme))
    assert back == scheme and back._last is None and copy.deepcopy(scheme)._last is None
    assert np.array_equal(solve(back), first)


def test_solution_equality_round_trips():
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=1)
    u0 = np.random.default_rng(0).standard_normal((4, 6))
    sol = _solve(model, u0, "tsit5")
    # before: ValueError "The truth value of an array with more than one element is ambiguous"
    assert sol == pickle.loads(pickle.dumps(sol)) and sol == copy.deepcopy(sol)
    other = _solve(model, u0 * 0.5, "tsit5")
    assert sol != other and sol != "a solution"
    with pytest.raises(TypeError, match="unhashable"):
        hash(sol)


_CHILD = """
import pickle, sys
import numpy as np
objs, u0 = pickle.loads(sys.stdin.buffer.read())
disc, product, atoms, scheme, controller, save_at, model = objs
out = [disc.integrate(np.cos(disc.nodes)), product.weights, atoms.nodes,
       model.evolve(u0, tokens=disc, features=product.first.refine(3), scheme=scheme,
                    controller=controller, save_at=save_at).final]
sys.stdout.buffer.write(pickle.dumps(out))
"""


def test_another_process_unpickles_and_computes_the_same_bits():
    disc = d.GaussLegendre(5, domain=(0.1, 0.1234567891))
    product = d.Product(d.Midpoint(2), d.Chebyshev(3))
    atoms = d.WithAtoms(d.Midpoint(4), weight=0.25, locations=[0.75])
    objs = (disc, product, atoms, S.get("tsit5"), S.PIController(1e-6, 1e-9), S.SaveAt(steps=True),
            ctformer.ContinuousTransformer.random_smooth(seed=3, layers=1))
    u0 = np.random.default_rng(1).standard_normal((5, 6))
    here = [disc.integrate(np.cos(disc.nodes)), product.weights, atoms.nodes,
            objs[-1].evolve(u0, tokens=disc, features=product.first.refine(3), scheme=objs[3],
                            controller=objs[4], save_at=objs[5]).final]
    done = subprocess.run([sys.executable, "-c", _CHILD], input=pickle.dumps((objs, u0)),
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    there = pickle.loads(done.stdout)
    assert all(np.array_equal(a, b) for a, b in zip(here, there))
    # the exact integral of cos on the domain, to rounding
    assert abs(here[0] - (np.sin(0.1234567891) - np.sin(0.1))) < 1e-16


def test_position_encodings_are_frozen_values():
    from ctformer.operators import ALiBi, AxialRoPE, RoPE

    rope = RoPE(500.0)
    with pytest.raises(AttributeError, match=r"RoPE is immutable.*'theta'.*build a new encoding"):
        rope.theta = 10000.0   # before: accepted, repr said 10000 while the angles used 500
    with pytest.raises(AttributeError, match="ALiBi is immutable"):
        ALiBi().slopes = np.array([0.5])
    # omega(tau) = theta**(-tau), the closed form
    np.testing.assert_array_equal(rope.omega(np.array([0.0, 0.5])), [1.0, 500.0 ** -0.5])
    pairs = [(RoPE(), RoPE(10000)), (RoPE(frequencies=[1.0, 0.5]), RoPE(frequencies=np.array([1, 0.5]))),
             (ALiBi([0.5, 0.25]), ALiBi(np.array([0.5, 0.25]))), (AxialRoPE(), AxialRoPE())]
    for a, b in pairs:   # before: compared by identity, so every copy was another encoding
        assert a == b and hash(a) == hash(b)
        assert pickle.loads(pickle.dumps(a)) == a and copy.deepcopy(a) == a
    assert RoPE() != RoPE(500.0) and RoPE() != AxialRoPE() and ALiBi() != ALiBi([0.5, 0.25])
    assert RoPE(frequencies=[1.0, 0.5]) != RoPE(frequencies=[1.0, 0.25])

"""The contracts declared on the base classes: what the rest of ctformer reads from a
discretization, an operator and a normalization, checked against closed forms."""
import textwrap
import warnings

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


# -- normalizations ---------------------------------------------------------------------------
from ctformer.kernels import PiecewiseConstant, read_only  # noqa: E402
from ctformer.model import Block, ContinuousTransformer, InconsistentDepthLimitWarning  # noqa: E402
from ctformer.operators import FeatureMap, FeedForward, LayerNormProjection, RMSNorm  # noqa: E402
from ctformer.operators.base import Normalization, Operator  # noqa: E402


class ScaledCentring(Normalization):
    r"""A user's normalization, :math:`N(u) = c\,(u - \mu(u))`.

    For :math:`c = 1` it is the :math:`L^2(Y)` orthogonal projection onto the functions of mean
    zero (linear, idempotent); for :math:`c \ne 1`, :math:`N(N(u)) = c N(u) \ne N(u)`.
    """

    def __init__(self, scale=1.0):
        self.scale = float(scale)

    def parameters(self) -> dict:
        return {"scale": read_only(np.asarray(self.scale))}

    @property
    def is_projection(self) -> bool:
        return self.scale == 1.0

    def _discretize(self, grids):
        w = np.asarray(grids.features.quadrature_weights) / grids.features.length
        scale = self.scale

        def centre(u):
            return scale * (u - (u @ w)[..., None])

        return centre


D, M, N = 6, 10, 5
RNG = np.random.default_rng(20)
W1, W2 = RNG.normal(size=(M, D)) / np.sqrt(D), RNG.normal(size=(D, M)) / np.sqrt(M)
B1, B2 = 0.1 * RNG.normal(size=M), 0.1 * RNG.normal(size=D)


def _feedforward():
    return FeedForward(PiecewiseConstant(W1), PiecewiseConstant(W2), B1, B2, activation="relu")


def _numpy_feedforward(v):
    return np.maximum(v @ W1.T + B1, 0.0) @ W2.T + B2


def test_a_user_normalization_plugs_into_a_model_and_matches_numpy():
    """Pre-norm, two layers, final normalization: run(x) against the discrete network written
    out in NumPy, u <- u + F(N(u)) per layer, then N_final(u)."""
    layers = [Block(feedforward=_feedforward(), normalization2=ScaledCentring(0.5 + l), placement="pre")
              for l in range(2)]
    model = ContinuousTransformer(layers, final_normalization=ScaledCentring(2.0), hidden=Midpoint(M))
    x = RNG.normal(size=(N, D))
    u = x.copy()
    for scale in (0.5, 1.5):
        v = scale * (u - u.mean(axis=-1, keepdims=True))
        u = u + _numpy_feedforward(v)
    expected = 2.0 * (u - u.mean(axis=-1, keepdims=True))
    np.testing.assert_allclose(model.run(x), expected, rtol=1e-13, atol=1e-13)
    # its parameter is the model's, and with_parameters changes what the model computes
    assert sorted(k for k in model.parameters() if "normalization" in k) == [
        "blocks.0.normalization2.scale", "blocks.1.normalization2.scale", "final_normalization.scale"]
    params = dict(model.parameters(), **{"final_normalization.scale": np.asarray(3.0)})
    np.testing.assert_allclose(model.with_parameters(params).run(x), 1.5 * expected, rtol=1e-13,
                               atol=1e-13)


def _post_norm(scale):
    return ContinuousTransformer([Block(feedforward=_feedforward(), normalization2=ScaledCentring(scale),
                                        placement="post")], hidden=Midpoint(M))


def _lie(scale, k, x):
    """Post-norm Lie steps written out: u <- N(u + F(u) / k), k times."""
    u = x
    for _ in range(k):
        u = u + _numpy_feedforward(u) / k
        u = scale * (u - u.mean(axis=-1, keepdims=True))
    return u


def test_post_norm_with_a_projection_converges_in_depth_and_is_not_reported():
    x = RNG.normal(size=(N, D))
    model = _post_norm(1.0)
    assert model.blocks[0].is_consistent_in_depth and not model.warns_inconsistent_depth
    with warnings.catch_warnings():
        warnings.simplefilter("error", InconsistentDepthLimitWarning)
        states = {k: model.solve(x, tokens=Midpoint(N), features=Midpoint(D), steps_per_layer=k)
                  for k in (8, 16, 32)}
    for k, u in states.items():
        np.testing.assert_allclose(u, _lie(1.0, k, x), rtol=1e-12, atol=1e-12)
    # first order in 1/k: the differences of successive refinements halve
    ratio = np.abs(states[8] - states[16]).max() / np.abs(states[16] - states[32]).max()
    assert 1.6 < ratio < 2.5, ratio


def test_post_norm_with_a_non_idempotent_normalization_is_reported_inconsistent():
    """N = 1.5 (u - mu): each of the k post-norm steps multiplies the mean-free part by 1.5 (up to
    O(1/k)), so u(1) grows like 1.5^k and has no limit in depth; the model says so."""
    x = RNG.normal(size=(N, D))
    model = _post_norm(1.5)
    assert not model.blocks[0].is_consistent_in_depth and model.warns_inconsistent_depth
    with pytest.warns(InconsistentDepthLimitWarning):
        u8 = model.solve(x, tokens=Midpoint(N), features=Midpoint(D), steps_per_layer=8)
    np.testing.assert_allclose(u8, _lie(1.5, 8, x), rtol=1e-12, atol=1e-12)
    with pytest.warns(InconsistentDepthLimitWarning):
        u16 = model.solve(x, tokens=Midpoint(N), features=Midpoint(D), steps_per_layer=16)
    growth = np.linalg.norm(u16) / np.linalg.norm(u8)
    assert 0.5 * 1.5 ** 8 < growth < 2.0 * 1.5 ** 8, growth


def test_a_declared_idempotent_map_that_is_not_a_projection_is_consistent():
    class Sign(ScaledCentring):
        """N(u) = sign(u - mu) up to scale is not an L2 projection, but u / max|u| is idempotent."""

        @property
        def is_projection(self):
            return False

        @property
        def is_idempotent(self):
            return True

    block = Block(feedforward=_feedforward(), normalization2=Sign(), placement="post")
    assert block.is_consistent_in_depth
    assert Normalization.is_idempotent.fget(ScaledCentring(2.0)) is False


@pytest.mark.parametrize("make, argname", [
    (lambda bad: Block(feedforward=_feedforward(), normalization2=bad), "normalization2"),
    (lambda bad: Block(feedforward=_feedforward(), normalization1=bad, placement="post"), "normalization1"),
    (lambda bad: ContinuousTransformer([Block(feedforward=_feedforward())], final_normalization=bad),
     "final_normalization")])
@pytest.mark.parametrize("bad", [lambda u: u, FeatureMap(PiecewiseConstant(np.eye(D)))])
def test_an_object_that_is_not_a_normalization_is_refused_naming_the_argument(make, argname, bad):
    with pytest.raises(TypeError, match=f"{argname} must be a ctformer.operators.Normalization"):
        make(bad)


def test_an_operator_without_parameters_cannot_be_built():
    class NoParameters(Normalization):
        def _discretize(self, grids):
            return lambda u: u

    with pytest.raises(TypeError, match="parameters"):
        NoParameters()


# -- Operator.parameters is what the model lists ----------------------------------------------
def _own(model):
    """The model's parameters rebuilt from each operator's own Operator.parameters()."""
    slots = ("attention", "feedforward", "normalization1", "normalization2")
    out = {}
    places = [(f"blocks.{i}.{slot}", getattr(b, slot)) for i, b in enumerate(model.blocks) for slot in slots]
    for place, op in places + [("final_normalization", model.final_normalization)]:
        if op is not None:
            assert isinstance(op, Operator)
            out.update({f"{place}.{name}" if name else place: v for name, v in op.parameters().items()})
    return out


@pytest.mark.parametrize("options", [
    dict(placement="pre"), dict(placement="post"),
    dict(normalization="rmsnorm", feedforward="swiglu", positions="rope", context_length=8.0),
    dict(feedforward="geglu", kv_heads=1, positions="alibi", context_length=8.0)])
def test_operator_parameters_are_what_the_model_lists(options):
    model = ContinuousTransformer.random_smooth(seed=3, **options)
    listed, own = model.parameters(), _own(model)
    assert sorted(listed) == sorted(own) and listed
    for name, value in listed.items():
        np.testing.assert_array_equal(value, own[name], err_msg=name)


def test_parameter_count_of_a_hand_built_model_is_the_closed_form():
    """Two layers of LayerNorm(d) + MLP(d, m) and a final RMSNorm(d): as many numbers as the
    torch modules, 2 (2 d + d m + m + m d + d) + d."""
    blocks = [Block(feedforward=_feedforward(),
                    normalization2=LayerNormProjection(gain=RNG.normal(size=D), shift=RNG.normal(size=D)))
              for _ in range(2)]
    model = ContinuousTransformer(blocks, final_normalization=RMSNorm(gain=RNG.normal(size=D)))
    assert sum(v.size for v in model.parameters().values()) == 2 * (2 * D + 2 * D * M + M + D) + D
    assert model.parameters().keys() == _own(model).keys()
    np.testing.assert_array_equal(model.parameters()["blocks.1.feedforward.W_2.weight"], W2)


# -- the activations registry -----------------------------------------------------------------
from ctformer.operators import activations  # noqa: E402


def _softplus(z):
    return np.logaddexp(z, 0.0)


@pytest.fixture
def softplus():
    activations.register_activation("softplus", _softplus)
    yield "softplus"
    del activations.ACTIVATIONS["softplus"]


def test_a_registered_activation_is_a_name_for_models_and_the_command_line(softplus):
    """One function plus registration: FeedForward(activation="softplus") is
    W_2 log(1 + exp(W_1 u + b_1)) + b_2, and `ctformer study --activation` lists it."""
    from ctformer.cli import build_parser

    op = FeedForward(PiecewiseConstant(W1), PiecewiseConstant(W2), B1, B2, activation=softplus)
    x = RNG.normal(size=(N, D))
    expected = np.log1p(np.exp(x @ W1.T + B1)) @ W2.T + B2
    np.testing.assert_allclose(op(x, Grids(Midpoint(N), Midpoint(D), hidden=Midpoint(M))), expected,
                               rtol=1e-13, atol=1e-13)
    args = build_parser().parse_args(["study", "--activation", "softplus", "--refine", "tokens",
                                      "--levels", "4,8", "--out", "unused"])
    assert args.activation == "softplus"


def test_a_registered_name_is_never_rebound(softplus):
    activations.register_activation(softplus, _softplus)   # the same function again: a no-op
    with pytest.raises(ValueError, match="'softplus' is already registered"):
        activations.register_activation(softplus, np.tanh)
    with pytest.raises(ValueError, match="'gelu' is already registered"):
        activations.register_activation("gelu", _softplus)
    with pytest.raises(TypeError, match="function must be callable"):
        activations.register_activation("twice", 2.0)


def test_a_registered_activation_that_is_not_pointwise_is_refused_when_applied():
    activations.register_activation("total", lambda z: np.sum(z, axis=-1))
    try:
        op = FeedForward(PiecewiseConstant(W1), PiecewiseConstant(W2), activation="total")
        with pytest.raises(ValueError, match="activation 'total' must act pointwise"):
            op(RNG.normal(size=(N, D)), Grids(Midpoint(N), Midpoint(D), hidden=Midpoint(M)))
    finally:
        del activations.ACTIVATIONS["total"]


def test_the_normalization_of_the_design_notes_runs_and_is_the_centring():
    """The code block of docs/design.rst, section 10: its Centring has mean zero on Gauss
    features (integral to 1e-15), is idempotent, and makes a post-norm model consistent."""
    from tests.test_docs_pages import python_blocks

    namespace = {}
    for block in python_blocks("design.rst"):
        exec(textwrap.dedent(block), namespace)
    centring = namespace["Centring"]()
    grids = Grids(Midpoint(N), get("gauss-legendre", 7))
    u = np.cos(np.add.outer(np.arange(N), 3.0 * grids.features.nodes))
    v = centring(u, grids)
    assert np.abs(grids.features.integrate(v)).max() < 1e-15
    np.testing.assert_allclose(v, u - grids.features.integrate(u)[:, None], rtol=0, atol=1e-15)
    np.testing.assert_allclose(centring(v, grids), v, rtol=0, atol=1e-15)   # idempotent
    assert Block(feedforward=_feedforward(), normalization2=centring, placement="post").is_consistent_in_depth

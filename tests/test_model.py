"""ContinuousTransformer: token convergence on smooth random models, depth against solve_ivp,
the per-layer trajectory and the parallel block against torch, validation and warnings."""
import warnings

import numpy as np
import pytest

from tests.conftest import fitted_order, require

from ctformer.discretizations import GaussLegendre, Midpoint
from ctformer.model import Block, ContinuousTransformer, InconsistentDepthLimitWarning

FEATURES = GaussLegendre(16)


def u0(x, y):
    """Initial data whose feature standard deviation is >= 0.4 at every token (design notes, section 1)."""
    return np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def feature_std(u, features=FEATURES):
    w = features.weights / features.length
    mean = (u * w).sum(-1, keepdims=True)
    return np.sqrt((((u - mean) ** 2) * w).sum(-1))


def solve(model, tokens, **kw):
    return model.solve(u0, tokens=tokens, features=FEATURES, **kw)


@pytest.mark.parametrize("norm", ["pre", "post", "none"])
def test_token_convergence_unmasked(norm):
    """Midpoint tokens: order 2; Gauss-Legendre tokens: spectral. Reference: GaussLegendre(96),
    interpolated (barycentric, spectrally accurate) at each level's nodes."""
    model = ContinuousTransformer.random_smooth(seed=1, placement=norm)
    fine = GaussLegendre(96)
    trajectory = solve(model, fine, trajectory=True)
    reference = trajectory[-1]
    assert min(feature_std(u).min() for u in trajectory) > 0.3

    def error(tokens):
        return np.abs(solve(model, tokens) - fine.interpolate(reference, tokens.nodes, axis=-2)).max()

    levels = [8, 16, 32, 64]
    errors = [error(Midpoint(n)) for n in levels]
    assert abs(fitted_order([1 / n for n in levels], errors) - 2.0) < 0.3, errors
    e16, e32 = error(GaussLegendre(16)), error(GaussLegendre(32))
    assert e16 < 1e-10 or e32 < e16 / 100, (e16, e32)


@pytest.mark.parametrize("element, order", [("p1", 2.0), ("p2", 3.0)])
def test_token_convergence_galerkin(element, order):
    """Galerkin tokens (flows evaluated at the element Gauss points, L2-projected back):
    the FE solution at 41 points converges with order p + 1 to the GaussLegendre(96) solution."""
    from ctformer.discretizations import get

    model = ContinuousTransformer.random_smooth(seed=1, placement="pre")
    fine = GaussLegendre(96)
    points = np.linspace(0.0, 1.0, 41)
    reference = fine.interpolate(solve(model, fine), points, axis=-2)
    degree = int(element[1])
    elements = [8, 16, 32, 64]
    errors = []
    for e in elements:
        tokens = get(element, degree * e + 1)
        assert tokens.kind == "galerkin"
        errors.append(np.abs(tokens.interpolate(solve(model, tokens), points, axis=-2) - reference).max())
    assert abs(fitted_order([1 / e for e in elements], errors) - order) < 0.3, errors


def test_token_convergence_causal():
    """Causal mask: the standard (full) diagonal is first order, the half-weight diagonal second
    order. Levels N = 4 * 3^k are nested, so every level has the coarse nodes; the reference is
    the Richardson extrapolation (9 u_972 - u_324) / 8 of the half rule at those nodes."""
    half = ContinuousTransformer.random_smooth(seed=1, mask="causal", diagonal="half")
    full = ContinuousTransformer.random_smooth(seed=1, mask="causal", diagonal="full")
    points = Midpoint(4).nodes

    def at_points(model, n):
        tokens = Midpoint(n)
        return tokens.interpolate(solve(model, tokens), points, axis=-2)

    reference = (9 * at_points(half, 972) - at_points(half, 324)) / 8
    levels = [4, 12, 36, 108]
    h = [1 / n for n in levels]
    for model, order in ((full, 1.0), (half, 2.0)):
        errors = [np.abs(at_points(model, n) - reference).max() for n in levels]
        assert abs(fitted_order(h, errors) - order) < 0.3, (model.blocks[0].attention, errors)


def test_initial_data_callable_is_sampled_and_trajectory():
    model = ContinuousTransformer.random_smooth(seed=2, layers=3)
    tokens = GaussLegendre(6)
    values = u0(tokens.nodes[:, None], FEATURES.nodes[None, :])
    states = model.solve(u0, tokens=tokens, features=FEATURES, trajectory=True)
    assert len(states) == model.layers + 1
    np.testing.assert_array_equal(states[0], values)
    np.testing.assert_array_equal(states[-1], model.solve(values, tokens=tokens, features=FEATURES))
    # names: n from the array's shape
    np.testing.assert_array_equal(model.solve(values, tokens="gauss-legendre", features="gauss-legendre"),
                                  states[-1])


def test_solve_validates_inputs():
    model = ContinuousTransformer.random_smooth(seed=0)
    tokens = Midpoint(5)
    u = np.ones((5, 16)) + np.linspace(0, 1, 16)
    with pytest.raises(ValueError, match=r"last two axes must be \(tokens.n, features.n\) = \(5, 16\)"):
        model.solve(u[:4], tokens=tokens, features=FEATURES)
    with pytest.raises(ValueError, match="tokens, features"):
        model.solve(u[0], tokens=tokens, features=FEATURES)
    for steps in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="steps_per_layer must be a positive integer"):
            model.solve(u, tokens=tokens, features=FEATURES, steps_per_layer=steps)
    with pytest.raises(ValueError, match="unknown scheme 'leapfrog'.*lie"):
        model.solve(u, tokens=tokens, features=FEATURES, scheme="leapfrog")
    with pytest.raises(ValueError, match="needs n"):
        model.solve(u0, tokens="midpoint", features=FEATURES)
    with pytest.raises(ValueError, match="broadcast"):
        model.solve(lambda x, y: np.ones(3), tokens=tokens, features=FEATURES)
    with pytest.raises(ValueError, match="NaN"):
        model.solve(u * np.nan, tokens=tokens, features=FEATURES)
    with pytest.raises(TypeError, match="real floating"):
        model.solve(u > 0, tokens=tokens, features=FEATURES)
    # LayerNorm with eps = 0 on a feature-constant token: a clear error, never NaN
    with pytest.raises(ValueError, match="variance"):
        model.solve(np.ones((5, 16)), tokens=tokens, features=FEATURES)
    with pytest.raises(ValueError, match="placement must be one of"):
        ContinuousTransformer.random_smooth(placement="sandwich")


def test_inconsistent_depth_limit_warning():
    u = u0(Midpoint(4).nodes[:, None], FEATURES.nodes[None, :])
    post = ContinuousTransformer.random_smooth(seed=3, placement="post")
    assert post.warns_inconsistent_depth
    with pytest.warns(InconsistentDepthLimitWarning, match="no consistent continuous-depth limit"):
        post.solve(u, tokens=Midpoint(4), features=FEATURES, steps_per_layer=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        post.solve(u, tokens=Midpoint(4), features=FEATURES, steps_per_layer=1)
        for norm in ("post-projection", "pre", "none"):
            model = ContinuousTransformer.random_smooth(seed=3, placement=norm)
            assert not model.warns_inconsistent_depth
            model.solve(u, tokens=Midpoint(4), features=FEATURES, steps_per_layer=2)
    assert issubclass(InconsistentDepthLimitWarning, UserWarning)


@pytest.mark.torch
def test_depth_refinement_against_solve_ivp_and_trajectory_against_layers():
    """A converted pre-norm torch encoder: (1) ``trajectory`` at dt = 1 equals the torch layers
    applied one by one; (2) ``euler`` at dt = 1 is the parallel block u + SA(N1 u) + FF(N2 u);
    (3) refining depth, lie converges with order 1 to the ODE du/dt = SA(N1 u) + FF(N2 u)
    (parameters of layer l on [l, l + 1)) integrated by scipy's DOP853 with torch right-hand
    sides."""
    torch = require("torch")
    from scipy.integrate import solve_ivp

    from ctformer.bridges import from_torch

    nn = torch.nn
    torch.manual_seed(0)
    d, n = 8, 5
    layer = nn.TransformerEncoderLayer(d, 2, 12, dropout=0.0, activation="gelu", norm_first=True, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).double().eval()
    with torch.no_grad():
        for p in encoder.parameters():
            p.mul_(0.6)
    model = from_torch(encoder)
    x = torch.randn(n, d, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    grids = dict(tokens=Midpoint(n), features=Midpoint(d))

    def attention(lay, u):
        h = lay.norm1(u)
        return lay.self_attn(h, h, h, need_weights=False)[0]

    def feedforward(lay, u):
        return lay.linear2(lay.activation(lay.linear1(lay.norm2(u))))

    with torch.no_grad():
        states = model.solve(x.numpy(), trajectory=True, **grids)
        u = x[None]
        for lay, state in zip(encoder.layers, states[1:]):
            u = lay(u)
            np.testing.assert_allclose(state, u[0].numpy(), rtol=0, atol=1e-12 * float(u.abs().max()))
        lay = encoder.layers[0]
        parallel = x[None] + attention(lay, x[None]) + feedforward(lay, x[None])
        one_layer = ContinuousTransformer(model.blocks[:1], head_features=model.head_features,
                                          hidden=model.hidden)
        np.testing.assert_allclose(one_layer.solve(x.numpy(), scheme="euler", **grids), parallel[0].numpy(),
                                   rtol=0, atol=1e-12 * float(parallel.abs().max()))

        def rhs(lay):
            def f(t, flat):
                v = torch.from_numpy(flat.reshape(1, n, d))
                return (attention(lay, v) + feedforward(lay, v)).numpy().ravel()
            return f

        y = x.numpy().ravel()
        for lay in encoder.layers:
            y = solve_ivp(rhs(lay), (0.0, 1.0), y, method="DOP853", rtol=1e-10, atol=1e-10).y[:, -1]
    exact = y.reshape(n, d)
    steps = [2, 4, 8, 16]
    errors = [np.abs(model.solve(x.numpy(), scheme="lie", steps_per_layer=k, **grids) - exact).max()
              for k in steps]
    assert abs(fitted_order([1 / k for k in steps], errors) - 1.0) < 0.2, errors


def test_removed_keywords_are_type_errors_and_the_new_names_compute_the_model():
    """The 0.1 names (random_smooth(norm=), Block(norm1=, norm2=), final_norm=, solve(key_mask=),
    run(mask=), Block.norm1/norm2, .final_norm) are gone: each keyword is a TypeError naming
    it, and the properties no longer exist."""
    u = u0(Midpoint(4).nodes[:, None], FEATURES.nodes[None, :])
    new = ContinuousTransformer.random_smooth(seed=2, placement="post")
    block = new.blocks[0]
    with pytest.raises(TypeError, match="norm"):
        ContinuousTransformer.random_smooth(seed=2, norm="post")
    with pytest.raises(TypeError, match="norm1"):
        Block(block.attention, block.feedforward, norm1=block.normalization1, placement="post")
    with pytest.raises(TypeError, match="norm2"):
        Block(block.attention, block.feedforward, norm2=block.normalization2, placement="post")
    with pytest.raises(TypeError, match="final_norm"):
        ContinuousTransformer(new.blocks, final_norm=None)
    for old in ("norm1", "norm2"):
        assert not hasattr(block, old)
    assert not hasattr(new, "final_norm")
    keep = np.array([True, True, False, True])
    with pytest.raises(TypeError, match="key_mask"):
        new.solve(u, tokens=Midpoint(4), features=FEATURES, key_mask=keep)
    with pytest.raises(TypeError, match="mask"):
        new.run(u[None], mask=keep[None])

"""The peers of the benchmarks compute what ctformer computes, and the fitted cost laws are
right: a benchmark's ratio means something only when both sides do the same arithmetic."""
import numpy as np
import pytest

from .conftest import benchmark_module


def test_growth_exponent_recovers_a_power_law():
    """A pure power law ``3 n^1.5`` has the exponent 1.5; a constant has 0."""
    env = benchmark_module("_environment")
    sizes = [64, 128, 256, 1024]
    assert env.growth_exponent(sizes, [3.0 * n**1.5 for n in sizes]) == pytest.approx(1.5, abs=1e-12)
    assert env.growth_exponent(sizes, [2.0] * 4) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("value, exponent", [(None, 28), ("", 28), ("4", 4), ("12", 12), ("2", 4), ("40", 30),
                                             ("0", 28), ("-3", 28), ("soon", 28)])
def test_the_header_states_how_long_openblas_threads_spin(monkeypatch, value, exponent):
    """OpenBLAS's idle threads spin 2^n cycles for OPENBLAS_THREAD_TIMEOUT = n > 0 (n clamped to
    4..30) and 2^28 otherwise; the header says which applies, naming the setting."""
    env = benchmark_module("_environment")
    if value is None:
        monkeypatch.delenv("OPENBLAS_THREAD_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("OPENBLAS_THREAD_TIMEOUT", value)
    line = env.openblas_idle()
    assert line.startswith(f"spin 2^{exponent} cycles before they sleep (")
    assert "OPENBLAS_THREAD_TIMEOUT" in line and (value in (None, "") or value in line)


def test_plain_particle_loop_is_ctformers_rk4():
    """particles.py's peer, RK4 on softmax(beta M M^T) M with the tangent projection in plain
    torch, rows renormalized after each step, gives ctformer's SA solve to rounding (float64,
    20 particles in R^3, beta = 2, 10 steps), and moves the particles (not a trivial match)."""
    torch = pytest.importorskip("torch")
    from ctformer.particles import SelfAttentionDynamics

    particles = benchmark_module("particles")
    x0 = np.random.default_rng(3).standard_normal((20, 3))
    x0 /= np.linalg.norm(x0, axis=1, keepdims=True)
    ours = SelfAttentionDynamics(2.0).solve(x0, 1.0, 0.1, scheme="rk4", save_every=10).final
    peer = particles.plain_loop(torch.from_numpy(x0), 2.0, 0.1, 10).numpy()
    assert particles.relative(ours, peer) < 1e-14
    assert np.abs(peer - x0).max() > 0.05


def test_window_mask_peer_is_the_banded_window():
    """local_attention.py's peer: SDPA with the dense window mask (0 <= p_i - p_j < W) equals
    the banded path to rounding in float64, and the dense mask keeps exactly min(i + 1, W)
    keys in row i."""
    pytest.importorskip("torch")
    bench = benchmark_module("local_attention")
    q, k, v, p = bench.problem(300, 2, 8, "float64", seed=1)
    mask = bench.window_mask(p, 32)
    assert np.array_equal(mask.sum(axis=1), np.minimum(np.arange(300) + 1, 32))
    sides = bench.calls(q, k, v, p, 32, with_peer=True, with_dense=True)
    banded = sides["banded"]()
    assert bench.relative(banded, sides["SDPA"]()) < 1e-13
    assert bench.relative(banded, sides["dense"]()) < 1e-13


@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_model_benchmarks_other_networks_are_the_huggingface_networks(name):
    """model.py's optional networks: the HuggingFace module the script times and the converted
    model compute the same network (float64, 1e-12 relative) on 160 tokens, past the sliding
    window of 128, and the window is in force (the same weights with a window wider than the sequence differ)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ctformer.bridges import from_hf

    bench = benchmark_module("model")
    model, ct = bench.load_model(name)
    x = bench.embedded_input(model, 1, 160)
    with torch.no_grad():
        reference = bench.torch_call(model, x, "float64")().numpy()
    assert bench.TOLERANCE["float64"] == 1e-12
    assert np.abs(ct.run(x) - reference).max() / np.abs(reference).max() < 1e-12
    model.config.sliding_window = 4096  # wider than the sequence: no window
    assert np.abs(from_hf(model).run(x) - reference).max() / np.abs(reference).max() > 1e-6


def test_alibi_peer_is_ctformers_alibi_attention():
    """local_attention.py's ALiBi peer: SDPA with the causal ALiBi float mask equals ctformer's
    causal ALiBi attention (float64, 1e-12), and the slopes matter (plain causal attention of
    the same inputs is 1e-3 or more away)."""
    pytest.importorskip("torch")
    from ctformer.operators import quadrature_attention

    bench = benchmark_module("local_attention")
    sides = bench.alibi_calls(96, "float64", heads=4, head_dim=8)
    ours, peer = sides["ALiBi"](), sides["SDPA"]()
    assert ours.shape == peer.shape == (4, 96, 8)
    assert bench.relative(ours, peer) < 1e-12
    q, k, v, _ = bench.problem(96, 4, 8, "float64")
    plain = quadrature_attention(q, k, v, beta=8 ** -0.5, mask="causal")
    assert bench.relative(plain, peer) > 1e-3


@pytest.mark.parametrize("n, dtype", [(3000, np.float64), (4500, np.float32)])
def test_attention_floor_forms_every_score_once(monkeypatch, n, dtype):
    """attention.py's floor (``products_alone``) does the streamed path's two products and
    nothing else: every one of the N x M scores formed once as q k^T, and weighted sums over
    exactly those scores (checked against float64 products), on the library's threads."""
    from ctformer._numerics import gemm

    attention = benchmark_module("attention")
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((n, 64)).astype(dtype) for _ in range(3))
    formed, summed = [], []
    score, weighted = gemm.attention_products(dtype)

    def checked(product, seen):
        def call(a, b, out):
            product(a, b, out=out)
            exact = a.astype(np.float64) @ b.astype(np.float64)
            seen.append((a.shape[0] * b.shape[-1] if seen is formed else a.size,
                         float(np.abs(out - exact).max() / np.abs(exact).max())))
            return out
        return call

    monkeypatch.setattr(gemm, "attention_products",
                        lambda dt: (checked(score, formed), checked(weighted, summed)))
    attention.products_alone(q, k, v, 0.125)()
    # every score formed once, and every score block weighted once
    assert sum(size for size, _ in formed) == sum(size for size, _ in summed) == n * n
    assert len(summed) == len(formed)
    tolerance = 1e-12 if dtype == np.float64 else 1e-5
    assert max(err for _, err in formed + summed) < tolerance


def test_particle_floor_forms_the_scores_of_four_velocities_a_step(monkeypatch):
    """particles.py's floor (``velocity_products``) does the two products of every RK4
    velocity of the simulation and nothing else: for 3 steps of 300 particles in R^16,
    12 x 300 x 300 scores formed as x x^T and weighted once, each product equal to the
    float64 product (1e-12), and as many score chunks as the library's velocity forms
    (counted in the same way through a real velocity call)."""
    from ctformer._numerics import gemm
    from ctformer.particles import SelfAttentionDynamics

    particles = benchmark_module("particles")
    x = np.random.default_rng(8).standard_normal((300, 16))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    score, weighted = gemm.attention_products(np.float64)
    formed, summed = [], []

    def checked(product, seen):
        def call(a, b, out):
            product(a, b, out=out)
            exact = a @ b
            seen.append((a.shape[0] * b.shape[-1] if seen is formed else a.size,
                         float(np.abs(out - exact).max() / np.abs(exact).max())))
            return out
        return call

    monkeypatch.setattr(gemm, "attention_products", lambda dt: (checked(score, formed), checked(weighted, summed)))
    particles.velocity_products(x, 1.0, 3)()
    assert sum(size for size, _ in formed) == sum(size for size, _ in summed) == 12 * 300 * 300
    assert max(err for _, err in formed + summed) < 1e-12
    chunks = len(formed)
    formed.clear()
    SelfAttentionDynamics(1.0).velocity(x)
    assert 12 * len(formed) == chunks
    assert sum(size for size, _ in formed) == 300 * 300

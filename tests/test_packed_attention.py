"""Streamed attention on key and value blocks packed once per call (oneDNN, float32;
ctformer._numerics.packed_attention): softmax attention against scipy's softmax in float64,
the same bits on every thread count, one packing per key/value head and block, and a choice
measured once per machine and asked for only where key blocks are used."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import softmax

from ctformer._numerics import blocks, gemm, measured_blocks, packed, packed_attention, store, streamed

from .conftest import onednn_or_stand_in, require

torch = require("torch")
KB = blocks.DEFAULT.key_block


@pytest.fixture
def key_blocks_here(monkeypatch):
    """Streamed attention blocks its keys (the compiled kernels and their row kernel). On a
    torch build without oneDNN's inner product (the pinned one has it) the packing logic runs
    on a stand-in (:func:`tests.conftest.onednn_or_stand_in`), so that every test below runs on every build; the BLAS fallback
    of such a build is test_without_onednn_the_blas_multiplies."""
    require("numba")
    onednn_or_stand_in(monkeypatch, torch)
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numba")
    monkeypatch.setattr(gemm, "softmax_provider", lambda dtype: "numpy")


def test_onednn_is_found_wherever_torch_reports_it():
    """The ops are looked up by name in torch.ops.mkldnn: a build whose oneDNN backend is
    available must expose both (a renamed op would silently turn packing off)."""
    if torch.backends.mkldnn.is_available():
        ops = packed._ops(torch)
        assert ops is not None
        rng = np.random.default_rng(5)
        m, a = (rng.standard_normal(shape).astype(np.float32) for shape in ((40, 24), (3, 40)))
        got = packed.PackedMatrix(m, None, torch)(a)
        assert np.abs(got - a.astype(np.float64) @ m).max() < 1e-5 * np.abs(a @ m).max()
    else:
        assert packed._ops(torch) is None


def test_the_stand_in_ops_are_the_product_they_stand_for(monkeypatch):
    monkeypatch.setattr(packed, "_ops", lambda torch: None)  # as on a build without oneDNN
    assert onednn_or_stand_in(monkeypatch, torch) is False
    rng = np.random.default_rng(6)
    m, a, b = (rng.standard_normal(shape).astype(np.float32) for shape in ((40, 24), (3, 40), (24,)))
    got = packed.PackedMatrix(m, b, torch)(a)
    assert np.abs(got - (a.astype(np.float64) @ m + b)).max() < 1e-5 * np.abs(a @ m + b).max()


def reference(q, k, v, beta, log_w):
    s = beta * np.einsum("...nd,...md->...nm", q.astype(np.float64), k.astype(np.float64)) + log_w
    return softmax(s, axis=-1) @ v.astype(np.float64)


def test_packed_blocks_give_softmax_attention_with_the_same_bits_on_any_threads(key_blocks_here, monkeypatch):
    rng = np.random.default_rng(21)
    m = 2 * KB + 77  # two full blocks and a short one
    q = rng.standard_normal((2, 3, 700, 32)).astype(np.float32)
    k, v = (rng.standard_normal((2, 1, m, 32)).astype(np.float32) for _ in range(2))  # shared by 3 heads
    log_w = np.log(rng.uniform(0.5, 2.0, m)).astype(np.float32)
    made = []
    original = packed_attention.PackedMatrix
    monkeypatch.setattr(packed_attention, "PackedMatrix", lambda *a: made.append(1) or original(*a))
    runs = []
    for count in ("1", "2"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        runs.append(streamed.stream(q, 0.3, k, v, log_w, None, False, None, (2, 3), None, blocks.DEFAULT,
                                    packed_attention.packed_blocks(KB)))
    assert np.array_equal(runs[0], runs[1])
    # K and V of each of the 2 key/value heads and 3 blocks, once per call
    assert len(made) == 2 * (2 * 2 * 3)
    ref = reference(q, np.broadcast_to(k, (2, 3, m, 32)), np.broadcast_to(v, (2, 3, m, 32)), 0.3, log_w)
    assert runs[0].dtype == np.float32
    assert np.abs(runs[0] - ref).max() / np.abs(ref).max() < 2e-6
    plain = streamed.stream(q, 0.3, k, v, log_w, None, False, None, (2, 3), None, blocks.DEFAULT)
    assert np.abs(runs[0] - plain).max() / np.abs(ref).max() < 2e-6


def test_packs_are_refused_where_they_do_not_apply(key_blocks_here):
    rng = np.random.default_rng(22)
    q, k, v = (rng.standard_normal((100, 2 * KB + 1, 8))[0] for _ in range(3))
    with pytest.raises(ValueError, match="packs: packed blocks of 1024 keys for float32, got float64"):
        streamed.stream(q, 1.0, k, v, None, None, False, None, (), None, blocks.DEFAULT,
                        packed_attention.packed_blocks(KB))
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    with pytest.raises(ValueError, match="packs: packed blocks of 512 keys"):
        streamed.stream(q32, 1.0, k32, v32, None, None, False, None, (), None, blocks.DEFAULT,
                        packed_attention.packed_blocks(512))


def test_the_choice_is_asked_for_float32_key_blocks_only(key_blocks_here, monkeypatch):
    asked = []
    monkeypatch.setattr(gemm, "_measured", lambda kind, dtype, *a: asked.append((kind, dtype)) or "torch")
    assert packed_attention.chosen(np.float32) is True
    assert ("packed attention", "float32") in asked
    asked.clear()
    assert packed_attention.chosen(np.float64) is False
    monkeypatch.setenv("CTFORMER_GEMM", "numpy")
    assert packed_attention.chosen(np.float32) is False
    monkeypatch.setenv("CTFORMER_GEMM", "auto")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "numpy")  # no key blocks
    assert packed_attention.chosen(np.float32) is False
    assert asked == []


def test_the_measurement_is_stored_once(key_blocks_here, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CTFORMER_GEMM", raising=False)
    gemm.forget_choices()
    try:
        first = packed_attention.chosen(np.float32)
        (path,) = (tmp_path / "ctformer").glob("gemm-*.json")
        entry = json.loads(path.read_text())["packed attention float32"]
        assert entry["checked"] == packed_attention.CHECKED
        assert (entry["provider"] == "torch") is first and 0.2 < entry["ratio"] < 5.0
        gemm.forget_choices()
        monkeypatch.setattr(packed_attention, "_measure", lambda dtype: pytest.fail("measured again"))
        assert packed_attention.chosen(np.float32) is first
    finally:
        gemm.forget_choices()


@pytest.mark.parametrize("chosen", [True, False])
def test_attention_multiplies_by_packed_blocks_where_chosen(key_blocks_here, monkeypatch, chosen):
    from ctformer.operators import quadrature_attention

    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", "streamed")
    monkeypatch.setenv("CTFORMER_GEMM", "auto")
    monkeypatch.setattr(packed_attention, "chosen", lambda dtype: chosen)
    rng = np.random.default_rng(23)
    q, k, v = (rng.standard_normal((2 * KB + 5, 16)).astype(np.float32) for _ in range(3))
    ours = quadrature_attention(q, k, v, beta=0.5)
    geometry = measured_blocks.geometry(np.float32)
    packs = packed_attention.packed_blocks(geometry.key_block) if chosen and 2 * geometry.key_block <= len(k) else None
    expected = streamed.stream(q, 0.5, k, v, None, None, False, None, (), None, geometry, packs)
    assert np.array_equal(ours, expected)


def test_keys_and_values_too_large_to_copy_keep_the_blas(key_blocks_here, monkeypatch):
    """The packed copies live for the call: above MAX_BYTES of keys and values the call keeps
    the worker tasks' products (and their few MiB per thread)."""
    from ctformer.operators import quadrature_attention

    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", "streamed")
    monkeypatch.setattr(packed_attention, "chosen", lambda dtype: True)
    made = []
    monkeypatch.setattr(packed_attention, "packed_blocks", lambda key_block: made.append(key_block) or None)
    rng = np.random.default_rng(24)
    m = 2 * max(blocks.KEY_BLOCKS) + 5  # key blocks in every geometry
    q = rng.standard_normal((100, 16)).astype(np.float32)
    k, v = (rng.standard_normal((m, 16)).astype(np.float32) for _ in range(2))
    assert packed_attention.fits(k, v) and (k.size + v.size) * 4 == 2 * m * 16 * 4
    monkeypatch.setattr(packed_attention, "MAX_BYTES", (k.size + v.size) * 4 - 1)
    assert not packed_attention.fits(k, v)
    quadrature_attention(q, k, v, beta=0.5)
    assert made == []
    monkeypatch.setattr(packed_attention, "MAX_BYTES", (k.size + v.size) * 4)
    quadrature_attention(q, k, v, beta=0.5)
    assert len(made) == 1


def test_without_onednn_the_blas_multiplies(monkeypatch, tmp_path):
    """A torch build without oneDNN's inner product (simulated on every build): both packed
    measurements choose the BLAS and say why, and long float32 attention without a mask is
    still softmax attention (against scipy's softmax in float64)."""
    from ctformer.operators import quadrature_attention

    monkeypatch.setattr(packed, "_ops", lambda torch: None)
    monkeypatch.setattr(packed_attention, "_ops", lambda torch: None)
    reason = "torch has no oneDNN inner product"
    assert packed_attention._measure(np.dtype(np.float32)) == {"provider": "numpy", "reason": reason}
    assert packed.measure(np.dtype(np.float32), lambda call: 1.0) == {"provider": "numpy", "reason": reason}
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CTFORMER_GEMM", raising=False)
    monkeypatch.setenv("CTFORMER_ATTENTION_ENGINE", "streamed")
    gemm.forget_choices()
    measured_blocks._measured.cache_clear()
    try:
        monkeypatch.setattr(gemm, "softmax_provider", lambda dtype: "numpy")
        assert packed_attention.chosen(np.float32) is False
        if streamed.key_blocked(m := 2 * max(blocks.KEY_BLOCKS) + 5, None, np.dtype(np.float32)):
            # with key blocks in use the refusal is the measurement's, stored with its reason
            entry = store.read(store.cache_file())["packed attention float32"]
            assert entry["provider"] == "numpy" and entry["reason"] == reason
        rng = np.random.default_rng(25)
        q = rng.standard_normal((300, 16)).astype(np.float32)
        k, v = (rng.standard_normal((m, 16)).astype(np.float32) for _ in range(2))
        out = quadrature_attention(q, k, v, beta=0.5)
        ref = reference(q, k, v, 0.5, 0.0)
        assert out.dtype == np.float32 and np.abs(out - ref).max() / np.abs(ref).max() < 2e-6
    finally:
        gemm.forget_choices()
        measured_blocks._measured.cache_clear()

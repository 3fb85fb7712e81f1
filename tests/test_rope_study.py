"""Refinement versus extension (ctformer.bridges.rope_study).

References: the unscaled model's own ``solve`` on the refined midpoint grid (linear scaling is
that discrete operator), the first order of the causal midpoint rule (full diagonal weight),
HuggingFace's float32 ``ROPE_INIT_FUNCTIONS`` for the frequencies and attention factors, and
the closed forms of the NTK base and of YaRN's and LongRoPE's attention factors.
"""
import math

import numpy as np
import pytest

from .conftest import require

require("torch")
transformers = require("transformers")

from ctformer.bridges.rope_study import (STUDY_ROPE_TYPES, refinement_versus_extension,  # noqa: E402
                                         rope_parameters_for)

L, THETA, FEATURES, HEADS = 16, 100.0, 16, 2
HEAD_DIM = FEATURES // HEADS
S = 8  # the largest factor


@pytest.fixture(scope="module")
def study():
    return refinement_versus_extension(context_length=L, levels=(1, 2, 4, 8), features=FEATURES, heads=HEADS,
                                       kv_heads=1, theta=THETA, reference_tokens=512, points=32)


def test_linear_scaling_is_token_refinement(study):
    assert study.refinement_identity < 1e-13  # the linear-scaled run is the refined solve
    assert study.reference_error < 0.1 * study.floor("linear")
    assert 0.8 <= study.order("linear") <= 1.2  # causal midpoint rule: first order
    errs = study.errors["linear"]
    assert all(b < 0.75 * a for a, b in zip(errs, errs[1:]))


def test_other_scalings_change_the_operator(study):
    errs = study.errors
    assert len({e[0] for e in errs.values()}) == 1  # s = 1: every type is the unscaled network
    for kind in STUDY_ROPE_TYPES[1:]:
        assert study.floor(kind) > 10 * study.floor("linear"), kind  # a floor, not convergence
        assert all(e > 5 * e_lin for e, e_lin in zip(errs[kind][1:], errs["linear"][1:])), kind
    assert "n=128" in study.table() and study.table().count("\n") == len(STUDY_ROPE_TYPES)


def test_frequency_ratios_and_temperatures_match_huggingface(study):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    tau = np.arange(0, HEAD_DIM, 2) / HEAD_DIM
    plain = THETA ** -tau
    for kind in STUDY_ROPE_TYPES:
        rope = rope_parameters_for(kind, S, THETA, L, HEAD_DIM // 2)
        cfg = transformers.LlamaConfig(hidden_size=FEATURES, num_attention_heads=HEADS, head_dim=HEAD_DIM,
                                       max_position_embeddings=S * L if "original_max_position_embeddings" in rope
                                       else L, rope_parameters=rope)
        omega, a = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu", seq_len=S * L)
        np.testing.assert_allclose(study.frequency_ratios[kind], S * omega.double().numpy() / plain, rtol=1e-6)
        assert study.temperatures[kind] == pytest.approx(a**2, rel=1e-6)
    np.testing.assert_allclose(study.frequency_ratios["linear"], 1.0, rtol=1e-15)
    base = THETA * (S * (S * L) / L - (S - 1)) ** (HEAD_DIM / (HEAD_DIM - 2))  # NTK at n = 8L
    np.testing.assert_allclose(study.frequency_ratios["dynamic"], S * (base / THETA) ** -tau, rtol=1e-13)
    assert study.temperatures["yarn"] == pytest.approx((0.1 * math.log(S) + 1) ** 2, rel=1e-14)
    assert study.temperatures["longrope"] == pytest.approx(1 + math.log(S) / math.log(L), rel=1e-14)
    np.testing.assert_allclose(study.frequency_ratios["longrope"], S / S ** (np.arange(4) / 3), rtol=1e-14)


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match="kind"):
        rope_parameters_for("ntk", 2.0, THETA, L, 4)
    with pytest.raises(ValueError, match="context_length"):
        refinement_versus_extension(context_length=1)

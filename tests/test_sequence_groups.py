"""Batches advanced in groups of whole sequences (``ctformer._numerics.sequence_groups``): the
grouping rule, the float64 HuggingFace modules with left and right padding, the same bits
for every thread count, and the statistics, layers and errors of the ungrouped solve."""
from __future__ import annotations

import numpy as np
import pytest

import ctformer
from ctformer._numerics import sequence_groups as groups_module
from ctformer.solvers import SaveAt
from tests.conftest import rel_err, require
from tests.test_modern_bridges import _randomize, _run_hf


@pytest.fixture
def two_cpus(monkeypatch):
    """The rule as on a machine of two CPUs, and a count of the grouped passes."""
    monkeypatch.setattr(groups_module, "machine_cpus", lambda: 2)
    calls = []
    advance = groups_module.SequenceGroups.advance

    def counted(self, scheme, u, segments, *args, **kwargs):
        calls.extend([len(self.slices)] * len(segments))  # the groups, once per segment
        return advance(self, scheme, u, segments, *args, **kwargs)

    monkeypatch.setattr(groups_module.SequenceGroups, "advance", counted)
    return calls


def _ungrouped(monkeypatch):
    monkeypatch.setattr(groups_module, "slices", lambda u: None)


@pytest.mark.parametrize("cpus, shape, sizes", [
    (2, (8, 128, 4), [4, 4]),        # 512 rows a group
    (2, (4, 512, 4), [1, 1, 1, 1]),
    (2, (3, 512, 4), [1, 1, 1]),
    (2, (2, 128, 4), [1, 1]),        # fewer sequences: one a CPU
    (2, (16, 32, 4), [8, 8]),
    (2, (10, 128, 4), [4, 4, 2]),    # the last group shorter
    (4, (8, 128, 4), [2, 2, 2, 2]),
    (16, (64, 128, 4), [4] * 16),
    (2, (8, 16, 4), None),           # 64 rows a group: below 128
    (2, (2, 64, 4), None),
    (16, (8, 128, 4), None),         # a group for every CPU would have 0 sequences
    (2, (1, 1024, 4), None),         # one sequence
    (1, (8, 128, 4), [4, 4]),        # one CPU: the groups run one after the other
])
def test_groups_follow_the_rule(monkeypatch, cpus, shape, sizes):
    monkeypatch.setattr(groups_module, "machine_cpus", lambda: cpus)
    got = groups_module.slices(np.zeros(shape))
    if sizes is None:
        assert got is None
    else:
        assert [s.stop - s.start for s in got] == sizes
        assert got[0].start == 0 and got[-1].stop == shape[0]
        assert all(a.stop == b.start for a, b in zip(got, got[1:]))


@pytest.mark.parametrize("u", [np.zeros((8, 128, 4), np.float16), np.zeros((8, 128, 4), np.int64),
                               np.zeros((2, 4, 128, 4)), np.zeros((1024, 4)), [[[0.0] * 4] * 128] * 8])
def test_other_states_are_not_grouped(monkeypatch, u):
    monkeypatch.setattr(groups_module, "machine_cpus", lambda: 2)
    assert groups_module.slices(u) is None


def test_off_advances_the_whole_batch_with_bits_independent_of_the_cpu_count(monkeypatch):
    """``CTFORMER_SEQUENCE_GROUPS=off``: no groups on a machine of 2 or 4 CPUs (where the rule
    makes 4 + 4 and 2 + 2 + 2 + 2 sequences), and the float32 bits of the whole batch's solve
    on a machine of 16 CPUs (one group, so none); a float64 solve agrees to float32 rounding."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=2, layers=2, heads=2, placement="pre")
    x = np.random.default_rng(6).standard_normal((8, 128, 8)).astype(np.float32)
    monkeypatch.setattr(groups_module, "machine_cpus", lambda: 16)
    assert groups_module.slices(x) is None
    whole = model.run(x)
    monkeypatch.setenv("CTFORMER_SEQUENCE_GROUPS", "off")
    for cpus in (2, 4):
        monkeypatch.setattr(groups_module, "machine_cpus", lambda cpus=cpus: cpus)
        assert groups_module.slices(x) is None
        assert np.array_equal(model.run(x), whole)
    monkeypatch.setenv("CTFORMER_SEQUENCE_GROUPS", " AUTO ")  # read as the other settings are
    assert [s.stop - s.start for s in groups_module.slices(x)] == [2, 2, 2, 2]
    assert rel_err(whole, model.run(x.astype(np.float64))) < 2e-6


def test_a_bad_groups_setting_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv("CTFORMER_SEQUENCE_GROUPS", "never")
    model = ctformer.ContinuousTransformer.random_smooth(seed=2, layers=1, heads=2, placement="pre")
    with pytest.raises(ValueError, match="CTFORMER_SEQUENCE_GROUPS must be one of auto, off, got 'never'"):
        model.run(np.zeros((8, 128, 8)))


def test_machine_cpus_is_the_affinity():
    import os

    assert groups_module.machine_cpus() == len(os.sched_getaffinity(0))


def _llama_model(t, torch, tokens):
    from ctformer.bridges import float64_reference

    config = t.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                           max_position_embeddings=tokens, rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                           bos_token_id=0, eos_token_id=0, pad_token_id=0)
    return float64_reference(_randomize(torch, t.LlamaModel(config).double().eval(), 3))


def test_grouped_llama_with_left_padding_equals_huggingface(two_cpus):
    """4 x 128 tokens in 2 groups: the first sequence loses its first 2 tokens, the third all
    but its last (its padding queries see no key); float64 HuggingFace to 1e-12."""
    torch = require("torch")
    t = require("transformers", "LlamaModel")
    from ctformer.bridges import from_hf

    model = _llama_model(t, torch, 128)
    x = np.random.default_rng(4).standard_normal((4, 128, 16))
    mask = np.ones((4, 128), dtype=bool)
    mask[0, :2] = False
    mask[2, :-1] = False
    last, hidden = _run_hf(torch, model, x, mask)
    got = from_hf(model).run(hidden[0], padding_mask=mask)
    assert two_cpus == [2, 2]  # both layers grouped
    assert rel_err(got, last, mask) < 1e-12
    assert rel_err(got, last, ~mask) < 1e-12


def test_grouped_gpt2_with_right_padding_equals_huggingface(two_cpus):
    torch = require("torch")
    t = require("transformers")
    from ctformer.bridges import from_hf

    config = t.GPT2Config(vocab_size=32, n_positions=256, n_embd=12, n_layer=2, n_head=3, n_inner=20,
                          bos_token_id=0, eos_token_id=0)
    model = _randomize(torch, t.GPT2Model(config).double().eval(), 5, conv1d=True)
    x = np.random.default_rng(5).standard_normal((3, 256, 12))
    mask = np.ones((3, 256), dtype=bool)
    mask[1, 200:] = False
    last, hidden = _run_hf(torch, model, x, mask)
    got = from_hf(model).run(hidden[0], padding_mask=mask)
    assert two_cpus == [3, 3]
    assert rel_err(got, last, mask) < 1e-12


@pytest.mark.parametrize("dtype, tol", [(np.float32, 2e-6), (np.float64, 1e-13)])
def test_same_bits_for_every_thread_count(monkeypatch, two_cpus, dtype, tol):
    """The grouped forward has the same bits for 1, 2 and 3 threads, and equals the ungrouped
    passes to rounding."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=2, layers=2, heads=2, placement="pre")
    x = np.random.default_rng(6).standard_normal((4, 128, 8)).astype(dtype)
    runs = []
    for count in ("1", "2", "3"):
        monkeypatch.setenv("CTFORMER_NUM_THREADS", count)
        runs.append(model.run(x))
    assert two_cpus == [2] * 6
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert runs[0].dtype == dtype
    _ungrouped(monkeypatch)
    assert rel_err(runs[0], model.run(x)) < tol


@pytest.mark.filterwarnings("ignore::ctformer.model.InconsistentDepthLimitWarning")  # two steps a post-norm layer
def test_layers_and_statistics_as_ungrouped(monkeypatch, two_cpus):
    """Two steps a layer, every layer kept, a post-norm model: the states, the times and
    the evaluation count of the ungrouped solve."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=4, layers=3, heads=2, placement="post")
    x = np.random.default_rng(7).standard_normal((2, 256, 8))
    kw = dict(tokens="midpoint", features="midpoint", scheme="strang", steps_per_layer=2,
              save_at=SaveAt(layers=True))
    grouped = model.evolve(x, **kw)
    assert two_cpus == [2, 2, 2]
    _ungrouped(monkeypatch)
    plain = model.evolve(x, **kw)
    assert grouped.stats["rhs_evaluations"] == plain.stats["rhs_evaluations"] == 3 * 2 * 3
    np.testing.assert_array_equal(grouped.times, plain.times)
    assert len(grouped.states) == len(plain.states) == 4
    for a, b in zip(grouped.states, plain.states):
        assert rel_err(a, b) < 1e-13
    assert rel_err(grouped.final, plain.final) < 1e-13


def test_an_error_in_a_group_names_the_batch_index(monkeypatch, two_cpus):
    """A step that fails in the second group is repeated on the whole batch: the message names
    the token (1, 5) of the batch, as the ungrouped solve does, not (0, 5) of the group."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2, heads=2, placement="pre")
    x = np.random.default_rng(8).standard_normal((2, 128, 8))
    x[1, 5, :] = 2.0  # a token without feature variance: LayerNorm with eps = 0 is undefined
    with pytest.raises(ValueError, match=r"token at index \(1, 5\) \(batch\.\.\., token\)") as grouped:
        model.run(x)
    assert two_cpus == [2]
    _ungrouped(monkeypatch)
    with pytest.raises(ValueError) as plain:
        model.run(x)
    assert str(grouped.value) == str(plain.value)


def test_a_state_that_overflows_names_the_layer(two_cpus):
    """Finiteness is checked on the whole batch after each layer, as without groups."""
    model = ctformer.ContinuousTransformer.random_smooth(seed=1, layers=2, heads=2, placement="pre")
    huge = ("blocks.0.feedforward.W_1.coefficients", "blocks.0.feedforward.W_2.coefficients")
    model = model.with_parameters({k: v * 1e160 if k in huge else v for k, v in model.parameters().items()})
    x = np.random.default_rng(8).standard_normal((2, 128, 8))
    with pytest.raises(FloatingPointError, match=r"in layer 0 \(t in \[0, 1\]\)"):
        model.run(x)
    assert two_cpus == [2]


@pytest.mark.parametrize("seconds, passes", [(1e-9, 6), (1e9, 2)])
def test_passes_cover_the_layers_that_take_a_quarter_second(monkeypatch, two_cpus, seconds, passes):
    """One pass per layer when a layer takes longer than the pass may, else the first layer
    alone (to time it) and the rest in one pass: the same bits either way."""
    monkeypatch.setattr(groups_module.SequenceGroups, "chunk_seconds", seconds)
    sizes = []
    advance = groups_module.SequenceGroups.advance
    monkeypatch.setattr(groups_module.SequenceGroups, "advance",
                        lambda self, scheme, u, segments, *a, **k: sizes.append(len(segments))
                        or advance(self, scheme, u, segments, *a, **k))
    model = ctformer.ContinuousTransformer.random_smooth(seed=3, layers=6, heads=2, placement="pre")
    x = np.random.default_rng(9).standard_normal((2, 128, 8)).astype(np.float32)
    got = model.solve(x, tokens="midpoint", features="midpoint", trajectory=True)
    assert len(sizes) == passes and sum(sizes) == 6
    monkeypatch.setattr(groups_module.SequenceGroups, "chunk_seconds", 1e-9 if seconds > 1 else 1e9)
    again = model.solve(x, tokens="midpoint", features="midpoint", trajectory=True)
    assert len(got) == len(again) == 7
    assert all(np.array_equal(a, b) for a, b in zip(got, again))


def test_ctrl_c_keeps_the_layers_before_the_pass(monkeypatch, two_cpus):
    """Ctrl-C during the second pass: the solve is interrupted with the states of the first
    pass (t = 0 and t = 1), which equal those of the uninterrupted solve."""
    from ctformer.solvers import SolveInterrupted

    model = ctformer.ContinuousTransformer.random_smooth(seed=3, layers=3, heads=2, placement="pre")
    x = np.random.default_rng(10).standard_normal((2, 128, 8))
    kw = dict(tokens="midpoint", features="midpoint", scheme="lie", steps_per_layer=1, save_at=SaveAt(layers=True))
    full = model.evolve(x, **kw)
    run = groups_module.run_blas_tasks
    passes = []

    def interrupted(*args):
        passes.append(1)
        if len(passes) == 2:
            raise KeyboardInterrupt
        return run(*args)

    monkeypatch.setattr(groups_module, "run_blas_tasks", interrupted)
    with pytest.raises(SolveInterrupted, match=r"kept 2 states up to t=1") as caught:
        model.evolve(x, **kw)
    kept = caught.value.result
    assert list(kept.times) == [0.0, 1.0]
    assert all(np.array_equal(a, b) for a, b in zip(kept.states, full.states[:2]))
    # nothing is lost: a restart from what was kept ends with the uninterrupted solve's bits
    monkeypatch.setattr(groups_module, "run_blas_tasks", run)
    rest = model.evolve(None, initial=kept, **kw)
    assert list(rest.times) == [1.0, 2.0, 3.0]
    assert all(np.array_equal(a, b) for a, b in zip(rest.states, full.states[1:]))


def test_the_first_group_runs_alone_the_first_time(monkeypatch, two_cpus):
    """The first pass of a new group shape runs its first group alone (the machine's one-time
    measurements then see an idle machine), later passes and solves all groups at once; the
    same bits either way."""
    monkeypatch.setattr(groups_module, "_SEEN", set())
    run = groups_module.run_blas_tasks
    calls = []
    monkeypatch.setattr(groups_module, "run_blas_tasks",
                        lambda worker, tasks, parallel: calls.append(list(tasks)) or run(worker, tasks, parallel))
    model = ctformer.ContinuousTransformer.random_smooth(seed=5, layers=3, heads=2, placement="pre")
    x = np.random.default_rng(11).standard_normal((2, 128, 8)).astype(np.float32)
    first = model.run(x)
    assert calls[:2] == [[0], [1]] and all(c == [0, 1] for c in calls[2:])
    calls.clear()
    again = model.run(x)
    assert calls and all(c == [0, 1] for c in calls)
    assert np.array_equal(first, again)

"""The goal scripts of issue 25 judge honestly: the peer is the issue's, a goal is met only
where ctformer's output equals the peer's within the issue's tolerances and the median is of
at least 5 rounds, and memory is measured where the call allocates it. Each check runs the
scripts' own logic at tiny sizes."""
import math
import sys
import types

import numpy as np
import pytest

from .conftest import benchmark_module


@pytest.fixture
def recorded(monkeypatch):
    """The ``_environment`` the scripts record their goals in, with empty records."""
    benchmark_module("goals")  # puts benchmarks/_environment on sys.modules as the scripts import it
    env = sys.modules["_environment"]
    for name, empty in (("_VERDICTS", []), ("_FLOORS", {}), ("_UNDECIDED", {})):
        monkeypatch.setattr(env, name, empty, raising=False)
    return env


def quick_rounds(env):
    """``rounds`` with a short warm-up and no pauses: the scripts' logic, not a measurement."""
    return lambda calls, repeats, **_: env.rounds(calls, repeats, warmup_s=0.0, gap_s=0.0, block_s=0.0)


def published_loop(m, beta, dt, steps):
    """Issue 25's peer written from its words: the softmax of beta M M^T, times M, times dt,
    added to M, rows renormalized (NumPy, float64)."""
    for _ in range(steps):
        s = beta * m @ np.swapaxes(m, -1, -2)
        a = np.exp(s - s.max(axis=-1, keepdims=True))
        m = m + dt * ((a / a.sum(axis=-1, keepdims=True)) @ m)
        m = m / np.linalg.norm(m, axis=-1, keepdims=True)
    return m


def test_particle_goal_peer_is_the_published_loop():
    """particle_batch.py times its goal against ``authors``: that side is the published loop
    (no tangent projection), equal to the issue's formula to rounding; ``projected`` adds the
    projection, which changes the run at O(dt^2) per step, and is what ctformer matches."""
    pytest.importorskip("torch")
    bench = benchmark_module("particle_batch")
    x0 = bench.uniform_start(6, 5, 2, seed=4)
    sides = bench.calls(x0, 4.0, 0.1, 10, torch_input=False)
    reference = published_loop(x0, 4.0, 0.1, 10)
    assert bench.relative(sides["authors"]().numpy(), reference) < 1e-14
    assert bench.relative(sides["projected"]().numpy(), reference) > 1e-4
    assert bench.relative(sides["ctformer"](), sides["projected"]().numpy()) < 1e-13


def test_particle_case_records_the_ratio_over_the_published_loop(recorded, monkeypatch):
    """run_case at a tiny size: its goal is ctformer / authors (the published loop), the
    outputs agree with the projected loop, and one round decides nothing."""
    pytest.importorskip("torch")
    bench = benchmark_module("particle_batch")
    monkeypatch.setattr(bench, "rounds", quick_rounds(recorded))
    args = types.SimpleNamespace(batch=8, n=4, d=2, dt=0.1, steps=3, repeats=1, no_torch_input=True)
    assert bench.run_case(4.0, "float64", args) is True
    (name, ratio, goal, unit, met, _), = recorded._VERDICTS
    assert name == "particles beta=4 float64 ctformer / authors' loop" and goal == 0.8 and not met
    assert recorded._outcome(met, goal, None, name) == "not met (1 rounds, fewer than 5: a smoke test)"


def test_attention_goal_needs_outputs_equal_to_sdpa(recorded, monkeypatch):
    """attention.py checks every output of ctformer against SDPA's with the issue's tolerance:
    at N = 256 in float32 the direct call agrees (about 1e-7); the same call off by 1e-4
    relative is flagged, meets no goal and stops the run with exit status 1."""
    pytest.importorskip("torch")
    bench = benchmark_module("attention")
    monkeypatch.setattr(bench, "rounds", quick_rounds(recorded))
    methods = bench.methods

    def off(causal):
        """The script's methods, the direct call's output scaled by 1 + 1e-4."""
        table = methods(causal)
        exact = table["quadrature"]

        def setup(*inputs):
            call = exact(*inputs)
            return lambda: call() * np.float32(1 + 1e-4)
        table["quadrature"] = setup
        return table

    args = types.SimpleNamespace(dim=8, no_naive=True, no_rss=True, repeats=5)
    rows = bench._configuration(False, 256, "float32", args, bench.IdleWaiter(0))
    quadrature = next(r for r in rows if r["method"] == "quadrature")
    assert quadrature["ok"] and quadrature["err"] <= 1e-5 and quadrature["rounds"] == 5
    monkeypatch.setattr(bench, "methods", off)
    rows = bench._configuration(False, 256, "float32", args, bench.IdleWaiter(0))
    quadrature = next(r for r in rows if r["method"] == "quadrature")
    assert not quadrature["ok"] and quadrature["err"] == pytest.approx(1e-4, rel=0.05)
    quadrature["ratio"] = 0.5  # fast, and wrong: not met
    bench.record_goals(rows)
    (name, ratio, _, _, met, _), = recorded._VERDICTS
    assert ratio == 0.5 and not met
    assert recorded._outcome(met, 0.9, None, name) == "not met (outputs differ from the peer's)"
    for quiet in ("summary", "limit_threads", "header", "_print_engines", "_print_geometry"):
        monkeypatch.setattr(bench, quiet, lambda *a, **k: None)
    monkeypatch.setattr(bench, "_configuration", lambda *a: rows)
    with pytest.raises(SystemExit) as stop:
        bench.main(["--sizes", "256", "--dtypes", "float32", "--masks", "none", "--no-rss", "--idle-wait", "0"])
    assert stop.value.code == 1


def test_attention_memory_goal_counts_torchs_allocations(recorded):
    """tracemalloc does not see torch's allocator (a 32 MiB torch tensor traces under 1 MiB),
    so the memory goal takes the peak RSS growth where it is larger: 70 MiB measured by RSS
    fails the 64 MiB goal even where the traced peak is 4 MiB."""
    torch = pytest.importorskip("torch")
    bench = benchmark_module("attention")
    assert bench.traced_extra(lambda: torch.ones(1 << 22, dtype=torch.float64)) < 1.0
    row = dict(mask="none", n=8192, dtype="float64", method="quadrature", ratio=0.8, spread=(0.79, 0.81),
               traced=4.0, rss=70.0, ok=True, rounds=5)
    bench.record_goals([row])
    memory = [v for v in recorded._VERDICTS if v[3] == "MiB"]
    assert [(v[1], v[4]) for v in memory] == [(70.0, False)]
    assert bench.extra_memory(dict(row, rss=math.nan)) == 4.0  # --no-rss: the traced peak alone


def test_small_solve_agreement_is_the_issues_float64_tolerance():
    """small_solve.py stops where the two final states differ by more than 1e-12 relative (it
    allowed 1e-11); ctformer's euler solve and the plain loop agree to about 3e-16."""
    bench = benchmark_module("small_solve")
    ref = bench.initial_state(bench.N_TOKENS, bench.N_FEATURES)
    with pytest.raises(SystemExit, match=r"differ by 5\.0e-12 \(> 1e-12, the float64 tolerance\)"):
        bench.agreement("euler", ref + 5e-12 * np.abs(ref).max(), ref)
    model, grids = bench.model_and_grids()
    from ctformer.discretizations import Midpoint

    ours = model.solve(ref, tokens=Midpoint(16), features=Midpoint(16), scheme="euler",
                       steps_per_layer=bench.STEPS)
    assert bench.agreement("euler", np.asarray(ours), bench.plain_solve(ref, bench.plain_parameters(model, grids),
                                                                         "euler")) < 1e-14


def test_model_row_with_differing_outputs_meets_no_goal(recorded, monkeypatch):
    """model.py on a one-layer GPT-2: ctformer's output off by 1e-3 is flagged and its row
    records "not met" even with a ratio under the goal."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from ctformer.bridges import from_hf

    bench = benchmark_module("model")
    monkeypatch.setattr(bench, "rounds", quick_rounds(recorded))
    gpt2 = transformers.GPT2Model(transformers.GPT2Config(
        n_embd=16, n_layer=1, n_head=2, n_inner=32, n_positions=16, vocab_size=32, bos_token_id=0,
        eos_token_id=0)).double().eval()
    exact = from_hf(gpt2)
    off = types.SimpleNamespace(run=lambda x: exact.run(x) * (1 + 1e-3))
    args = types.SimpleNamespace(dtypes=["float64"], state="numpy", compare_groups=False, repeats=5)
    rows = bench._network_rows("gpt2", gpt2, exact, [(1, 4)], args)
    assert rows[0]["ok"] and rows[0]["diff"] <= 1e-12
    rows = bench._network_rows("gpt2", gpt2, off, [(1, 4)], args)
    assert not rows[0]["ok"] and rows[0]["diff"] == pytest.approx(1e-3, rel=1e-6)
    name = recorded._VERDICTS[-1][0]
    assert not recorded._VERDICTS[-1][4]
    assert recorded._outcome(False, 0.8, None, name) == "not met (outputs differ from the peer's)"


def test_verdict_needs_five_rounds_and_equal_outputs(recorded, monkeypatch, tmp_path):
    """A ratio under its goal is met only from at least 5 rounds and with outputs equal to the
    peer's; the reason reaches goals.py's closing table."""
    monkeypatch.setenv("CTFORMER_GOALS_FILE", str(tmp_path / "goals.jsonl"))
    assert recorded.Rounds({"ours": [1.0] * 5, "peer": [2.0] * 4}).count == 4
    assert recorded.verdict("five rounds", 0.5, 0.8, show=False, rounds=5)
    assert not recorded.verdict("three rounds", 0.5, 0.8, show=False, rounds=3)
    assert not recorded.verdict("differs", 0.5, 0.8, show=False, agrees=False, rounds=5)
    assert recorded.verdict("memory", 4.0, 64.0, "MiB", show=False)
    recorded._append_goals("numpy: openblas")
    rows = benchmark_module("goals").read_goals(tmp_path / "goals.jsonl")
    assert [r["verdict"] for r in rows] == ["met", "not met (3 rounds, fewer than 5: a smoke test)",
                                            "not met (outputs differ from the peer's)", "met"]


def test_minilm_peer_computes_attention_as_huggingface_does_by_default(recorded, monkeypatch):
    """model.py times MiniLM's HuggingFace side with the attention HuggingFace loads the
    checkpoint with by default (SDPA), not the eager kernel of the float64 reference (which
    took 1.7-1.8x SDPA's time at 4 x 512); the outputs still agree (float64, 1 x 4 tokens)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from ctformer.bridges import from_hf, minilm

    model, _ = minilm.load()
    default = transformers.AutoModel.from_pretrained(str(minilm.model_path())).config._attn_implementation
    bench = benchmark_module("model")
    monkeypatch.setattr(bench, "rounds", quick_rounds(recorded))
    monkeypatch.setattr(bench, "product_share", lambda call: 0.5)
    made, torch_call = [], bench.torch_call
    monkeypatch.setattr(bench, "torch_call", lambda *a, **k: made.append(torch_call(*a, **k)) or made[-1])
    args = types.SimpleNamespace(dtypes=["float64"], state="numpy", compare_groups=False, repeats=5)
    rows = bench._network_rows("minilm", model, from_hf(model), [(1, 4)], args)
    timed = getattr(made[-1], "module", None)
    assert default == "sdpa" and model.config._attn_implementation == "eager"
    assert timed is not None and timed.config._attn_implementation == default
    assert rows[0]["ok"] and rows[0]["diff"] <= 1e-12

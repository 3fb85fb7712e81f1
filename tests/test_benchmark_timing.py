"""The benchmarks' timing in alternating rounds (benchmarks/_environment.py)."""
import importlib.util
import os
import time

import pytest

from .conftest import benchmark_module

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def env():
    spec = importlib.util.spec_from_file_location("_bench_environment",
                                                  os.path.join(ROOT, "benchmarks", "_environment.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_ratio_is_the_median_of_the_rounds_ratios(env):
    # per round: 2/1, 9/3, 4/1 -> ratios 2, 3, 4, median 3; the ratio of the medians would be 4/1
    timed = env.Rounds({"ours": [2.0, 9.0, 4.0], "peer": [1.0, 3.0, 1.0]})
    assert timed.ratio("ours", "peer") == 3.0
    assert timed["ours"] == 4.0 and timed.median("peer") == 1.0


def test_spread_is_the_quartiles_of_the_rounds_ratios(env):
    # ratios 1, 2, 3, 4, 5: inclusive quartiles at positions 1 and 3 of 0..4 -> 2 and 4
    timed = env.Rounds({"ours": [1.0, 4.0, 9.0, 16.0, 25.0], "peer": [1.0, 2.0, 3.0, 4.0, 5.0]})
    assert timed.ratios("ours", "peer") == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert timed.spread("ours", "peer") == (2.0, 4.0)
    # four ratios 1, 2, 3, 5: positions 0.75 and 2.25 -> 1.75 and 3.5 (linear interpolation)
    four = env.Rounds({"ours": [1.0, 2.0, 3.0, 5.0], "peer": [1.0] * 4})
    assert four.spread("ours", "peer") == (1.75, 3.5)
    assert env.Rounds({"ours": [3.0], "peer": [2.0]}).spread("ours", "peer") == (1.5, 1.5)


def test_a_goal_inside_the_spread_is_marked(env, capsys):
    env._VERDICTS.clear()
    try:
        assert env.verdict("close", 0.79, 0.8, spread=(0.75, 0.85)) is True
        assert env.verdict("clear", 0.60, 0.8, spread=(0.55, 0.65)) is True
        assert env.verdict("far", 1.10, 0.8, spread=(1.0, 1.2)) is False
        assert env.verdict("memory", 4.0, 64.0, "MiB") is True
        lines = capsys.readouterr().out.splitlines()
        assert lines[0] == "goal close: 0.790x [0.75-0.85] <= 0.800x -> met (within the spread)"
        assert lines[1].endswith("-> met") and lines[2].endswith("-> not met")
        assert lines[3] == "goal memory: 4 MiB <= 64 MiB -> met"
        assert env.within_spread(0.8, (0.75, 0.85)) and not env.within_spread(0.8, (0.55, 0.65))
        assert not env.within_spread(0.8, None)
        assert env.summary() is False
        out = capsys.readouterr().out
        assert "3 of 4 goals met -> not met; 1 of them within the spread" in out
    finally:
        env._VERDICTS.clear()


def test_rounds_time_every_call_in_each_round(env):
    order = []

    def sleeper(name, seconds):
        def call():
            order.append(name)
            time.sleep(seconds)
        return call

    timed = env.rounds({"short": sleeper("short", 0.004), "long": sleeper("long", 0.012)}, repeats=4,
                       warmup_s=0.0, gap_s=0.0, block_s=0.0)
    assert [len(t) for t in timed.times.values()] == [4, 4]
    # a sleep lasts at least its argument and overshoots by far less than its length
    assert all(t >= 0.004 for t in timed.times["short"]) and all(t >= 0.012 for t in timed.times["long"])
    assert 2.0 <= timed.ratio("long", "short") <= 3.5
    # one warm-up each, then the order alternates: short, long | long, short | ...
    assert order[2:] == ["short", "long", "long", "short"] * 2


def test_rounds_count_the_page_faults_of_each_call(env):
    """A call that maps and touches 256 fresh pages faults at least once a page; one that
    touches nothing new faults (almost) never."""
    import mmap

    pages = 256

    def touch():
        with mmap.mmap(-1, pages * mmap.PAGESIZE) as m:
            for page in range(pages):
                m[page * mmap.PAGESIZE] = 1

    timed = env.rounds({"touch": touch, "idle": lambda: None}, repeats=3, warmup_s=0.0, gap_s=0.0,
                       block_s=0.0)
    assert len(timed.faults["touch"]) == 3
    assert pages <= timed.faults_per_call("touch") < 2 * pages
    assert timed.faults_per_call("idle") < 8
    assert env.Rounds({"ours": [1.0]}).faults_per_call("ours") is None


def test_steal_share_of_the_rounds_is_a_fraction(env):
    env._STEAL.clear()
    env.rounds({"noop": lambda: None}, repeats=3, warmup_s=0.0, gap_s=0.05)
    if env._cpu_ticks() is None:
        assert env.steal_report() is None  # no /proc/stat: nothing is claimed
        return
    assert all(0.0 <= share <= 1.0 for share in env._STEAL)
    assert "stolen by the hypervisor" in env.steal_report()


def test_model_floor_counts_the_calling_threads_feature_products():
    """benchmarks/model.py's floor: the share of a call its calling thread spends in ctformer's
    feature products. A call of nothing but one large product is almost all product; a call
    that makes none, or makes it on another thread only (a worker's row block, concurrent with
    the caller's own), counts none; the functions are the library's own again afterwards."""
    pytest.importorskip("torch")
    import threading

    import numpy as np

    from ctformer._numerics import few_rows, gemm, packed
    from ctformer.operators import attention_flow, feature

    model = benchmark_module("model")
    a = np.ones((600, 600))  # milliseconds: the wrappers cost microseconds
    before = (feature.rows_product, attention_flow.rows_product, attention_flow.numpy_rows)
    library = (gemm.numpy_rows, few_rows.FewRowsMatrix.__call__, packed.PackedMatrix.__call__)

    def elsewhere():
        worker = threading.Thread(target=lambda: feature.rows_product(a, a))
        worker.start()
        worker.join()

    share = model.product_share(lambda: feature.rows_product(a, a))
    assert 0.9 < share <= 1.0  # rows_product calls numpy_rows: the product inside counts once
    assert model.product_share(lambda: attention_flow.numpy_rows(a, a)) > 0.9
    assert model.product_share(lambda: gemm.numpy_rows(a, a)) > 0.9  # as a small plan calls it
    assert model.product_share(lambda: time.sleep(0.01)) == 0.0
    assert model.product_share(elsewhere) == 0.0
    assert (feature.rows_product, attention_flow.rows_product, attention_flow.numpy_rows) == before
    assert (gemm.numpy_rows, few_rows.FewRowsMatrix.__call__, packed.PackedMatrix.__call__) == library


def test_peer_share_counts_huggingfaces_own_products():
    """benchmarks/model.py's ``HF mm``: the share of a HuggingFace call spent in its ``Linear``
    and GPT-2 ``Conv1D`` modules, timed by forward hooks. A call of nothing but products is
    almost all product, a product beside a pause of the same length about half, a call with
    none counts none; the hooks are gone afterwards."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    model = benchmark_module("model")

    class Pause(torch.nn.Module):
        def __init__(self, seconds):
            super().__init__()
            self.seconds = seconds

        def forward(self, x):
            time.sleep(self.seconds)
            return x

    x = torch.ones(600, 600, dtype=torch.float64)

    def timed_call(module):
        def call():
            with torch.no_grad():
                return module(x)
        call.module = module
        return call

    products = torch.nn.Sequential(torch.nn.Linear(600, 600).double(), Conv1D(600, 600).double())
    assert 0.9 < model.peer_product_share(timed_call(products)) <= 1.0
    start = time.perf_counter()
    products(x)
    alone = time.perf_counter() - start
    half = model.peer_product_share(timed_call(torch.nn.Sequential(products, Pause(alone))))
    assert 0.25 < half < 0.75
    assert model.peer_product_share(timed_call(Pause(0.01))) == 0.0
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in products.modules())


def test_emulated_avx2_holds_every_library_to_avx2(env, monkeypatch):
    """``--emulate avx2``: a process started with ``emulation_env("avx2")`` runs OpenBLAS's
    Haswell kernel, torch's AVX2 kernels, Numba's Haswell target and NumPy without its AVX-512
    dispatch; the OpenBLAS overrides it does not set are gone; an unknown name is refused."""
    import json
    import subprocess
    import sys

    pytest.importorskip("torch")
    pytest.importorskip("numba")
    monkeypatch.setenv("OPENBLAS_L2_SIZE", "512")
    emulated = env.emulation_env("avx2")
    assert "OPENBLAS_L2_SIZE" not in emulated and emulated[env.EMULATION_MARK] == "avx2"
    probe = ("import json, numpy, torch, threadpoolctl, numba\n"
             "from numpy._core._multiarray_umath import __cpu_features__ as f\n"
             "blas = [i.get('architecture') for i in threadpoolctl.threadpool_info() if i['user_api'] == 'blas']\n"
             "print(json.dumps([torch.backends.cpu.get_cpu_capability(), f.get('X86_V4', False), blas,"
             " numba.config.CPU_NAME]))")
    out = subprocess.run([sys.executable, "-c", probe], env=emulated, capture_output=True, text=True, check=True)
    capability, v4, blas, numba_target = json.loads(out.stdout.strip().splitlines()[-1])
    assert capability == "AVX2" and v4 is False and numba_target == "haswell"
    assert blas and all(arch == "Haswell" for arch in blas)
    with pytest.raises(SystemExit, match="--emulate: 'avx1' is not one of avx2"):
        env.emulation_env("avx1")


def test_goals_table_carries_the_floor(env, monkeypatch, tmp_path):
    """A goal recorded with a floor (``model.py``'s networks) reaches ``goals.py``'s closing
    table with it; a goal without one has an empty floor cell; the count of goals met is right."""
    monkeypatch.setenv("CTFORMER_GOALS_FILE", str(tmp_path / "goals.jsonl"))
    monkeypatch.setattr(env, "_VERDICTS", [])
    monkeypatch.setattr(env, "_FLOORS", {})
    assert env.verdict("net 8x128 float32 / HuggingFace", 0.7, 0.8, show=False, spread=(0.6, 0.75), floor=0.5)
    assert not env.verdict("convolution M=128", 1.1, 1.0, show=False)
    env._append_goals("numpy: openblas")
    goals = benchmark_module("goals")
    rows = goals.read_goals(tmp_path / "goals.jsonl")
    assert [r["floor"] for r in rows] == [0.5, None]
    table = goals.table(rows, {}).splitlines()
    assert table[-4].endswith("| net 8x128 float32 / HuggingFace | 0.700x | 0.60-0.75 | <= 0.8x | met | 0.50 |")
    assert table[-3].endswith("| convolution M=128 | 1.100x |  | <= 1x | not met |  |")
    assert table[-1] == "1 of 2 goals met"


def test_model_compares_groups_with_the_whole_batch(monkeypatch):
    """benchmarks/model.py --compare-groups: the batches this machine solves in groups (8 x 128
    on two CPUs), and the passes' call, which solves them whole (no grouped pass) and leaves
    the setting as it found it, set or not."""
    pytest.importorskip("torch")
    import numpy as np

    import ctformer
    from ctformer._numerics import sequence_groups

    model = benchmark_module("model")
    monkeypatch.setattr(sequence_groups, "machine_cpus", lambda: 2)
    x = np.random.default_rng(0).standard_normal((8, 128, 8)).astype(np.float32)
    assert model._grouped(x) and not model._grouped(x[:1]) and not model._grouped(x.tolist())
    advanced = []
    advance = sequence_groups.SequenceGroups.advance
    monkeypatch.setattr(sequence_groups.SequenceGroups, "advance",
                        lambda self, *a, **k: advanced.append(len(self.slices)) or advance(self, *a, **k))
    net = ctformer.ContinuousTransformer.random_smooth(seed=2, layers=2, heads=2, placement="pre")
    for previous in (None, "auto"):
        if previous is None:
            monkeypatch.delenv("CTFORMER_SEQUENCE_GROUPS", raising=False)
        else:
            monkeypatch.setenv("CTFORMER_SEQUENCE_GROUPS", previous)
        whole = model._groups_off(lambda: net.run(x))()
        assert advanced == [] and os.environ.get("CTFORMER_SEQUENCE_GROUPS") == previous
    grouped = net.run(x)
    assert advanced == [2, 2]  # two groups, in two passes: the first covers one layer and is timed
    assert np.abs(grouped - whole).max() < 2e-6 * np.abs(whole).max()

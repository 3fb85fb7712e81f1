"""The benchmarks' timing in alternating rounds (benchmarks/_environment.py)."""
import importlib.util
import os
import time

import pytest

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


def test_steal_share_of_the_rounds_is_a_fraction(env):
    env._STEAL.clear()
    env.rounds({"noop": lambda: None}, repeats=3, warmup_s=0.0, gap_s=0.05)
    if env._cpu_ticks() is None:
        assert env.steal_report() is None  # no /proc/stat: nothing is claimed
        return
    assert all(0.0 <= share <= 1.0 for share in env._STEAL)
    assert "stolen by the hypervisor" in env.steal_report()


def test_model_floor_counts_only_the_shared_kernels():
    """benchmarks/model.py's floor: the share of a call spent in torch's mm / addmm / fused
    attention. A call of nothing but one large product is almost all kernel; a call that
    calls none of them is none; the functions are torch's own again afterwards."""
    torch = pytest.importorskip("torch")
    import sys

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("_bench_model", os.path.join(ROOT, "benchmarks", "model.py"))
        model = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(model)
    finally:
        sys.path.remove(os.path.join(ROOT, "benchmarks"))
    a = torch.ones(700, 700, dtype=torch.float64)  # tens of ms: the wrappers cost microseconds
    before = (torch.mm, torch.addmm, torch.nn.functional.scaled_dot_product_attention)
    assert model.shared_kernel_share(lambda: torch.mm(a, a)) > 0.9
    assert model.shared_kernel_share(lambda: time.sleep(0.01)) == 0.0
    q = torch.ones(1, 4, 512, 64, dtype=torch.float64)
    assert model.shared_kernel_share(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)) > 0.5
    assert (torch.mm, torch.addmm, torch.nn.functional.scaled_dot_product_attention) == before

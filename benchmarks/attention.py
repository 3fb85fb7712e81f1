"""Benchmark: quadrature_attention against torch SDPA and a naive NumPy softmax, on the CPU.

Run ``python benchmarks/attention.py`` (the issue's configurations: N = 2048, 8192, 32768, head
dimension 64, float32 and float64, without a mask and causal; about 15 minutes on 2 cores;
``--quick``: N = 512, 1024, 3 repeats, no subprocess memory, a smoke test). For each
configuration it times in the same process

* ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (``is_causal`` for the mask),
* ``quadrature``: :func:`ctformer.operators.quadrature_attention` (``mask="causal"``), as a
  user calls it: where torch does this machine's products and MKL's strict reproducibility
  mode is on, this is torch's fused kernel on ctformer's threads (the header says which),
* ``streamed``: the same with the library's own streamed path (``chunk`` given explicitly:
  the chunk of :func:`ctformer._numerics.streamed.stream_chunk` in this machine's block
  geometry, :func:`ctformer._numerics.measured_blocks.geometry`, printed in the header),
* ``naive``: NumPy with the full N x N score matrix (in place, one softmax; N <= 8192 only,
  it needs 8 N^2 bytes),
* ``products`` (without a mask): the streamed path's two products alone (:func:`products_alone`),
  whose ratio to SDPA is printed as the goal's ``floor``: where it is close to 0.9, the goal
  is out of reach unless the BLAS products themselves get faster,

all with 2 threads (torch.set_num_threads, OPENBLAS/OMP/MKL_NUM_THREADS and threadpoolctl),
in ``--repeats`` alternating rounds after a 0.5 s warm-up each (:func:`_environment.rounds`: a
pause before each block lets torch's and OpenBLAS's spinning threads go idle, and a ratio is
the median of the rounds' ratios); on a shared machine each configuration first waits (at
most ``--idle-wait`` seconds in all) until the CPUs are idle. It prints the CPU, the BLAS kernels, each time, its ratio to SDPA, the extra peak
memory of one call, the relative difference max |ours - SDPA| / max |SDPA| of every output, and
the issue's goals as "met" / "not met": ratio <= 0.9 at every N, dtype and mask, extra memory
<= 64 MiB at N = 8192 in float64 (the larger of ``traced`` and ``rss``: tracemalloc does not
see torch's allocator, which serves the call where it takes torch's fused kernel). A ratio
goal whose output differs from SDPA's by more than 1e-12 (float64) or 1e-5 (float32) is not
met, and the exit status is then 1; so is one timed in fewer than 5 rounds (``--quick``).

Memory columns: ``traced`` is the peak of NumPy allocations during one call (tracemalloc,
including the output array; not available for torch), ``rss`` is the growth of the peak
resident set size over one call in a fresh subprocess that holds only the inputs (all methods,
torch included; page-granular; the peak is reset through /proc/self/clear_refs on Linux).

Environment: unless ``--keep-env`` is given, the script re-executes itself without
OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE (so OpenBLAS picks its kernel for the real CPU) and
says so; the BLAS libraries actually loaded are printed from threadpoolctl.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _environment import (TOLERANCE, add_emulation_option, header, limit_threads, prepare, rounds,  # noqa: E402
                          summary, verdict)

if __name__ == "__main__":
    prepare(sys.argv[1:], __file__)

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402

MiB = 1 << 20
GOAL_RATIO, GOAL_MIB, NAIVE_MAX = 0.9, 64.0, 8192
OURS = ("quadrature", "streamed")  # ctformer's sides, whose outputs must equal SDPA's


def make_inputs(n, d, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal((n, d)).astype(dtype) for _ in range(3))


def naive_attention(q, k, v, beta, causal=False):
    """Full N x N softmax in NumPy (in place, but the whole score matrix at once)."""
    s = q @ k.T
    s *= s.dtype.type(beta)
    if causal:
        s[np.triu_indices(s.shape[0], 1)] = -np.inf
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=1, keepdims=True)
    return s @ v


def methods(causal):
    """name -> (setup(q, k, v, beta) -> zero-argument call); imports lazily."""
    def sdpa(q, k, v, beta):
        import torch

        tq, tk, tv = (torch.from_numpy(a)[None, None] for a in (q, k, v))
        f = torch.nn.functional.scaled_dot_product_attention

        def call():
            with torch.no_grad():
                return f(tq, tk, tv, is_causal=causal, scale=beta)

        return call

    def quadrature(q, k, v, beta):
        from ctformer.operators import quadrature_attention

        mask = "causal" if causal else None
        return lambda: quadrature_attention(q, k, v, beta=beta, mask=mask)

    def streamed(q, k, v, beta):
        from ctformer._numerics.measured_blocks import geometry
        from ctformer._numerics.streamed import key_blocked, stream_chunk
        from ctformer.operators import quadrature_attention

        shape = geometry(q.dtype)
        blocked = key_blocked(len(k), None, q.dtype, causal, shape.key_block, shape.chunk_bytes)
        chunk = stream_chunk(len(q), len(k), q.dtype.itemsize, 1, blocked, shape, causal)
        mask = "causal" if causal else None
        return lambda: quadrature_attention(q, k, v, beta=beta, mask=mask, chunk=chunk)

    def naive(q, k, v, beta):
        return lambda: naive_attention(q, k, v, beta, causal)

    table = {"sdpa": sdpa, "quadrature": quadrature, "streamed": streamed, "naive": naive}
    if not causal:
        table["products"] = products_alone
    return table


def products_alone(q, k, v, beta):
    """The streamed path's two products alone, as its worker tasks run them without a mask:
    the same query chunks and key blocks (whole rows where the library takes them), the same
    BLAS for each product (:func:`ctformer._numerics.gemm.attention_products`), on the same
    threads, with nothing between them (no exponentials, no sums, no division). Its time over
    SDPA's is the attention goals' floor: the ratio left if everything else took no time.
    Where float32 blocks are packed (oneDNN), the floor is still that of the BLAS products."""
    from ctformer._numerics import gemm, measured_blocks, streamed, threads

    shape = measured_blocks.geometry(q.dtype)
    (n, d), m, e = q.shape, len(k), v.shape[-1]
    blocked = streamed.key_blocked(m, None, q.dtype, False, shape.key_block)
    chunk = streamed.stream_chunk(n, m, q.dtype.itemsize, 1, blocked, shape)
    width = shape.key_block if blocked and not streamed.whole_rows(m, q.dtype.itemsize, shape) else m
    score, weighted = gemm.attention_products(q.dtype)
    tasks = list(range(0, n, chunk))

    def worker(next_task):
        scores, sums = np.empty(chunk * width, dtype=q.dtype), np.empty((chunk, e), dtype=q.dtype)
        while (start := next_task()) is not None:
            rows = q[start:start + chunk]
            for col0 in range(0, m, width):
                keys, values = k[col0:col0 + width], v[col0:col0 + width]
                s = scores[: len(rows) * len(keys)].reshape(len(rows), len(keys))
                score(rows, keys.T, out=s)
                weighted(s, values, out=sums[: len(rows)])

    return lambda: threads.run_blas_tasks(worker, tasks, n * m >= streamed._PARALLEL_MIN_ENTRIES)


def _print_geometry(dtypes):
    """The block geometry of the streamed path on this machine (ctformer._numerics.blocks)."""
    from ctformer._numerics.blocks import DEFAULT
    from ctformer._numerics.measured_blocks import geometry

    for dtype in dtypes:
        g = geometry(dtype)
        how = "the default" if g == DEFAULT else f"measured here; the default is {DEFAULT.rows} x {DEFAULT.key_block}"
        print(f"streamed blocks, {dtype}: {g.rows} queries x {g.key_block} keys without a mask, "
              f"{g.chunk_bytes >> 20} MiB of scores per chunk otherwise ({how})")


def _print_engines(dtypes):
    """Which engine the direct call used for problems of 2^20 scores and more, plain and
    causal: the setting, or the stored measurement of this machine (none stored: the kernel
    did not apply here; ctformer._numerics.fused.fused_chosen), and whether float32 attention
    without a mask multiplied by packed key and value blocks (ctformer._numerics.packed_attention)."""
    from ctformer._numerics import store

    setting = os.environ.get("CTFORMER_ATTENTION_ENGINE", "auto") or "auto"
    stored = store.read(store.cache_file())
    for mask in ("plain", "causal"):
        for dtype in dtypes:
            entry = stored.get(f"{mask} attention {dtype}") if setting == "auto" else None
            if setting != "auto":
                print(f"{mask} attention, >= 2^20 scores, {dtype}: CTFORMER_ATTENTION_ENGINE={setting}")
            elif entry:
                engine = "torch's kernel" if entry["provider"] == "torch" else "the streamed engine"
                print(f"{mask} attention, >= 2^20 scores, {dtype}: {engine} (measured streamed / kernel "
                      f"{entry['ratio']:.2f}, streamed faster in {entry['wins']} of 9 pairs)")
    packed = stored.get("packed attention float32")
    if packed and "float32" in dtypes:
        how = "yes" if packed["provider"] == "torch" else "no"
        print(f"float32 attention without a mask on packed key and value blocks: {how} (measured "
              f"{packed.get('ratio', float('nan')):.2f} of the time of the tasks' products)")


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def rss_child(method, n, d, dtype, causal):
    """Child process: peak resident set growth (MiB) over one call with only the inputs alive.

    Linux: the peak (VmHWM) is reset to the current RSS through /proc/self/clear_refs, so
    import-time peaks do not hide the call's; elsewhere falls back to ru_maxrss.
    """
    q, k, v = make_inputs(n, d, dtype)
    call = methods(causal)[method](q, k, v, 1 / math.sqrt(d))
    if method == "sdpa":
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    # load code pages first, on the path of the measured call (512 tokens: 2^18 scores, streamed)
    methods(causal)[method](*make_inputs(512, d, dtype), 1 / math.sqrt(d))()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kib("VmRSS")
        out = call()
        after = _status_kib("VmHWM")
    except OSError:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = call()
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    del out
    print(json.dumps({"rss_mib": (after - before) / 1024}))


def rss_extra(method, n, d, dtype, causal):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", method, str(n), str(d),
           np.dtype(dtype).name, "1" if causal else "0"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])["rss_mib"]
    except (subprocess.SubprocessError, ValueError, IndexError, KeyError) as exc:
        print(f"  (rss measurement of {method} failed: {exc})", file=sys.stderr)
        return math.nan


def traced_extra(call):
    tracemalloc.start()
    try:
        out = call()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del out
    return peak / MiB


def cpu_idle_fraction(interval=0.25):
    """Fraction of all CPUs idle over ``interval`` seconds (Linux /proc/stat; 1.0 elsewhere)."""
    def read():
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return fields[3] + fields[4], sum(fields)

    try:
        idle0, total0 = read()
        time.sleep(interval)
        idle1, total1 = read()
    except OSError:
        return 1.0
    return (idle1 - idle0) / max(1, total1 - total0)


class IdleWaiter:
    """Before a timing round, wait (within a total budget) until the machine is idle."""

    def __init__(self, budget_s, threshold=0.9):
        self.budget_s, self.threshold = budget_s, threshold
        self.idle_rounds = self.rounds = 0

    def __call__(self):
        self.rounds += 1
        while self.budget_s > 0:
            t0 = time.perf_counter()
            idle = cpu_idle_fraction() >= self.threshold
            self.budget_s -= time.perf_counter() - t0
            if idle:
                self.idle_rounds += 1
                return


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192, 32768], help="token counts")
    parser.add_argument("--dim", type=int, default=64, help="head dimension")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--masks", nargs="+", default=["none", "causal"], choices=["none", "causal"])
    parser.add_argument("--causal", action="store_true", help="only the causal mask (--masks causal)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="N = 512, 1024; 3 repeats; no rss (a smoke test)")
    parser.add_argument("--no-naive", action="store_true", help="skip the N x N NumPy baseline")
    parser.add_argument("--no-rss", action="store_true", help="skip the subprocess peak-RSS measurement")
    parser.add_argument("--idle-wait", type=float, default=120.0,
                        help="total seconds to spend waiting for an idle machine before rounds (0: never)")
    parser.add_argument("--keep-env", action="store_true",
                        help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as they are")
    add_emulation_option(parser)
    args = parser.parse_args(argv)
    if args.causal:
        args.masks = ["causal"]
    if args.quick:
        args.sizes, args.repeats, args.no_rss = [512, 1024], 3, True

    limit_threads(args.threads)
    header(f"attention against torch SDPA: head dim {args.dim}, beta = 1/sqrt(d), medians of {args.repeats} "
           "alternating rounds",
           notes=["memory: traced = tracemalloc peak of NumPy allocations, rss = peak RSS growth in a "
                  "fresh subprocess"])
    row = f"{'mask':>6} {'N':>6} {'dtype':>8} {'method':>11} {'time ms':>9} {'/ SDPA':>7} {'traced MiB':>11} {'rss MiB':>8}"
    print(row + "\n" + "-" * len(row))
    rows = []
    waiter = IdleWaiter(args.idle_wait)
    for mask in args.masks:
        for dtype in args.dtypes:
            for n in args.sizes:
                rows += _configuration(mask == "causal", n, dtype, args, waiter)
    print(f"\ntiming rounds started on an idle machine (>= 90% of CPU idle): {waiter.idle_rounds} of {waiter.rounds}")
    _print_engines(args.dtypes)
    _print_geometry(args.dtypes)
    record_goals(rows)
    summary()
    agree = all(r["ok"] for r in rows if r["method"] in OURS)
    print(f"ctformer's outputs {'agree with' if agree else 'DIFFER from'} SDPA's (float64 <= 1e-12, float32 <= 1e-5 "
          "relative)")
    if not agree:
        raise SystemExit(1)
    return rows


def record_goals(rows):
    """The issue's goals from the rows of :func:`_configuration`: the direct call's ratio to
    SDPA (met only where its output agrees with SDPA's and the median is of enough rounds),
    and its extra memory at N = 8192 in float64 (:func:`extra_memory`)."""
    floors = {(r["mask"], r["n"], r["dtype"]): r["ratio"] for r in rows if r["method"] == "products"}
    for r in rows:
        if r["method"] != "quadrature":
            continue
        verdict(f"attention {r['mask']:<7} N={r['n']:<5} {r['dtype']} / SDPA", r["ratio"], GOAL_RATIO, show=False,
                spread=r["spread"], floor=floors.get((r["mask"], r["n"], r["dtype"])), agrees=r["ok"],
                rounds=r["rounds"])
        if r["n"] == 8192 and r["dtype"] == "float64":
            verdict(f"attention {r['mask']:<7} N=8192  float64 extra memory", extra_memory(r), GOAL_MIB, "MiB",
                    show=False)


def extra_memory(row) -> float:
    """The extra memory of one call (MiB): the larger of the traced peak and the peak RSS
    growth. tracemalloc sees NumPy's allocations only, not torch's allocator, which serves
    the call where it takes torch's fused kernel; the RSS growth sees both (the traced peak
    alone where RSS was not measured, ``--no-rss``)."""
    measured = [x for x in (row["traced"], row.get("rss", math.nan)) if not math.isnan(x)]
    return max(measured) if measured else math.nan


def _configuration(causal, n, dtype, args, waiter):
    """Time every method at one mask, N and dtype; print a row each; returns the rows."""
    q, k, v = make_inputs(n, args.dim, dtype)
    beta = 1 / math.sqrt(args.dim)
    setups = methods(causal)
    if args.no_naive or n > NAIVE_MAX:
        setups.pop("naive")
    calls = {name: setup(q, k, v, beta) for name, setup in setups.items()}
    ref = np.asarray(calls["sdpa"]()[0, 0], dtype=np.float64)
    waiter()
    timed = rounds(calls, args.repeats)
    rows = []
    mask = "causal" if causal else "none"
    for name, call in calls.items():
        if name == "products":  # no output: the floor of the goal
            rows.append(dict(mask=mask, n=n, dtype=dtype, method=name, ms=timed[name] * 1e3,
                             ratio=timed.ratio(name, "sdpa"), spread=timed.spread(name, "sdpa")))
            print(f"{mask:>6} {n:>6} {dtype:>8} {name:>11} {timed[name] * 1e3:>9.1f} {rows[-1]['ratio']:>7.3f} "
                  f"{'-':>11} {'-':>8}   (the two products alone: the floor)", flush=True)
            continue
        out = np.asarray(call()).reshape(ref.shape)
        err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
        ok = bool(err <= TOLERANCE[np.dtype(dtype).name])
        traced = math.nan if name == "sdpa" else traced_extra(call)
        rss = math.nan if args.no_rss else rss_extra(name, n, args.dim, dtype, causal)
        ratio = timed.ratio(name, "sdpa")
        rows.append(dict(mask=mask, n=n, dtype=dtype, method=name, ms=timed[name] * 1e3, ratio=ratio,
                         spread=timed.spread(name, "sdpa"), traced=traced, rss=rss, err=err, ok=ok,
                         rounds=timed.count))
        print(f"{mask:>6} {n:>6} {dtype:>8} {name:>11} {timed[name] * 1e3:>9.1f} {ratio:>7.3f} "
              f"{_fmt(traced):>11} {_fmt(rss):>8}   (max rel. diff to SDPA {err:.1e})"
              + ("" if ok or name not in OURS else "  <- beyond tolerance"), flush=True)
    return rows


def _fmt(x):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}"


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _, _, method, n, d, dtype, causal = sys.argv
        rss_child(method, int(n), int(d), dtype, causal == "1")
    else:
        main()

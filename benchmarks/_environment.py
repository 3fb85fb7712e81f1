"""What every benchmark shares: a clean BLAS environment and timing in blocks.

``prepare(argv, script)`` fixes the thread counts and, unless ``--keep-env`` (or ``--child``)
is given, re-executes ``script`` without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, so that
OpenBLAS picks its kernel for the real CPU (those variables are set on some machines for old
OpenBLAS builds and slow a current one by about 40%); the benchmark says so in its output.
It must run before NumPy is imported. ``timed_block`` warms a call up in its own block and
times it: torch's OpenMP threads and OpenBLAS's threads keep spinning after a call and slow
the other library's next calls, so timings must never be interleaved.
"""
from __future__ import annotations

import os
import statistics
import sys
import time

CLEARED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
MARK = "CTFORMER_BENCH_CLEARED_ENV"


def prepare(argv, script, default_threads="2"):
    """Thread counts from ``--threads`` (default 2); re-exec ``script`` without OpenBLAS overrides."""
    threads = default_threads
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif arg.startswith("--threads="):
            threads = arg.split("=", 1)[1]
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CTFORMER_NUM_THREADS"):
        os.environ[name] = threads
    if "--keep-env" in argv or "--child" in argv:
        return
    present = [name for name in CLEARED if name in os.environ]
    if present:
        env = {key: value for key, value in os.environ.items() if key not in CLEARED}
        env[MARK] = ",".join(f"{name}={os.environ[name]}" for name in present)
        os.execve(sys.executable, [sys.executable, os.path.abspath(script), *argv], env)


def timed_block(call, repeats, warmup_s=0.5, min_calls=2):
    """Warm ``call`` up for ``warmup_s`` seconds (at least ``min_calls`` times), then time it
    ``repeats`` times; returns ``(median, min, max)`` in seconds."""
    t0 = time.perf_counter()
    calls = 0
    while calls < min_calls or time.perf_counter() - t0 < warmup_s:
        call()
        calls += 1
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times)


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), named with every figure a benchmark prints."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"

"""What every benchmark shares: a clean BLAS environment and timing in interleaved rounds.

``prepare(argv, script)`` fixes the thread counts and, unless ``--keep-env`` (or ``--child``)
is given, re-executes ``script`` without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, so that
OpenBLAS picks its kernel for the real CPU (those variables are set on some machines for old
OpenBLAS builds and slow a current one by about 40%); the benchmark says so in its output.
With ``--emulate avx2`` it re-executes ``script`` with every library of both sides limited to
AVX2 instead (:data:`EMULATED`): a CPU without AVX-512 (AMD EPYC before Zen 4, Intel Xeon
before Skylake-SP), emulated on this one. It must run before NumPy is imported.

``rounds(calls, repeats)`` times ctformer and its peers in alternating rounds: each round
times a short block of every call in turn, and a ratio is the median over rounds of the
per-round ratio. On the shared virtual machines these benchmarks run on, the speed of the
guest changes by up to 2x within a minute (the hypervisor gives its CPU time to other
guests: "steal" time), so two sides timed in separate blocks a minute apart can disagree by
that much; within one round both sides see the same machine. Between two blocks the script
sleeps ``gap_s`` (0.2 s): torch's OpenMP threads and OpenBLAS's threads keep spinning for up
to ~0.1 s after a call and would slow whatever runs next. Every run prints the share of CPU
time stolen while it timed (:func:`steal_report`).

``header(title)`` prints what every figure depends on (the CPU model, NumPy's and torch's BLAS
and kernel, threads, the environment, the load average); ``verdict(name, ratio, goal)`` prints
and records "met" / "not met" for one goal, and ``summary()`` closes a run with the table of
all goals for the CPU it ran on.
"""
from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time

# The repository root, so that a script run from anywhere imports this checkout's ctformer.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

CLEARED = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
#: Outputs equal to the peer's: max |ours - peer| / max |peer| (issue 25's goals).
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}
MARK = "CTFORMER_BENCH_CLEARED_ENV"
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CTFORMER_NUM_THREADS")
#: ``--emulate NAME``: the settings that hold the libraries of both sides to an instruction set
#: (OpenBLAS's kernel, torch's vector kernels, oneDNN, MKL, Numba's target, NumPy's dispatch).
#: FFTW and the libraries' own threading are not limited. The measured choices of an emulated
#: run are stored apart (``ctformer._numerics.store.KERNEL_SETTINGS``).
EMULATED = {"avx2": {"OPENBLAS_CORETYPE": "Haswell", "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
                     "MKL_ENABLE_INSTRUCTIONS": "AVX2", "NUMBA_CPU_NAME": "haswell",
                     "NPY_DISABLE_CPU_FEATURES": "X86_V4 AVX512_ICL AVX512_SPR"}}
EMULATION_MARK = "CTFORMER_BENCH_EMULATED"


def prepare(argv, script, default_threads="2"):
    """Thread counts from ``--threads`` (default 2); re-exec ``script`` without OpenBLAS overrides."""
    threads = default_threads
    for i, arg in enumerate(argv):
        if arg == "--threads" and i + 1 < len(argv):
            threads = argv[i + 1]
        elif arg.startswith("--threads="):
            threads = arg.split("=", 1)[1]
    for name in THREAD_VARIABLES:
        os.environ[name] = threads
    emulated = _option(argv, "--emulate")
    if os.environ.get(EMULATION_MARK) or "--child" in argv:  # already set (goals.py sets it for every script)
        return
    if emulated is not None:
        os.execve(sys.executable, [sys.executable, os.path.abspath(script), *argv], emulation_env(emulated))
    if "--keep-env" in argv:
        return
    present = [name for name in CLEARED if name in os.environ]
    if present:
        env = {key: value for key, value in os.environ.items() if key not in CLEARED}
        env[MARK] = ",".join(f"{name}={os.environ[name]}" for name in present)
        os.execve(sys.executable, [sys.executable, os.path.abspath(script), *argv], env)


def emulation_env(name: str) -> dict:
    """This process's environment with the settings of ``EMULATED[name]`` (the OpenBLAS
    overrides it does not set removed), marked as emulating ``name``."""
    if name not in EMULATED:
        raise SystemExit(f"--emulate: {name!r} is not one of {', '.join(EMULATED)}")
    env = {key: value for key, value in os.environ.items() if key not in CLEARED}
    env.update(EMULATED[name])
    env[EMULATION_MARK] = name
    return env


def _option(argv, flag):
    """The value of ``flag`` in ``argv`` (``--flag value`` or ``--flag=value``), or None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def growth_exponent(sizes, values) -> float:
    """The slope of log(value) against log(size), least squares: the measured power of a cost
    law ``value ~ size^p`` (or an observed order, with step sizes and errors)."""
    import numpy as np

    return float(np.polyfit(np.log(np.asarray(sizes, dtype=float)), np.log(np.asarray(values, dtype=float)), 1)[0])


def limit_threads(threads: int, with_torch: bool = True) -> None:
    """``threads`` for the BLAS libraries (threadpoolctl) and, with ``with_torch``, for torch."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(threads, user_api="blas")
    if with_torch:
        import torch

        torch.set_num_threads(threads)


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


class Rounds:
    """Per-round times of several calls (:func:`rounds`): ``times[name]`` is one block median
    per round, in seconds; ``faults[name]`` the minor page faults per call of each round's
    block (the whole process's, which runs nothing else meanwhile; empty where the platform
    cannot count them)."""

    def __init__(self, times: dict, faults: dict | None = None):
        self.times = times
        self.faults = faults or {name: [] for name in times}

    @property
    def count(self) -> int:
        """The number of rounds (the fewest of any call): what a goal's median is taken over."""
        return min((len(t) for t in self.times.values()), default=0)

    def faults_per_call(self, name: str) -> float | None:
        """The median over rounds of ``name``'s minor page faults per call, or None."""
        return statistics.median(self.faults[name]) if self.faults.get(name) else None

    def median(self, name: str) -> float:
        """The median over rounds of ``name``'s time (seconds)."""
        return statistics.median(self.times[name])

    def ratio(self, ours: str, peer: str) -> float:
        """The median over rounds of ``ours / peer``, each ratio from one round's two blocks."""
        return statistics.median(self.ratios(ours, peer))

    def ratios(self, ours: str, peer: str) -> list:
        """The per-round ratios ``ours / peer``, in round order."""
        return [a / b for a, b in zip(self.times[ours], self.times[peer])]

    def spread(self, ours: str, peer: str) -> tuple:
        """``(q1, q3)``: the lower and upper quartiles of the per-round ratios ``ours / peer``
        (linear interpolation between order statistics; one round: that ratio twice). A goal
        between them is decided by the noise of the machine as much as by the code."""
        ratios = sorted(self.ratios(ours, peer))
        if len(ratios) == 1:
            return ratios[0], ratios[0]
        q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
        return q1, q3

    def __getitem__(self, name: str) -> float:
        return self.median(name)


_STEAL: list[float] = []  # the stolen share of CPU time of every timed round so far


def _cpu_ticks():
    """(stolen, all) CPU ticks since boot over all CPUs (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (fields[7] if len(fields) > 7 else 0), sum(fields[:8])


def rounds(calls: dict, repeats: int, warmup_s: float = 0.5, gap_s: float = 0.2,
           block_s: float = 0.1) -> Rounds:
    """Time ``calls`` (name -> zero-argument call) in ``repeats`` alternating rounds.

    Each call is first warmed up for ``warmup_s`` (at least once), which also sets its block:
    as many calls as take about ``block_s`` (at least one). A round then times one block of
    every call, in turn (the order reversed every other round, so that no call always follows
    the same one), after a pause of ``gap_s`` and, for calls under 0.1 s, one untimed call;
    a block's time is the median of its calls. The stolen share of CPU time of each round is
    recorded for :func:`steal_report`.
    """
    counts = {}
    for name, call in calls.items():
        t0, done = time.perf_counter(), 0
        while done < 1 or time.perf_counter() - t0 < warmup_s:
            call()
            done += 1
        once = (time.perf_counter() - t0) / done
        counts[name] = max(1, min(2000, int(block_s / max(once, 1e-7))))
    times = {name: [] for name in calls}
    faults = {name: [] for name in calls}
    names = list(calls)
    for r in range(repeats):
        before = _cpu_ticks()
        for name in (names if r % 2 == 0 else names[::-1]):
            call = calls[name]
            time.sleep(gap_s)
            if counts[name] > 1:
                call()
            block = []
            first = minor_faults()
            for _ in range(counts[name]):
                t = time.perf_counter()
                call()
                block.append(time.perf_counter() - t)
            last = minor_faults()
            times[name].append(statistics.median(block))
            if first is not None and last is not None:
                faults[name].append((last - first) / len(block))
        after = _cpu_ticks()
        if before and after and after[1] > before[1]:
            _STEAL.append((after[0] - before[0]) / (after[1] - before[1]))
    return Rounds(times, faults)


def minor_faults() -> int | None:
    """The process's minor page faults so far (all its threads), or None where the platform
    cannot say. A call that takes memory the allocator has just given back to the system
    touches it again page by page: glibc returns the top of its heap above a threshold that
    it raises to the largest block it has freed so far (up to 32 MiB), so the same call can
    fault 0 or 15 000 times a forward depending on what the process allocated before it."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def steal_report() -> str | None:
    """One line: the share of CPU time the hypervisor gave to other guests during the timed
    rounds (mean and worst round), or None where nothing was measured."""
    if not _STEAL:
        return None
    return (f"CPU time stolen by the hypervisor while timing: {100 * statistics.mean(_STEAL):.0f}% on "
            f"average, {100 * max(_STEAL):.0f}% in the worst of {len(_STEAL)} rounds (ratios are "
            "medians of per-round ratios, so both sides of a ratio saw the same machine)")


def add_run_options(parser, quick: str, repeats: int = 5, threads: int = 2) -> None:
    """The options every timing script shares: ``--repeats``, ``--threads``, ``--quick`` (with
    the script's own meaning ``quick``) and ``--keep-env``."""
    parser.add_argument("--repeats", type=int, default=repeats, help="timed runs per side (median)")
    parser.add_argument("--threads", type=int, default=threads, help="threads of each side")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--keep-env", action="store_true", help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE")
    add_emulation_option(parser)


def add_emulation_option(parser) -> None:
    """``--emulate``: run both sides limited to an instruction set (:data:`EMULATED`)."""
    parser.add_argument("--emulate", choices=sorted(EMULATED), default=None,
                        help="limit every library of both sides to this instruction set (another CPU kind, emulated)")


def cpu_model() -> str:
    """The CPU's model name, named with every figure a benchmark prints (imported when called:
    :func:`prepare` must run before NumPy, which importing ctformer loads), with the
    instruction set it is limited to when emulating (``--emulate``)."""
    from ctformer.environment import cpu_model as model

    emulated = os.environ.get(EMULATION_MARK)
    return model() + (f" emulating {emulated.upper()}" if emulated else "")


def numpy_blas() -> list[str]:
    """One line per BLAS library loaded (NumPy's, SciPy's, ...): the package that ships it, API,
    version, kernel, threads (threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return ["threadpoolctl not installed: BLAS kernel unknown"]
    return [f"{_owner(i.get('filepath', ''))}: {i.get('internal_api')} {i.get('version')} kernel "
            f"{i.get('architecture', '?')}, {i.get('num_threads')} threads"
            for i in threadpool_info() if i.get("user_api") == "blas"] or ["no BLAS loaded yet"]


def _owner(path: str) -> str:
    """The package whose wheel ships a library (``.../numpy.libs/libscipy_openblas...`` -> numpy)."""
    folder = os.path.basename(os.path.dirname(path))
    return folder[:-5] if folder.endswith(".libs") else os.path.basename(path) or "?"


def torch_blas() -> str | None:
    """torch's BLAS (``BLAS_INFO``: mkl, openblas, ...), its CPU capability and parallel
    backend and threads, or ``None`` where torch has not been imported by the script."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    config = torch.__config__.show()
    fields = dict(re.findall(r"(BLAS_INFO|LAPACK_INFO)=([^,\s]+)", config))
    capability = re.search(r"CPU capability usage: (\S+)", config)
    library = re.search(r"Math Kernel Library Version (\d[\d.]*)|(OpenBLAS \S+)", config)
    backend = re.search(r"ATen parallel backend: (.+)", torch.__config__.parallel_info())
    return (f"BLAS {fields.get('BLAS_INFO', '?')} ({_library(library)}), "
            f"CPU capability {capability.group(1) if capability else '?'}, parallel backend "
            f"{backend.group(1).strip() if backend else '?'}, {torch.get_num_threads()} threads")


def _strict_reproducibility() -> str:
    """Whether ctformer runs its products on torch's threads (MKL's strict mode on) or by
    blocks on one thread each; asked early, so that MKL still accepts the mode."""
    from ctformer._numerics.torch_threads import threaded_products

    if threaded_products():
        return "on (ctformer's feature products run on torch's threads, as torch's own do)"
    return "off (ctformer's products on many rows run by blocks, one thread each)"


def _prepared_products(key: str, chosen: str, how: str) -> str:
    """Whether feature products run on a product prepared once per matrix, as this machine's
    store holds under ``key`` (``packed float32``: oneDNN's packed matrix; ``few rows float64``
    or ``float32``: the compiled kernel), with the measurement's ratio, threads and tile."""
    import numpy as np

    from ctformer._numerics import gemm, store

    gemm.prepared_products(np.dtype(key.split()[-1]))  # measured now where the store lacks it
    stored = store.read(store.cache_file()).get(key, {})
    if stored.get("provider") != chosen:
        return "no (NumPy's or torch's BLAS)"
    against = {"numpy": "NumPy's", "torch": "torch's"}.get(stored.get("against"), "NumPy's")
    threads = stored.get("threads", 1)
    tile = f", tiles of 4 x {stored['columns']}" if "columns" in stored else ""
    return (f"yes ({how}{tile}, measured {stored.get('ratio', float('nan')):.2f} of {against} time, "
            f"{threads} thread{'s' if threads != 1 else ''})")


def _library(match) -> str:
    if match is None:
        return "version unknown"
    return f"MKL {match.group(1)}" if match.group(1) else match.group(2)


def header(title: str, notes=()) -> None:
    """Print what every figure below depends on: the CPU model, NumPy's and torch's BLAS and
    kernel, the thread settings, the OpenBLAS overrides removed or kept, the load average.

    Call it after the script has imported NumPy (and torch, where torch is a peer) and set its
    thread counts, so that the libraries and counts printed are the ones timed.
    """
    import numpy as np

    print(f"== {title} ==")
    print(f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs)")
    print(f"NumPy {np.__version__}; BLAS libraries loaded:")
    for line in numpy_blas():
        print(f"  {line}")
    described = torch_blas()
    if described:
        print(f"torch {sys.modules['torch'].__version__}: {described}")
        print(f"MKL strict reproducibility: {_strict_reproducibility()}")
        print(f"float32 feature products packed once: {_prepared_products('packed float32', 'torch', 'oneDNN')}")
    for dtype in ("float32", "float64"):
        print(f"{dtype} feature products of 2-16 rows compiled: "
              f"{_prepared_products(f'few rows {dtype}', 'compiled', 'Numba, OpenMP threads')}")
    threads = ", ".join(f"{name}={os.environ.get(name, 'unset')}" for name in THREAD_VARIABLES)
    print(f"threads: {threads}")
    print(f"OpenBLAS's idle threads: {openblas_idle()}")
    cleared = os.environ.get(MARK)
    kept = [f"{name}={os.environ[name]}" for name in CLEARED if name in os.environ]
    emulated = os.environ.get(EMULATION_MARK)
    if emulated:
        settings = ", ".join(f"{key}={value}" for key, value in EMULATED[emulated].items())
        print(f"environment: EMULATING {emulated.upper()} on this CPU (--emulate {emulated}), both sides: {settings}")
    else:
        print("environment: " + (f"re-executed without {cleared} (--keep-env keeps them)" if cleared else
                                 f"kept {', '.join(kept)}" if kept else
                                 "OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE not set, nothing removed"))
    print(f"memory allocator: {allocator_settings()}")
    for note in notes:
        print(note)
    print(f"load average at start: {os.getloadavg()[0]:.2f}\n", flush=True)


def openblas_idle() -> str:
    """How long OpenBLAS's threads spin after a threaded product before they sleep:
    ``OPENBLAS_THREAD_TIMEOUT`` (read when OpenBLAS loads: 2^n cycles for n > 0, n clamped to
    4..30; 2^28 when unset or not positive), which decides how long a core stays busy after
    such a product (docs/performance.rst, "Where the threads run")."""
    value = os.environ.get("OPENBLAS_THREAD_TIMEOUT", "").strip()
    try:
        given = int(value) if value else 0
    except ValueError:
        return f"spin 2^28 cycles before they sleep (OPENBLAS_THREAD_TIMEOUT={value!r} is not an integer)"
    exponent = min(30, max(4, given)) if given > 0 else 28  # 0 or less: OpenBLAS's default
    source = f"OPENBLAS_THREAD_TIMEOUT={value}" if value else "OPENBLAS_THREAD_TIMEOUT unset"
    return f"spin 2^{exponent} cycles before they sleep ({source})"


# glibc's malloc settings that decide whether freed memory goes back to the system
ALLOCATOR_VARIABLES = ("GLIBC_TUNABLES", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_",
                       "LD_PRELOAD")


def allocator_settings() -> str:
    """The allocator settings of this process that change the page faults of both sides."""
    found = [f"{name}={os.environ[name]}" for name in ALLOCATOR_VARIABLES if os.environ.get(name)]
    return ", ".join(found) if found else "the C library's defaults (no GLIBC_TUNABLES, MALLOC_*_ or LD_PRELOAD)"


_VERDICTS: list[tuple[str, float, float, str, bool, tuple | None]] = []
_FLOORS: dict[str, float] = {}  # goal name -> its floor, where the script measures one
#: goal name -> why it cannot be met whatever its ratio (outputs differ, too few rounds)
_UNDECIDED: dict[str, str] = {}
#: Issue 25's timings are medians of at least this many runs; fewer decide no goal.
MIN_ROUNDS = 5


def verdict(name: str, ratio: float, goal: float, unit: str = "x", show: bool = True,
            spread: tuple | None = None, floor: float | None = None, agrees: bool = True,
            rounds: int | None = None) -> bool:
    """Record (and print, unless ``show=False``) whether ``ratio <= goal``: "met" or "not met".

    ``unit`` is ``"x"`` for a time ratio ctformer / peer, or e.g. ``"MiB"``; a NaN never meets
    its goal. ``spread``: the quartiles of the per-round ratios (:meth:`Rounds.spread`), or
    None; a goal between them is marked "within the spread" (the median decides, but another
    run may decide otherwise). ``floor``: the ratio below which no work outside the kernels
    both sides share can go (``model.py``'s floor), or None; it goes into the closing tables.
    A goal is met only where ``ratio <= goal``, ``agrees`` (ctformer's output equals the
    peer's within :data:`TOLERANCE`; a fast wrong answer meets nothing) and ``rounds`` (the
    number of rounds behind the median, :attr:`Rounds.count`; None where not timed in rounds)
    is at least :data:`MIN_ROUNDS`. Returns whether the goal is met; :func:`summary` prints
    them all.
    """
    reasons = ([] if agrees else ["outputs differ from the peer's"]) + (
        [f"{rounds} rounds, fewer than {MIN_ROUNDS}: a smoke test"] if rounds is not None and rounds < MIN_ROUNDS
        else [])
    met = bool(ratio <= goal) and not reasons
    spread = None if spread is None else (float(spread[0]), float(spread[1]))
    _VERDICTS.append((name, float(ratio), float(goal), unit, met, spread))
    if floor is not None:
        _FLOORS[name] = float(floor)
    if reasons:
        _UNDECIDED[name] = "; ".join(reasons)
    if show:
        print(f"goal {name}: {_figure(ratio, unit)}{_spread_text(spread, unit)} <= {_figure(goal, unit)} -> "
              f"{_outcome(met, goal, spread, name)}", flush=True)
    return met


def within_spread(goal: float, spread: tuple | None) -> bool:
    """Whether ``goal`` lies between the quartiles ``spread`` (False without one)."""
    return spread is not None and spread[0] <= goal <= spread[1]


def _outcome(met: bool, goal: float, spread, name: str | None = None) -> str:
    if name in _UNDECIDED:
        return f"not met ({_UNDECIDED[name]})"
    return ("met" if met else "not met") + (" (within the spread)" if within_spread(goal, spread) else "")


def _spread_text(spread, unit: str) -> str:
    if spread is None or unit != "x":
        return ""
    return f" [{spread[0]:.2f}-{spread[1]:.2f}]"


def summary() -> bool:
    """Print the load average and every recorded goal as a table for this CPU; True if all met."""
    print(f"\nload average at end: {os.getloadavg()[0]:.2f}")
    stolen = steal_report()
    if stolen:
        print(stolen)
    if not _VERDICTS:
        return True
    blas = "; ".join(line.split(",")[0] for line in numpy_blas())
    torch_line = torch_blas()
    print(f"goals on {cpu_model()} (BLAS {blas}"
          + (f"; torch {torch_line.split(',')[0]}" if torch_line else "") + "):")
    width = max(len(v[0]) for v in _VERDICTS)
    print(f"  {'goal':<{width}}  {'ratio':>10} {'quartiles':>11}    {'goal':<9} verdict")
    for name, ratio, goal, unit, met, spread in _VERDICTS:
        floor = f"  (floor {_FLOORS[name]:.2f})" if name in _FLOORS else ""
        print(f"  {name:<{width}}  {_figure(ratio, unit):>10} {_spread_text(spread, unit):>11} <= "
              f"{_figure(goal, unit):<9} {_outcome(met, goal, spread, name)}{floor}")
    _append_goals(blas + (f"; torch {torch_line.split(',')[0]}" if torch_line else ""))
    count = sum(v[4] for v in _VERDICTS)
    close = sum(within_spread(v[2], v[5]) and v[0] not in _UNDECIDED for v in _VERDICTS)
    print(f"{count} of {len(_VERDICTS)} goals met -> {'met' if count == len(_VERDICTS) else 'not met'}"
          + (f"; {close} of them within the spread of the rounds (the quartiles of the per-round "
             f"ratios), decided by this run's noise as much as by the code" if close else ""), flush=True)
    return count == len(_VERDICTS)


def _append_goals(blas: str) -> None:
    """Append every recorded goal as one JSON line to ``CTFORMER_GOALS_FILE`` when it is set
    (``goals.py`` collects them into one table)."""
    path = os.environ.get("CTFORMER_GOALS_FILE")
    if not path:
        return
    script = os.path.basename(sys.argv[0])
    with open(path, "a") as out:
        for name, ratio, goal, unit, met, spread in _VERDICTS:
            out.write(json.dumps({"script": script, "cpu": cpu_model(), "blas": blas, "name": name,
                                  "ratio": ratio, "goal": goal, "unit": unit, "met": met, "spread": spread,
                                  "verdict": _outcome(met, goal, spread, name), "floor": _FLOORS.get(name)}) + "\n")


def _figure(value: float, unit: str) -> str:
    return f"{value:.3f}x" if unit == "x" else f"{value:.4g} {unit}"

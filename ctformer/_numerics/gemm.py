r"""Matrix products on NumPy arrays by the faster BLAS of this CPU: NumPy's or torch's.

NumPy multiplies with the BLAS it was built with (OpenBLAS in the wheels); torch's CPU wheels
carry Intel's MKL. Which is faster depends on the CPU and on the shapes attention and the
feature maps use (a short inner dimension, ``(256, 64) @ (64, 8192)``, or rows of a feature
map, ``(256, 384) @ (384, 1536)``): on an Intel Xeon with AVX-512 MKL did these 1.25-1.5x
faster than OpenBLAS, on an AMD EPYC the two were close. So the choice is measured, once per
machine, dtype and set of library versions, on those shapes with one thread each, and kept
(attention's two products each by the BLAS that multiplied its own shape faster,
:func:`attention_products`: on an AMD EPYC of family 23, model 49, MKL formed float64 scores
1.4x faster than OpenBLAS and OpenBLAS the weighted sums 1.25x faster than MKL):

* ``CTFORMER_GEMM`` chooses: ``auto`` (the default: the measured choice), ``numpy`` or
  ``torch`` (an ImportError without torch);
* the measurement (about 0.1 s; :mod:`ctformer._numerics.gemm_measure`) is kept in this
  machine's store of measured choices (:mod:`ctformer._numerics.store`), so a machine gives
  the same bits run after run.

The engines' worker tasks use torch (:func:`matmul`) on one thread each, with torch limited
to one thread for that call (a thread-local setting, restored after), so that, as with NumPy's
BLAS, a product's rounding never depends on the number of threads. The two libraries round
differently (relative differences of a few ulps), which is why the choice is fixed per machine
rather than per call.

Whether torch's products may run on its own threads (MKL's strict reproducibility mode) is
:mod:`ctformer._numerics.torch_threads`; torch's fused attention kernel is
:mod:`ctformer._numerics.fused`.
"""
from __future__ import annotations

import sys
from functools import lru_cache

import numpy as np

from ..backend import matmul_rows, plus_bias
from ..environment import choice
from . import few_rows as _few_rows, packed as _packed, store as _store
# the measurements behind the choices (their own module); tests replace _best and _measure_products here
from .gemm_measure import _PRODUCTS_CHECKED, _best, _measure_products, _measure_softmax
from .threads import _INSIDE, _ROW_BLOCKS_MIN_ROWS, num_threads
from .torch_threads import _one_torch_thread, _tensor, _torch, _torch_threads, threaded_products

__all__ = ["attention_block", "attention_products", "gemm_provider", "matmul", "measured_name", "packed_rows", "prepared_products", "rows_peer", "rows_product", "softmax_provider", "softmax_rows",
           "threaded_rows", "uses_torch"]

_PROVIDERS = ("auto", "numpy", "torch")
_FLOAT_NAMES: dict = {}  # a dtype as given -> "float32", "float64", or "" (NumPy's BLAS)
_TORCH_FREE = frozenset({"few rows"})  # choices measured without torch
_PEERS_DECIDED: set = set()  # dtypes whose rows_peer is decided (prepared_products asks once)
_THREADED_MIN_PRODUCTS = 1 << 18  # multiply-adds from which rows_product calls torch outside workers


def gemm_provider(dtype) -> str:
    """``"numpy"`` or ``"torch"``: who multiplies NumPy matrices of ``dtype`` in worker tasks.

    Raises
    ------
    ValueError
        If ``CTFORMER_GEMM`` is not one of auto, numpy, torch.
    ImportError
        If ``CTFORMER_GEMM=torch`` and torch is not installed.
    """
    choice = _choice()
    name = _float_name_of(dtype)
    if not name or choice == "numpy":
        return "numpy"
    if choice == "torch":
        if _torch() is None:
            raise ImportError("CTFORMER_GEMM=torch needs torch: pip install torch")
        return "torch"
    return _products_entry(name)["provider"]


def _float_name(dtype) -> str:
    return dtype.name if dtype in (np.float32, np.float64) else ""


def _float_name_of(dtype) -> str:
    """The name ``"float32"``, ``"float64"`` or ``""`` of a dtype as given: a dict lookup, asked
    for every product of a small solve and every attention call (NumPy's ``dtype.name`` took
    3-5 us)."""
    name = _FLOAT_NAMES.get(dtype)
    if name is None:
        name = _FLOAT_NAMES.setdefault(dtype, _float_name(np.dtype(dtype)))
    return name


def _choice() -> str:
    return choice("CTFORMER_GEMM", _PROVIDERS)  # read for every product


def measured_name(dtype) -> str | None:
    """``"float32"`` or ``"float64"``, the name this machine's measured choices for ``dtype``
    are stored under, where they apply (``CTFORMER_GEMM=auto``); None where the defaults hold
    (a pinned ``CTFORMER_GEMM``, other dtypes). A ValueError if ``CTFORMER_GEMM`` is not one
    of auto, numpy, torch."""
    if _choice() != "auto":
        return None
    return _float_name_of(dtype) or None


def uses_torch(dtype) -> bool:
    """True when worker tasks multiply ``dtype`` matrices with torch."""
    return gemm_provider(dtype) == "torch"


def prepared_products(dtype) -> bool:
    """Whether feature maps multiply ``dtype`` rows by a product prepared once per matrix on
    this machine: float32 by the packed matrix (:mod:`ctformer._numerics.packed`) where it was
    chosen, else float32 and float64 of few rows by the compiled kernel
    (:mod:`ctformer._numerics.few_rows`); ``CTFORMER_GEMM=auto`` only, each measured once.
    Asked for every product: two comparisons and cached reads."""
    if _choice() != "auto":
        return False
    name = "float32" if dtype == np.float32 else "float64" if dtype == np.float64 else None
    if name is None:
        return False
    _decide_peer(name)
    return (name == "float32" and _packed_chosen()) or \
        _measured("few rows", name, _measure_few_rows, _few_rows.CHECKED) == "compiled"


def _decide_peer(name: str) -> None:
    """Decide the rows' own product first: a prepared product's measurement times against it,
    under the store's lock, where no other choice may be measured."""
    if name not in _PEERS_DECIDED:
        threaded_rows(np.dtype(name))
        _PEERS_DECIDED.add(name)


def _packed_chosen() -> bool:
    return _measured("packed", "float32", _measure_packed, _packed.CHECKED) == "torch"


@lru_cache(maxsize=None)
def few_rows_columns(dtype) -> int:
    """The width of the compiled few-row kernel's tiles for ``dtype`` (float32 or float64) on
    this machine (four rows by 4 or 3 columns, :func:`ctformer._numerics.few_rows.measure`),
    where :func:`prepared_products` chose the kernel: read once from the stored verdict."""
    name = np.dtype(dtype).name
    threaded_rows(np.dtype(name))  # decided first: the measurement times against it
    # a damaged entry (a width the kernel has no tile for) is measured again, not used
    entry = _store.entry("few rows", name, _measure_few_rows, _few_rows.CHECKED,
                         lambda e: e.get("columns", 4) in _few_rows._TILES, needs_torch=False)
    return int(entry.get("columns", 4))


def packed_rows(dtype) -> bool:
    """Whether feature maps multiply ``dtype`` rows by products packed once and run on one
    thread (float32 where :func:`prepared_products` holds by the packed matrix), so that only
    blocks of rows (:func:`~ctformer._numerics.threads.by_row_blocks`) put their products on
    the threads."""
    return dtype == np.float32 and prepared_products(dtype) and _packed_chosen()


def _measure_packed(dtype) -> dict:
    against, peer = rows_peer(dtype)
    return {**_packed.measure(dtype, _best, peer), "against": against}


def _measure_few_rows(dtype) -> dict:
    threads = num_threads()  # timed as the products run: on the library's threads
    against, peer = rows_peer(dtype, threads)
    return {**_few_rows.measure(dtype, _best, peer, threads), "against": against}


def rows_peer(dtype, threads: int = 1) -> tuple:
    """``(name, product)``: what multiplies a feature map's rows of ``dtype`` outside worker
    tasks when no prepared product does, as a ``product(a, b, out)`` to time a prepared
    product against: torch's on ``threads`` threads where it multiplies them on its threads
    (:func:`threaded_rows`; MKL on an Intel Xeon was 1.25-1.5x faster than OpenBLAS), else
    NumPy's BLAS (on its own threads, which a caller timing one thread limits)."""
    if threaded_rows(dtype):
        torch = _torch()

        def product(a, b, out):
            with _torch_threads(torch, threads):
                torch.mm(_tensor(torch, a), _tensor(torch, b), out=_tensor(torch, out))
        return "torch", product
    return "numpy", lambda a, b, out: np.matmul(a, b, out=out)


def softmax_provider(dtype) -> str:
    """``"numpy"`` (the compiled row kernel, or NumPy passes) or ``"torch"`` (torch's
    vectorized softmax): who normalizes the score rows of streamed attention in worker tasks,
    measured like :func:`gemm_provider` and set by the same ``CTFORMER_GEMM``; torch only
    where it also does the products."""
    if gemm_provider(dtype) == "numpy":
        return "numpy"
    if _choice() == "torch":
        return "torch"
    return _measured("softmax", _float_name_of(dtype))


def softmax_rows(s) -> None:
    """In place, ``s[i] <- exp(s[i] - max s[i]) / sum_j exp(s[i, j] - max s[i])`` by torch's
    kernel, on one thread (every row must have a finite entry)."""
    torch = _torch()
    with _one_torch_thread(torch):
        t = _tensor(torch, s)
        torch.ops.aten._softmax.out(t, -1, False, out=t)


def matmul(a, b, out):
    """``out[...] = a @ b`` for NumPy matrices (2-d, positive strides, ``out`` writable), by
    the provider of :func:`gemm_provider` with one thread; returns ``out``."""
    if uses_torch(out.dtype):
        return torch_matmul(a, b, out)
    return np.matmul(a, b, out=out)


def torch_matmul(a, b, out):
    """``out[...] = a @ b`` by torch's BLAS on one thread for NumPy matrices (2-d, positive
    strides; NumPy's otherwise); returns ``out``."""
    if _strides_ok(a, b, out):
        torch = _torch()
        with _one_torch_thread(torch):
            torch.mm(_tensor(torch, a), _tensor(torch, b), out=_tensor(torch, out))
        return out
    return np.matmul(a, b, out=out)


def attention_products(dtype) -> tuple:
    """``(scores, weighted_sums)``: the one-thread products ``product(a, b, out)`` with which
    the worker tasks of streamed attention form the scores :math:`q k^T` and the weighted sums
    :math:`P v` of ``dtype``. With ``CTFORMER_GEMM=auto`` each is the BLAS that multiplied
    its own shape faster on this machine (measured with :func:`gemm_provider`'s choice, the
    same margin); with ``numpy`` or ``torch``, that one for both.

    Raises
    ------
    ValueError
        If ``CTFORMER_GEMM`` is not one of auto, numpy, torch.
    """
    provider = gemm_provider(dtype)  # validates the setting, measures once
    name = measured_name(dtype)
    if name is None:
        return (torch_matmul,) * 2 if provider == "torch" else (np.matmul,) * 2
    entry = _products_entry(name)
    return tuple(torch_matmul if entry.get(kind, provider) == "torch" else np.matmul
                 for kind in ("scores", "weighted sums"))


def forget_choices() -> None:
    """Forget every measured choice this process has read, and what it decided while reading
    them: the next call reads the store again, and measures what it lacks (a test that
    switches stores, or a setting such as ``CTFORMER_LOOP_ENGINE`` changed in the process).

    Forgotten together: the products', softmax's, packed and few-row choices, which dtypes had
    their rows' own product decided first, whether the compiled few-row kernel is on, and the
    attention blocks' and convolution route's choices."""
    _measured.cache_clear()
    _products_entry.cache_clear()
    few_rows_columns.cache_clear()
    # a kept "decided" would let the few-row measurement ask for an unstored products choice
    # under the store's lock (a RuntimeError), and kept kernels would time the loops of the old
    # CTFORMER_LOOP_ENGINE into the new setting's store
    _PEERS_DECIDED.clear()
    _few_rows._kernels.cache_clear()
    # these modules import this one, so they are reached where loaded, not imported (a cycle)
    for module in ("measured_blocks", "convolution_route"):
        loaded = sys.modules.get(f"{__package__}.{module}")
        if loaded is not None:
            loaded._measured.cache_clear()


@lru_cache(maxsize=None)
def _products_entry(name: str) -> dict:
    """This machine's stored measurement of the products of ``name`` (measured when missing)."""
    return _store.entry("products", name, _measure_products, _PRODUCTS_CHECKED)


def rows_product(a, b, bias=None, prepared=None):
    """``a @ b + bias`` for a matrix ``b`` (a feature map's rows, ``(..., d) @ (d, m)``; ``bias``
    an ``(m,)`` array of the same dtype, or None for no bias).

    ``prepared``: None, or the product by ``b`` and ``bias`` prepared once
    (:meth:`ctformer.operators.base.Constants.prepared`: a
    :class:`~ctformer._numerics.packed.PackedMatrix` for float32, a
    :class:`~ctformer._numerics.few_rows.FewRowsMatrix` for float64), which multiplies
    C-contiguous NumPy rows of its dtype within its bounds. Otherwise, for C-contiguous NumPy
    float arrays where torch multiplies (:func:`gemm_provider`), one
    product on the folded rows: inside a worker task by torch on one thread; outside, where
    :func:`threaded_products` holds and the product has at least 2^18 multiply-adds, by torch
    on :func:`~ctformer._numerics.threads.num_threads` threads; in both, a bias of the rows'
    dtype enters the product (``addmm``: one pass over the output less). torch tensors with a
    bias of their dtype and device by ``torch.addmm``, as torch's ``Linear``. Anything else by
    :func:`ctformer.backend.matmul_rows` (NumPy's BLAS as configured, torch, CuPy) and
    :func:`ctformer.backend.plus_bias`."""
    if (type(a) is np.ndarray and type(b) is np.ndarray and a.ndim >= 2 and b.ndim == 2
            and a.dtype == b.dtype and a.flags.c_contiguous):
        if prepared is not None and a.dtype == prepared.dtype and prepared.applies(a.size // a.shape[-1]):
            return prepared(a)
        inside = getattr(_INSIDE, "worker", False)
        # outside workers torch only for products worth its call (~5 us against NumPy's ~1 us)
        if (inside or a.size * b.shape[1] >= _THREADED_MIN_PRODUCTS) and uses_torch(a.dtype) and \
                (inside or threaded_products()):
            out = np.empty((*a.shape[:-1], b.shape[1]), dtype=a.dtype)
            rows, flat = a.reshape(-1, a.shape[-1]), out.reshape(-1, b.shape[1])
            if not _strides_ok(rows, b):  # torch.from_numpy refuses negative strides
                return plus_bias(np.matmul(rows, b, out=flat).reshape(out.shape), bias)
            torch = _torch()
            ta, tb, tout = _tensor(torch, rows), _tensor(torch, b), _tensor(torch, flat)
            # the bias in the product inside tasks too: float64 MiniLM and GPT-2 forwards of 8 x 128
            # tokens in groups took 0.980 / 0.986 of the time of a product and a pass adding the
            # bias (AMD EPYC, family 23 model 49)
            with _one_torch_thread(torch) if inside else _torch_threads(torch, num_threads()):
                if type(bias) is np.ndarray and bias.dtype == a.dtype and bias.shape == (b.shape[1],):
                    torch.addmm(_tensor(torch, bias), ta, tb, out=tout)
                else:
                    torch.mm(ta, tb, out=tout)
                    return plus_bias(out, bias)
            return out
        return numpy_rows(a, b, bias)
    if bias is not None and _torch_operands(a, b, bias):  # the bias in the product's pass, as torch's Linear
        rows = a.reshape(-1, a.shape[-1])
        return _torch().addmm(bias, rows, b).reshape(*a.shape[:-1], b.shape[1])
    return plus_bias(matmul_rows(a, b), bias)


def _torch_operands(a, b, bias) -> bool:
    """Whether ``a`` (..., d), ``b`` (d, m) and ``bias`` (m,) are torch tensors of one dtype and device."""
    torch = sys.modules.get("torch")
    return (torch is not None and isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
            and isinstance(bias, torch.Tensor) and a.ndim >= 2 and b.ndim == 2 and bias.shape == (b.shape[1],)
            and a.dtype == b.dtype == bias.dtype and a.device == b.device == bias.device)


def numpy_rows(a, b, bias=None):
    """NumPy's ``a @ b + bias`` for the C-contiguous NumPy rows ``a`` and a matrix ``b``: one
    product on the folded rows (as :func:`ctformer.backend.matmul_rows`, written out: small
    solves make four of these per step), the bias added in place."""
    out = a @ b if a.ndim == 2 else (a.reshape(-1, a.shape[-1]) @ b).reshape(*a.shape[:-1], b.shape[1])
    return plus_bias(out, bias)


def plain_rows(rows: int, d: int, width: int) -> bool:
    """Whether :func:`rows_product` of ``rows`` C-contiguous NumPy rows of width ``d`` by a
    ``(d, width)`` matrix of their dtype, called outside worker tasks through
    :func:`~ctformer._numerics.threads.by_row_blocks`, is NumPy's ``@`` on the whole input
    followed by the bias added in place (the products too small for torch's call and for
    row blocks)."""
    return rows < _ROW_BLOCKS_MIN_ROWS and rows * d * width < _THREADED_MIN_PRODUCTS


def threaded_rows(dtype) -> bool:
    """True when :func:`rows_product` multiplies ``dtype`` rows outside worker tasks on
    torch's threads (torch chosen, :func:`threaded_products` holds). Packed products
    (:mod:`ctformer._numerics.packed`) do not count: large states keep their row blocks, each
    block's packed product on one thread (GPT-2 and Llama at 4 x 512 in float32: 0.52 of
    HuggingFace's time by blocks, 0.65-0.67 as one product on two threads; AMD EPYC)."""
    return uses_torch(dtype) and threaded_products()


def attention_block(qs, k, v, bias, out) -> None:
    """``out = softmax(qs k^T + bias) v`` over the leading axes, by torch on one thread
    (NumPy arrays of one float dtype; ``bias`` None or broadcasting to the scores; every
    row must keep a key)."""
    torch = _torch()
    with _one_torch_thread(torch):
        s = torch.matmul(_tensor(torch, qs), _tensor(torch, k).transpose(-1, -2))
        if bias is not None:
            s += _tensor(torch, np.asarray(bias, dtype=qs.dtype))
        torch.ops.aten._softmax.out(s, -1, False, out=s)
        np.copyto(out, torch.matmul(s, _tensor(torch, v)).numpy())


def _strides_ok(*arrays) -> bool:
    return all(x.ndim == 2 and min(x.strides) >= 0 for x in arrays)


@lru_cache(maxsize=None)
def _measured(kind: str, dtype: str, measure=None, checked: str | None = None) -> str:
    """The stored choice, ``"numpy"``, ``"torch"`` or ``"compiled"``, for ``kind`` ("products",
    "softmax", or a caller's kind with its ``measure(dtype) -> {"provider": ...}``) and ``dtype``
    on this machine, measured and stored when missing (:func:`ctformer._numerics.store.entry`;
    torch is imported only to measure, or when chosen; the kinds of ``_TORCH_FREE`` do without
    it)."""
    if measure is None:
        measure = _measure_softmax
    return _store.entry(kind, dtype, measure, checked, needs_torch=kind not in _TORCH_FREE)["provider"]

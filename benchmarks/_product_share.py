"""The share of a network's time spent in its feature products, on each side of ``model.py``.

The feature products (the projections and the feed-forward matrices, with their biases) are
the same matrices on both sides: ctformer multiplies them with the BLAS this machine chose,
HuggingFace with torch's. :func:`product_share` gives ctformer's share (``model.py``'s floor is
the ratio times it), :func:`peer_product_share` HuggingFace's own. Where the two are close,
the products run at the same speed on both sides, and a ratio ``g`` needs everything else of
ctformer to take at most ``g - floor`` of HuggingFace's time, against the ``1 - share`` that
HuggingFace's own rest takes.
"""
from __future__ import annotations

import threading
import time

import numpy as np


def product_share(call, repeats=3):
    """Median share of one ``call``'s time that the calling thread spends in ctformer's
    feature products: :func:`ctformer._numerics.gemm.rows_product`, NumPy's products
    (``numpy_rows``) and the prepared ones (packed, few rows) that small plans call directly,
    each wrapped by a timer where it is looked up; a product inside another counts once."""
    from ctformer._numerics import few_rows, gemm, packed
    from ctformer.operators import attention_flow, feature

    spent, depth = [0.0], [0]
    caller = threading.get_ident()

    def timed(function):
        def wrapper(*args, **kwargs):
            if threading.get_ident() != caller or depth[0]:  # a worker's block, or inside a timed product
                return function(*args, **kwargs)
            depth[0], start = 1, time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - start
                depth[0] = 0
        return wrapper

    names = ((attention_flow, "rows_product"), (attention_flow, "numpy_rows"), (feature, "rows_product"),
             (gemm, "numpy_rows"), (few_rows.FewRowsMatrix, "__call__"), (packed.PackedMatrix, "__call__"))
    originals = [getattr(owner, name) for owner, name in names]
    try:
        for (owner, name), function in zip(names, originals):
            setattr(owner, name, timed(function))
        return _median_share(call, spent, repeats)
    finally:
        for (owner, name), function in zip(names, originals):
            setattr(owner, name, function)


def peer_product_share(call, repeats=3):
    """Median share of one HuggingFace ``call``'s time spent in its feature products: every
    ``torch.nn.Linear`` and ``transformers`` ``Conv1D`` (GPT-2's) of ``call.module``, each
    call timed from a forward pre-hook to a forward hook (its wall time, torch's threads
    working inside; a product inside another counts once). The hooks are removed afterwards."""
    import torch

    kinds = [torch.nn.Linear]
    try:
        from transformers.pytorch_utils import Conv1D
        kinds.append(Conv1D)
    except ImportError:  # pragma: no cover - transformers is there wherever model.py runs
        pass
    spent, started = [0.0], []

    def before(module, args):
        started.append(time.perf_counter())

    def after(module, args, output):
        start = started.pop()
        if not started:  # the outermost product only
            spent[0] += time.perf_counter() - start

    handles = []
    try:
        for module in call.module.modules():
            if isinstance(module, tuple(kinds)):
                handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]
        return _median_share(call, spent, repeats)
    finally:
        for handle in handles:
            handle.remove()


def _median_share(call, spent, repeats) -> float:
    """The median over ``repeats`` calls of ``spent[0]`` (reset before each) over the call's time."""
    samples = []
    for _ in range(repeats):
        spent[0], start = 0.0, time.perf_counter()
        call()
        samples.append(spent[0] / (time.perf_counter() - start))
    return float(np.median(samples))

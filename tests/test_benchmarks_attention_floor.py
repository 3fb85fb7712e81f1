"""model.py's attention floor runs exactly the products of bidirectional attention: every
layer, sequence and head, n^2 e multiply-adds for the scores and as many for the weighted
sums, and only where the library streams the attention."""
import sys

import numpy as np

from .conftest import benchmark_module


def test_attention_floor_multiplies_every_score_once(monkeypatch):
    benchmark_module("model")  # puts benchmarks/_attention_floor on sys.modules as model.py imports it
    floor = sys.modules["_attention_floor"]
    from ctformer._numerics import gemm

    done = {"scores": 0, "weighted": 0}

    def counting(kind):
        def product(a, b, out):
            done[kind] += a.shape[0] * a.shape[1] * b.shape[1]
            return np.matmul(a, b, out=out)
        return product

    monkeypatch.setattr(gemm, "attention_products", lambda dtype: (counting("scores"), counting("weighted")))
    layers, batch, heads, n, e = 2, 2, 3, 300, 5
    floor.attention_products(batch, n, heads, e, layers, "float64")()
    assert done == {"scores": layers * batch * heads * n * n * e, "weighted": layers * batch * heads * n * n * e}
    assert floor.seconds(lambda: None, repeats=3) >= 0.0


def test_attention_floor_only_where_the_attention_is_streamed():
    benchmark_module("model")
    floor = sys.modules["_attention_floor"]
    from ctformer._numerics import dense

    edge = int(np.ceil(np.sqrt(dense._STREAM_MIN_ENTRIES)))
    assert (floor.streamed(edge - 1), floor.streamed(edge)) == (False, True)

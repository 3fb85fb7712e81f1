"""RoPE's rotation of the pairs in one compiled pass (ctformer._numerics.loops.rotate_pairs)
against the complex product (q1 + i q2) e^{i theta} in float64, on strided head views."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.operators import positions

from .conftest import require

require("numba")


@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-15), (np.float32, 1e-6)])
@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
def test_rotation_is_the_complex_product(rng, dtype, tol, lead, monkeypatch):
    n, m = 9, 4
    packed = rng.standard_normal((*lead[:-1], n, 2 * (lead[-1] if lead else 1), 2 * m)).astype(dtype)
    q = np.swapaxes(packed, -3, -2)[..., : (lead[-1] if lead else 1), :, :]   # a strided view
    q = q.reshape((*lead, n, 2 * m)) if not lead else q
    theta = rng.uniform(-np.pi, np.pi, (n, m))
    cos, sin = np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)
    taken = []
    monkeypatch.setattr(positions._compiled, "kernels",
                        lambda real=positions._compiled.kernels: taken.append(real()) or taken[-1])
    got = positions.rotate(np, q, cos, sin)
    assert taken[-1] is not None and got.dtype == dtype and got.shape == q.shape
    z = (q[..., :m].astype(np.float64) + 1j * q[..., m:]) * np.exp(1j * theta)
    exact = np.concatenate([z.real, z.imag], axis=-1)
    assert np.abs(got - exact).max() / np.abs(exact).max() < tol


def test_other_tables_keep_the_array_formula(rng):
    q = rng.standard_normal((2, 5, 6))
    cos = np.ones((1, 5, 3))   # broadcast tables: not the kernel's (N, m)
    sin = np.zeros((1, 5, 3))
    np.testing.assert_array_equal(positions.rotate(np, q, cos, sin), q)


@pytest.mark.parametrize("view", ["reversed tokens", "broadcast heads", "strided features", "empty"])
def test_rotation_of_any_view_is_the_complex_product(rng, view):
    """The kernel reads q through a flat view of its memory: views with negative, zero and
    non-unit feature strides (copied first, or read in place) rotate as the complex product."""
    n, m = 7, 3
    base = rng.standard_normal((2, n, 4 * m))
    q = {"reversed tokens": base[:, ::-1, : 2 * m],
         "broadcast heads": np.broadcast_to(base[:1, :, : 2 * m], (3, n, 2 * m)),
         "strided features": base[:, :, ::2],
         "empty": base[:0, :, : 2 * m]}[view]
    theta = rng.uniform(-np.pi, np.pi, (n, m))
    got = positions.rotate(np, q, np.cos(theta), np.sin(theta))
    z = (q[..., :m] + 1j * q[..., m:]) * np.exp(1j * theta)
    exact = np.concatenate([z.real, z.imag], axis=-1)
    assert got.shape == q.shape
    np.testing.assert_allclose(got, exact, rtol=0, atol=4e-16 * max(1.0, np.abs(exact).max(initial=0)))

"""Settings and dtypes that were accepted and then failed elsewhere, or silently: a thread
count beyond a C int, a memory budget under one byte, the exact GELU of long doubles."""
import numpy as np
import pytest

from ctformer._numerics import threads
from ctformer.discretizations import memory
from ctformer.operators.activations import gelu


def test_thread_count_beyond_a_c_int_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("CTFORMER_NUM_THREADS", str(2**31))
    with pytest.raises(ValueError, match=r"CTFORMER_NUM_THREADS must be a positive integer at most 2147483647"):
        threads.num_threads()
    monkeypatch.setenv("CTFORMER_NUM_THREADS", "3")
    assert threads.num_threads() == 3


def test_a_memory_budget_under_one_byte_is_refused(monkeypatch):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "0.5")
    with pytest.raises(ValueError, match=r"CTFORMER_MEMORY_BUDGET must be a positive number of bytes \(at least 1\)"):
        memory.memory_budget()
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e9")
    assert memory.memory_budget() == 10**9


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 on this platform")
def test_the_exact_gelu_of_long_doubles_is_refused_with_the_remedy():
    with pytest.raises(TypeError, match=r"long double.*astype\(np.float64\)"):
        gelu(np.linspace(-2, 2, 5, dtype=np.longdouble))
    z = np.linspace(-2, 2, 5)
    from scipy.special import erf
    np.testing.assert_allclose(gelu(z), z * 0.5 * (1 + erf(z / np.sqrt(2))), rtol=1e-15, atol=1e-16)

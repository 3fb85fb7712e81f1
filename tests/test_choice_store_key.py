"""The store of measured choices is named by everything that selects the machine code timed:
a setting that changes torch's, oneDNN's, MKL's, Numba's or NumPy's kernels opens another
store, so a choice measured on AVX-512 kernels is never reused for AVX2 ones (issue 25)."""
from __future__ import annotations

import json

import pytest

from ctformer._numerics import store


@pytest.fixture
def no_kernel_settings(monkeypatch, fresh_store):
    for name in store.KERNEL_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    return fresh_store


@pytest.mark.parametrize("name", store.KERNEL_SETTINGS)
def test_every_kernel_setting_opens_its_own_store(monkeypatch, no_kernel_settings, name):
    default = store.cache_file()
    monkeypatch.setenv(name, "avx2")
    first = store.cache_file()
    monkeypatch.setenv(name, "avx512_core")
    second = store.cache_file()
    assert len({default, first, second}) == 3
    monkeypatch.setenv(name, "")  # set but empty: as unset
    assert store.cache_file() == default
    assert default.parent == first.parent == no_kernel_settings / "ctformer"


def test_numba_version_names_the_store(monkeypatch, no_kernel_settings):
    default = store.cache_file()
    monkeypatch.setattr(store, "_numba_version", lambda: "0.0.1")
    assert store.cache_file() != default
    monkeypatch.setattr(store, "_numba_version", lambda: None)
    assert store.cache_file() != default


def test_a_choice_measured_under_one_setting_is_not_read_under_another(monkeypatch, no_kernel_settings):
    calls = []

    def measure(dtype):
        calls.append(dtype.name)
        return {"provider": "torch" if len(calls) == 1 else "numpy"}

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert store.entry("test kind", "float32", measure, needs_torch=False)["provider"] == "torch"
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    assert store.entry("test kind", "float32", measure, needs_torch=False)["provider"] == "numpy"
    assert calls == ["float32", "float32"]
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")  # its own store again: read, not measured
    assert store.entry("test kind", "float32", measure, needs_torch=False)["provider"] == "torch"
    assert len(calls) == 2
    files = sorted((no_kernel_settings / "ctformer").glob("gemm-*.json"))
    assert len(files) == 2
    assert sorted(json.loads(f.read_text())["test kind float32"]["provider"] for f in files) == ["numpy", "torch"]

"""ctformer.environment.setting: the cheap read of an environment variable, against os.environ."""
import os

import pytest

from ctformer._numerics import compiled
from ctformer.environment import positive_int, setting

NAME = "CTFORMER_TEST_SETTING"


@pytest.mark.parametrize("value", ["numpy", "", "  Numba ", "größe", "a=b"])
def test_setting_reads_what_os_environ_holds(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    assert setting(NAME, "default") == os.environ.get(NAME, "default") == value
    monkeypatch.delenv(NAME)
    assert setting(NAME, "default") == os.environ.get(NAME, "default") == "default"
    assert setting(NAME) == ""


def test_setting_sees_changes_made_through_os_environ(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    os.environ[NAME] = "3"
    try:
        assert setting(NAME) == "3" and positive_int(NAME) == 3
        os.environ[NAME] = "7"
        assert positive_int(NAME) == 7
    finally:
        del os.environ[NAME]
    assert positive_int(NAME, 5) == 5


def test_loop_engine_follows_the_variable_after_caching(monkeypatch):
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", " NumPy ")
    assert compiled.loop_engine() == "numpy"
    assert compiled.loop_engine() == "numpy"   # the normalized value, from the cache
    monkeypatch.setenv("CTFORMER_LOOP_ENGINE", "fortran")
    with pytest.raises(ValueError, match="got 'fortran'"):
        compiled.loop_engine()
    with pytest.raises(ValueError, match="got 'fortran'"):   # an invalid value is never cached
        compiled.loop_engine()


def test_a_choice_follows_the_variable_and_names_a_bad_value(monkeypatch):
    """``choice`` normalizes as ``os.environ.get(name, default).strip().lower()`` would, for
    every value the variable takes in turn (its cache is keyed by the raw value)."""
    from ctformer.environment import choice

    allowed = ("auto", "numpy", "torch")
    for raw in (" Torch ", "numpy", "", "AUTO", "torch"):
        monkeypatch.setenv(NAME, raw)
        assert choice(NAME, allowed) == (os.environ.get(NAME, "auto").strip().lower() or "auto")
    monkeypatch.delenv(NAME)
    assert choice(NAME, allowed) == "auto"
    monkeypatch.setenv(NAME, "mkl")
    with pytest.raises(ValueError, match=f"{NAME} must be one of auto, numpy, torch, got 'mkl'"):
        choice(NAME, allowed)


def test_the_cpu_is_named_with_its_family_and_model():
    """The measured choices are stored under the CPU's name: virtual machines name different
    generations alike ("AMD EPYC"), so the family and model numbers are part of it (where
    /proc/cpuinfo gives them; elsewhere the platform's name)."""
    import platform
    import re

    from ctformer.environment import cpu_model

    text = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    name = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    family = re.search(r"^cpu family\s*:\s*(\d+)", text, re.M)
    model = re.search(r"^model\s*:\s*(\d+)", text, re.M)
    if name and family and model:
        expected = f"{name.group(1).strip()} (cpu family {family.group(1)}, model {model.group(1)})"
    elif name:
        expected = name.group(1).strip()
    else:
        expected = platform.processor() or platform.machine() or "unknown CPU"
    assert cpu_model() == expected

"""A missing test dependency fails the test that needs it and names the remedy; it never skips."""
from __future__ import annotations

import pytest

from . import conftest


def test_missing_module_fails_naming_the_remedy():
    with pytest.raises(pytest.fail.Exception) as info:
        conftest.require("ctformer_no_such_module")
    assert "ctformer_no_such_module" in str(info.value)
    assert 'pip install -e ".[test]"' in str(info.value)


def test_missing_attribute_is_missing_too():
    with pytest.raises(pytest.fail.Exception, match="this math has no no_such_function"):
        conftest.require("math", "no_such_function")


def test_present_module_is_returned():
    import math

    assert conftest.require("math") is math and conftest.require("math", "pi").pi == math.pi

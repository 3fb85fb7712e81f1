"""A missing test dependency fails by default and names the remedy; it skips only when the
user asks for a partial run (CTFORMER_ALLOW_MISSING=1), and never in CI."""
from __future__ import annotations

import pytest

from . import conftest


@pytest.mark.parametrize("allow, expected", [(False, pytest.fail.Exception), (True, pytest.skip.Exception)])
def test_missing_module_fails_unless_allowed(monkeypatch, allow, expected):
    monkeypatch.setattr(conftest, "ALLOW_MISSING", allow)
    with pytest.raises(expected) as info:
        conftest.require("ctformer_no_such_module")
    assert "ctformer_no_such_module" in str(info.value)
    if not allow:
        assert "pip install -e '.[test]'" in str(info.value) and "CTFORMER_ALLOW_MISSING=1" in str(info.value)


def test_missing_attribute_is_missing_too(monkeypatch):
    monkeypatch.setattr(conftest, "ALLOW_MISSING", False)
    with pytest.raises(pytest.fail.Exception, match="this math has no no_such_function"):
        conftest.require("math", "no_such_function")


def test_present_module_is_returned():
    import math

    assert conftest.require("math") is math and conftest.require("math", "pi").pi == math.pi


@pytest.mark.parametrize("environ, allowed", [
    ({}, False),
    ({"CTFORMER_ALLOW_MISSING": "1"}, True),
    ({"CTFORMER_ALLOW_MISSING": "1", "CTFORMER_REQUIRE_ALL": "1"}, False),   # CI wins
    ({"CTFORMER_ALLOW_MISSING": "yes"}, False),
])
def test_only_an_explicit_partial_run_skips(environ, allowed):
    assert conftest.allow_missing(environ) is allowed

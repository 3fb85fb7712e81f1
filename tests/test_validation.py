"""The scalar checks: each accepts what it names and refuses the rest with the argument's name."""
import math

import numpy as np
import pytest

from ctformer import validation as v


@pytest.mark.parametrize("value, minimum, expected", [(3, 1, 3), (np.int64(0), 0, 0), (-5, None, -5)])
def test_integer_accepts_integers_in_range(value, minimum, expected):
    out = v.integer(value, "n", minimum=minimum)
    assert out == expected and type(out) is int


@pytest.mark.parametrize("value, error", [(True, TypeError), (2.0, TypeError), ("3", TypeError),
                                          (0, ValueError), (-1, ValueError)])
def test_integer_refuses_with_the_name(value, error):
    with pytest.raises(error, match=r"steps must be a positive integer, got "):
        v.integer(value, "steps")


def test_integer_range_words():
    with pytest.raises(ValueError, match="k must be an integer >= 2 and <= 4, got 5"):
        v.integer(5, "k", minimum=2, maximum=4)
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        v.integer(-1, "seed", minimum=0)


def test_real():
    assert v.real(np.float32(0.5), "dt", positive=True) == 0.5
    assert v.real(0, "eps", nonnegative=True) == 0.0
    for bad, error in [(math.inf, ValueError), (math.nan, ValueError), (False, TypeError),
                       (0.0, ValueError), ("1", TypeError)]:
        with pytest.raises(error, match="dt must be a finite positive number"):
            v.real(bad, "dt", positive=True)
    with pytest.raises(ValueError, match="eps must be a finite non-negative number, got -1e-12"):
        v.real(-1e-12, "eps", nonnegative=True)


def test_boolean_and_one_of():
    assert v.boolean(np.bool_(True), "causal") is True
    for bad in (1, 0, None, "yes"):
        with pytest.raises(TypeError, match="causal must be True or False"):
            v.boolean(bad, "causal")
    assert v.one_of("post", "placement", ("pre", "post")) == "post"
    with pytest.raises(ValueError, match="placement must be one of 'pre', 'post'; got 'Pre'"):
        v.one_of("Pre", "placement", ("pre", "post"))
    with pytest.raises(ValueError, match="flag must be one of True, False; got 1"):
        v.one_of(1, "flag", (True, False))
    with pytest.raises(ValueError, match="x must be one of"):
        v.one_of(np.zeros(3), "x", (0.0,))

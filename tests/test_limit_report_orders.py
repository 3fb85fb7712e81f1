"""The depth orders of ``limit_report`` beside the scheme's order and the neighbour orders.

The printed numbers are checked against ``numpy.polyfit`` of log(error) on log(1/k) and
against log2 of successive error ratios, both taken from the printed errors themselves."""
from __future__ import annotations

import re

import numpy as np
import pytest

from tests.conftest import require

pytestmark = pytest.mark.transformers


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_orders_are_the_fit_and_the_ratios_of_the_printed_errors(model):
    require("torch")
    require("transformers")
    from ctformer.bridges.hf import limit_report

    text = limit_report(model)
    for scheme, expected in (("lie", 1), ("strang", 2)):
        row = re.search(rf"{scheme}: (k=1: .*)\n\s+observed order ([0-9.]+) \(expected ([0-9.]+); "
                        rf"neighbour orders ([0-9., ]+)\)", text)
        assert row is not None, text
        errors = np.array([float(e) for e in re.findall(r"k=\d+: ([0-9.e+-]+)", row[1])])
        h = 1.0 / np.array([1, 2, 4, 8])
        fitted = np.polyfit(np.log(h), np.log(errors), 1)[0]
        assert float(row[2]) == pytest.approx(fitted, abs=0.006)          # printed to 2 digits
        assert float(row[3]) == expected
        neighbours = [float(o) for o in row[4].split(", ")]
        assert neighbours == pytest.approx(np.log2(errors[:-1] / errors[1:]), abs=0.006)

"""A study's ``fine`` whose interpolation matrix cannot fit is refused before the first case
runs, naming ``fine`` (not GaussLegendre's ``n``, nor a matrix met after a case); a ``fine``
just within the budget runs and gives the closed-form errors."""
from __future__ import annotations

import numpy as np
import pytest

from ctformer.discretizations import SizeTooLargeError
from ctformer.state import Grids
from ctformer.studies import convergence

STUDY = dict(refine="tokens", levels=[4, 8, 16, 32], tokens="gauss-legendre",
             features="gauss-legendre:6", progress=False)


class CountingModel:
    """The identity flow: the sampled initial state is the solution; counts its solves."""

    def __init__(self):
        self.solves = 0

    def solve(self, u0, *, tokens, features, head_features, hidden, scheme, steps_per_layer,
              trajectory):
        self.solves += 1
        u = Grids(tokens, features, head_features, hidden).sample(u0)
        return [u, u]


def _u0(x, y):
    return x ** 3 * np.cos(y)


@pytest.mark.parametrize("fine, size", [(10**8, "25.3 GiB"), (2 * 10**6, "519 MiB")])
def test_fine_too_large_is_refused_before_any_case_naming_fine(monkeypatch, fine, size):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1e8")
    model = CountingModel()
    # 10**8 was refused naming GaussLegendre's n; 2 * 10**6 after the first case, naming
    # "the barycentric interpolation matrix"
    message = (rf"^fine={fine}: the {fine} x 32 matrix interpolating the largest tokens level \(32\) "
               rf"to the evaluation points would need {size}, .*; use fine <= 367647 \(argument fine\)")
    with pytest.raises(SizeTooLargeError, match=message):
        convergence(model, u0=_u0, fine=fine, **STUDY)
    assert model.solves == 0
    assert 8 * 367647 * 32 + 16 * 367647 <= 1e8 < 8 * 367648 * 32 + 16 * 367648


def test_fine_just_within_the_budget_runs_with_exact_errors(monkeypatch):
    # 8 bytes x 16 values + 16 bytes a point: 9027 points fit in 1.3e6 bytes
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", "1.3e6")
    levels = [4, 8, 16]
    fits = int(1.3e6 // (8 * 16 + 16))
    with pytest.raises(SizeTooLargeError, match=rf"use fine <= {fits} \(argument fine\)"):
        convergence(CountingModel(), u0=_u0, fine=fits + 1, **dict(STUDY, levels=levels))
    model = CountingModel()
    result = convergence(model, u0=_u0, fine=fits, **dict(STUDY, levels=levels))
    assert model.solves == 3 and result.parameters["fine"] == fits == 9027
    # Gauss-Legendre on n >= 4 nodes reproduces the cubic x^3 exactly: only rounding is left
    errors = [row.error for row in result.table if row.error is not None]
    assert len(errors) == 2 and max(errors) < 1e-13

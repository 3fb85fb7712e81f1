"""Solvers audit, round 5: the dense output counts in the memory budget as the saved states do.

``SaveAt(dense=True)`` keeps, per accepted step, the step's end state and the arrays its
interpolant reads (an embedded pair's stages, the first shared with the step before; else the
two end slopes of the cubic Hermite interpolant). Those records were not counted in
``CTFORMER_MEMORY_BUDGET`` while ``SaveAt(steps=True)`` states were. The reference for the bytes
is the number of distinct arrays the records of the uninterrupted solve hold, and the matrix
exponential (``scipy.linalg.expm``) for the values of the partial dense output.
"""
from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import expm

from ctformer import SaveAt, solvers
from ctformer.discretizations import SizeTooLargeError, memory
from ctformer.solvers import Piecewise, PIController, SplitProblem

A = np.array([[-1.0, 2.0], [-2.0, -1.0]])
LINEAR = Piecewise.single(SplitProblem([lambda u: A @ u]), 1.0)   # u(t) = expm(A t) u0
U0 = np.ones((2, 256))
S = U0.nbytes
CONTROL = PIController(rtol=1e-8, atol=1e-10)


def _solve(control, scheme="dopri5"):
    return solvers.integrate(LINEAR, U0, control, scheme=solvers.get(scheme),
                             save_at=SaveAt(dense=True), memory=memory)


def _distinct_bytes(records) -> int:
    """Bytes of the distinct arrays the records hold besides the initial state."""
    arrays = {id(x): x for r in records for x in (r.u1, *(r.ks or ()))}
    arrays.pop(id(U0), None)
    return S * len(arrays)


@pytest.mark.parametrize("scheme", ["dopri5", "bosh3", "tsit5"])
def test_controlled_dense_output_refused_at_the_first_record_beyond_the_budget(monkeypatch, scheme):
    full = _solve(CONTROL, scheme)
    assert len(full.records) > 12
    budget = _distinct_bytes(full.records[:10])   # exactly the first 10 steps' records
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(budget))
    with pytest.raises(SizeTooLargeError, match=r"dense output of every accepted step.*kept the "
                       r"records of 10 steps.*exc\.solution.*without dense=True"):
        _solve(CONTROL, scheme)
    try:
        _solve(CONTROL, scheme)
    except SizeTooLargeError as exc:
        part = exc.solution
    assert [(r.t0, r.h) for r in part.records] == [(r.t0, r.h) for r in full.records[:10]]
    end = part.records[-1].t0 + part.records[-1].h
    np.testing.assert_allclose(part.evaluate(0.5 * end), expm(0.5 * end * A) @ U0, rtol=0, atol=1e-8)
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(budget + 1))   # one byte more: the same
    with pytest.raises(SizeTooLargeError, match="records of 10 steps"):
        _solve(CONTROL, scheme)


def test_fixed_step_dense_output_refused_before_the_first_step(monkeypatch):
    steps = 20   # Hermite records: the end state and two slopes per step
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(3 * steps * S - 1))
    with pytest.raises(SizeTooLargeError, match=r"dense output of 20 steps \(3 states each"):
        _solve(steps, "rk4")
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(3 * steps * S))
    sol = _solve(steps, "rk4")
    assert len(sol.records) == steps
    np.testing.assert_allclose(sol.evaluate(0.37), expm(0.37 * A) @ U0, rtol=0, atol=1e-6)


def test_dense_records_and_kept_steps_share_one_budget(monkeypatch):
    full = solvers.integrate(LINEAR, U0, CONTROL, scheme=solvers.get("dopri5"),
                             save_at=SaveAt(steps=True), memory=memory)
    # with every step's states (2 S each at the peak) and records together, fewer steps fit
    # than with the states alone
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(2 * 20 * S))
    with pytest.raises(SizeTooLargeError) as states_only:
        solvers.integrate(LINEAR, U0, CONTROL, scheme=solvers.get("dopri5"),
                          save_at=SaveAt(steps=True), memory=memory)
    with pytest.raises(SizeTooLargeError) as both:
        solvers.integrate(LINEAR, U0, CONTROL, scheme=solvers.get("dopri5"),
                          save_at=SaveAt(steps=True, dense=True), memory=memory)
    assert len(full.times) > 20 and len(states_only.value.solution.times) == 20
    # u0 (2 S), then per step a record (8 S for the first, 7 S after: FSAL) and a state (2 S):
    # 12 S + 3 * 9 S = 39 S fit in 40 S, the fifth step's record does not
    assert len(both.value.solution.times) == 5 and len(both.value.solution.records) == 4
    assert "records of 4 steps" in str(both.value)


def test_final_state_without_dense_output_is_never_refused(monkeypatch):
    monkeypatch.setenv("CTFORMER_MEMORY_BUDGET", str(S // 2))
    sol = solvers.integrate(LINEAR, U0, CONTROL, scheme=solvers.get("dopri5"), memory=memory)
    np.testing.assert_allclose(sol.final, expm(A) @ U0, rtol=0, atol=1e-8)

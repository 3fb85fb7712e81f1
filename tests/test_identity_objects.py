"""Identity of a computation for objects, partials, bound methods and schemes (issue 19, items
3 and 13): a stored case is reused only for the same computation, whatever carries the
parameters (a scheme's attribute that its repr leaves out, a ``functools.partial`` keyword, an
instance behind a bound method); what cannot be identified refuses the store; a record path
that cannot take a record is refused before anything is computed."""
from __future__ import annotations

import datetime
import functools
import importlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from ctformer import ContinuousTransformer
from ctformer.operators.activations import gelu
from ctformer.solvers import Scheme
from ctformer.studies import convergence, model_identity, run_cases
from ctformer.studies.identity import describe

TIME = dict(refine="time", levels=[1, 2, 4, 8], tokens="midpoint:6", features="midpoint:6",
            progress=False)
TOKENS = dict(refine="tokens", levels=[4, 8, 16], tokens="midpoint", features="midpoint:8",
              progress=False)


class Theta(Scheme):
    r"""The explicit theta method :math:`u + \Delta t\,(\theta f(u) + (1 - \theta) f(u + \Delta t f(u)))`.

    ``Theta(1.0)`` is explicit Euler, ``Theta(0.5)`` Heun's method; both print ``Theta()``.
    """

    name = "theta"
    nominal_order = 1.0

    def __init__(self, theta):
        self.theta = theta

    def step(self, problem, u, dt):
        first = problem.rhs(u)
        second = problem.rhs(u + dt * first)
        return problem.project_all(u + dt * (self.theta * first + (1.0 - self.theta) * second))


def scaled_gelu(z, alpha=1.0):
    """GELU of ``alpha z`` (module level: picklable, identified by name)."""
    return gelu(alpha * z)


class ScaledGelu:
    """A parametrized activation handed over as a bound method."""

    def __init__(self, alpha):
        self.alpha = alpha

    def apply(self, z):
        return gelu(self.alpha * z)


class Slotted:
    """An object whose state lives in slots, not in ``vars()``."""

    __slots__ = ("alpha",)

    def __init__(self, alpha):
        self.alpha = alpha

    def __call__(self, z):
        return gelu(self.alpha * z)


def _errors(result):
    return np.array([np.nan if r.error is None else r.error for r in result.table])


def _model(activation="gelu"):
    return ContinuousTransformer.random_smooth(seed=1, layers=1, activation=activation)


def test_scheme_parameter_missing_from_repr_is_a_new_computation(tmp_path):
    """Issue reproducer: Theta(1.0) then Theta(0.5) into one store (both repr 'Theta()').
    Reference: Theta(1.0) is ctformer's Euler, Theta(0.5) its Heun method."""
    model = _model()
    assert repr(Theta(1.0)) == repr(Theta(0.5))
    euler = convergence(model, scheme=Theta(1.0), store=tmp_path, **TIME)
    heun = convergence(model, scheme=Theta(0.5), store=tmp_path, **TIME)
    np.testing.assert_allclose(_errors(euler), _errors(convergence(model, scheme="euler", **TIME)),
                               rtol=1e-9)
    np.testing.assert_allclose(_errors(heun), _errors(convergence(model, scheme="heun", **TIME)),
                               rtol=1e-9)
    assert _errors(heun)[0] < 0.1 * _errors(euler)[0]   # second order against first order
    assert len(list(tmp_path.glob("*.json"))) == 2 * len(TIME["levels"])   # nothing shared


def test_partial_keywords_are_part_of_the_identity(tmp_path):
    """Issue reproducer: activation=partial(f, alpha=1.0) then alpha=2.0 into one store."""
    one = _model(functools.partial(scaled_gelu, alpha=1.0))
    two = _model(functools.partial(scaled_gelu, alpha=2.0))
    assert model_identity(one) != model_identity(two)
    assert model_identity(one) == model_identity(_model(functools.partial(scaled_gelu, alpha=1.0)))
    first = convergence(one, store=tmp_path, **TOKENS)
    stored = convergence(two, store=tmp_path, **TOKENS)
    # references: alpha = 1 is the plain GELU model, alpha = 2 computed without a store
    np.testing.assert_array_equal(_errors(first), _errors(convergence(_model("gelu"), **TOKENS)))
    np.testing.assert_array_equal(_errors(stored), _errors(convergence(two, **TOKENS)))
    assert stored.table[0].error != first.table[0].error
    assert len(list(tmp_path.glob("*.json"))) == 2 * len(TOKENS["levels"])


def test_bound_methods_are_identified_by_their_instance(tmp_path):
    one, two = _model(ScaledGelu(1.0).apply), _model(ScaledGelu(2.0).apply)
    assert model_identity(one) != model_identity(two)
    assert model_identity(one) == model_identity(_model(ScaledGelu(1.0).apply))
    convergence(one, store=tmp_path, **TOKENS)
    stored = convergence(two, store=tmp_path, **TOKENS)
    np.testing.assert_array_equal(_errors(stored), _errors(convergence(two, **TOKENS)))
    np.testing.assert_array_equal(
        _errors(convergence(one, store=tmp_path, **TOKENS)), _errors(convergence(_model(), **TOKENS)))


def test_objects_are_identified_by_their_full_state():
    assert describe(Slotted(1.0)) != describe(Slotted(2.0))
    assert describe(Slotted(1.0)) == describe(Slotted(1.0))
    assert model_identity(_model(Slotted(1.0))) != model_identity(_model(Slotted(2.0)))
    assert describe(Theta(1.0)) != describe(Theta(np.nextafter(1.0, 2.0)))   # one ulp
    # objects pickled through bytes (a date) and object arrays (their bytes are addresses)
    assert describe(datetime.date(2020, 1, 1)) != describe(datetime.date(2020, 1, 2))
    assert describe(np.array([Slotted(1.0)], dtype=object)) == \
        describe(np.array([Slotted(1.0)], dtype=object))
    assert describe(np.array([Slotted(1.0)], dtype=object)) != \
        describe(np.array([Slotted(2.0)], dtype=object))


@pytest.mark.parametrize("activation, what", [
    (functools.partial(lambda z, a: gelu(a * z), a=1.0), "lambda"),
    (ScaledGelu(threading.Lock()).apply, "cannot be pickled"),
])
def test_what_cannot_be_identified_refuses_the_store(tmp_path, activation, what):
    with pytest.raises(TypeError, match=what):
        convergence(_model(activation), store=tmp_path, **TOKENS)
    assert not list(tmp_path.glob("*.json"))


def test_scheme_without_identity_refuses_the_store(tmp_path):
    with pytest.raises(TypeError, match="scheme.*lambda"):
        convergence(_model(), scheme=Theta(lambda: 0.5), store=tmp_path, **TIME)
    convergence(_model(), scheme=Theta(1.0), **TIME)   # without a store: no identity needed


def test_sets_are_identified_in_a_canonical_order():
    """A set's iteration order depends on the string hash seed; its identity must not."""
    code = ("from ctformer.studies.identity import describe; import json; "
            "print(json.dumps(describe({'gelu', 'relu', 'silu', 'tanh', 'erf', 'exp'})))")
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout
               for seed in ("1", "2", "3")}
    assert len(outputs) == 1


def test_zero_dimensional_arrays_are_their_numbers():
    assert describe(np.asarray(1.5)) == describe(1.5)
    assert describe(np.asarray(1.5, dtype=np.float32)) == describe(np.float32(1.5))
    assert describe(np.asarray(1.5)) != describe(np.nextafter(1.5, 2.0))


def test_identical_study_after_with_parameters_reuses_every_case(tmp_path, monkeypatch):
    """Issue reproducer: m.with_parameters(m.parameters()) is the same computation."""
    module = importlib.import_module("ctformer.studies.convergence")   # not the function
    model = _model()
    same = model.with_parameters(model.parameters())
    assert model_identity(same) == model_identity(model)
    first = convergence(model, store=tmp_path, **TOKENS)
    calls = []
    original = module.compute_case
    monkeypatch.setattr(module, "compute_case", lambda study, level: calls.append(level)
                        or original(study, level))
    again = convergence(same, store=tmp_path, **TOKENS)
    assert calls == []
    np.testing.assert_array_equal(_errors(again), _errors(first))


def counting_task(context, case):
    context.append(case)
    return {"value": float(case) ** 2}


def test_directory_at_a_record_path_is_refused_before_computing(tmp_path):
    """Issue reproducer: a directory where a record is to be written: before this fix a raw
    IsADirectoryError naming a temporary file, after recomputing."""
    from ctformer.studies import case_key

    cases = [(case_key({"n": n}), n) for n in (1, 2, 3)]
    blocked = tmp_path / f"{cases[1][0]}.json"
    blocked.mkdir()
    calls = []
    with pytest.raises(PermissionError) as info:
        run_cases(counting_task, calls, cases, store=tmp_path, progress=False)
    assert calls == []                    # nothing was computed
    assert str(blocked) in str(info.value) and "is a directory" in str(info.value)
    assert "Remove or rename it" in str(info.value)
    blocked.rmdir()
    records = run_cases(counting_task, calls, cases, store=tmp_path, progress=False)
    assert [records[k]["value"] for k, _ in cases] == [1.0, 4.0, 9.0]


def test_directory_at_a_record_path_in_a_study_names_the_path(tmp_path):
    model = _model()
    convergence(model, store=tmp_path, **TOKENS)
    record = sorted(tmp_path.glob("*.json"))[0]
    record.unlink()
    record.mkdir()
    with pytest.raises(PermissionError, match=f"{record.name}.*is a directory"):
        convergence(model, store=tmp_path, **TOKENS)

"""Running a study: executors and Dask (same bits), failed cases named by level, Ctrl-C with
the cases kept and a rerun that ends on the same numbers, verdicts at the boundary, plots and
files of short and odd studies."""
from __future__ import annotations

import concurrent.futures
import math

import numpy as np
import pytest

from ctformer.model import ContinuousTransformer
from ctformer.state import Grids
from ctformer.studies import ConvergenceResult, Row, StudyInterrupted, convergence
from ctformer.studies import execution, fit_order, neighbour_orders

from .conftest import require

STUDY = dict(refine="tokens", levels=[4, 8, 16, 32], tokens="midpoint",
             features="gauss-legendre:6", progress=False)


def _u0(x, y):
    return np.sin(np.pi * x) * np.cos(y)


class FailingModel:
    """The sampled initial state is the solution, except at one level: a NaN state
    (``nan_at``) or a raised error (``raise_at``), by the tokens' size or the steps per layer."""

    def __init__(self, nan_at=None, raise_at=None):
        self.nan_at, self.raise_at = nan_at, raise_at

    def solve(self, u0, *, tokens, features, head_features, hidden, scheme, steps_per_layer,
              trajectory):
        if self.raise_at in (tokens.n, steps_per_layer):
            raise ValueError("step size too large for stability")
        u = Grids(tokens, features, head_features, hidden).sample(u0)
        return [u, u * np.nan if tokens.n == self.nan_at else u]


def _columns(result):
    return ([r.error for r in result.table], [r.order for r in result.table],
            result.observed_order, result.min_feature_std)


@pytest.fixture(scope="module")
def model():
    return ContinuousTransformer.random_smooth(seed=3, layers=1)


@pytest.fixture(scope="module")
def serial(model):
    return convergence(model, **STUDY)


@pytest.mark.parametrize("processes", [False, True])
def test_pools_and_dask_clusters_give_the_serial_bits(model, serial, processes):
    distributed = require("distributed")
    runs = []
    if not processes:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            runs.append(convergence(model, executor=pool, **STUDY))
        with concurrent.futures.ProcessPoolExecutor(2) as pool:
            runs.append(convergence(model, executor=pool, **STUDY))
    where = dict(host="127.0.0.1") if processes else {}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=processes,
                                  dashboard_address=":0", **where) as cluster, \
            distributed.Client(cluster) as client:
        runs.append(convergence(model, executor=client, **STUDY))
    assert serial.table[0].error > 0 and math.isfinite(serial.observed_order)
    for run in runs:
        assert _columns(run) == _columns(serial)          # bit for bit


def test_a_nan_solution_is_refused_naming_its_level_and_the_kept_cases(tmp_path):
    """It was ``ValueError: u contains NaN or inf`` from the interpolation: no level."""
    with pytest.raises(FloatingPointError, match=r"the solution at tokens level 16 is not "
                       r"finite \(NaN or inf\)") as info:
        convergence(FailingModel(nan_at=16), u0=_u0, store=tmp_path, **STUDY)
    assert info.value.__notes__[-1] == ("cases kept: 4, 8; still to compute: 16, 32; a rerun "
                                        "with the same store computes only these")
    assert len(list(tmp_path.glob("*.json"))) == 2


@pytest.mark.parametrize("where", ["serial", "threads", "dask"])
def test_a_failing_case_names_its_variable_and_level(where):
    """A step-size failure at 2 steps per layer: the same ``ValueError``, its message led by
    the level (it came bare, with no level), the cause chained where it ran here."""
    study = dict(STUDY, refine="time", levels=[1, 2, 4, 8], tokens="midpoint:4")
    failing = FailingModel(raise_at=2)

    def run(executor=None):
        with pytest.raises(ValueError) as info:
            convergence(failing, u0=_u0, executor=executor, **study)
        assert str(info.value) == "time level 2: step size too large for stability"
        return info.value

    if where == "serial":
        err = run()
        assert isinstance(err.__cause__, ValueError) and "level" not in str(err.__cause__)
        assert err.__notes__ == ["cases finished but not kept (no store): 1; not finished: "
                                 "2, 4, 8"]
    elif where == "threads":
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            err = run(pool)
    else:
        distributed = require("distributed")
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                      dashboard_address=":0") as cluster, \
                distributed.Client(cluster) as client:
            err = run(client)
    assert "not kept (no store)" in err.__notes__[-1]


def _interrupt_after_saves(monkeypatch, count):
    """Ctrl-C lands just after the ``count``-th record is written (before it was counted)."""
    save, saved = execution.CaseStore.save, [0]

    def interrupted(self, key, record):
        save(self, key, record)
        saved[0] += 1
        if saved[0] == count:
            raise KeyboardInterrupt

    monkeypatch.setattr(execution.CaseStore, "save", interrupted)


@pytest.mark.parametrize("where", ["serial", "dask"])
def test_ctrl_c_names_the_cases_kept_and_a_rerun_ends_on_the_same_numbers(
        model, serial, tmp_path, monkeypatch, where):
    """The count was taken before the record was counted: '1 of 4 cases are stored' with 2
    records in the store; it is the store's count now, with the cases themselves."""
    def run(executor=None):
        _interrupt_after_saves(monkeypatch, 2)
        with pytest.raises(StudyInterrupted) as info:
            convergence(model, store=tmp_path, executor=executor, **STUDY)
        monkeypatch.undo()
        return info.value, convergence(model, store=tmp_path, executor=executor, **STUDY)

    if where == "serial":
        err, resumed = run()
    else:
        distributed = require("distributed")
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                      dashboard_address=":0") as cluster, \
                distributed.Client(cluster) as client:
            err, resumed = run(client)
    stored = sorted(execution.CaseStore(tmp_path).load(p.stem)["case"]
                    for p in tmp_path.glob("*.json"))
    assert len(stored) == 4                                    # the rerun finished the study
    assert err.stored == 2 and len(err.kept) == 2 and set(err.kept) <= set(STUDY["levels"])
    assert str(err) == (f"interrupted: 2 of 4 cases are stored in {tmp_path}; rerun the same "
                        "command to resume")
    if where == "serial":
        assert err.kept == (4, 8)
        assert err.__notes__[-1].startswith("cases kept: 4, 8; still to compute: 16, 32")
    assert _columns(resumed) == _columns(serial)


def _result(errors, observed=None, expected=2.0, h=(0.25, 0.125, 0.0625, 0.03125)):
    h = list(h[:len(errors)])
    orders = neighbour_orders(h, errors)
    rows = [Row(level=i, n=round(1 / hi), h=hi, error=e, order=p, seconds=0.0)
            for i, (hi, e, p) in enumerate(zip(h, errors, orders))]
    return ConvergenceResult(
        table=rows, observed_order=fit_order(h, errors) if observed is None else observed,
        expected_order=expected, refine="tokens", method="midpoint", reference="exact",
        norm="l2", min_feature_std=0.4, wall_seconds=0.0)


@pytest.mark.parametrize("observed, met", [(1.7, True), (2.3, True), (1.69, False),
                                           (2.31, False)])
def test_the_stated_tolerance_holds_on_both_sides(observed, met):
    """1.7 against 2 read as a miss (2 - 1.7 = 0.30000000000000004 > 0.3), 2.3 did not."""
    line = _result([1e-2, 2.5e-3, 6e-4], observed=observed).headline()
    assert line.startswith(f"observed order {observed:.2f} (expected 2)")
    assert (";" not in line) == met, line


def test_an_exact_finest_level_is_named_when_no_order_remains():
    line = _result([1e-3, 0.0]).headline()
    assert line == ("no order: an order needs errors above the rounding floor at two levels "
                    "at least; the error is 0 at 1 level(s), which the fit leaves out; "
                    "expected 2")


@pytest.mark.parametrize("errors", [[1e-2], [1e-2, 2.5e-3], [1e-2, 2.5e-3, 0.0],
                                    [1e-3, 4e-3, 1.6e-2]], ids=["one", "two", "zero", "grow"])
def test_plots_and_files_of_short_and_odd_studies(errors, tmp_path):
    require("matplotlib")
    xr = require("xarray")
    result = _result(errors)
    fig = result.plot(tmp_path / "study.png")
    drawn = fig.axes[0].lines[0].get_ydata()
    np.testing.assert_array_equal(drawn, [e for e in errors if e > 0])
    assert (tmp_path / "study.png").stat().st_size > 0
    expected = np.polyfit(np.log(result.h[result.errors > 0]),
                          np.log(result.errors[result.errors > 0]), 1)[0] \
        if sum(e > 0 for e in errors) >= 2 else np.nan
    np.testing.assert_allclose(result.observed_order, expected, rtol=1e-12)
    result.to_netcdf(tmp_path / "study.nc")
    with xr.open_dataset(tmp_path / "study.nc", engine="h5netcdf") as ds:
        np.testing.assert_array_equal(ds["error"].values, errors)
        np.testing.assert_array_equal(ds["n"].values, [r.n for r in result.table])
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_fitted_order_is_polyfit_over_the_levels_above_the_floor(model):
    """Gauss-Legendre features reach 6e-15 at 32 values: below the floor, left out."""
    result = convergence(model, refine="features", levels=[4, 8, 16, 32, 48],
                         features="gauss-legendre", tokens="gauss-legendre:6", progress=False,
                         expected_order=3)
    h, e = result.h, result.errors
    assert e[-1] < 1e-13 < 1e-10 < e[-2]
    np.testing.assert_allclose(result.observed_order,
                               np.polyfit(np.log(h[:-1]), np.log(e[:-1]), 1)[0], rtol=1e-12)
    orders = [r.order for r in result.table[1:-1]]
    np.testing.assert_allclose(orders, np.log(e[:-1] / e[1:]) / np.log(h[:-1] / h[1:]),
                               rtol=1e-12)


@pytest.mark.parametrize("reference, message", [
    (np.zeros((5, 4)), r"reference has shape \(5, 4\), the solutions on these grids \(6, 4\)"),
    (np.full((6, 4), np.nan), r"reference holds NaN or inf; pass a finite u\*\(T\)")])
def test_work_precision_refuses_a_reference_it_cannot_measure_against(model, reference, message):
    """A wrong shape failed inside NumPy ('operands could not be broadcast'); a NaN reference
    gave NaN errors, and ``table()`` then failed on errors[0] = nan."""
    from ctformer.discretizations import get
    from ctformer.studies import smooth_initial_state, work_precision

    with pytest.raises(ValueError, match=message):
        work_precision(model, smooth_initial_state, tokens=get("gauss-legendre", 6),
                       features=get("gauss-legendre", 4), schemes=("dopri5",), rtols=(1e-3,),
                       reference=reference)


def test_a_narrow_error_axis_has_labels_that_differ():
    """Errors within 15 %: matplotlib falls back to linear ticks, which were labelled
    0.0013, 0.0013, 0.0014, 0.0014, ... (two digits); every label now names its own tick."""
    require("matplotlib")
    import matplotlib.pyplot as plt

    from ctformer.studies import plot_convergence

    fig = plot_convergence(_result([1.5e-3, 1.4e-3, 1.3e-3]), slopes=False)
    ax = fig.axes[0]
    fig.canvas.draw()
    low, high = ax.get_ylim()
    shown = [(t, label.get_text()) for t, label in zip(ax.get_yticks(), ax.get_yticklabels())
             if low <= t <= high]
    assert len(shown) >= 2
    labels = [text for _, text in shown]
    assert len(set(labels)) == len(labels), labels
    for tick, text in shown:                 # each label reads back as its tick, to 1 %
        assert float(text) == pytest.approx(tick, rel=1e-2)
    plt.close(fig)


def test_richardson_with_an_expected_order_0_is_refused_before_dividing_by_0(model):
    """Fourier tokens on non-periodic data expect 0 in the maximum norm: (h_c/h_f)^0 - 1 = 0,
    and the study blamed an overflow ('max |u| = 2.93 ... has blown up')."""
    from ctformer.studies.contracts import NonPeriodicDataWarning

    with pytest.warns(NonPeriodicDataWarning), \
            pytest.raises(ValueError, match=r"reference='richardson' needs an expected order "
                          r"> 0, and this study expects 0 \(fourier is spectral only on "
                          r"periodic data"):
        convergence(model, refine="tokens", levels=[4, 8, 16], tokens="fourier",
                    features="gauss-legendre:6", error_norm="max", reference="richardson",
                    progress=False)

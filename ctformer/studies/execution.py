r"""Running the cases of a study: executors, Dask, an on-disk store, resume, progress.

A study is a list of independent *cases* (one solve per refinement level). :func:`run_cases`
sends them to

* nobody (``executor=None``): they run one after the other in this process;
* any :class:`concurrent.futures.Executor` (threads or processes): the model travels to
  process workers pickled once (models pickle with the standard library; :mod:`cloudpickle`,
  when installed, carries the user's initial-data function too, even a lambda);
* a :class:`dask.distributed.Client`: the model is scattered to the workers once, cases are
  submitted with ``client.submit`` and collected as they finish.

With a ``store`` directory every finished case is kept in a :class:`ctformer.studies.store.CaseStore`
(one checksummed record per case, written atomically): re-running the same study computes
only the missing cases.

The store, and the path of every record still to write, are checked *before* anything is
computed, an interrupted study (Ctrl-C) raises :class:`StudyInterrupted` saying how many
cases are stored where, and a Dask worker lost with the shared model raises
:class:`WorkerLost` with the same information; both count the records in the store and hold
the kept cases (``kept``). These, and the error of a case that failed, carry a note naming
the cases kept and those still to compute.
"""
from __future__ import annotations

import concurrent.futures
import math
import pickle
import sys
import warnings
from typing import Any, Callable, Sequence

from ..validation import boolean
from .store import (RECORD_SCHEMA, CaseStore, CorruptRecordWarning, _nonfinite,
                    case_key, check_key, record_checksum, seal_record)

__all__ = ["CaseStore", "case_key", "run_cases", "is_dask_client", "CorruptRecordWarning",
           "StudyInterrupted", "WorkerLost", "RECORD_SCHEMA", "record_checksum", "finite_or_none"]



class StudyInterrupted(KeyboardInterrupt):
    """Ctrl-C during :func:`run_cases`; finished cases are kept in the store.

    Attributes
    ----------
    stored : int
        Number of cases of this study whose records are in the store (0 without a store).
    total : int
        Number of cases of the study.
    directory : str or None
        The store directory, ``None`` without a store.
    kept : tuple
        The cases (as given to :func:`run_cases`: the levels of a study) whose records are in
        the store, in the order of the study; without a store, those that were finished.
    """

    def __init__(self, stored: int, total: int, directory: str | None, kept=()):
        self.stored, self.total, self.directory = int(stored), int(total), directory
        self.kept = tuple(kept)
        super().__init__(str(self))

    def __reduce__(self):  # pickled with its counts (a process pool, a Dask client), not its text
        return type(self), (self.stored, self.total, self.directory, self.kept)

    def __str__(self) -> str:
        if self.directory is None:
            return (f"interrupted: {self.stored} of {self.total} cases were finished but nothing "
                    "was kept (no store); pass a store directory to keep finished cases")
        return (f"interrupted: {self.stored} of {self.total} cases are stored in "
                f"{self.directory}; rerun the same command to resume")


class WorkerLost(RuntimeError):
    """A Dask worker holding the shared model died; finished cases are kept in the store.

    Attributes are those of :class:`StudyInterrupted`.
    """

    def __init__(self, stored: int, total: int, directory: str | None, detail: str = "",
                 kept=()):
        self.stored, self.total, self.directory = int(stored), int(total), directory
        self.detail, self.kept = detail, tuple(kept)
        super().__init__(str(self))

    def __reduce__(self):
        return type(self), (self.stored, self.total, self.directory, self.detail, self.kept)

    def __str__(self) -> str:
        where = ("nothing was kept (no store)" if self.directory is None
                 else f"{self.stored} of {self.total} cases are stored in {self.directory}")
        return f"worker lost: a Dask worker holding the model died; {where}; rerun to resume"


def is_dask_client(obj) -> bool:
    """True for a :class:`dask.distributed.Client` (checked without importing Dask)."""
    return type(obj).__module__.startswith("distributed") and hasattr(obj, "gather") \
        and hasattr(obj, "submit") and hasattr(obj, "scatter")


def _dumps(obj) -> bytes:
    try:
        import cloudpickle
    except ImportError:  # pragma: no cover - cloudpickle comes with dask
        dumps = pickle.dumps
    else:
        dumps = cloudpickle.dumps
    try:
        return dumps(obj)
    except (TypeError, pickle.PicklingError, AttributeError) as exc:
        raise TypeError(_UNPICKLABLE.format(exc=exc)) from exc


_UNPICKLABLE = ("the model cannot be sent to other processes ({exc}); objects it holds (e.g. a "
                "cached sparse factorization) do not pickle. Use executor=None or a "
                "ThreadPoolExecutor, or a freshly built model")


def _call_pickled(blob: bytes, case):
    task, context = pickle.loads(blob)
    return task(context, case)


def _worker_lost_errors() -> tuple:
    """Exceptions by which Dask reports a lost worker or lost scattered data."""
    errors = [concurrent.futures.CancelledError]
    try:
        import asyncio

        errors.append(asyncio.CancelledError)
        from distributed.client import FutureCancelledError

        errors.append(FutureCancelledError)
        from distributed.scheduler import KilledWorker

        errors.append(KilledWorker)
    except ImportError:  # pragma: no cover - only reached with a Dask client
        pass
    return tuple(errors)


def run_cases(task: Callable, context: Any, cases: Sequence[tuple[str, Any]], *, executor=None,
              store=None, progress: bool = True, description: str = "cases",
              costs: Sequence[float] | None = None, required: dict | None = None) -> dict:
    """Run ``task(context, case)`` for every ``(key, case)`` not already in ``store``.

    Parameters
    ----------
    task : callable
        A module-level function ``task(context, case) -> dict`` (picklable by reference).
    context : object
        What every case shares (the model, the initial state, the scheme); sent once.
    cases : sequence of (str, object)
        Case keys (see :func:`case_key`; 1 to 128 letters, digits, ``_`` or ``-``) and the
        case descriptions given to ``task``.
    executor : None, concurrent.futures.Executor or dask.distributed.Client, optional
        Where the cases run; ``None`` runs them in this process, in order.
    store : None, str, os.PathLike or CaseStore, optional
        Directory of finished cases; trustworthy records found there are not recomputed,
        corrupt ones are reported (:class:`CorruptRecordWarning`) and recomputed.
    progress : bool, optional
        Show a :mod:`tqdm` progress bar on standard error.
    description : str, optional
        Label of the progress bar.
    costs : sequence of float, optional
        The relative work of each case: the bar then shows the percentage of the work done
        (the finest level of a study, often its reference, is most of it), not of the cases.
    required : dict, optional
        The fields the caller reads from every record, name to kind (``"array"``,
        ``"number"``, ...) or to ``(kind, trailing shape)``: a stored record that lacks one,
        or declares another kind or shape, is reported as corrupt and its case recomputed
        (instead of a ``KeyError`` or a broadcast of the wrong shape afterwards).

    Returns
    -------
    dict
        Case key to record: the dictionary returned by ``task`` (arrays turned into lists),
        plus ``"key"``, ``"case"``, ``"schema"``, ``"fields"`` and ``"checksum"``.

    Raises
    ------
    TypeError
        If ``executor`` is neither ``None``, an Executor nor a Dask client, or ``progress`` is
        not ``True`` or ``False``.
    ValueError
        If a key is not a valid case key (e.g. ``"../x"`` or an absolute path).
    PermissionError
        If cases must be computed and the store is not writable, or something other than a
        file (a directory) is where a record is to be written (raised before computing,
        naming the directory or the record path).
    StudyInterrupted
        On Ctrl-C (a :class:`KeyboardInterrupt`): how many cases are stored where, and which
        (``kept``).
    WorkerLost
        When the Dask worker holding the shared model dies; a rerun resumes.
    Exception
        What a case raised, as it came, with a note naming the cases kept and those still to
        compute.
    """
    progress = boolean(progress, "progress")  # "no" is a string, and a string is true
    if not (executor is None or isinstance(executor, concurrent.futures.Executor)
            or is_dask_client(executor)):
        raise TypeError("executor must be None, a concurrent.futures.Executor or a "
                        f"dask.distributed.Client, got {type(executor).__name__}")
    cases = _checked_cases(cases)
    case_store = store if isinstance(store, CaseStore) else (None if store is None else CaseStore(store))
    records, pending = _stored_records(case_store, cases, required)
    directory = None if case_store is None else str(case_store.directory)
    stored = [len(records)]  # records in the store, for the interrupt message

    from tqdm.auto import tqdm

    share = _shares(cases, costs)
    done = sum(share[key] for key, _ in cases if key in records)
    bar = tqdm(total=100.0 if costs is not None else len(cases), initial=done, desc=description,
               disable=not progress, file=sys.stderr, leave=True,
               bar_format="{l_bar}{bar}| {n:.0f}% of the work{postfix} [{elapsed}<{remaining}]"
               if costs is not None else None, mininterval=0 if costs is not None else 0.1)
    counted = [len(cases) - len(pending)]

    def advance(key):
        counted[0] += 1
        if costs is not None:  # the bar is the work; the cases are told beside it
            bar.set_postfix_str(f"{counted[0]}/{len(cases)} cases", refresh=False)
        bar.update(share[key])

    if costs is not None:
        bar.set_postfix_str(f"{counted[0]}/{len(cases)} cases")

    def finish(key, case, output):
        record = seal_record(key, {**dict(output), "case": case})
        bad = [name for name in record["fields"] if _nonfinite(record[name])]
        if case_store is not None and not bad:
            case_store.save(key, record)
            stored[0] += 1
        elif case_store is not None:
            warnings.warn(f"case {key}: fields {bad} hold NaN or inf; the result is returned "
                          "but not stored", RuntimeWarning, stacklevel=3)
        records[key] = record
        advance(key)

    try:
        if pending:
            _run_pending(executor, task, context, pending, finish, stored, len(cases), directory)
    except StudyInterrupted:
        raise
    except (KeyboardInterrupt, Exception) as exc:
        reported = _reported(exc, case_store, cases, records)
        if reported is exc:  # a failed case: its own type, message and cause, with the note
            raise
        raise reported from None
    finally:
        bar.close()
    return {key: records[key] for key, _ in cases}


def _reported(exc: BaseException, case_store, cases, records) -> BaseException:
    """What :func:`run_cases` raises for ``exc``: :class:`StudyInterrupted` for Ctrl-C,
    :class:`WorkerLost` recounted, else ``exc`` itself (a failed case, named by the task); each
    with a note naming the cases kept and those still to compute."""
    if case_store is None:
        kept = {key: case for key, case in cases if key in records}
    else:  # counted in the store: an interrupt between a write and its count left it one short
        kept = {key: case for key, case in cases if case_store.path(key).is_file()}
    directory = None if case_store is None else str(case_store.directory)
    if isinstance(exc, KeyboardInterrupt):
        exc = StudyInterrupted(len(kept), len(cases), directory, kept.values())
    elif isinstance(exc, WorkerLost):
        exc = WorkerLost(len(kept), len(cases), directory, exc.detail, kept.values())
    rest = [case for key, case in cases if key not in kept]
    done, left = (("kept", "still to compute") if directory is not None else
                  ("finished but not kept (no store)", "not finished"))
    add_note(exc, f"cases {done}: {', '.join(map(str, kept.values())) or 'none'}; {left}: "
                  f"{', '.join(map(str, rest)) or 'none'}"
             + ("; a rerun with the same store computes only these" if directory else ""))
    return exc


def add_note(exc: BaseException, text: str) -> None:
    """``exc.add_note(text)``: printed under the traceback from Python 3.11; on 3.10 the note
    is kept in ``exc.__notes__`` all the same (as 3.11 keeps it), only not printed."""
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:  # pragma: no cover - Python 3.10
        exc.__notes__ = [*getattr(exc, "__notes__", []), text]


def _shares(cases, costs) -> dict:
    """Each case's step of the progress bar: 1, or its percentage of the total cost."""
    if costs is None:
        return {key: 1 for key, _ in cases}
    costs = [float(c) for c in costs]
    if len(costs) != len(cases) or not all(c > 0 for c in costs):
        raise ValueError(f"costs must be one positive number per case ({len(cases)}), got {costs}")
    total = sum(costs)
    return {key: 100.0 * c / total for (key, _), c in zip(cases, costs)}


def _checked_cases(cases) -> list:
    """The (key, case) pairs, each key validated (it becomes a file name in the store)."""
    cases = list(cases)
    for item in cases:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ValueError(f"cases must be (key, case) pairs, got {item!r}")
        check_key(item[0])
    return cases


def _stored_records(case_store, cases, required=None) -> tuple[dict, list]:
    """Trustworthy stored records, and the cases still to compute (store checked writable)."""
    records, pending = {}, []
    for key, case in cases:
        record = case_store.load(key, required) if case_store is not None else None
        if record is None:
            pending.append((key, case))
        else:
            records[key] = record
    if pending and case_store is not None:
        case_store.check_writable()
    return records, pending


def _run_pending(executor, task, context, pending, finish, stored, total, directory):
    """Compute the pending cases here, on an Executor, or on a Dask cluster."""
    if executor is None:
        for key, case in pending:
            finish(key, case, task(context, case))
        return
    if is_dask_client(executor):
        _run_dask(executor, task, context, pending, finish, stored, total, directory)
        return
    if isinstance(executor, concurrent.futures.ThreadPoolExecutor):
        submit = lambda case: executor.submit(task, context, case)  # noqa: E731
    else:
        blob = _dumps((task, context))
        submit = lambda case: executor.submit(_call_pickled, blob, case)  # noqa: E731
    futures = {submit(case): (key, case) for key, case in pending}
    try:
        for future in concurrent.futures.as_completed(futures):
            finish(*futures[future], future.result())
    finally:
        for future in futures:
            future.cancel()


def _run_dask(client, task, context, pending, finish, stored, total, directory):
    from distributed import as_completed

    _dumps(context)  # fail early, with a clear message, if the model does not pickle
    lost = _worker_lost_errors()
    shared = client.scatter(context, broadcast=True, hash=False)
    futures = {client.submit(task, shared, case, pure=False): (key, case) for key, case in pending}
    try:
        for future in as_completed(list(futures)):
            try:
                output = future.result()
            except lost as exc:
                raise WorkerLost(stored[0], total, directory, detail=repr(exc)) from None
            finish(*futures[future], output)
    finally:
        for future in futures:
            future.cancel()


def finite_or_none(value):
    """``None`` for NaN/inf (JSON and CSV friendly), else the float."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None

r"""Running the cases of a study: executors, Dask, an on-disk store, resume, progress.

A study is a list of independent *cases* (one solve per refinement level). :func:`run_cases`
sends them to

* nobody (``executor=None``): they run one after the other in this process;
* any :class:`concurrent.futures.Executor` (threads or processes): the model travels to
  process workers pickled once (with :mod:`cloudpickle` when it is installed, so closures
  and lambdas inside the model are fine);
* a :class:`dask.distributed.Client`: the model is scattered to the workers once, cases are
  submitted with ``client.submit`` and collected as they finish.

With a ``store`` directory every finished case is written to ``<store>/<key>.json`` at once,
atomically (a temporary file in the same directory, then :func:`os.replace`), so a killed
study leaves only complete records. Re-running the same study loads those records and
computes only the missing cases: nothing is lost and nothing is computed twice. The key is
a SHA-256 hash of everything that determines the case (model fingerprint, discretizations,
scheme, steps per layer, initial state, evaluation grid and level).
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import os
import pickle
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["CaseStore", "case_key", "run_cases", "is_dask_client"]


def case_key(parameters: dict) -> str:
    """SHA-256 hex digest of the canonical JSON form of ``parameters``."""
    text = json.dumps(parameters, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class CaseStore:
    """A directory holding one JSON record per finished case.

    Parameters
    ----------
    directory : str or os.PathLike
        Created if missing.

    Raises
    ------
    TypeError
        If ``directory`` is not a path.
    ValueError
        If ``directory`` exists and is not a directory.
    """

    def __init__(self, directory):
        if not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"store must be a directory path, got {type(directory).__name__}")
        self.directory = Path(directory)
        if self.directory.exists() and not self.directory.is_dir():
            raise ValueError(f"store {str(self.directory)!r} exists and is not a directory")
        self.directory.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        """Where the record of case ``key`` lives."""
        return self.directory / f"{key}.json"

    def load(self, key: str) -> dict | None:
        """The stored record of ``key``, or ``None`` when absent or unreadable (warns)."""
        path = self.path(key)
        if not path.exists():
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            warnings.warn(f"ignoring unreadable study record {path}: {exc}", stacklevel=3)
            return None
        if not isinstance(record, dict) or record.get("key") != key:
            warnings.warn(f"ignoring study record {path}: it belongs to another case", stacklevel=3)
            return None
        return record

    def save(self, key: str, record: dict) -> None:
        """Write ``record`` atomically: temporary file in the same directory, then rename."""
        text = json.dumps(record, allow_nan=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, 0o644)  # mkstemp makes private files; records are plain results
            os.replace(tmp, self.path(key))
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def __repr__(self) -> str:
        return f"CaseStore({str(self.directory)!r})"


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


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def run_cases(task: Callable, context: Any, cases: Sequence[tuple[str, Any]], *, executor=None,
              store=None, progress: bool = True, description: str = "cases") -> dict:
    """Run ``task(context, case)`` for every ``(key, case)`` not already in ``store``.

    Parameters
    ----------
    task : callable
        A module-level function ``task(context, case) -> dict`` (picklable by reference).
    context : object
        What every case shares (the model, the initial state, the scheme); sent once.
    cases : sequence of (str, object)
        Case keys (see :func:`case_key`) and the case descriptions given to ``task``.
    executor : None, concurrent.futures.Executor or dask.distributed.Client, optional
        Where the cases run; ``None`` runs them in this process, in order.
    store : None, str or os.PathLike, optional
        Directory of finished cases; records found there are not recomputed.
    progress : bool, optional
        Show a :mod:`tqdm` progress bar on standard error.
    description : str, optional
        Label of the progress bar.

    Returns
    -------
    dict
        Case key to record: the dictionary returned by ``task`` (arrays turned into lists),
        plus ``"key"`` and ``"case"``.

    Raises
    ------
    TypeError
        If ``executor`` is neither ``None``, an Executor nor a Dask client.
    """
    if not (executor is None or isinstance(executor, concurrent.futures.Executor)
            or is_dask_client(executor)):
        raise TypeError("executor must be None, a concurrent.futures.Executor or a "
                        f"dask.distributed.Client, got {type(executor).__name__}")
    case_store = store if isinstance(store, CaseStore) else (None if store is None else CaseStore(store))
    records: dict[str, dict] = {}
    pending = []
    for key, case in cases:
        record = case_store.load(key) if case_store is not None else None
        if record is None:
            pending.append((key, case))
        else:
            records[key] = record

    from tqdm.auto import tqdm

    bar = tqdm(total=len(cases), initial=len(cases) - len(pending), desc=description,
               disable=not progress, file=sys.stderr, leave=True)

    def finish(key, case, output):
        record = _jsonable(dict(output))
        record["key"] = key
        record["case"] = _jsonable(case)
        if case_store is not None:
            case_store.save(key, record)
        records[key] = record
        bar.update(1)

    try:
        if not pending:
            pass
        elif executor is None:
            for key, case in pending:
                finish(key, case, task(context, case))
        elif is_dask_client(executor):
            from distributed import as_completed

            _dumps(context)  # fail early, with a clear message, if the model does not pickle
            shared = executor.scatter(context, broadcast=True, hash=False)
            futures = {executor.submit(task, shared, case, pure=False): (key, case)
                       for key, case in pending}
            try:
                for future in as_completed(list(futures)):
                    finish(*futures[future], future.result())
            finally:
                for future in futures:
                    future.cancel()
        else:
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
    finally:
        bar.close()
    return {key: records[key] for key, _ in cases}


def finite_or_none(value):
    """``None`` for NaN/inf (JSON and CSV friendly), else the float."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None

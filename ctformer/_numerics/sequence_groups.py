r"""The sequences of a batch advanced in groups, one group a task, with no barrier inside a step.

A network's state :math:`u` of shape :math:`(B, N, d)` holds :math:`B` sequences that never
meet: attention mixes the tokens of one sequence,

.. math::  (\mathrm{Attn}\, u)_b(x) = \int_X \kappa(u_b; x, x')\, V u_b(x')\, dx',

and every other map (feature maps, normalizations, residual sums, the steps of a splitting
scheme) acts token by token. A step of the whole batch is therefore the step of each sequence,
and a fixed-step solve of a NumPy state can advance groups of whole sequences on separate
threads, each group through all the sub-steps of a step (normalization, products, attention,
activation, residual sum) without waiting for the other threads in between. The operators'
own parallel passes wait for every thread after each pass, and leave the normalizations and
sums between passes to the calling thread.

On two threads (AMD EPYC, family 23 model 49) forwards of 8 x 128 and 4 x 512 tokens took
0.90-0.94 of the passes' time (MiniLM, GPT-2, Llama, float32 and float64), and 2 x 128 to
16 x 32 0.84-0.89; groups of fewer than 128 rows were slower (1.05-1.16 at 2 x 16 and
2 x 32: small states lose their prepared plans inside a task).

A pass of the tasks takes each group through the layers that take about ``CHUNK_SECONDS``
(timed on the first layer): a pass per layer was 1-4% slower than one for the whole solve
(each pass wakes the pool's thread and waits for the slower group), and one pass for the
whole solve would make Ctrl-C wait for all of it.

The groups depend on the state's shape and on the machine's CPU count only (:func:`slices`),
never on the thread count, and each group runs in a worker task with one BLAS thread whatever
the number of workers: the result has the same bits for every thread count. Its last bits
differ from the operators' passes on the whole batch (other product shapes).
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import ClassVar

import numpy as np

from ..backend import all_finite
from ..environment import choice
from .threads import run_blas_tasks

__all__ = ["CHUNK_SECONDS", "SequenceGroups", "machine_cpus", "plan", "slices"]

# A group holds the whole sequences of about _GROUP_ROWS rows (tokens): one thread's products
# then multiply 512 rows at a time. 8 x 128 tokens in groups of 4 sequences took 0.90-0.94 of
# the passes' time, in groups of 2 (256 rows) 0.94-0.95 (AMD EPYC, family 23 model 49).
_GROUP_ROWS = 512
# No group of fewer rows: small states are faster on the operators' prepared plans.
_LEAST_ROWS = 128
_LOCK = threading.Lock()
_SEEN: set = set()  # (dtype, group shape, scheme, flows) advanced in this process (_first_seen)
#: A pass of the tasks covers the segments (layers) that take about this long, as timed on
#: the first one: Ctrl-C waits for one pass, and keeps the state before it.
CHUNK_SECONDS = 0.25


@lru_cache(maxsize=1)
def machine_cpus() -> int:
    """The CPUs this process may run on (its affinity; else ``os.cpu_count()``), read once:
    the groups must give every CPU one, and must not change with the thread count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def slices(u) -> tuple | None:
    r"""The groups of sequences of a state ``u`` of shape :math:`(B, N, d)`, as slices of its
    first axis, or None where the state is advanced whole.

    A group holds :math:`s = \min(\lceil 512 / N \rceil, \lfloor B / P \rfloor)` sequences
    (:math:`P` = :func:`machine_cpus`): about 512 rows, fewer where that leaves a CPU without
    a group. None for other arrays than float32 and float64 NumPy states of three axes, for a
    group of fewer than 128 rows, and for a single group. The last group may be shorter.
    None too with ``CTFORMER_SEQUENCE_GROUPS=off`` (the default is ``auto``): every solve
    then advances the whole batch, whose bits do not depend on the CPU count.

    Raises
    ------
    ValueError
        If ``CTFORMER_SEQUENCE_GROUPS`` is not one of auto, off (read at every call)."""
    if choice("CTFORMER_SEQUENCE_GROUPS", ("auto", "off")) == "off":
        return None
    if type(u) is not np.ndarray or u.ndim != 3 or u.dtype not in (np.float32, np.float64):
        return None
    batch, tokens = u.shape[0], u.shape[1]
    per = min(-(-_GROUP_ROWS // max(tokens, 1)), batch // machine_cpus())
    if per < 1 or per * tokens < _LEAST_ROWS or per >= batch:
        return None
    return tuple(slice(start, min(batch, start + per)) for start in range(0, batch, per))


@dataclass(frozen=True)
class SequenceGroups:
    """Groups of a batch (``slices`` of its first axis) and each group's piecewise problem.

    ``problems[g]`` is the problem of the sequences ``slices[g]`` (the whole batch's problem
    where it does not depend on the batch, or the problem of the group's padding mask);
    ``whole`` is the whole batch's, which repeats steps that failed in a group so that the
    error names the batch's own indices (a token ``(1, 5)``, not ``(0, 5)`` of a group)."""

    slices: tuple
    problems: tuple
    whole: object
    chunk_seconds: ClassVar[float] = CHUNK_SECONDS  # the duration of a pass (module constant)

    def with_first(self, problem) -> "SequenceGroups":
        """The groups with the first group's problem replaced (a solve counting its
        evaluations on one group only)."""
        return replace(self, problems=(problem,) + self.problems[1:])

    def advance(self, scheme, u, segments, steps: int, keep: bool):
        """Segments ``segments`` (``(index, h)`` pairs, consecutive) of ``steps`` steps each from
        ``u``, in one pass of worker tasks, a task advancing one group through all of them
        (:func:`run_blas_tasks`). Returns ``(states, failed)``: the batch's state at the end of
        each segment (only the last one unless ``keep``), and the place in ``segments`` of
        the first segment after which a group's state was not finite (None if none was; the
        states after it are not computed)."""
        states, failed = [u[s] for s in self.slices], [len(segments)] * len(self.slices)
        kept = [[] for _ in self.slices]

        def worker(next_task):
            while (g := next_task()) is not None:
                v, problem = states[g], self.problems[g].problems
                for place, (index, h) in enumerate(segments):
                    for _ in range(steps):
                        v = scheme.step(problem[index], v, h)
                    if keep:
                        kept[g].append(v)
                    if not all_finite(v):
                        failed[g] = place
                        break
                states[g] = v

        tasks = list(range(len(states)))
        try:
            if _first_seen(u.dtype, states[0].shape, scheme, self.problems[0].problems[segments[0][0]]):
                # the first group alone first: the choices this machine measures once (products,
                # softmax rows, block sizes, FFT engines) are timed on an otherwise idle machine
                run_blas_tasks(worker, tasks[:1], True)
                tasks = tasks[1:]
            run_blas_tasks(worker, tasks, True)
        except Exception:
            # the whole batch from the same start, as the ungrouped solve: its error names the
            # batch's indices, or its state stops being finite first
            v = u
            for place, (index, h) in enumerate(segments):
                for _ in range(steps):
                    v = scheme.step(self.whole.problems[index], v, h)
                if not all_finite(v):
                    return [], place
            raise  # the whole batch's steps did not fail: the group's error as it is
        first = min(failed)
        if first < len(segments):
            return [], first
        if not keep:
            return [np.concatenate(states, axis=0)], None
        return [np.concatenate(column, axis=0) for column in zip(*kept)], None


def _first_seen(dtype, shape, scheme, problem) -> bool:
    """True the first time in this process that a group of ``shape`` and ``dtype`` is advanced
    by ``scheme`` on ``problem`` (a layer's split problem, whose flows make a network's
    operators): only then can its step meet a choice not yet measured."""
    key = (np.dtype(dtype).str, shape, type(scheme).__name__, len(problem.flows))
    with _LOCK:
        if key in _SEEN:
            return False
        _SEEN.add(key)
        return True


def plan(u, padding_mask, problem, build) -> SequenceGroups | None:
    """The :class:`SequenceGroups` of a fixed-step solve of ``u`` (None where :func:`slices`
    is None): ``problem`` for every group without a ``padding_mask``, else ``build(mask)``
    for each group's rows of it."""
    groups = slices(u)
    if groups is None:
        return None
    if padding_mask is None:
        return SequenceGroups(groups, (problem,) * len(groups), problem)
    return SequenceGroups(groups, tuple(build(padding_mask[s]) for s in groups), problem)

r"""What a restart must share with the solve it continues: one computation, not another one.

A restart continues the saved solve exactly only with the same right-hand side and the same
control. :func:`recorded` reads what a :class:`~ctformer.Solution` (or its file) says about its
computation: the scheme, the tolerances and error norm of a controlled solve and the
controller's settings that choose its step sizes (:data:`CONTROL`), each discretization by its
``repr``, the reference length :math:`L` of positions (``context_length``), and a fingerprint
of the model, and the step of a fixed-step solve (``dt``: the step :math:`h` of particles and
mean fields; ``steps_per_layer``: a model's), read from its step statistics as
:math:`(t_{\rm last} - t_0)/n` over its :math:`n` steps; :func:`refuse_another` compares them with
the continued solve and names every difference.

A particle system or mean field has no parameters of a model: its fingerprint
(:func:`system_fingerprint`) digests every public attribute (beta, the head matrices, masks,
weights, degrees, noise) in full.

The model's fingerprint (:func:`model_fingerprint`) is a BLAKE2 digest of the model's class,
its number of layers, and each parameter's name, shape, dtype and 16 of its values, spread
over the array (about 8 ms for the 1118 arrays of a GPT-2 of 124M parameters): a model with
other weights (another seed, checkpoint or fine-tuning) differs in all of them. A change to a
single weight between the sampled ones, or to the model's structure alone, is not seen; the
full SHA-256 of every weight (:func:`ctformer.studies.model_identity`, 3.4 s for that GPT-2)
is what a study's store uses, where a stored result is reused without being recomputed.
"""
from __future__ import annotations

import hashlib
import math
import weakref

import numpy as np

from .. import labelled_methods
from ..backend import to_host

__all__ = ["model_fingerprint", "system_fingerprint", "mask_digest", "recorded", "refuse_another", "computation",
           "CONTROL", "control_settings", "fixed_step"]

#: The :class:`~ctformer.solvers.PIController` settings besides the tolerances that choose the
#: step sizes (``dt0`` does not: a restart takes its first step from the saved solve; nor do
#: ``dt_min`` and ``max_steps``, which only end a solve).
CONTROL = ("pcoeff", "icoeff", "safety", "factor_min", "factor_max")


def control_settings(controller) -> dict:
    """``{name: value}`` of :data:`CONTROL` for ``controller``."""
    return {name: float(getattr(controller, name)) for name in CONTROL}

_GRID_NAMES = ("tokens", "features", "head_features", "hidden")
_SAMPLES = 16


def model_fingerprint(model) -> str:
    """A hex digest of ``model``'s class, layers and sampled parameter values (module notes).

    Remembered for a model whose parameters are all read-only NumPy arrays (they cannot
    change; a converted model's shared tensors are watched by the model itself)."""
    cached = _FINGERPRINTS.get(id(model))
    if cached is not None and cached[0]() is model:
        return cached[1]
    parameters = model.parameters()
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{type(model).__qualname__}:{len(getattr(model, 'blocks', ()))}".encode())
    for name, values in sorted(parameters.items()):
        if getattr(getattr(values, "device", None), "type", None) == "cpu":
            values = to_host(values)  # a torch tensor on the CPU: its memory, no copy
        shape = tuple(values.shape)
        size = math.prod(shape)
        count = min(size, _SAMPLES)
        picks = np.arange(count) * (size - 1) // max(count - 1, 1)
        if not shape:
            sample = values.reshape(1)
        else:
            where = np.unravel_index(picks, shape)  # no copy of a strided view (reshape would)
            sample = values[where] if type(values) is np.ndarray else values[_like(values, where)]
        sample = np.ascontiguousarray(to_host(sample))
        digest.update(f"{name}:{shape}:{sample.dtype.str}:".encode())
        digest.update(sample.tobytes())
    found = digest.hexdigest()
    if all(type(v) is np.ndarray and not v.flags.writeable for v in parameters.values()):
        try:
            _FINGERPRINTS[id(model)] = (weakref.ref(model, lambda _, key=id(model): _FINGERPRINTS.pop(key, None)),
                                        found)
        except TypeError:  # a model without weak references: computed each time
            pass
    return found


_FINGERPRINTS: dict = {}


def system_fingerprint(system) -> str:
    """A hex digest of ``system``'s class and every public attribute: numbers, strings, flags
    and arrays (NumPy, torch, CuPy: dtype, shape and every value), also inside tuples and
    lists. Attributes of other types (a basis, a backend) follow from those and are left out."""
    digest = hashlib.blake2b(type(system).__qualname__.encode(), digest_size=16)
    for name, value in sorted(vars(system).items()):
        if not name.startswith("_"):
            _digest_value(digest, name, value)
    return digest.hexdigest()


def _digest_value(digest, name, value) -> None:
    if value is None or isinstance(value, (bool, int, float, complex, str)):
        digest.update(f"{name}={value!r};".encode())
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _digest_value(digest, f"{name}[{i}]", item)
    elif hasattr(value, "shape") and hasattr(value, "dtype"):
        host = np.ascontiguousarray(to_host(value))
        digest.update(f"{name}:{host.shape}:{host.dtype.str}:".encode())
        digest.update(host.tobytes())


def mask_digest(mask) -> str:
    """``"none"``, or a hex digest of the boolean padding mask ``mask`` (its shape and every
    entry: a mask is small, and one other entry is another computation)."""
    if mask is None:
        return "none"
    values = np.ascontiguousarray(to_host(mask), dtype=bool)
    digest = hashlib.blake2b(f"{values.shape}:".encode(), digest_size=16)
    digest.update(np.packbits(values).tobytes())
    return digest.hexdigest()


def _like(values, where):
    """The index arrays ``where`` in the array library of ``values`` (torch, CuPy)."""
    import array_api_compat

    xp = array_api_compat.array_namespace(values)
    device = array_api_compat.device(values)
    return tuple(xp.asarray(w, device=device) for w in where)


_IDENTITY = ("model_fingerprint", "padding_mask")  # digests: the model, the padding mask


def _length(value):
    """A context length (None, a number, a pair; a file's int, float or array) as one string,
    ``"7.0"`` or ``"(16.0, 16.0)"``; None stays None (the solve used no positions: nothing to
    compare)."""
    if value is None:
        return None
    values = np.asarray(value, dtype=np.float64).reshape(-1)
    return repr(float(values[0])) if np.ndim(value) == 0 else repr(tuple(float(v) for v in values))


def fixed_step(accepted, step_times, t0, stopped=False):
    r"""The step :math:`h = (t_{\rm last} - t_0)/n` of a fixed-step solve that took ``accepted``
    (:math:`n`) steps from ``t0`` to the last entry of ``step_times``; None when one of them is
    missing (a file written before ``t0`` was recorded) or no step was taken.

    ``stopped``: a terminal event ended the solve, and the last entry is the event's depth inside
    its step, not a step's end: :math:`h` is read from the :math:`n - 1` steps before it (None
    for :math:`n = 1`)."""
    if accepted is None or step_times is None or t0 is None:
        return None
    times = np.asarray(step_times, dtype=np.float64).reshape(-1)
    n = int(np.asarray(accepted).reshape(-1)[0])
    if stopped:  # 0.25-steps stopped at 0.6 gave 0.6 / 3 = 0.2 (steps_per_layer 5, not 4)
        n, times = n - 1, times[:-1]
    if n < 1 or times.size == 0:
        return None
    return (float(times[-1]) - float(t0)) / n


def _step_entry(h, layered: bool) -> dict:
    """``{"steps_per_layer": k}`` (a model: layers of length 1) or ``{"dt": "h"}`` (12 digits:
    the same step written as t1/steps for another t1 differs in its last bit only)."""
    if h is None or not h > 0:
        return {}
    return {"steps_per_layer": round(1.0 / h)} if layered else {"dt": f"{h:.12g}"}


def recorded(initial) -> dict:
    """What ``initial`` (a Solution, a saved result of one or its Dataset) says about its solve:
    ``rtol``, ``atol``, ``norm``, the :data:`CONTROL` settings, the discretizations' reprs,
    the ``context_length`` of positions, ``model_fingerprint`` and ``padding_mask``, and for
    fixed steps ``dt`` or ``steps_per_layer`` (:func:`fixed_step`), the keys it has.

    Raises
    ------
    TypeError
        If ``initial`` is a saved result of another kind (a ``Trajectory`` or mean field of
        ``solve``), which records none of these."""
    if hasattr(initial, "attrs") and hasattr(initial, "data_vars"):
        # an xarray Dataset: its raw attributes hold control_json, and step_times is a variable
        initial = labelled_methods.read(initial)
    attrs = getattr(initial, "attrs", None)
    kind = getattr(initial, "kind", "Solution") if isinstance(attrs, dict) else "Solution"
    if kind != "Solution":  # in memory such a result is refused already (restart_point)
        raise TypeError(f"initial is a saved {kind}, the result of solve, which records no "
                        "fingerprint of its system, no step and no scheme: a restart from it "
                        "could continue another computation unseen; initial must be a saved "
                        "ctformer.Solution (the result of evolve); start a new solve from its "
                        "last state (initial.final) instead")
    if isinstance(attrs, dict):  # a file's attributes
        found = {key: attrs.get(key) for key in ("rtol", "atol", "norm", *_IDENTITY, *_GRID_NAMES)}
        found["context_length"] = _length(attrs.get("context_length"))
        found.update(attrs.get("control") or {})  # written as control_json, read back parsed
        h = fixed_step(attrs.get("stats_accepted"), getattr(initial, "arrays", {}).get("step_times"),
                       attrs.get("t0"), bool(attrs.get("event_terminal", 0)))
    else:
        grids = getattr(initial, "grids", None)
        found = {key: getattr(initial, key, None) for key in ("rtol", "atol", "norm", *_IDENTITY)}
        found.update({key: None if grids is None else repr(getattr(grids, key)) for key in _GRID_NAMES})
        found["context_length"] = None if grids is None else _length(grids.context_length)
        found.update(getattr(initial, "control", None) or {})
        stats = getattr(initial, "stats", None) or {}
        h = fixed_step(stats.get("accepted"), stats.get("step_times"), getattr(initial, "t0", None),
                       bool(getattr(initial, "event_terminal", False)))
    if found.get("rtol") is None:  # fixed steps: the step is part of the computation
        found.update(_step_entry(h, found.get("tokens") is not None))
    return {key: value for key, value in found.items() if value is not None}


def computation(fingerprint, control, grids=None) -> dict:
    """What a solve is, in the terms of :func:`recorded`: the fingerprint of its model or
    system, the discretizations' reprs (``grids``, a model's solve), and the tolerances, norm
    and :data:`CONTROL` settings of a :class:`~ctformer.solvers.PIController` ``control``;
    fixed steps: ``steps_per_layer`` (``control`` an int, a model's solve) or ``dt`` (``control``
    a pair ``(steps, h)``)."""
    from .controller import PIController

    now = {"model_fingerprint": fingerprint}
    if grids is not None:
        now.update({name: repr(getattr(grids, name)) for name in _GRID_NAMES})
        if grids.context_length is not None:  # positions p(x) = L x - 1/2: another L, another solve
            now["context_length"] = _length(grids.context_length)
    if isinstance(control, PIController):
        now.update(rtol=control.rtol, atol=control.atol, norm=control.norm, **control_settings(control))
    else:
        now["rtol"] = "none (fixed steps)"
        if grids is not None:  # a model: steps per layer
            now["steps_per_layer"] = int(control)
        elif isinstance(control, tuple):  # (steps, h) of particles and mean fields
            now["dt"] = f"{float(control[1]):.12g}"
    return now


def refuse_another(saved: dict, now: dict) -> None:
    """ValueError naming each entry that ``saved`` (:func:`recorded`) and ``now`` both have
    and that differs: the restart would continue another computation."""
    differ = [key for key in saved if key in now and not _same(saved[key], now[key])]
    if differ:
        what = "; ".join(f"{key}: saved {_shown(saved[key])}, now {_shown(now[key])}" for key in differ)
        raise ValueError(f"initial belongs to another computation ({what}): a restart continues "
                         "the saved solve only with its model (or particle system, mean field), "
                         "discretizations and control (tolerances, or the step dt or "
                         "steps_per_layer of fixed steps); pass those, or start a new solve from "
                         "the state with u0=")


def _shown(value) -> str:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return repr(int(value))
    return repr(value if isinstance(value, str) else float(value))


def _same(a, b) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return str(a) == str(b)
    return float(a) == float(b)

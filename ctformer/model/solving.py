"""What a model's solves do around the time loop, for :class:`ctformer.model.ContinuousTransformer`.

``_Solving`` is inherited by the model (it reads its ``blocks``, ``final_normalization``,
``grids()`` and ``parameters()``): the initial state and its grids (``_initial_state``, with
the default discretizations of ``_default``) and the check that the state and tensor
parameters share a namespace, device and dtype (``_check_namespaces``, over ``_operators``),
both called by :func:`ctformer.evolution.evolve`; the error-controlled branch of ``solve``
(``_solve_controlled``) and the result after the final normalization (``_readout``).
``_on_state_device`` makes a torch state's device torch's default while a solve runs.
"""
from __future__ import annotations

import contextlib
import sys

import array_api_compat

from .. import solvers, validation
from ..discretizations import Discretization, as_discretization
from ..discretizations import get as get_discretization
from ..evolution import evolve
from ..kernels import is_host
from ..model_inputs import as_state_array
from ..operators.base import has_host_parameters
from ..shared_tensors import StaleConversionError, check_unchanged
from ..solvers.controller import DEFAULT_STEPS_PER_LAYER, is_default  # noqa: F401 (the model's default)
from .checks import _device, _refuse_meta, _same_kind


def _on_state_device(u0):
    """While a solve of the torch state ``u0`` runs, torch's default device is ``u0``'s.

    Tensors the solve makes without naming a device (a constant, an index range, a mask from
    NumPy) then live where the state does. Without it a CPU state under
    ``torch.set_default_device("cuda")`` met CUDA constants: a device mismatch, or, on a machine
    without a GPU, "Torch not compiled with CUDA enabled" from inside torch. Nothing is changed
    (no context's per-operation cost) when the devices agree or ``u0`` is no tensor."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(u0, torch.Tensor):
        return contextlib.nullcontext()
    try:
        same = u0.device == torch.get_default_device()
    except (AssertionError, RuntimeError):  # a CUDA default on a machine without CUDA
        same = False
    return contextlib.nullcontext() if same else torch.device(u0.device)


def _names_size(spec) -> bool:
    """Whether ``spec`` is a ``"NAME:N"`` string, which carries its own size."""
    return isinstance(spec, str) and ":" in spec


def _sized(spec, n: int, name: str, source: str) -> Discretization:
    """``spec`` as a discretization of ``n`` values; ``source`` says where ``n`` comes from.

    A ``"NAME:N"`` whose ``N`` agrees with ``n`` says the size twice, consistently: accepted.
    Another ``N`` is refused naming both sizes (a grid of one size cannot hold a state of the
    other)."""
    if not _names_size(spec):
        return as_discretization(spec, n)
    disc = get_discretization(spec)  # it reports a bad name or a size that is no integer
    if disc.n != n:
        raise ValueError(f"{name}={spec!r} asks for {disc.n} values but {source}: give "
                         f"{name}={spec.partition(':')[0].strip()!r} (the size is then {n}) or "
                         f"{name}='{spec.partition(':')[0].strip()}:{n}'")
    return disc


class _Solving:
    """The steps of ``solve`` and ``evolve`` around the time loop, for
    :class:`ContinuousTransformer` (reads its ``blocks``, ``final_normalization``, ``grids()``
    and ``parameters()``)."""

    def __getstate__(self):
        """The model's attributes, for ``pickle`` and ``copy``. A converted model whose module
        changed in place after the conversion is refused, as its solves are: the copy would
        hold the module's new values beside arrays derived from the old ones (norm gains,
        packed projections), so it would compute neither network, and nothing would watch it.

        Raises
        ------
        ctformer.bridges.StaleConversionError
            Naming the changed weights; the remedy is to convert the module again.
        """
        try:
            check_unchanged(self)
        except StaleConversionError as error:
            raise StaleConversionError(f"cannot pickle or copy this converted model: {error}") from None
        return self.__dict__.copy()

    def _operators(self):
        """Every operator of the model (None where a block has none)."""
        for block in self.blocks:
            yield from (block.attention, block.feedforward, block.normalization1, block.normalization2)
        yield self.final_normalization

    def _check_namespaces(self, u, name: str = "u0") -> None:
        """A state and tensor parameters must live in one namespace and on one device; ``name``
        is the argument the state came in as (``u0``, or ``x`` of :meth:`run`)."""
        if all(op is None or has_host_parameters(op) for op in self._operators()):
            return  # host parameters only, known since each operator was discretized (no walk)
        tensors = [v for v in self.parameters().values() if not is_host(v)]
        if not tensors:
            return
        like = tensors[0]
        if not _same_kind(u, like):
            raise TypeError(
                f"{name} is a {type(u).__module__}.{type(u).__name__} on "
                f"{_device(u)}, the parameters are {type(like).__module__}."
                f"{type(like).__name__} on {_device(like)}: pass {name} in the "
                "parameters' namespace and on their device")
        if u.dtype != like.dtype:
            param = next(k for k, v in self.parameters().items() if v is like)
            raise TypeError(f"{name} has dtype {u.dtype}, the tensor parameters (e.g. {param!r}) "
                            f"have dtype {like.dtype}: pass {name} as {like.dtype} "
                            f"({name}.to({like.dtype}))")

    @staticmethod
    def _default(spec, own, features, name):
        if spec is None:
            return own if own is not None else features
        if isinstance(spec, str):
            if own is None and _names_size(spec):  # the features' size is only a default here
                return get_discretization(spec)
            size = own.n if own is not None else features.n
            return _sized(spec, size, name, f"the model's own {name} have {size}")
        if not isinstance(spec, Discretization):
            raise TypeError(f"{name} must be a Discretization, a name or None, got {type(spec).__name__}")
        return spec

    def _solve_controlled(self, u0, tokens, features, head_features, hidden, scheme,
                          steps_per_layer, trajectory, padding_mask, context_length, checkpoint,
                          rtol, atol):
        if not is_default(steps_per_layer):  # an explicit 1 beside rtol is refused too
            raise ValueError(f"steps_per_layer={steps_per_layer!r} and rtol/atol both given: "
                             "choose fixed steps or error control, not both")
        if validation.boolean(checkpoint, "checkpoint"):
            raise ValueError("checkpoint=True needs fixed steps (steps_per_layer), not rtol/atol")
        save_at = solvers.SaveAt(layers=validation.boolean(trajectory, "trajectory"))
        with _on_state_device(u0):
            solution = evolve(self, u0, tokens=tokens, features=features, head_features=head_features,
                              hidden=hidden, scheme=scheme,
                              rtol=1e-6 if rtol is None else rtol, atol=1e-9 if atol is None else atol,
                              save_at=save_at, padding_mask=padding_mask, context_length=context_length)
            return self._readout(solution, trajectory)

    def _readout(self, solution, trajectory):
        """The final state after the final normalization (or the layer states, the last one so)."""
        grids = solution.grids
        final = grids.lift(self.final_normalization.discretize(grids)) \
            if self.final_normalization is not None else None
        if trajectory:
            states = [solution.states[i, ...] for i in range(len(solution.times))]
            if final is not None:
                states[-1] = final(states[-1])
            return states
        return solution.final if final is None else final(solution.final)

    def _run_input(self, x, padding_mask=None):
        """The input of :meth:`run`: a finite array (N, d) or (B, N, d), N and d >= 1, of the
        model's width where it has one, in the namespace, device and dtype of tensor parameters;
        neither ``x`` nor ``padding_mask`` on torch's value-less ``meta`` device.

        Checked here, under the name the caller used: the solve it is handed to would name it
        ``u0`` (ValueError or TypeError naming ``x`` instead)."""
        x = as_state_array(x, "x")
        _refuse_meta(x, "x")
        _refuse_meta(padding_mask, "padding_mask")
        if x.ndim not in (2, 3) or 0 in tuple(x.shape[-2:]):
            raise ValueError(f"x must have shape (N, d) or (B, N, d) with N >= 1 tokens and d >= 1 "
                             f"features, got shape {tuple(x.shape)}")
        if self.features is not None and x.shape[-1] != self.features.n:
            raise ValueError(f"x has {x.shape[-1]} features, the model expects {self.features.n}")
        xp = array_api_compat.array_namespace(x)
        if not bool(xp.all(xp.isfinite(x))):
            raise ValueError("x contains NaN or inf; run needs finite token states (replace "
                             "padded or missing entries by a finite value and pass a padding_mask)")
        self._check_namespaces(x, "x")
        return x

    def _initial_state(self, u0, tokens, features, head_features, hidden, context_length):
        if callable(u0) and not hasattr(u0, "shape"):
            for name, spec in (("tokens", tokens), ("features", features)):
                if not isinstance(spec, Discretization) and not _names_size(spec):
                    raise ValueError(
                        f"{name} given as {spec!r} needs n, which a callable u0 cannot provide; "
                        "pass a Discretization object or 'NAME:N' (e.g. "
                        f"'{spec if isinstance(spec, str) else 'midpoint'}:16')"
                    )
            tokens, features = (get_discretization(s) if _names_size(s) else s
                                for s in (tokens, features))
            grids = self.grids(tokens, features, head_features, hidden, context_length)
            return grids.sample(u0), grids
        u = as_state_array(u0, "u0")
        _refuse_meta(u, "u0")
        if u.ndim < 2:
            raise ValueError(f"u0 must have shape (..., tokens, features), got shape {tuple(u.shape)}")
        if 0 in tuple(u.shape[-2:]):
            raise ValueError(f"u0 has shape {tuple(u.shape)}: a state needs at least one token and "
                             "one feature")
        shape = tuple(u.shape)
        tokens = _sized(tokens, u.shape[-2], "tokens", f"u0 of shape {shape} has {shape[-2]} tokens")
        features = _sized(features, u.shape[-1], "features",
                          f"u0 of shape {shape} has {shape[-1]} features")
        grids = self.grids(tokens, features, head_features, hidden, context_length)
        grids.validate(u, "u0")
        return u, grids

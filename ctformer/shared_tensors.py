r"""The tensors a converted model shares with its module, and the check that they are unchanged.

A bridge converts a float64 module without copying its weights: the model's kernels are
read-only NumPy views of the tensors' memory. What the model derives from them is computed
once and kept: the packed query/key/value matrix of an attention, the weights cast to
float32 for a float32 state, norm gains such as Gemma's :math:`1 + w`. A tensor changed in
place after the conversion (``p.mul_``, an optimizer's step, ``load_state_dict``) would then
leave a model that computes neither the old network nor the new one: the views follow the
module, the derived arrays do not.

So a converted model remembers the version counter of every tensor it shares (torch
increments it at every in-place change; a ``state_dict()`` alias shares it with the
parameter), and each solve compares them first, about 0.1 us per tensor. A changed tensor
stops the solve with :class:`StaleConversionError`, naming the weight; the remedy is a new
conversion of the changed module. Models built any other way share nothing and check
nothing; so do copies of a converted model (``copy.deepcopy``, pickling,
``with_parameters``), which hold arrays of their own.

:func:`tied_copies` copies a model's parameters for differentiation, one copy per tensor, so
layers given one tensor stay tied to one copy.
"""
from __future__ import annotations

import weakref

__all__ = ["StaleConversionError", "check_unchanged", "tied_copies", "watch"]

_WATCHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # model -> _Shared


class StaleConversionError(RuntimeError):
    """A tensor that a converted model shares with its module was changed in place after the
    conversion: the model would mix the new values with arrays derived from the old ones."""


class _Shared:
    __slots__ = ("label", "names", "tensors", "versions")

    def __init__(self, label: str, entries):
        self.label = label
        self.names = tuple(name for name, _ in entries)
        self.tensors = tuple(tensor for _, tensor in entries)
        self.versions = tuple(tensor._version for tensor in self.tensors)

    def check(self) -> None:
        if all(t._version == v for t, v in zip(self.tensors, self.versions)):
            return
        changed = [name for name, t, v in zip(self.names, self.tensors, self.versions) if t._version != v]
        shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
        raise StaleConversionError(
            f"the {self.label} weight{'s' if len(changed) > 1 else ''} {shown} changed in place after "
            f"the conversion: this model shares the module's float64 tensors but keeps arrays derived "
            f"from the old values (the packed attention projections, float32 copies), so it would "
            f"compute neither network. Convert the module again after changing it (from_hf(module)), "
            f"or convert a copy that nothing changes (from_hf(copy.deepcopy(module)))")


def watch(model, label: str, entries) -> None:
    """Remember the versions of the tensors ``entries`` ((name, tensor) pairs) that ``model``
    shares with its module (``label`` names the module in the message); none: nothing kept."""
    entries = [(name, tensor) for name, tensor in entries if hasattr(tensor, "_version")]
    if entries:
        _WATCHED[model] = _Shared(label, entries)


def check_unchanged(model) -> None:
    """Raise :class:`StaleConversionError` if a tensor that ``model`` shares changed in place.

    Raises
    ------
    StaleConversionError
        Naming the changed weights and the remedy (convert the module again).
    """
    shared = _WATCHED.get(model)
    if shared is not None:
        shared.check()


def tied_copies(values, like, requires_grad: bool = False) -> dict:
    """New torch tensors of ``like``'s dtype and device for the arrays ``values`` (name -> NumPy
    array or tensor), one per tensor: names given one tensor (layers tied by
    ``with_parameters``) share its copy, so a gradient reaches it as the sum over those layers.

    Parameters
    ----------
    values : dict
        Name -> NumPy array or torch tensor (e.g. ``model.parameters()``).
    like : torch.Tensor
        Supplies the dtype and device of the copies.
    requires_grad : bool
        Whether the copies are leaves that record gradients.

    Returns
    -------
    dict
        Name -> tensor; NumPy values get a copy each, tensors one copy per distinct tensor.
    """
    import torch

    seen = {}

    def copy(value):
        if not isinstance(value, torch.Tensor):
            return torch.tensor(value, dtype=like.dtype, device=like.device).requires_grad_(requires_grad)
        if id(value) not in seen:  # detach().clone(), not torch.tensor(tensor), which warns
            seen[id(value)] = value.detach().to(like.device, like.dtype).clone().requires_grad_(requires_grad)
        return seen[id(value)]

    return {name: copy(value) for name, value in values.items()}

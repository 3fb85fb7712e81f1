r"""The :class:`Operator` contract: a continuous operator, discretized on a :class:`Grids`.

A continuous operator (attention, feed-forward, normalization) acts on functions
:math:`u(x, y)` of the token variable :math:`x` and the feature variable :math:`y`. Given one
discretization per continuous variable (a :class:`Grids`), it becomes a callable on arrays of
values at quadrature points, shaped ``(..., Nq_tokens, Nq_features)`` where the last two axes
hold :math:`u` at ``grids.tokens.quadrature_nodes`` x ``grids.features.quadrature_nodes``
(nodal values for quadrature and spectral rules). Leading axes are batch axes.

:meth:`Operator.discretize` builds that callable once per :class:`Grids` and caches it outside
the operator; host matrices are built once, device copies once per namespace, device and
dtype (:func:`ctformer.backend.constant`). The discretized callable does not validate its
input: states are validated where they enter a computation (a solve, or a direct call of the
operator, :meth:`Operator.__call__`).

What a model reads from an operator is declared here, not probed:

- :meth:`Operator.parameters` (abstract): the operator's numbers as a flat mapping
  ``name -> array``; the model's :meth:`~ctformer.ContinuousTransformer.parameters`,
  ``with_parameters`` and the identity of a study are built from it.
- :class:`Normalization`, the base of every normalization a block or a model accepts,
  declares :attr:`Normalization.is_projection` and :attr:`Normalization.is_idempotent`; a
  post-norm model is consistent in depth exactly when its normalizations are idempotent,
  :math:`N(N(u)) = N(u)`.
"""
from __future__ import annotations

import abc
import weakref
from typing import Callable

import numpy as np

from ..backend import constant
from .._numerics import few_rows as _few_rows, gemm as _gemm, packed as _packed
from ..kernels import is_host
from ..state import Grids

__all__ = ["Grids", "Operator", "Normalization", "Constants", "check_normalization"]


def check_state(u, grids: Grids, argname: str = "u"):
    """Validate point values on ``grids`` (see :meth:`ctformer.state.Grids.validate`)."""
    return grids.validate(u, argname, points=True)


class Constants:
    """The host constants of one discretized operator, handed out like a given state.

    ``constants(name, u)`` is ``host[name]`` in the namespace, device and dtype of ``u``,
    converted once (:func:`ctformer.backend.constant`). A discretized operator's closure holds
    this object, never the operator itself, so that the operator can be collected (and its
    cache entry with it) while nothing else refers to it.
    """

    __slots__ = ("host", "_numpy", "_prepared", "_tensors", "__weakref__")

    def __init__(self, **host):
        self.host = host
        self._numpy = {}  # (name, dtype) -> array, for NumPy states: one dict lookup per use
        self._prepared = {}  # (matrix, bias, dtype) -> a prepared product or None, for NumPy states
        # values assembled from tensors (with_parameters) are used as they are: they already
        # live in the state's namespace, and autograd must see them
        self._tensors = frozenset(k for k, v in host.items() if not is_host(v))

    def __call__(self, name, like):
        if name in self._tensors:
            return self.host[name]
        if type(like) is np.ndarray:
            key = (name, like.dtype)
            found = self._numpy.get(key, self)
            if found is self:
                found = self._numpy[key] = constant(self, name, self.host[name], like)
            return found
        return constant(self, name, self.host[name], like)

    def prepared(self, matrix, bias, like):
        """The product by ``host[matrix]`` plus ``host[bias]`` (a name, or None) prepared once
        for the NumPy state ``like``, where this machine prepares products of its dtype
        (:func:`ctformer._numerics.gemm.prepared_products`): float32 by the packed matrix
        (:mod:`ctformer._numerics.packed`) where this machine chose it, else float64 and
        float32 of few rows by the compiled kernel (:mod:`ctformer._numerics.few_rows`). None
        for other states, for tensors handed in, or where the machine does not prepare them."""
        if type(like) is not np.ndarray or not _gemm.prepared_products(like.dtype):
            return None
        key = (matrix, bias, like.dtype)
        found = self._prepared.get(key, self)
        if found is self:
            found = self._prepared[key] = None if matrix in self._tensors or bias in self._tensors else \
                _prepare(self(matrix, like), None if bias is None else self(bias, like))
        return found


    def small_product(self, matrix, bias, like):
        """The product by ``host[matrix]`` plus ``host[bias]`` (a name, or None) for
        C-contiguous NumPy rows of ``like``'s shape and dtype, as one callable ``a -> a M + b``
        that does what :func:`~ctformer._numerics.gemm.rows_product` does for them outside
        worker threads (the prepared product where it applies, else NumPy's): the same bits,
        without the dispatch. None where ``rows_product`` would call torch (products of at
        least 2^18 multiply-adds or many rows) or the constants are tensors."""
        if matrix in self._tensors or bias in self._tensors:
            return None
        rows, d = like.size // like.shape[-1], like.shape[-1]
        m, b = self(matrix, like), None if bias is None else self(bias, like)
        prepared = self.prepared(matrix, bias, like)
        if prepared is not None and prepared.applies(rows):
            return prepared
        if m.shape[0] != d or not _gemm.plain_rows(rows, d, m.shape[1]):
            return None
        return lambda a: _gemm.numpy_rows(a, m, b)


# operator -> {grids: discretized callable}: kept outside the operator, so that an operator
# (and a model holding it) stays plain data that pickles and hashes by its parameters.
_DISCRETIZED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class Operator(abc.ABC):
    r"""An operator of the continuous model, discretized on demand.

    Subclasses implement :meth:`_discretize`, which returns a function of the array ``u``
    (shape ``(..., Nq_tokens, Nq_features)``) for one :class:`Grids`. Assigning an attribute
    (``op.W_1 = ...``) drops the discretizations built so far; changing what the operator
    holds (an array edited in place, an attribute of one of its kernels) does not, so build a
    new operator, or use ``model.with_parameters``, to change values. The arrays that
    ``parameters()`` hands out are read-only views, so an edit through them raises
    :class:`ValueError` instead.

    Subclasses also implement :meth:`parameters` (abstract: an operator without numbers
    returns ``{}``).
    """

    @abc.abstractmethod
    def parameters(self) -> dict:
        """The operator's numbers: a flat mapping ``name -> array`` (``{}`` when it has none).

        Names are relative to the operator (``"gain"``, ``"W_Q.0.weight"``); a model prefixes
        them with the operator's place (``"blocks.0.normalization1.gain"``). Host arrays are
        read-only views of the operator's own arrays (:func:`ctformer.kernels.read_only`),
        tensors handed in by ``with_parameters`` are returned as they are. Every number the
        discretized operator depends on, apart from structural options (``eps``, an
        activation, inverse temperatures), must be listed: the model's ``with_parameters``
        replaces exactly these, and a study identifies a model by them.
        """

    def discretize(self, grids: Grids) -> Callable:
        """The discretized operator on ``grids``: a callable ``f(u)``, built once per grids.

        Parameters
        ----------
        grids : Grids
            Discretizations of the continuous variables.

        Returns
        -------
        callable
            ``f(u)`` mapping an array of shape ``(..., Nq_tokens, Nq_features)`` to one of the
            same shape, on the same backend and with the same dtype.

        Raises
        ------
        TypeError
            If ``grids`` is not a :class:`Grids`.
        """
        if not isinstance(grids, Grids):
            raise TypeError(f"grids must be a ctformer.operators.Grids, got {type(grids).__name__}")
        cache = _DISCRETIZED.get(self)
        if cache is None:
            # the parameters are walked once: an operator with a cache entry holds host arrays
            if not all(is_host(v) for v in self.parameters().values()):
                return self._discretize(grids)   # tensors (with_parameters): rebuilt, never cached
            cache = _DISCRETIZED.setdefault(self, {})
        found = cache.get(grids)
        if found is None:
            found = cache[grids] = self._discretize(grids)
        return found

    def __setattr__(self, name, value):
        # what was discretized belongs to the old attribute values: drop it
        _DISCRETIZED.pop(self, None)
        object.__setattr__(self, name, value)

    @abc.abstractmethod
    def _discretize(self, grids: Grids) -> Callable: ...

    def __call__(self, u, grids: Grids, **kwargs):
        """Apply the operator on ``grids`` to validated point values ``u``.

        ``u`` must be a real floating array of shape ``(..., Nq_tokens, Nq_features)`` without
        NaN or inf (:class:`TypeError` / :class:`ValueError` otherwise); then
        ``self.discretize(grids)(u, **kwargs)``.
        """
        if not isinstance(grids, Grids):
            raise TypeError(f"grids must be a ctformer.Grids, got {type(grids).__name__}")
        grids.validate(u, "u", points=True)
        return self.discretize(grids)(u, **kwargs)


class Normalization(Operator):
    r"""A normalization per token, :math:`u(x, \cdot) \mapsto N(u(x, \cdot))`: the contract.

    Every normalization a :class:`~ctformer.model.Block` or a
    :class:`~ctformer.ContinuousTransformer` takes derives from this class
    (:class:`~ctformer.operators.LayerNormProjection`, :class:`~ctformer.operators.RMSNorm`,
    :class:`~ctformer.operators.SphereProjection`, or a user's own). A subclass implements

    - :meth:`_discretize`: for one :class:`Grids`, a function of point values
      ``(..., Nq_tokens, Nq_features)`` that normalizes each token over the feature variable
      (with the feature quadrature) and returns an array of the same shape, namespace and
      dtype; it does not validate its input (the solve did);
    - :meth:`parameters`: its numbers (``{}`` when it has none);

    and declares, as properties or class attributes,

    - :attr:`is_projection`: True when :math:`N` is the :math:`L^2(Y)` nearest-point
      projection onto a set :math:`M` (:math:`N(u) \in M` is the point of :math:`M` closest
      to :math:`u`); default False;
    - :attr:`is_idempotent`: True when :math:`N(N(u)) = N(u)` for every :math:`u`; default
      :attr:`is_projection` (a projection is idempotent).

    What the model does with them: a post-norm step applies :math:`N` after every sub-step,
    :math:`k` times per layer with ``steps_per_layer = k``. When :math:`N` is idempotent the
    steps converge, as :math:`k \to \infty`, to the flow constrained to the image of
    :math:`N`; when it is not (a per-feature gain, :math:`\varepsilon > 0`), applying it
    :math:`k` times is a different map for each :math:`k`, so the post-norm model has no
    limit in depth (:attr:`~ctformer.ContinuousTransformer.warns_inconsistent_depth`). Pre-norm
    models read neither attribute. Declaring ``is_idempotent = True`` for a map that is not
    idempotent is a silent wrong answer; the default (False) only costs a warning.
    """

    @property
    def is_projection(self) -> bool:
        """Whether :math:`N` is the :math:`L^2(Y)` nearest-point projection onto a set (default False)."""
        return False

    @property
    def is_idempotent(self) -> bool:
        """Whether :math:`N(N(u)) = N(u)` for every :math:`u` (default: :attr:`is_projection`)."""
        return self.is_projection


def _prepare(matrix, bias):
    """The product by ``matrix`` and ``bias`` (host arrays of the state's dtype) prepared once:
    packed for float32 where this machine chose it, else the compiled few-row kernel in this
    machine's tiles."""
    if matrix.dtype == np.float32 and _gemm.packed_rows(matrix.dtype):
        return _packed.pack(matrix, bias)
    return _few_rows.prepare(matrix, bias, _gemm.few_rows_columns(matrix.dtype))


def check_normalization(normalization, argname: str):
    """``normalization`` itself when it is ``None`` or a :class:`Normalization`.

    Raises
    ------
    TypeError
        Naming ``argname``, for anything else (a plain function, an attention operator).
    """
    if normalization is None or isinstance(normalization, Normalization):
        return normalization
    raise TypeError(f"{argname} must be a ctformer.operators.Normalization (LayerNormProjection, "
                    f"RMSNorm, SphereProjection or a subclass of Normalization) or None, got "
                    f"{type(normalization).__name__}; wrap your own normalization in a subclass "
                    "of Normalization that implements _discretize and parameters")


def has_host_parameters(operator) -> bool:
    """True when ``operator`` is known to hold host (NumPy) parameters only: it has been
    discretized with them and no attribute was assigned since (a cheap test for the hot path;
    False means "unknown", not "tensors")."""
    return operator in _DISCRETIZED

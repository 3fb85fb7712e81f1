r"""Continuous Transformers with smooth random parameters, for convergence studies.

Every kernel is a :class:`ctformer.kernels.SmoothRandom` kernel with :math:`L^2` norm
``KERNEL_SCALE`` = 0.5, so each linear map is a contraction-sized, entire function of its two
variables; every bias and every LayerNorm gain or shift is a low-frequency trigonometric
function of its variable. The flow is then smooth in :math:`x` and :math:`y` and of size
:math:`O(1)` over a few layers, and discretization errors come only from the rules, not from
the parameters. A different ``seed`` gives independent parameters.

The components of current Transformers (design notes, section 10) are options: RMSNorm
instead of LayerNorm, a gated (SwiGLU, GeGLU) feed-forward layer, grouped-query attention,
rotary or ALiBi positions at a reference length ``context_length``, and a sliding window. The
default options draw exactly the random numbers they always drew, so existing seeds keep
their models.
"""
from __future__ import annotations

import math

import array_api_compat
import numpy as np

from . import validation
from .discretizations import Midpoint
from .kernels import SmoothRandom, is_host, read_only
from .operators import ALiBi, Attention, FeedForward, GatedFeedForward, LayerNormProjection, RMSNorm, RoPE

__all__ = ["random_layers", "PLACEMENTS", "KERNEL_SCALE", "NORMALIZATIONS", "FEEDFORWARDS", "POSITIONS"]

NORMALIZATIONS = ("layernorm", "rmsnorm")
FEEDFORWARDS = ("mlp", "swiglu", "geglu")
POSITIONS = (None, "rope", "alibi")

PLACEMENTS = ("pre", "post", "post-projection", "none")
KERNEL_SCALE = 0.5
#: Default head-feature rule size of a RoPE model (``Midpoint(8)``: four rotation pairs).
ROPE_HEAD_FEATURES = 8
BIAS_SCALE = 0.1


class _Trig:
    r"""The function :math:`y \mapsto c_0 + a \sin(\pi k y + \phi)` (vectorized, picklable)."""

    def __init__(self, offset, amplitude, frequency, phase):
        self.offset, self.amplitude, self.frequency, self.phase = offset, amplitude, frequency, phase

    def __call__(self, y):
        tensors = [v for v in (self.offset, self.amplitude, self.frequency, self.phase) if not is_host(v)]
        if not tensors:
            return self.offset + self.amplitude * np.sin(np.pi * self.frequency * np.asarray(y) + self.phase)
        xp = array_api_compat.array_namespace(*tensors)   # parameters handed in as tensors
        y = xp.asarray(np.asarray(y, dtype=np.float64), dtype=tensors[0].dtype,
                       device=array_api_compat.device(tensors[0]))
        return self.offset + self.amplitude * xp.sin(math.pi * self.frequency * y + self.phase)

    def parameters(self) -> dict:
        """The four numbers of the function, as read-only 0-d arrays."""
        return {name: (read_only(np.asarray(float(getattr(self, name))))
                       if is_host(getattr(self, name)) else getattr(self, name))
                for name in ("offset", "amplitude", "frequency", "phase")}

    def __repr__(self):
        return (f"{self.offset:.3g} + {self.amplitude:.3g} sin(pi {self.frequency} y "
                f"+ {self.phase:.3g})")


def random_layers(seed=0, layers=2, heads=2, placement="pre", activation="gelu", mask=None,
                  diagonal="full", beta=4.0, *, normalization="layernorm", feedforward="mlp",
                  kv_heads=None, positions=None, context_length=None, window=None,
                  rope_theta=10000.0, **unknown) -> dict:
    r"""The layers of a continuous Transformer with smooth random parameters.

    :meth:`ctformer.ContinuousTransformer.random_smooth` builds the model from them.

    Parameters
    ----------
    seed : int
        Seed of all parameters.
    layers : int
        Number of layers :math:`T \ge 1`.
    heads : int
        Attention heads :math:`H \ge 1` per layer.
    placement : {"pre", "post", "post-projection", "none"}
        Where the normalizations act:

        - ``"pre"``: pre-norm blocks with LayerNorms of smooth per-feature gain
          :math:`g(y) = 1 + 0.2 \sin(\pi k y + \phi)` and shift :math:`c(y)` of size 0.1,
          ``eps = 0``, and a final LayerNorm of the same kind;
        - ``"post"``: post-norm blocks with such per-feature affine LayerNorms. They are not
          projections: refining depth warns (:class:`ctformer.model.InconsistentDepthLimitWarning`);
        - ``"post-projection"``: post-norm blocks with scalar :math:`\sigma_1`, :math:`\sigma_2`
          and ``eps = 0``, the exact :math:`L^2` projection onto :math:`S_1(\sigma_1, \sigma_2)`
          (Tai et al. 2025, Thm 3.1), which has a continuous-depth limit;
        - ``"none"``: no normalization.
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
        FFN activation.
    mask : None or "causal"
        Attention mask.
    diagonal : {"full", "half"}
        Weight of the diagonal cell with ``mask="causal"``.
    beta : float
        Inverse temperature of every head.
    normalization : {"layernorm", "rmsnorm"}
        :class:`~ctformer.operators.LayerNormProjection` or :class:`~ctformer.operators.RMSNorm`
        (gain :math:`1 + 0.2 \sin(\pi k y + \phi)`, ``eps = 0``; with
        ``"post-projection"`` the plain sphere projection).
    feedforward : {"mlp", "swiglu", "geglu"}
        :class:`~ctformer.operators.FeedForward` with ``activation``, or a
        :class:`~ctformer.operators.GatedFeedForward` with SiLU (SwiGLU) or GELU (GeGLU) gates
        (``activation`` is then not used).
    kv_heads : int, optional
        Key/value heads of grouped-query attention (dividing ``heads``).
    positions : {None, "rope", "alibi"}
        Rotary positions (:math:`\omega(\tau) = \Theta^{-\tau}`, :math:`\Theta` =
        ``rope_theta``) or ALiBi with the default slopes. RoPE needs a head-feature rule with
        the pairing :math:`(\sigma, \sigma + 1/2)`: the model's default head features are
        then ``Midpoint(8)`` (``"head_features"`` in the result; override with
        ``head_features=`` in :meth:`~ctformer.ContinuousTransformer.solve`).
    context_length : float or pair of float, optional
        The reference length :math:`L` of positions :math:`p(x) = L x - 1/2`; required with
        ``positions`` or ``window``. A pair :math:`(L_1, L_2)` with ``positions="rope"`` is
        axial RoPE for a two-dimensional token domain (image patches).
    window : float, optional
        Sliding window :math:`W` (needs ``mask="causal"`` and ``context_length``).
    rope_theta : float
        :math:`\Theta` of the RoPE frequencies, default 10000.

    Returns
    -------
    dict
        ``"blocks"``: one dict of :class:`ctformer.model.Block` arguments per layer;
        ``"final_normalization"``: the final normalization or ``None``; ``"context_length"``:
        :math:`L` when given. The model has no default ``head_features``/``hidden``:
        :meth:`ContinuousTransformer.solve` uses the feature discretization for them unless
        told otherwise.

    Raises
    ------
    TypeError
        For a keyword that is none of these (the message names the closest one).
    ValueError
        For an unknown ``placement``, ``normalization``, ``feedforward`` or ``positions``,
        non-positive ``layers`` or ``heads``, ``positions`` or ``window`` without
        ``context_length``, or invalid attention or activation options (raised by the
        operators).

    Notes
    -----
    Kernels are :class:`ctformer.kernels.SmoothRandom` with ``modes=4``, ``decay=2`` and
    :math:`\|W\|_{L^2} = 0.5`; biases are :math:`0.1 \sin(\pi k y + \phi)` with
    :math:`k \in \{1, 2\}`. Feature variance must stay away from zero for LayerNorm to be
    smooth (design notes, section 1); choose the initial data accordingly.
    """
    if unknown:  # a TypeError that names the keyword and the one meant, not this function
        _refuse_keyword(next(iter(unknown)))
    validation.one_of(placement, "placement", PLACEMENTS)
    layers, heads = validation.integer(layers, "layers"), validation.integer(heads, "heads")
    seed = validation.integer(seed, "seed", minimum=0)
    validation.one_of(normalization, "normalization", NORMALIZATIONS)
    validation.one_of(feedforward, "feedforward", FEEDFORWARDS)
    validation.one_of(positions, "positions", POSITIONS)
    context_length = _checked_context_length(context_length, positions, window)
    n_kv = heads if kv_heads is None else validation.integer(kv_heads, "kv_heads")
    if heads % n_kv:
        raise ValueError(f"kv_heads={kv_heads} must divide heads={heads}")
    position_op = RoPE(theta=rope_theta) if positions == "rope" else ALiBi() if positions == "alibi" else None
    draw = _Draws(np.random.default_rng(int(seed)), normalization)
    attention_options = dict(beta=beta, mask=mask, diagonal=diagonal, kv_heads=kv_heads, positions=position_op,
                             window=window)
    blocks = [_random_block(draw, heads, n_kv, attention_options, feedforward, activation, placement)
              for _ in range(int(layers))]
    final = draw.layer_norm() if placement == "pre" else None
    layout = {"blocks": blocks, "final_normalization": final}
    if context_length is not None:
        layout["context_length"] = context_length
    if positions == "rope":
        # rotation pairs (sigma, sigma + 1/2) need a rule whose second half of points is the
        # first half shifted by 1/2: the model's default head-feature rule is Midpoint(8)
        layout["head_features"] = Midpoint(ROPE_HEAD_FEATURES)
    return layout


def _checked_context_length(context_length, positions, window):
    """``context_length`` as :func:`random_layers` keeps it (a float, a pair of floats for
    axial RoPE, or None), after checking that the options that need it have it."""
    if (positions is not None or window is not None) and context_length is None:
        raise ValueError("positions and window need context_length=L, the reference length of "
                         "positions p(x) = L x - 1/2 (e.g. context_length=32)")
    if context_length is None:
        return None
    pair = isinstance(context_length, (tuple, list)) and len(context_length) == 2
    for value in (context_length if pair else (context_length,)):
        if not validation.is_real(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"context_length must be a positive number, or a pair of them for "
                             f"axial positions on image patches, got {context_length!r}")
    if not pair:
        return context_length
    if positions != "rope":
        raise ValueError("a pair context_length=(L1, L2) is for axial RoPE on a two-"
                         "dimensional token domain (positions='rope')")
    return tuple(float(v) for v in context_length)


class _Draws:
    """The random parameters of :func:`random_layers`, drawn from one generator in the order
    the layers are built (so a seed keeps its model)."""

    def __init__(self, rng, normalization: str):
        self.rng, self.normalization = rng, normalization

    def kernel(self):
        return SmoothRandom(int(self.rng.integers(2**31)), modes=4, decay=2.0, scale=KERNEL_SCALE)

    def trig(self, offset, amplitude):
        return _Trig(offset, amplitude, int(self.rng.integers(1, 3)), float(self.rng.uniform(0, 2 * math.pi)))

    def bias(self):
        return self.trig(0.0, BIAS_SCALE)

    def layer_norm(self):
        if self.normalization == "rmsnorm":
            return RMSNorm(gain=self.trig(1.0, 0.2), eps=0.0)
        return LayerNormProjection(gain=self.trig(1.0, 0.2), shift=self.bias(), eps=0.0)

    def block_norms(self, placement: str):
        if placement == "post-projection" and self.normalization == "rmsnorm":
            projection = RMSNorm()  # the plain projection onto the sphere
            return projection, projection
        if placement == "post-projection":
            # One constraint set S1(sigma1, sigma2) per block: both sub-steps project onto the
            # same set, so every scheme has the same continuous-depth limit.
            projection = LayerNormProjection(gain=float(self.rng.uniform(0.8, 1.2)),
                                             shift=float(self.rng.uniform(-0.1, 0.1)), eps=0.0)
            return projection, projection
        return self.layer_norm(), self.layer_norm()


def _random_block(draw: _Draws, heads: int, n_kv: int, attention_options: dict, feedforward: str,
                  activation, placement: str) -> dict:
    """One layer's :class:`ctformer.model.Block` arguments, its parameters drawn by ``draw``."""
    attention = Attention(
        [draw.kernel() for _ in range(heads)], [draw.kernel() for _ in range(n_kv)],
        [draw.kernel() for _ in range(n_kv)], [draw.kernel() for _ in range(heads)],
        b_Q=[draw.bias() for _ in range(heads)], b_K=[draw.bias() for _ in range(n_kv)],
        b_V=[draw.bias() for _ in range(n_kv)], b_O=draw.bias(), **attention_options)
    if feedforward == "mlp":
        feedforward_op = FeedForward(draw.kernel(), draw.kernel(), b_1=draw.bias(), b_2=draw.bias(),
                                     activation=activation)
    else:
        feedforward_op = GatedFeedForward(draw.kernel(), draw.kernel(), draw.kernel(), b_gate=draw.bias(),
                                          b_up=draw.bias(), b_2=draw.bias(),
                                          activation="silu" if feedforward == "swiglu" else "gelu")
    block = {"attention": attention, "feedforward": feedforward_op, "placement": "none"}
    if placement != "none":
        block["normalization1"], block["normalization2"] = draw.block_norms(placement)
        block["placement"] = "pre" if placement == "pre" else "post"
    return block


def _refuse_keyword(name: str):
    import difflib
    import inspect

    known = [k for k in inspect.signature(random_layers).parameters if k != "unknown"]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if name in ("norm", "norm_first"):  # torch's and other libraries' words
        hint = " (placement= says where the norms sit, normalization= which norm)"
    raise TypeError(f"random_smooth / random_layers got an unexpected keyword argument {name!r}{hint}; "
                    f"the keywords are {', '.join(known)}")

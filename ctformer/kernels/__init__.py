r"""Feature kernels :math:`W(y, \eta)` and their discretization on pairs of discretizations.

A kernel defines the integral operator of the design notes, section 1,

.. math::  (W u)(y) = \int_{Y_{\mathrm{in}}} W(y, \eta)\, u(\eta)\, d\eta ,

mapping functions of :math:`\eta` (the input variable, e.g. features :math:`Y`) to functions of
:math:`y` (the output variable, e.g. head features :math:`Y_h` or the FFN variable :math:`R`).
Operators act on values at quadrature points, so a kernel discretized on an output
discretization ``out`` and an input discretization ``inp`` is the host matrix

.. math::  A_{ij} = W(y_i, \eta_j)\, w_j ,

with :math:`y_i` = ``out.quadrature_nodes``, :math:`\eta_j` = ``inp.quadrature_nodes`` and
:math:`w_j` = ``inp.quadrature_weights`` (:meth:`Kernel.matrix`). Applying the operator is a
contraction with this matrix (:meth:`Kernel.apply`), except for :class:`Convolution`, which uses
FFTs on uniform periodic grids.

Every kernel is defined on the reference square :math:`[0, 1]^2`. On other domains it is
transplanted affinely, :math:`W(y, \eta) = W_{\mathrm{ref}}(s, t) / L_{\mathrm{in}}` with
:math:`s = (y - a_{\mathrm{out}}) / L_{\mathrm{out}}` and :math:`t = (\eta - a_{\mathrm{in}}) /
L_{\mathrm{in}}`, so that the operator does not depend on the domain length.

A kernel is a frozen value (:class:`Kernel`): its attributes cannot be set after construction,
and kernels of the same type with the same numbers (arrays compared byte for byte) are equal
and hash alike, so a pickled or copied kernel equals its original and shares its cached
matrices. ``model.with_parameters`` is the way to other numbers.

==========================  ==========================================================
kernel                      :math:`W_{\mathrm{ref}}(s, t)`
==========================  ==========================================================
:class:`PiecewiseConstant`  :math:`d_{\mathrm{in}} A_{ij}` on cell :math:`(i, j)` (a torch ``nn.Linear``)
:class:`Smooth`             a user function
:class:`SmoothRandom`       a random entire function (trigonometric modes)
:class:`Convolution`        :math:`p((s - t) \bmod 1)`
==========================  ==========================================================
"""
from __future__ import annotations

# One concept a module: a kernel's numbers (parameters), the Kernel contract (base), then the
# kernels (piecewise, smooth, convolution). Names outside __all__ stay importable from here.
from ..backend import _cached, backend_of, constant, to_host  # noqa: F401
from .parameters import _to_host, callable_parameters, is_host, read_only, read_only_parameters  # noqa: F401
from .base import Kernel, _as_input, _check_discretization, _check_input, _reference_points  # noqa: F401
from .piecewise import PiecewiseConstant, _finite_sum, _identity, cell_index  # noqa: F401
from .smooth import Smooth, SmoothRandom
from .convolution import Convolution, measured_dense_below  # noqa: F401

__all__ = ["Kernel", "PiecewiseConstant", "Smooth", "SmoothRandom", "Convolution", "cell_index",
           "read_only", "read_only_parameters", "callable_parameters"]

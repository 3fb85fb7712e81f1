r"""Embedded Runge-Kutta pairs with their continuous extensions, as data.

==========  ======================================  =====  ========  =====  ======  ====
name        method                                  order  embedded  dense  stages  FSAL
==========  ======================================  =====  ========  =====  ======  ====
``bosh3``   Bogacki and Shampine (1989)             3      2         3      4       yes
``dopri5``  Dormand and Prince (1980)               5      4         4      7       yes
``tsit5``   Tsitouras (2011)                        5      4         4      7       yes
==========  ======================================  =====  ========  =====  ======  ====

Each pair is one :class:`~ctformer.solvers.runge_kutta.ButcherTableau` registered with
:func:`~ctformer.solvers.runge_kutta.register_tableau`: a scheme of
:func:`ctformer.solvers.available` (fixed steps, ``steps_per_layer=k``; being FSAL, each step
after the first of a layer costs :math:`s - 1` right-hand sides: 3 for ``bosh3``, 6 for the
fifth-order pairs) and a sub-step method of the splitting schemes. The error weights are
:math:`e_i = b_i - \hat b_i`, so :math:`h \sum_i e_i k_i` estimates the local error of the
embedded solution. The dense outputs are the methods' own continuous extensions,
:math:`u(t + \theta h) \approx u + h \sum_i b_i(\theta) k_i`:

* ``bosh3``: the cubic Hermite interpolant of :math:`u, F(u), u_{\text{new}},
  F(u_{\text{new}})` (third order), which is the pair's natural interpolant since :math:`k_1`
  and :math:`k_4` are the end-point derivatives;
* ``dopri5``: the fourth-order extension of Shampine (Math. Comp. 46, 1986) that
  ``dopri5``/``RK45`` codes use;
* ``tsit5``: Tsitouras' own fourth-order interpolant, published with the pair
  (Comput. Math. Appl. 62, 2011, written out here in powers of :math:`\theta`).

References: P. Bogacki, L. F. Shampine, "A 3(2) pair of Runge-Kutta formulas", Appl. Math.
Lett. 2 (1989); J. R. Dormand, P. J. Prince, "A family of embedded Runge-Kutta formulae",
J. Comput. Appl. Math. 6 (1980); Ch. Tsitouras, "Runge-Kutta pairs of order 5(4) satisfying
only the first column simplifying assumption", Comput. Math. Appl. 62 (2011).
"""
from __future__ import annotations

from .runge_kutta import ButcherTableau, register_tableau

__all__ = ["BOSH3_TABLEAU", "DOPRI5_TABLEAU", "TSIT5_TABLEAU"]

BOSH3_TABLEAU = register_tableau(ButcherTableau(
    "bosh3",
    a=((), (1 / 2,), (0.0, 3 / 4), (2 / 9, 1 / 3, 4 / 9)),
    b=(2 / 9, 1 / 3, 4 / 9, 0.0), order=3.0,
    # b - b_hat with b_hat = (7/24, 1/4, 1/3, 1/8)
    b_error=(2 / 9 - 7 / 24, 1 / 3 - 1 / 4, 4 / 9 - 1 / 3, -1 / 8), error_order=2.0, fsal=True,
    # Hermite: b_i(theta) from u, k1 = F(u), u_new and k4 = F(u_new)
    dense=((1.0, -4 / 3, 5 / 9), (0.0, 1.0, -2 / 3), (0.0, 4 / 3, -8 / 9), (0.0, -1.0, 1.0)),
    dense_order=3.0))

_DOPRI5_B = (35 / 384, 0.0, 500 / 1113, 125 / 192, -2187 / 6784, 11 / 84, 0.0)
_DOPRI5_B_HAT = (5179 / 57600, 0.0, 7571 / 16695, 393 / 640, -92097 / 339200, 187 / 2100, 1 / 40)

DOPRI5_TABLEAU = register_tableau(ButcherTableau(
    "dopri5",
    a=((), (1 / 5,), (3 / 40, 9 / 40), (44 / 45, -56 / 15, 32 / 9),
       (19372 / 6561, -25360 / 2187, 64448 / 6561, -212 / 729),
       (9017 / 3168, -355 / 33, 46732 / 5247, 49 / 176, -5103 / 18656),
       _DOPRI5_B[:-1]),
    b=_DOPRI5_B, order=5.0,
    b_error=tuple(b - bh for b, bh in zip(_DOPRI5_B, _DOPRI5_B_HAT)), error_order=4.0, fsal=True,
    dense=((1.0, -8048581381 / 2820520608, 8663915743 / 2820520608,
            -12715105075 / 11282082432),
           (0.0, 0.0, 0.0, 0.0),
           (0.0, 131558114200 / 32700410799, -68118460800 / 10900136933,
            87487479700 / 32700410799),
           (0.0, -1754552775 / 470086768, 14199869525 / 1410260304,
            -10690763975 / 1880347072),
           (0.0, 127303824393 / 49829197408, -318862633887 / 49829197408,
            701980252875 / 199316789632),
           (0.0, -282668133 / 205662961, 2019193451 / 616988883, -1453857185 / 822651844),
           (0.0, 40617522 / 29380423, -110615467 / 29380423, 69997945 / 29380423)),
    dense_order=4.0))

_TSIT5_B = (0.09646076681806523, 0.01, 0.4798896504144996, 1.379008574103742,
            -3.290069515436081, 2.324710524099774, 0.0)

TSIT5_TABLEAU = register_tableau(ButcherTableau(
    "tsit5",
    a=((), (0.161,), (-0.008480655492356989, 0.335480655492357),
       (2.8971530571054935, -6.359448489975075, 4.3622954328695815),
       (5.325864828439257, -11.748883564062828, 7.4955393428898365, -0.09249506636175525),
       (5.86145544294642, -12.92096931784711, 8.159367898576159, -0.071584973281401,
        -0.028269050394068383),
       _TSIT5_B[:-1]),
    b=_TSIT5_B, order=5.0, c=(0.0, 0.161, 0.327, 0.9, 0.9800255409045097, 1.0, 1.0),
    b_error=(-0.00178001105222577714, -0.0008164344596567469, 0.007880878010261995,
             -0.1447110071732629, 0.5823571654525552, -0.45808210592918697, 1 / 66),
    error_order=4.0, fsal=True,
    dense=((1.0, -2.763706197274826, 2.9132554618219126, -1.0530884977290216),
           (0.0, 0.13169999999999998, -0.2234, 0.1017),
           (0.0, 3.9302962368947516, -5.941033872131505, 2.490627285651253),
           (0.0, -12.411077166933676, 30.33818863028232, -16.548102889244902),
           (0.0, 37.50931341651104, -88.1789048947664, 47.37952196281928),
           (0.0, -27.896526289197286, 65.09189467479366, -34.87065786149660),
           (0.0, 1.5, -4.0, 2.5)),
    dense_order=4.0))

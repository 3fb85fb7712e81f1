"""The Numba kernel that names the threads of Numba's parallel team (imported only when used).

``thread_ids(out)`` runs a parallel loop of ``out.size`` iterations and writes, at the team
index of the thread that ran each one (``numba.get_thread_id()``), that thread's kernel thread
id (``gettid``, declared as an external C function, which keeps the kernel cacheable where a
ctypes function pointer would not). :class:`ctformer._numerics.placement.Team` uses it to find
the threads it keeps off their caller's CPU.
"""
from __future__ import annotations

import numba
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import kernel_cache as _kernel_cache

_kernel_cache.install()  # before the kernel is defined: see kernel_cache


@intrinsic
def _gettid(typingctx):
    """The calling thread's kernel thread id (the C library's ``gettid``)."""
    def codegen(context, builder, signature, args):
        function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []), "gettid")
        return builder.sext(builder.call(function, []), ir.IntType(64))
    return types.int64(), codegen


@njit(parallel=True, cache=True)
def thread_ids(out):
    """out[team index] = kernel thread id, for every thread that ran an iteration."""
    for i in prange(out.size):
        out[numba.get_thread_id()] = _gettid()

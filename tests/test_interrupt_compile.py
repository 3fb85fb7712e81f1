"""Ctrl-C while Numba compiles: one line, exit status 130, no traceback, no "Exception ignored".

LLVM calls back into Python while it compiles; a KeyboardInterrupt raised in that ctypes
callback printed ``Exception ignored on calling ctypes callback function ...
KeyboardInterrupt`` with a traceback, and the compile went on (the Ctrl-C was lost). Numba's
compile event lets the child process send itself SIGINT at the exact moment a kernel starts
compiling, from an empty cache directory, so the test does not depend on timing.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from .conftest import require

_CHILD = textwrap.dedent("""
    import os, signal, sys
    from numba.core import event

    class InterruptAtFirstCompile(event.Listener):
        first = None

        def on_start(self, ev):
            if self.first is None:
                self.first = ev.data["dispatcher"]
                print("compiling", self.first.py_func.__name__, file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C while the kernel compiles

        def on_end(self, ev):
            if ev.data["dispatcher"] is self.first:   # not the functions compiled inside it
                print("compiled", self.first.py_func.__name__, file=sys.stderr, flush=True)

    event.register("numba:compile", InterruptAtFirstCompile())
    from ctformer.cli import main
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.skipif(not hasattr(signal, "SIGINT") or os.name != "posix", reason="needs POSIX signals")
def test_ctrl_c_during_the_first_compile_prints_one_line_and_exits_130(tmp_path):
    """``ctformer study`` from an empty NUMBA_CACHE_DIR, SIGINT when the first kernel starts
    compiling: the compile finishes (its cache index is written), then the command ends with
    the one-line message and status 130; nothing else reaches standard error."""
    require("numba")
    cache = tmp_path / "numba-cache"
    cache.mkdir()
    env = dict(os.environ, CTFORMER_LOOP_ENGINE="numba", NUMBA_CACHE_DIR=str(cache))
    command = [sys.executable, "-c", _CHILD, "study", "--refine", "tokens", "--levels", "4,8,16",
               "--out", str(tmp_path / "out"), "--no-progress"]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 130, result.stderr
    assert lines[0].startswith("compiling ") and lines[1] == "compiled " + lines[0].split()[1], lines
    assert len(lines) == 3 and lines[2].startswith("ctformer: interrupted"), result.stderr
    assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr
    kernel = lines[0].split()[1]
    assert any(kernel in path.name and path.suffix == ".nbi" for path in cache.rglob("*")), \
        "the interrupted compile did not finish and write its cache index"

"""benchmarks/gpu_check.py's dry run on a machine without a GPU: every check of the GPU run
(CuPy against NumPy, adaptive depth, the sphere mean fields, the new bridges) runs on the CPU
at small sizes against its references and passes, so the first task lent a GPU meets a
script that works."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import require

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run_passes():
    require("torch")
    require("transformers")
    env = {**os.environ, "CTFORMER_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    # --dry-run: the host run, also on a machine with a GPU
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--dry-run"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if "[dry run]" in line]
    assert len(rows) >= 30                        # depth, sphere and bridge checks all ran
    assert not [line for line in done.stdout.splitlines() if " FAIL " in line]
    for name in ("DeiT", "Gemma", "Phi", "GPT-NeoX", "evolve", "Zonal"):
        assert any(name.lower() in line.lower() for line in rows), name

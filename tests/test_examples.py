"""Every gallery example runs as a test (the docs build runs them too)."""
from pathlib import Path
import runpy

import matplotlib
import pytest

matplotlib.use("Agg")

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("plot_*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs(path, tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(path), run_name="__main__")
    plt.close("all")

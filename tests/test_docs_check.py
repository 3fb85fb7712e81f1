"""The rendered-docs check (``docs/check_rendered.py``) tells a plot from an empty canvas.

CI runs the check on the built site in headless Chromium; these tests pin down its verdicts on
inputs whose answer is known, without a browser.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("check_rendered", ROOT / "docs" / "check_rendered.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _figure(path, draw):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    if draw:
        x = np.linspace(0, 1, 50)
        ax.loglog(x[1:], x[1:] ** 2, "o-", label="slope 2")
        ax.legend()
    else:
        ax.set_axis_off()                         # a blank white canvas
    fig.savefig(path, dpi=100)
    plt.close(fig)


def test_a_plot_passes_and_a_blank_canvas_fails(check, tmp_path):
    _figure(tmp_path / "plot.png", draw=True)
    _figure(tmp_path / "blank.png", draw=False)
    assert check.image_problem(tmp_path / "plot.png") is None
    assert check.image_problem(tmp_path / "blank.png").startswith("only ")   # compresses to little
    assert "flat image" in check.image_problem(tmp_path / "blank.png", min_bytes=0)
    from matplotlib import image

    dot = np.ones((400, 500, 3))
    dot[200:203, 250:253] = 0.0                                 # one dark speck on white
    image.imsave(tmp_path / "speck.png", dot)
    assert "almost empty" in check.image_problem(tmp_path / "speck.png", min_bytes=0)
    (tmp_path / "tiny.png").write_bytes((tmp_path / "plot.png").read_bytes()[:100])
    assert check.image_problem(tmp_path / "tiny.png") == "only 100 bytes"
    assert check.image_problem(tmp_path / "absent.png") == "missing"


def test_visible_text_keeps_prose_and_drops_code_and_scripts(check):
    dom = ('<p>typeset <mjx-container>x</mjx-container> and raw \\(u_0\\)</p>'
           '<script>var s = "\\(";</script><pre>print("\\(")</pre>')
    text = check.visible_text(dom)
    assert "raw \\(u_0\\)" in text and text.count("\\(") == 1


def test_work_precision_timings_must_grow(check, tmp_path):
    page = tmp_path / "auto_examples" / "plot_work_precision.html"
    page.parent.mkdir()
    table = ("<pre>discretization      n   L2 error  ms per sequence\n"
             "midpoint           16   2.27e-02            0.241\n"
             "midpoint           32   5.60e-03            0.446\n"
             "midpoint           64   1.40e-03            1.210\n"
             "legendre           16   1.44e-02            0.336\n"
             "legendre           24   2.71e-03            0.200\n"
             "legendre           48   1.10e-05            0.410\n</pre>")
    page.write_text(table)
    problems = check.check_work_precision(tmp_path)
    assert len(problems) == 1 and "legendre" in problems[0] and "[0.336, 0.2, 0.41]" in problems[0]
    # neighbouring small levels may swap places under noise; the whole range must grow
    page.write_text(table.replace("0.410", "0.900"))
    assert check.check_work_precision(tmp_path) == []


def test_gallery_pages_must_not_print_reprs_or_progress_bars(check, tmp_path):
    gallery = tmp_path / "auto_examples"
    gallery.mkdir()
    _figure(gallery / "sphx_glr_plot_a_001.png", draw=True)
    body = '<img src="sphx_glr_plot_a_001.png"><pre>{}</pre>'
    page = gallery / "plot_a.html"
    page.write_text(body.format("observed order 2.01"))
    assert check.check_gallery(tmp_path) == []
    for noise in ("&lt;matplotlib.legend.Legend object at 0x7f35aa799890&gt;",
                  "Loading weights: 100%|####| 103/103 [00:00&lt;00:00, 7132.35it/s]"):
        page.write_text(body.format(noise))
        problems = check.check_gallery(tmp_path)
        assert len(problems) == 1 and "prints" in problems[0], noise

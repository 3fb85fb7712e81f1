"""Check the built HTML docs in a real browser: math is typeset offline, plots are plots.

Usage::

    python docs/check_rendered.py docs/_build/html [--screenshots DIR]

Headless Chromium (the Debian package ``chromium``; ``CHROMIUM`` may name another binary)
opens pages of the built site from the file system, lets MathJax run, and dumps the DOM.
The checks, each reported in one line:

- no page loads a script from the network (MathJax comes from ``_static/mathjax``);
- on the theory, design, getting-started and API pages every math node of the HTML became a
  typeset ``mjx-container`` and no raw ``\\(`` or ``\\[`` is left in the visible text;
- every image of every gallery page exists, is larger than 5 KB and is not one flat colour
  (a figure with content, not an empty canvas), and no gallery page prints an object's repr
  (``<... object at 0x...>``) or a progress bar;
- the work-precision example's timings grow with ``n`` in every family (within 15 %, for
  timer noise).

With ``--screenshots DIR`` it also saves PNG screenshots of the theory page and of one gallery
page. Exit status 0 when every check passes, 1 otherwise.
"""
from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

MATH_PAGES = ("theory.html", "design.html", "getting_started.html", "api.html")
GALLERY_SHOT = "auto_examples/plot_real_transformer.html"
MIN_IMAGE_BYTES = 5_000


def chromium() -> str:
    """The Chromium binary: ``$CHROMIUM``, else ``chromium`` or ``chromium-browser`` on PATH."""
    for name in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    sys.exit("check_rendered: no Chromium found: apt-get install chromium (or set CHROMIUM)")


def browser(page: Path, *extra: str, timeout: float = 120.0) -> str:
    """Run headless Chromium on ``page`` with ``extra`` flags; return standard output."""
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--virtual-time-budget=10000", *extra, page.resolve().as_uri()]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"chromium failed on {page}: {proc.stderr.strip()[-500:]}")
    return proc.stdout


def visible_text(dom: str) -> str:
    """Text a reader sees: no scripts, styles, code blocks or MathJax's assistive copy."""
    for tag in ("script", "style", "pre", "code", "mjx-assistive-mml", "textarea"):
        dom = re.sub(rf"<{tag}\b.*?</{tag}>", " ", dom, flags=re.S | re.I)
    return html.unescape(re.sub(r"<[^>]+>", " ", dom))


def check_math(site: Path, name: str) -> list[str]:
    page = site / name
    source = page.read_text()
    nodes = len(re.findall(r'class="math notranslate nohighlight"', source))
    if nodes == 0:
        return [f"{name}: no math in the page (expected formulas)"]
    dom = browser(page, "--dump-dom")
    typeset = len(re.findall(r"<mjx-container\b", dom))
    problems = []
    if typeset < nodes:
        problems.append(f"{name}: {typeset} typeset formulas for {nodes} math nodes "
                        "(MathJax did not run or failed)")
    raw = re.findall(r"\\[(\[].{0,40}", visible_text(dom))
    if raw:
        problems.append(f"{name}: raw TeX left in the visible text, e.g. {raw[0]!r}")
    print(f"check_rendered: {name}: {typeset} of {nodes} formulas typeset")
    return problems


def check_offline(site: Path) -> list[str]:
    problems = []
    for page in sorted(site.rglob("*.html")):
        remote = re.findall(r'<script[^>]+src="(https?:[^"]+)"', page.read_text())
        if remote:
            problems.append(f"{page.relative_to(site)}: loads {remote[0]} from the network")
    return problems


def image_problem(path: Path, min_bytes: int = MIN_IMAGE_BYTES) -> str | None:
    """Why ``path`` is not a plot with content, or None."""
    import numpy as np
    from matplotlib import image

    if not path.is_file():
        return "missing"
    size = path.stat().st_size
    if size < min_bytes:
        return f"only {size} bytes"
    pixels = image.imread(path)[..., :3]
    spread = float(np.ptp(pixels))
    if spread < 0.1:
        return f"a flat image (pixel values within {spread:.3f})"
    background = pixels[0, 0]
    drawn = float(np.mean(np.abs(pixels - background).sum(axis=-1) > 0.05))
    if drawn < 0.01:
        return f"almost empty ({100 * drawn:.2f} % of pixels differ from the background)"
    return None


def check_gallery(site: Path) -> list[str]:
    problems, count = [], 0
    pages = sorted((site / "auto_examples").glob("plot_*.html"))
    if not pages:
        return ["auto_examples: no gallery pages (was the gallery built?)"]
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        noise = re.search(r"<[\w.]+ object at 0x[0-9a-f]+>|\d+/\d+ \[[\d:<?]+|it/s\]", text)
        if noise:
            problems.append(f"{page.name}: prints {noise.group(0)!r}")
        sources = re.findall(r'<img[^>]+src="([^"]+)"', page.read_text())
        figures = [s for s in sources if "sphx_glr_" in s and "_thumb" not in s]
        if not figures:
            problems.append(f"{page.name}: no figure")
        for src in figures:
            count += 1
            why = image_problem((page.parent / src).resolve())
            if why:
                problems.append(f"{page.name}: image {src} is {why}")
    print(f"check_rendered: {count} gallery images on {len(pages)} pages checked")
    return problems


def check_work_precision(site: Path) -> list[str]:
    page = site / "auto_examples" / "plot_work_precision.html"
    text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
    rows = re.findall(r"^([a-z0-9-]+)\s+(\d+)\s+([\d.e+-]+)\s+([\d.]+)\s*$", text, re.M)
    if not rows:
        return [f"{page.name}: no timing table in the page"]
    times: dict[str, list[float]] = {}
    for name, _n, _error, ms in rows:
        times.setdefault(name, []).append(float(ms))
    # Neighbouring small levels cost about the same (fixed overhead dominates) and swap places
    # under machine noise; only the trend over the whole range of n is a property of the code.
    problems = []
    for name, t in times.items():
        if not t[-1] > 1.5 * t[0]:
            problems.append(f"{page.name}: {name} time does not grow from the smallest to the "
                            f"largest n: {t}")
    return problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, help="the built HTML, e.g. docs/_build/html")
    parser.add_argument("--screenshots", type=Path, default=None,
                        help="save screenshots of the theory page and a gallery page here")
    args = parser.parse_args(argv)
    site = args.site
    if not (site / "index.html").is_file():
        print(f"check_rendered: {site} holds no built site (index.html missing)")
        return 1
    problems = check_offline(site)
    for name in MATH_PAGES:
        problems += check_math(site, name)
    problems += check_gallery(site)
    problems += check_work_precision(site)
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
        for page, name in (("theory.html", "theory.png"), (GALLERY_SHOT, "gallery.png")):
            target = args.screenshots / name
            browser(site / page, "--window-size=1280,2400", f"--screenshot={target}")
            print(f"check_rendered: screenshot {target}")
    for problem in problems:
        print(f"check_rendered: FAIL {problem}")
    print(f"check_rendered: {'FAILED' if problems else 'all checks passed'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

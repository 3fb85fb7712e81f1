"""The Python blocks of the pages on two-dimensional token domains, gradients, the sphere and
speed and reproducibility run, in order, and their asserts (the pages' claims) hold."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .conftest import require

ROOT = Path(__file__).resolve().parents[1]


def python_blocks(page: str) -> list[str]:
    """The bodies of the ``.. code-block:: python`` directives of ``docs/PAGE``, dedented
    whatever their indent (a block inside a list item is indented further)."""
    lines, out, i = (ROOT / "docs" / page).read_text().splitlines(), [], 0
    while i < len(lines):
        if lines[i].strip() == ".. code-block:: python":
            i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("   ")):
                body.append(lines[i])
                i += 1
            out.append(textwrap.dedent("\n".join(body)))
        else:
            i += 1
    return out


@pytest.mark.parametrize("page, needs", [("images.rst", ()), ("gradients.rst", ("torch",)),
                                         ("sphere.rst", ()), ("performance.rst", ())])
def test_page_blocks_run(page, needs):
    for module in needs:
        require(module)
    blocks = python_blocks(page)
    assert len(blocks) >= 1
    namespace = {}
    for block in blocks:
        exec(compile(block, f"docs/{page}", "exec"), namespace)

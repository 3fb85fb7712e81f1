"""Sphinx configuration for ctformer."""
import importlib.util
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

project = "ctformer"
author = "the ctformer developers"
copyright = "2026, the ctformer developers"
import ctformer  # noqa: E402  (the version is written once, in the package)

release = version = ctformer.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinx.ext.intersphinx",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
# _static holds files served or kept as they are (the issue screenshots and their README.md),
# not pages.
exclude_patterns = ["_build", "_static", "auto_examples/*.ipynb", "auto_examples/*.py", "**.zip",
                    "**.md5"]
templates_path = []
html_theme = "furo"
html_title = "ctformer"
html_static_path = []

# Math renders offline: MathJax 3 ships in the PyPI package ``sphinx-mathjax-offline`` (docs
# extra). Its ``static`` folder holds ``mathjax/``, copied to ``_static/mathjax`` and loaded
# from there, so no page asks a CDN for anything.
_MATHJAX = importlib.util.find_spec("sphinx-mathjax-offline")
if _MATHJAX is None:
    raise RuntimeError("the docs need MathJax from the package sphinx-mathjax-offline: "
                       "pip install -e \".[docs]\"")
html_static_path.append(str(Path(_MATHJAX.origin).parent / "static"))
mathjax_path = "mathjax/tex-chtml.js"

autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": False}
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False
# Docstrings are written for readers; the API pages must build without warnings.
nitpicky = False

intersphinx_mapping = {}

sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "matplotlib_animations": False,
    "write_computation_times": False,
}
suppress_warnings = ["config.cache"]

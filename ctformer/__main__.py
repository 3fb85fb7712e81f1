"""``python -m ctformer``: the command-line interface (see :mod:`ctformer.cli`)."""
import sys

from .cli import main

sys.exit(main())

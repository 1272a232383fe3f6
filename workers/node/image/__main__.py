"""Entry point for `python -m workers.node.image` (see `cli.py`)."""

import sys

from .cli import main

sys.exit(main())

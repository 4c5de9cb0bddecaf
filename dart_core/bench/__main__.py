"""``python -m dart_core.bench``: the benchmark command line (see bench/cli.py)."""
import sys

from .cli import main

sys.exit(main())

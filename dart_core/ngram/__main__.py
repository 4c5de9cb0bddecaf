"""``python -m dart_core.ngram``: the N-gram table command line (ngram/cli.py)."""
import sys

from .cli import main

sys.exit(main())
